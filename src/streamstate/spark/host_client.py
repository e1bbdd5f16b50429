"""The task side of a state host: find or start the host, stream one batch, shut hosts down.

Starting is race-free: a task connects to ``<id>.sock``; if nobody listens it takes the spawn
``flock`` (``<id>.spawn``), tries again (another task may have started the host meanwhile), and
only then spawns ``python -m streamstate.spark.state_host serve ...`` and waits for its
``READY`` line. A host that cannot start says why (``ERROR <reason>`` plus the tail of its log)
in a :class:`~streamstate.errors.StateHostError`, which fails the Spark task (and Spark retries
it).
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import selectors
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from typing import Any

import msgspec

from streamstate.errors import StateHostError
from streamstate.spark.protocol import PROTOCOL_VERSION, Connection
from streamstate.spark.state_host import HostSpec, host_paths, proc_start_time

__all__ = ["connect", "find_jvm_pid", "ping", "run_batch", "shutdown", "spawn"]


def find_jvm_pid() -> int | None:
    """The nearest ancestor process named ``java`` (the executor JVM; the driver's in local
    mode), or None."""
    pid = os.getppid()
    for _ in range(10):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "java":
                    return pid
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            return None
        if pid <= 1:
            return None
    return None


def _log_tail(path: str, limit: int = 3000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def spawn(spec: HostSpec, timeout: float = 120.0, pythonpath: str | None = None) -> float:
    """Start the host of ``spec`` and wait until it is ready; returns the seconds it took.

    ``pythonpath`` is put first on the host's PYTHONPATH (default: the directory this
    ``streamstate`` was imported from)."""
    from streamstate.spark.job import src_path

    paths = host_paths(spec.id, spec.run_dir)
    env = dict(os.environ)
    # the host imports the same streamstate as this process (a source checkout included)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (pythonpath or src_path(), env.get("PYTHONPATH", "")) if p
    )
    read_fd, write_fd = os.pipe()
    t0 = time.perf_counter()
    with open(paths["log"], "ab") as log:
        launcher = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "streamstate.spark.state_host",
                "serve",
                json.dumps(msgspec.to_builtins(spec)),
                str(write_fd),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            pass_fds=(write_fd,),
            close_fds=True,
            start_new_session=True,
            cwd="/",
            env=env,
        )
    os.close(write_fd)
    launcher.wait()  # it exits right after forking the host
    selector = selectors.DefaultSelector()
    selector.register(read_fd, selectors.EVENT_READ)
    msg = b""
    deadline = time.monotonic() + timeout
    try:
        while not msg.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                raise StateHostError(
                    f"the state host of {spec.operator!r} subtask {spec.subtask} did not start "
                    f"within {timeout:.0f} s; see {paths['log']}"
                )
            chunk = os.read(read_fd, 4096)
            if not chunk:
                break
            msg += chunk
    finally:
        os.close(read_fd)
    line = msg.decode(errors="replace").strip()
    if line != "READY":
        raise StateHostError(
            f"the state host of {spec.operator!r} subtask {spec.subtask} (job {spec.job}) failed "
            f"to start: {line or 'it exited without a status'}\n--- {paths['log']} (tail) ---\n"
            f"{_log_tail(paths['log'])}"
        )
    return time.perf_counter() - t0


def _try_connect(path: str, io_timeout: float) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    sock.settimeout(io_timeout)
    return sock


def connect(
    spec: HostSpec, *, start: bool = True, pythonpath: str | None = None
) -> tuple[Connection, dict[str, Any], float | None] | None:
    """Connect to the host of ``spec`` (starting it if ``start``); returns the connection, the
    host's HELLO and the spawn time (None if it was running), or None if it is not running and
    ``start`` is False."""
    paths = host_paths(spec.id, spec.run_dir)
    spawned = None
    for _ in range(50):
        sock = _try_connect(paths["sock"], spec.io_timeout)
        if sock is None:
            if not start:
                return None
            with open(paths["spawn"], "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # one spawner; the others wait, then connect
                sock = _try_connect(paths["sock"], spec.io_timeout)
                if sock is None:
                    spawned = spawn(spec, pythonpath=pythonpath)
                    sock = _try_connect(paths["sock"], spec.io_timeout)
                    if sock is None:
                        raise StateHostError(
                            f"the state host {spec.id} reported READY but {paths['sock']} "
                            "refuses connections"
                        )
        conn = Connection(sock)
        try:
            conn.send({"t": "HELLO", "proto": PROTOCOL_VERSION})
            hello, _ = conn.recv()
            return conn, hello, spawned
        except (EOFError, ConnectionError):
            conn.close()  # accepted by a host that was shutting down: try again
            time.sleep(0.02)
    raise StateHostError(f"could not reach the state host {spec.id} ({paths['sock']})")


def _raise_remote(spec: HostSpec, msg: dict[str, Any]) -> None:
    raise StateHostError(
        f"the state host of {spec.operator!r} subtask {spec.subtask} failed: {msg.get('type')}: "
        f"{msg.get('message')}\n{msg.get('traceback', '')}"
    )


def run_batch(
    spec: HostSpec,
    begin: dict[str, Any],
    batches: Iterable[Any],
    *,
    pythonpath: str | None = None,
) -> tuple[bytes, dict[str, Any]]:
    """Stream one micro-batch of one subtask through its host.

    ``begin`` is the BEGIN header; ``batches`` the subtask's Arrow record batches. Returns the
    encoded ``BatchResult`` and timings. Raises :class:`StateHostError` if the host reports an
    error or goes away (the host has then dropped the batch's changes).
    """
    t0 = time.perf_counter()
    got = connect(spec, pythonpath=pythonpath)
    assert got is not None
    conn, _hello, spawned = got
    t_connect = time.perf_counter() - t0
    paths = host_paths(spec.id, spec.run_dir)
    try:
        it = (b for b in batches if b.num_rows)
        first = next(it, None)
        schema = None if first is None else bytes(first.schema.serialize())
        conn.send({**begin, "t": "BEGIN", "schema": schema})
        msg, _ = conn.recv()
        if msg["t"] == "ERROR":
            _raise_remote(spec, msg)
        t_begin = time.perf_counter()
        for batch in itertools.chain(() if first is None else (first,), it):
            conn.send({"t": "DATA"}, batch.serialize())
            reply, _ = conn.recv()
            if reply["t"] != "OK":
                _raise_remote(spec, reply)
        conn.send({"t": "END"})
        done, _ = conn.recv()
        if done["t"] != "DONE":
            _raise_remote(spec, done)
        timings = {
            "connect_ms": t_connect * 1e3,
            "spawn_ms": None if spawned is None else spawned * 1e3,
            "stream_ms": (time.perf_counter() - t_begin) * 1e3,
            "restore": msg.get("restore"),
        }
        return bytes(done["result"]), timings
    except (EOFError, ConnectionError, TimeoutError) as exc:
        raise StateHostError(
            f"lost the state host of {spec.operator!r} subtask {spec.subtask} ({exc!r}); see "
            f"{paths['log']}"
        ) from exc
    finally:
        conn.close()


def ping(spec: HostSpec) -> dict[str, Any] | None:
    """The host's PONG, or None if it is not running."""
    try:
        got = connect(spec, start=False)
    except StateHostError:
        return None
    if got is None:
        return None
    conn = got[0]
    try:
        conn.send({"t": "PING"})
        return conn.recv()[0]
    except (EOFError, OSError):
        return None
    finally:
        conn.close()


def shutdown(spec: HostSpec, reason: str = "") -> bool:
    """Ask the host of ``spec`` to exit; False if it was not running."""
    paths = host_paths(spec.id, spec.run_dir)
    sock = _try_connect(paths["sock"], 10.0)
    if sock is None:
        return False
    conn = Connection(sock)
    try:
        conn.send({"t": "SHUTDOWN", "reason": reason})
        conn.recv()
        return True
    except (EOFError, OSError):
        return False
    finally:
        conn.close()


def host_spec(
    job_url: str,
    operator: str,
    subtask: int,
    parallelism: int,
    *,
    directory: str | None = None,
    idle_timeout: float = 600.0,
    watch: bool = True,
) -> HostSpec:
    """The spec of the host of one subtask, watching this process's executor JVM."""
    from streamstate.spark.state_host import host_id, run_dir

    jvm = find_jvm_pid() if watch else None
    return HostSpec(
        id=host_id(job_url, operator, subtask, parallelism),
        job=job_url,
        operator=operator,
        subtask=subtask,
        parallelism=parallelism,
        run_dir=run_dir(directory),
        watch_pid=jvm,
        watch_start=proc_start_time(jvm) if jvm else None,
        idle_timeout=idle_timeout,
    )
