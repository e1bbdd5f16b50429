"""A state host's files in its node's run directory: its lock, its Unix socket, and what hosts
that exited long ago left behind (:func:`clean_stale_host_files`, run by a host start at most every
:data:`SWEEP_EVERY_S` seconds per node).

A host (and the host zygote, :mod:`streamstate.spark.host.zygote`) holds the ``flock`` of its
``<id>.lock`` for its whole life (:func:`hold_lock`): a second host of the same id exits at
once, and a lock that nobody holds says the host is gone. Its socket is its owner's only
(:func:`listen_unix`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from streamstate.spark.wire.hosts import host_paths

__all__ = [
    "KEEP_LOGS_S",
    "STALE_AFTER_S",
    "SWEEP_EVERY_S",
    "SWEPT_MARK",
    "SocketFile",
    "clean_run_dir",
    "clean_stale_host_files",
    "hold_lock",
    "listen_unix",
    "sweep_due",
]


#: files of a host that exited are removed once this old (seconds since last written)...
STALE_AFTER_S = 3600.0
#: ... and its log once this old (it tells what happened to a run, for a while)
KEEP_LOGS_S = 7 * 86400.0
#: a node's run directory is swept at most this often (seconds), by the host starting then
SWEEP_EVERY_S = 600.0
#: the file whose time says when the run directory was last swept
SWEPT_MARK = "swept"


def clean_stale_host_files(
    directory: str,
    *,
    stale_after: float = STALE_AFTER_S,
    keep_logs: float = KEEP_LOGS_S,
    now: float | None = None,
) -> list[str]:
    """Remove what hosts that no longer run left in a node's run directory: the ``.lock``,
    ``.spawn`` and ``.sock`` files and the ``.d`` working directory (RocksDB) of every host
    whose lock is free and whose files were last written ``stale_after`` seconds ago or
    earlier, and its ``.log`` once ``keep_logs`` seconds old. A host that runs holds its lock
    (and a task that starts one holds the spawn lock), so neither is touched. Returns the paths
    removed."""
    import shutil

    now = time.time() if now is None else now
    removed: list[str] = []
    # one listing with each file's time: a node keeps a week of logs, thousands of files, and a
    # call per file and kind took seconds of a starting host's CPU
    mtimes: dict[str, float] = {}
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.name.endswith((".lock", ".spawn", ".log")):
                    with contextlib.suppress(OSError):
                        mtimes[entry.name] = entry.stat(follow_symlinks=False).st_mtime
    except OSError:
        return removed
    ids = {n.rsplit(".", 1)[0] for n in mtimes}
    for hid in sorted(ids):
        paths = host_paths(hid, directory)
        times = [mtimes[f"{hid}.{k}"] for k in ("lock", "spawn", "log") if f"{hid}.{k}" in mtimes]
        if now - max(times) < stale_after:
            continue
        held = []
        try:
            for k in ("spawn", "lock"):
                if f"{hid}.{k}" not in mtimes:
                    continue
                f = open(paths[k], "a")  # noqa: SIM115 - closed below
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    f.close()
                    raise
                held.append(f)
            for k in ("sock", "lock", "spawn"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(paths[k])
                    removed.append(paths[k])
            if os.path.isdir(paths["local"]):
                shutil.rmtree(paths["local"], ignore_errors=True)
                removed.append(paths["local"])
            if f"{hid}.log" in mtimes and now - max(times) >= keep_logs:
                os.unlink(paths["log"])
                removed.append(paths["log"])
        except BlockingIOError:
            continue  # a host runs, or a task is starting it
        finally:
            for f in held:
                f.close()
    return removed


def hold_lock(path: str) -> tuple[Any, str]:
    """Take the ``flock`` of ``path`` for the life of the process and write this pid into it:
    (the open file, ""), or (None, what the holder wrote: its pid) if another process holds it."""
    lock = open(path, "a+")  # noqa: SIM115 - held for the life of the process
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip()
        lock.close()
        return None, holder
    lock.seek(0)
    lock.truncate()
    lock.write(str(os.getpid()))
    lock.flush()
    return lock, ""


def listen_unix(path: str, backlog: int) -> socket.socket:
    """A listening Unix socket at ``path``, the file the owner's only (0600); a socket file left
    there by a dead process is replaced (the caller holds the lock that says so). Raises
    OSError if it cannot bind."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        listener.bind(path)
    except OSError:
        listener.close()
        raise
    finally:
        os.umask(old_umask)
    listener.listen(backlog)
    return listener


def sweep_due(directory: str, now: float | None = None, every: float = SWEEP_EVERY_S) -> bool:
    """Whether this host start sweeps the run directory: not if another did less than
    ``every`` seconds ago (the time of the file :data:`SWEPT_MARK`, touched here when a sweep
    is due). Two hosts starting at once may both sweep, which is harmless."""
    now = time.time() if now is None else now
    mark = os.path.join(directory, SWEPT_MARK)
    with contextlib.suppress(OSError):
        if 0 <= now - os.stat(mark).st_mtime < every:
            return False
    with contextlib.suppress(OSError):
        with open(mark, "a"):
            pass
        os.utime(mark, (now, now))
    return True


def clean_run_dir(directory: str, log: Callable[[str], None], now: float | None = None) -> None:
    """What hosts that exited long ago left in this node's run directory goes (a host start
    sweeps it, at most every :data:`SWEEP_EVERY_S` seconds per node: the directory does not
    grow with every query run, and starting hosts do not all read it); ``log`` says what."""
    if not sweep_due(directory, now):
        return
    try:
        removed = clean_stale_host_files(directory, now=now)
    except Exception as exc:  # never worth failing a host for
        log(f"cleaning {directory} failed: {exc!r}")
        return
    if removed:
        log(f"removed {len(removed)} files of hosts that exited in {directory}")


class SocketFile:
    """The host's socket file, unlinked only while it is still this host's (a new host of the
    same id may have bound the path since)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.inode = os.stat(path).st_ino

    def unlink(self) -> None:
        try:
            if os.stat(self.path).st_ino == self.inode:
                os.unlink(self.path)
        except FileNotFoundError:
            pass
