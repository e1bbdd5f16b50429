"""The host zygote: a process that has imported what a state host needs and forks new hosts.

A state host started as a new interpreter (``python -m streamstate.spark.host.state_host
serve``) spends about 1.2 s of CPU before its first batch can run at full speed: the interpreter
and streamstate, then pyarrow, the backends, the checkpoint code and pandas (pyarrow imports it
the first time it converts Python values). A query's hosts start together, with its first
micro-batch, so on a 2-core node they compete with the JVM for that micro-batch. PySpark starts
its Python workers the same way for the same reason: its daemon forks them. The zygote pays the
imports once per node, executor JVM and interpreter; a host forked from it runs its first batch
without importing anything.

Who starts it: the first spawner of a host watching a JVM (:func:`~streamstate.spark.task.
host_client.spawn`) that finds none, under the zygote's spawn ``flock``; it waits for the
zygote's ``READY``, then asks it for the host. A zygote that cannot start or answer costs only
the head start: the spawner starts the host as a new interpreter. ``STREAMSTATE_HOST_ZYGOTE=0``
turns it off.

Protocol: a Unix socket ``<id>.sock`` in the node's run directory (0600, the peer's uid
checked, one request per connection): a 4-byte length sent with two file descriptors (the
spawner's status pipe and the host's log file, ``SCM_RIGHTS``), then a
:class:`~streamstate.spark.wire.hosts.ForkRequest` (msgpack). The zygote forks; the child
becomes the host as ``state_host.main`` does after its double fork (a new session, the log as
stdout and stderr, the spawner's environment) and reports ``READY`` or
``ERROR <reason>`` on the status pipe itself; the zygote answers ``FORKED <pid>``, or
``REFUSED <why>`` to a request it cannot take (the spawner then starts the host itself). Hosts are
the zygote's children (it reaps them), each in its own session.

Lifetime: it exits when the JVM it watches exits, after ``idle_timeout`` seconds without a
request, or on SIGTERM. Its id (:func:`~streamstate.spark.wire.hosts.zygote_id`) covers the
interpreter, the JVM, the address-space limit and the environment variables read when an
interpreter starts or a module is imported (``PYTHON*``, ``STREAMSTATE_*``, ``LD_*``, ...): a
new Spark application, whose code may have changed, gets a new zygote, and so does a spawner
whose hosts must start differently. It holds ``<id>.lock`` for its life (a second one exits at
once) and logs to ``<id>.log``.

``python -m streamstate.spark.host.zygote <run dir> <id> <jvm pid> <jvm start> <idle timeout>
<status fd>``. The hosts it forks show the command line of a host started as a new interpreter
(``setproctitle``).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys
import time
import traceback
from typing import Any

import msgspec
import setproctitle

from streamstate.spark.host import state_host
from streamstate.spark.host.run_dir import hold_lock, listen_unix
from streamstate.spark.host.startup import warm_imports
from streamstate.spark.wire.hosts import ForkRequest, JobPin, host_paths, proc_start_time
from streamstate.spark.wire.security import peer_uid

__all__ = ["MAX_REQUEST", "serve_zygote"]

#: largest request accepted (the spawner's environment is most of it)
MAX_REQUEST = 1 << 20
#: seconds a spawner has to send its request once connected
_REQUEST_TIMEOUT = 5.0


def _log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} zygote[{os.getpid()}] {msg}", flush=True)


def _report(fd: int, msg: str) -> None:
    if msg != "READY":
        _log(msg)
    with contextlib.suppress(OSError):
        os.write(fd, (msg + "\n").encode())
        os.close(fd)


def serve_zygote(
    run_dir: str, zid: str, watch_pid: int, watch_start: int, idle_timeout: float, status_fd: int
) -> int:
    """The zygote's life: take its lock, import, listen, report READY on ``status_fd``, then
    fork a host for each request until the JVM ``watch_pid`` exits or ``idle_timeout`` seconds
    pass without one."""
    paths = host_paths(zid, run_dir)
    lock, holder = hold_lock(paths["lock"])
    if lock is None:
        _report(status_fd, f"ERROR another zygote (pid {holder or '?'}) holds {paths['lock']}")
        return 3
    if proc_start_time(watch_pid) != watch_start:
        _report(status_fd, f"ERROR the JVM {watch_pid} is already gone")
        return 4
    watch = os.pidfd_open(watch_pid)
    warm_imports()
    import cloudpickle  # noqa: F401 - what serve() imports before READY
    import pyarrow  # noqa: F401

    import streamstate.spark.subtask  # noqa: F401

    try:
        listener = listen_unix(paths["sock"], 64)
    except OSError as exc:
        _report(status_fd, f"ERROR cannot bind {paths['sock']}: {exc}")
        return 5
    inode = os.stat(paths["sock"]).st_ino
    stop: list[str] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(f"signal {signum}"))
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the hosts that exit
    _log(f"ready: JVM {watch_pid}, {sys.executable}, run dir {run_dir}")
    _report(status_fd, "READY")
    waited: list[Any] = [listener, watch]
    last = time.monotonic()
    why = "idle timeout"
    try:
        while not stop:
            left = idle_timeout - (time.monotonic() - last)
            if left <= 0:
                break
            try:
                ready, _, _ = select.select(waited, [], [], min(left, 1.0))
            except InterruptedError:
                continue
            if watch in ready:
                why = f"the JVM {watch_pid} exited"
                break
            if listener not in ready:
                continue
            conn, _ = listener.accept()
            with conn:
                pid = _fork_host(conn, (listener, lock, watch))
            if pid is not None:
                _log(f"forked host {pid}")
                last = time.monotonic()
        else:
            why = stop[0]
    finally:
        with contextlib.suppress(OSError):
            if os.stat(paths["sock"]).st_ino == inode:
                os.unlink(paths["sock"])
    _log(f"exit: {why}")
    return 0


def _fork_host(conn: socket.socket, inherited: tuple[object, ...]) -> int | None:
    """Read one request from ``conn`` and fork its host; returns the host's pid (None: the
    request was refused, and the spawner starts the host itself). ``inherited``: what the
    child must close (the listener, the zygote's lock, the pidfd)."""
    conn.settimeout(_REQUEST_TIMEOUT)
    fds: list[int] = []
    try:
        if peer_uid(conn) != os.getuid():
            _refuse(conn, "a request from another user")
            return None
        header, fds, _, _ = socket.recv_fds(conn, 4, 2)
        if len(header) != 4 or len(fds) != 2:
            _refuse(conn, f"{len(header)} header bytes and {len(fds)} descriptors")
            return None
        size = int.from_bytes(header, "big")
        if size > MAX_REQUEST:
            _refuse(conn, f"a request of {size} bytes (at most {MAX_REQUEST})")
            return None
        body = bytearray()
        while len(body) < size:
            chunk = conn.recv(size - len(body))
            if not chunk:
                _log("a spawner went away mid-request")
                return None
            body += chunk
        request = msgspec.msgpack.decode(bytes(body), type=ForkRequest)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _become_host(request, fds[0], fds[1], conn, inherited)
        conn.sendall(f"FORKED {pid}\n".encode())
        return pid
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        _refuse(conn, f"an undecodable request: {exc}")
        return None
    except OSError as exc:
        _log(f"a request failed: {exc!r}")
        return None
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def _refuse(conn: socket.socket, why: str) -> None:
    """Tell the spawner its request was refused (it starts the host itself)."""
    _log(f"refused {why}")
    with contextlib.suppress(OSError):
        conn.sendall(f"REFUSED {why}\n".encode())


def _become_host(
    request: ForkRequest,
    status_fd: int,
    log_fd: int,
    conn: socket.socket,
    inherited: tuple[object, ...],
) -> None:
    """The forked child: the zygote's files closed, the spawner's session settings, then the
    host's main loop; never returns."""
    rc = 1
    try:
        conn.close()
        for thing in inherited:
            if isinstance(thing, int):
                os.close(thing)
            else:
                thing.close()  # type: ignore[attr-defined]
        os.setsid()
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        # the command line a host started as a new interpreter has: ps (and whoever looks for
        # the hosts of a checkpoint) sees a host, not the zygote
        setproctitle.setproctitle(
            f"{sys.executable} -m streamstate.spark.host.state_host serve "
            f"{json.dumps(msgspec.to_builtins(request.spec))} {status_fd}"
        )
        os.environ.clear()
        os.environ.update(request.env)
        pin = msgspec.json.decode(request.pin, type=JobPin) if request.pin else None
        rc = state_host.serve(request.spec, status_fd, request.secret, pin)
    except BaseException:
        traceback.print_exc()
        _report(status_fd, "ERROR the host forked by the zygote failed; see its log")
    finally:
        os._exit(rc)


def main(argv: list[str]) -> int:
    if len(argv) != 6:
        print(__doc__, file=sys.stderr)
        return 2
    run_dir, zid, watch_pid, watch_start, idle_timeout, status_fd = argv
    # double fork, as a host's launcher: the spawner reaps the launcher at once, and the zygote
    # is nobody's child, in a session of its own
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    os.chdir("/")
    return serve_zygote(
        run_dir, zid, int(watch_pid), int(watch_start), float(idle_timeout), int(status_fd)
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
