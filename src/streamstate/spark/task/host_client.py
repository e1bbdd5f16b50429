"""The task side of a state host: find or start the host, stream one batch, shut hosts down.

Routing (:func:`run_batch`): the driver tells the task of subtask ``i`` where the subtask's
host was at the end of the previous batch (its *location*: node id, TCP address, socket path,
from the host's HELLO via the acknowledgement). On that node the task uses the Unix socket;
on another node it streams its records to the host over TCP; if that host cannot be reached
(node lost: connection refused or timed out within ``connect_timeout``, or the handshake
fails) it starts a host on its own node, which reloads the base version from checkpoint
storage. Routing never decides what state is used: the host's version, lineage and attempt
checks do (:meth:`~streamstate.spark.subtask.SubtaskRuntime.prepare`).

Every connection first passes the HMAC handshake (:mod:`streamstate.spark.wire.security`) with the
query run's secret (or, outside a query run, the node's), within one deadline
(:data:`HANDSHAKE_TIMEOUT`); every frame after it is sealed (:mod:`streamstate.spark.wire.channel`).
A host started here is told the job it serves (:class:`~streamstate.spark.wire.hosts.JobPin`,
on its stdin with the secret).

Starting is race-free: a task connects to ``<id>.sock``; if nobody listens it takes the spawn
``flock`` (``<id>.spawn``), tries again (another task may have started the host meanwhile), and
only then spawns ``python -m streamstate.spark.host.state_host serve ...`` and waits for its
``READY`` line. A host that cannot start says why (``ERROR <reason>`` plus the tail of its log)
in a :class:`~streamstate.errors.StateHostError`, which fails the Spark task (and Spark retries
it).
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import logging
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
from streamstate.spark.wire.hosts import (
    ZYGOTE_SWITCH,
    ForkRequest,
    HostSpec,
    JobPin,
    host_paths,
    zygote_id,
)
from streamstate.spark.wire.network import split_address, tcp_tune
from streamstate.spark.wire.protocol import PROTOCOL_VERSION, Connection, ProtocolError
from streamstate.spark.wire.security import (
    AuthError,
    client_handshake,
    node_id,
    node_secret,
    peer_uid,
)
from streamstate.spark.wire.step import Begin, StepTask

__all__ = [
    "FunctionFailed",
    "connect",
    "connect_tcp",
    "find_jvm_pid",
    "log_tail",
    "ping",
    "run_batch",
    "shutdown",
    "shutdown_remote",
    "spawn",
]

log = logging.getLogger(__name__)

#: seconds a handshake may take in all: a host runs handshakes concurrently with its batches,
#: so a live host answers within a round trip or two, busy or not
HANDSHAKE_TIMEOUT = 10.0
#: seconds to wait for the HELLO of a host on another node once authenticated: it serves one
#: connection at a time, so one busy with another attempt of the same subtask (a reload can
#: take tens of seconds) answers only after it; a node that vanished meanwhile is noticed by
#: keepalive. (A host on this node gets the I/O timeout.)
BUSY_TIMEOUT = 120.0


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


def log_tail(path: str, limit: int = 3000) -> str:
    """The last ``limit`` bytes of a log file as text (empty if it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def spawn(
    spec: HostSpec,
    timeout: float = 120.0,
    pythonpath: str | None = None,
    secret: bytes | None = None,
    job: bytes | None = None,
) -> float:
    """Start the host of ``spec`` and wait until it is ready; returns the seconds it took.

    ``pythonpath`` is put first on the host's PYTHONPATH (default: the directory this
    ``streamstate`` was imported from). ``secret`` (default: the node's) and the pin of
    ``job`` (an encoded :class:`~streamstate.spark.job.JobSpec`: the only job the host will
    serve; None: it serves no batch) reach the host on its stdin."""
    from streamstate.spark.job import JobSpec, src_path

    paths = host_paths(spec.id, spec.run_dir)
    env = dict(os.environ)
    # the host imports the same streamstate as this process (a source checkout included)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (pythonpath or src_path(), env.get("PYTHONPATH", "")) if p
    )
    secret = secret or node_secret(spec.run_dir)
    pin = b""
    if job is not None:
        pin = msgspec.json.encode(JobPin.of(msgspec.msgpack.decode(job, type=JobSpec)))
    read_fd, write_fd = os.pipe()
    t0 = time.perf_counter()
    try:
        if not _fork_from_zygote(spec, env, write_fd, secret, pin, timeout):
            _launch(spec, env, write_fd, secret, pin)
    finally:
        os.close(write_fd)
    line = _read_status(read_fd, timeout)
    if line is None:
        raise StateHostError(
            f"the state host of {spec.operator!r} subtask {spec.subtask} did not start "
            f"within {timeout:.0f} s; see {paths['log']}"
        )
    if line != "READY":
        raise StateHostError(
            f"the state host of {spec.operator!r} subtask {spec.subtask} (job {spec.job}) failed "
            f"to start: {line or 'it exited without a status'}\n--- {paths['log']} (tail) ---\n"
            f"{log_tail(paths['log'])}"
        )
    return time.perf_counter() - t0


def _launch(spec: HostSpec, env: dict[str, str], status_fd: int, secret: bytes, pin: bytes) -> None:
    """Start the host as a new interpreter (it double-forks; its status comes on
    ``status_fd``); the secret and the pin go on its stdin."""
    launcher = _start_detached(
        "streamstate.spark.host.state_host",
        ["serve", json.dumps(msgspec.to_builtins(spec)), str(status_fd)],
        host_paths(spec.id, spec.run_dir)["log"],
        status_fd,
        env,
        stdin=secret.hex().encode() + b"\n" + pin + b"\n",
    )
    launcher.wait()  # it exits right after forking the host


def _start_detached(
    module: str,
    args: list[str],
    log_path: str,
    status_fd: int,
    env: dict[str, str],
    stdin: bytes | None = None,
) -> subprocess.Popen[bytes]:
    """``python -m module args...`` in a session of its own, in ``/``, its output appended to
    ``log_path``, the pipe ``status_fd`` its only inherited descriptor, ``stdin`` written to it
    (None: no stdin)."""
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=log_file,
            stderr=log_file,
            pass_fds=(status_fd,),
            close_fds=True,
            start_new_session=True,
            cwd="/",
            env=env,
        )
    if proc.stdin is not None:
        try:
            proc.stdin.write(stdin or b"")
            proc.stdin.close()
        except BrokenPipeError:
            pass  # it died at once: the status pipe says why
    return proc


def _read_status(read_fd: int, timeout: float) -> str | None:
    """The status line a starting process writes on the pipe ``read_fd`` (closed here): READY,
    ERROR <reason>, or empty if it exited without one; None if none came within ``timeout``."""
    selector = selectors.DefaultSelector()
    selector.register(read_fd, selectors.EVENT_READ)
    msg = b""
    deadline = time.monotonic() + timeout
    try:
        while not msg.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                return None
            chunk = os.read(read_fd, 4096)
            if not chunk:
                break
            msg += chunk
    finally:
        selector.close()
        os.close(read_fd)
    return msg.decode(errors="replace").strip()


# ---- the host zygote (streamstate.spark.host.zygote) -------------------------------------------


def _fork_from_zygote(
    spec: HostSpec, env: dict[str, str], status_fd: int, secret: bytes, pin: bytes, timeout: float
) -> bool:
    """Have the host zygote of this node, JVM and interpreter fork the host of ``spec``
    (starting the zygote if there is none); False if it cannot, or the spec does not ask for it,
    and the host is started as a new interpreter. Only hosts that watch a JVM: the zygote lives
    no longer than that JVM."""
    if (
        not spec.zygote
        or spec.watch_pid is None
        or spec.watch_start is None
        or os.environ.get(ZYGOTE_SWITCH) == "0"
    ):
        return False
    zid = zygote_id(env, spec.watch_pid, spec.watch_start)
    request = msgspec.msgpack.encode(
        ForkRequest(
            spec=spec,
            secret=secret,
            pin=pin,
            env=env,
        )
    )
    log_path = host_paths(spec.id, spec.run_dir)["log"]
    if _request_fork(spec.run_dir, zid, request, status_fd, log_path):
        return True
    return _start_zygote(spec, env, zid, min(timeout, 60.0)) and _request_fork(
        spec.run_dir, zid, request, status_fd, log_path
    )


def _request_fork(run_dir: str, zid: str, request: bytes, status_fd: int, log_path: str) -> bool:
    """Send the zygote ``zid`` the request; False if it could not be sent (no zygote) or the
    zygote refused it, and the spawner starts the host itself. Once the zygote took it, the
    status pipe decides, never a second host (a zygote that died before forking closed its copy
    of the pipe, and the spawner reads that the host exited without a status)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10.0)
    try:
        sock.connect(host_paths(zid, run_dir)["sock"])
        if peer_uid(sock) != os.getuid():
            return False
        with open(log_path, "ab") as log_file:
            socket.send_fds(sock, [len(request).to_bytes(4, "big")], [status_fd, log_file.fileno()])
        sock.sendall(request)
        reply = b""
        with contextlib.suppress(OSError):
            while not reply.endswith(b"\n"):
                chunk = sock.recv(256)
                if not chunk:
                    break
                reply += chunk
        if reply.startswith(b"REFUSED"):
            log.warning("the state-host zygote %s refused a host: %s", zid, reply.decode().strip())
            return False
        return True
    except OSError:
        return False
    finally:
        sock.close()


def _start_zygote(spec: HostSpec, env: dict[str, str], zid: str, timeout: float) -> bool:
    """Start the zygote ``zid`` unless one runs (or another spawner started it meanwhile);
    True once it is READY."""
    paths = host_paths(zid, spec.run_dir)
    with open(paths["spawn"], "a") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # a spawner starting it holds this
        if _lock_held(paths["lock"]):
            return True  # a zygote runs
        read_fd, write_fd = os.pipe()
        try:
            launcher = _start_detached(
                "streamstate.spark.host.zygote",
                [
                    spec.run_dir,
                    zid,
                    str(spec.watch_pid),
                    str(spec.watch_start),
                    str(spec.idle_timeout),
                    str(write_fd),
                ],
                paths["log"],
                write_fd,
                env,
            )
        finally:
            os.close(write_fd)
        launcher.wait()  # it exits right after forking the zygote
        status = _read_status(read_fd, timeout)
        if status != "READY":
            log.warning(
                "the state-host zygote %s did not start (%s; see %s): hosts start as new "
                "interpreters",
                zid,
                f"no answer within {timeout:.0f} s" if status is None else status or "no status",
                paths["log"],
            )
        return status == "READY"


def _lock_held(path: str) -> bool:
    """True if a live process holds the ``flock`` of ``path``."""
    try:
        f = open(path, "a")  # noqa: SIM115 - closed below
    except OSError:
        return False
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def _try_connect(path: str, io_timeout: float) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    uid = peer_uid(sock)
    if uid != os.getuid():
        sock.close()
        raise StateHostError(
            f"{path} is served by uid {uid}, not by this user (uid {os.getuid()}): refusing it"
        )
    sock.settimeout(io_timeout)
    return sock


def _open(
    sock: socket.socket,
    spec_id: str,
    secret: bytes,
    io_timeout: float,
    max_frame: int,
    hello_timeout: float | None = None,
) -> tuple[Connection, dict[str, Any]]:
    """Handshake (within :data:`HANDSHAKE_TIMEOUT`) and HELLO (within ``hello_timeout``,
    default ``io_timeout``) on a connected socket (closed on failure)."""
    try:
        keys = client_handshake(sock, secret, spec_id, min(HANDSHAKE_TIMEOUT, io_timeout))
        sock.settimeout(hello_timeout or io_timeout)
        conn = Connection(sock, keys, max_frame)
        conn.send({"t": "HELLO", "proto": PROTOCOL_VERSION})
        hello, _ = conn.recv()
        sock.settimeout(io_timeout)
    except BaseException:
        sock.close()
        raise
    if hello.get("t") != "HELLO":
        sock.close()
        raise ProtocolError(f"the state host {spec_id} answered HELLO with {hello!r}")
    return conn, hello


def connect(
    spec: HostSpec,
    *,
    start: bool = True,
    pythonpath: str | None = None,
    secret: bytes | None = None,
    job: bytes | None = None,
) -> tuple[Connection, dict[str, Any], float | None] | None:
    """Connect to the host of ``spec`` on this node (starting it if ``start``); returns the
    connection, the host's HELLO and the spawn time (None if it was running), or None if it is
    not running and ``start`` is False. ``secret``: the query run's (default: the node's);
    ``job``: the encoded ``JobSpec`` a host started here serves (:func:`spawn`)."""
    paths = host_paths(spec.id, spec.run_dir)
    if secret is None:
        secret = node_secret(spec.run_dir)
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
                    spawned = spawn(spec, pythonpath=pythonpath, secret=secret, job=job)
                    sock = _try_connect(paths["sock"], spec.io_timeout)
                    if sock is None:
                        raise StateHostError(
                            f"the state host {spec.id} reported READY but {paths['sock']} "
                            "refuses connections"
                        )
        try:
            conn, hello = _open(sock, spec.id, secret, spec.io_timeout, spec.max_frame)
            return conn, hello, spawned
        except AuthError as exc:
            raise StateHostError(
                f"the state host {spec.id} ({paths['sock']}) refused this client: {exc}; see "
                f"{paths['log']}"
            ) from exc
        except (EOFError, ConnectionError, ProtocolError):
            time.sleep(0.02)  # accepted by a host that was shutting down: try again
    raise StateHostError(f"could not reach the state host {spec.id} ({paths['sock']})")


def connect_tcp(
    address: str,
    spec: HostSpec,
    secret: bytes,
    *,
    connect_timeout: float = 3.0,
) -> tuple[Connection, dict[str, Any]]:
    """Connect to the host of ``spec`` at ``address`` (``host:port``) on another node; raises
    ``OSError`` (refused, timed out, :class:`~streamstate.spark.wire.security.AuthError`) or
    :class:`~streamstate.spark.wire.protocol.ProtocolError` if it cannot be used."""
    sock = socket.create_connection(split_address(address), timeout=connect_timeout)
    tcp_tune(sock)
    return _open(
        sock,
        spec.id,
        secret,
        spec.io_timeout,
        spec.max_frame,
        min(spec.io_timeout, max(connect_timeout, BUSY_TIMEOUT)),
    )


def open_host(
    spec: HostSpec,
    *,
    secret: bytes | None = None,
    location: dict[str, Any] | None = None,
    connect_timeout: float = 3.0,
    pythonpath: str | None = None,
    job: bytes | None = None,
) -> tuple[Connection, dict[str, Any], float | None, str, str | None]:
    """The connection to the host of ``spec``: at ``location`` if that is another node and
    reachable (route ``tcp``), else on this node (``unix``; ``fallback`` if ``location`` could
    not be reached). Returns (connection, HELLO, spawn seconds, route, why it fell back)."""
    if secret is None:
        secret = node_secret(spec.run_dir)
    why = None
    if location and location.get("tcp") and location.get("node") != node_id(spec.run_dir):
        try:
            conn, hello = connect_tcp(
                location["tcp"], spec, secret, connect_timeout=connect_timeout
            )
            return conn, hello, None, "tcp", None
        except (OSError, EOFError, ProtocolError) as exc:
            why = f"{location['tcp']}: {exc!r}"  # node lost, host gone: start one here
    got = connect(spec, pythonpath=pythonpath, secret=secret, job=job)
    assert got is not None
    conn, hello, spawned = got
    return conn, hello, spawned, "unix" if why is None else "fallback", why


class FunctionFailed(StateHostError):
    """The host reported a function error (:func:`~streamstate.spark.failures.
    is_function_error`): ``report`` describes it as plain data, for the driver to raise."""

    def __init__(self, message: str, report: dict[str, Any]) -> None:
        super().__init__(message)
        self.report = report


def _raise_remote(spec: HostSpec, msg: dict[str, Any]) -> None:
    report = msg.get("report")
    if isinstance(report, dict):
        raise FunctionFailed(
            f"the function of {spec.operator!r} subtask {spec.subtask} raised "
            f"{report.get('type')}: {report.get('message')}",
            report,
        )
    raise StateHostError(
        f"the state host of {spec.operator!r} subtask {spec.subtask} failed: {msg.get('type')}: "
        f"{msg.get('message')}\n{msg.get('traceback', '')}"
    )


def location_of(hello: dict[str, Any]) -> dict[str, Any]:
    """Where a host lives, from its HELLO (what the acknowledgement carries to the driver)."""
    return {k: hello.get(k) for k in ("id", "node", "tcp", "unix", "pid")}


def run_batch(
    spec: HostSpec,
    task: StepTask,
    attempt: int,
    batches: Iterable[Any],
    *,
    pythonpath: str | None = None,
    secret: bytes | None = None,
    location: dict[str, Any] | None = None,
    connect_timeout: float = 3.0,
) -> tuple[bytes, dict[str, Any]]:
    """Stream one micro-batch of one subtask through its host.

    ``task`` is the step (sent in the BEGIN message with ``attempt``, the task attempt that
    runs it); ``batches`` the subtask's Arrow record batches;
    ``location`` where the driver last saw the subtask's host (see :func:`open_host`). Returns
    the encoded ``BatchResult`` and timings (with ``route`` and the host's ``location``).
    Raises :class:`StateHostError` if the host reports an error or goes away (the host has then
    dropped the batch's changes).
    """
    t0 = time.perf_counter()
    conn, hello, spawned, route, why = open_host(
        spec,
        secret=secret,
        location=location,
        connect_timeout=connect_timeout,
        pythonpath=pythonpath,
        job=task.job,
    )
    t_connect = time.perf_counter() - t0
    where = hello.get("tcp") if route == "tcp" else host_paths(spec.id, spec.run_dir)["log"]
    try:
        it = (b for b in batches if b.num_rows)
        first = next(it, None)
        schema = None if first is None else bytes(first.schema.serialize())
        conn.send(Begin(task=task, subtask=spec.subtask, attempt=attempt, schema=schema))
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
            "route": route,
            "location": location_of(hello),
        }
        if why is not None:
            timings["fallback"] = why
        return bytes(done["result"]), timings
    except (EOFError, ConnectionError, TimeoutError, ProtocolError) as exc:
        error = _error_before_close(conn) if isinstance(exc, ConnectionError) else None
        if error is not None:
            _raise_remote(spec, error)
        raise StateHostError(
            f"lost the state host of {spec.operator!r} subtask {spec.subtask} over {route} "
            f"({exc!r}); see {where}"
        ) from exc
    finally:
        conn.close()


def _error_before_close(conn: Connection) -> dict[str, Any] | None:
    """The ERROR a host sent before closing the connection, if it is there to read: a host
    whose batch fails at its start (a timer the watermark fires raises) reports and closes
    while the task may still be sending (END, a DATA frame), which then breaks its pipe first."""
    try:
        conn.sock.settimeout(1.0)
        msg, _ = conn.recv()
    except (OSError, EOFError, ProtocolError):
        return None
    return msg if msg.get("t") == "ERROR" else None


#: what a client of a host that is gone, busy past the timeout or not ours may raise
_UNREACHABLE = (StateHostError, EOFError, OSError, ProtocolError)


def ping(spec: HostSpec, secret: bytes | None = None) -> dict[str, Any] | None:
    """The host's PONG, or None if it is not running or does not answer within the spec's
    I/O timeout (it never raises for that)."""
    try:
        got = connect(spec, start=False, secret=secret)
    except _UNREACHABLE:
        return None
    if got is None:
        return None
    conn = got[0]
    try:
        conn.send({"t": "PING"})
        return conn.recv()[0]
    except (EOFError, OSError, ProtocolError):
        return None
    finally:
        conn.close()


def _bye(conn: Connection, reason: str, pid: int | None = None) -> bool:
    try:
        conn.send({"t": "SHUTDOWN", "reason": reason, "pid": pid})
        reply, _ = conn.recv()
        return not reply.get("ignored")
    except (EOFError, OSError, ProtocolError):
        return False
    finally:
        conn.close()


def shutdown(
    spec: HostSpec, reason: str = "", secret: bytes | None = None, timeout: float = 10.0
) -> bool:
    """Ask the host of ``spec`` on this node to exit; False if it was not running or did not
    answer within ``timeout`` seconds (it never raises for that: a caller stopping many hosts
    goes on with the next)."""
    try:
        got = connect(msgspec.structs.replace(spec, io_timeout=timeout), start=False, secret=secret)
    except _UNREACHABLE:
        return False
    return False if got is None else _bye(got[0], reason)


def shutdown_remote(
    address: str,
    spec: HostSpec,
    secret: bytes,
    reason: str = "",
    timeout: float = 3.0,
    pid: int | None = None,
) -> bool:
    """Ask the host of ``spec`` listening at ``address`` (on any node) to exit; with ``pid``,
    only if it is still that process."""
    try:
        conn, _ = connect_tcp(
            address, msgspec.structs.replace(spec, io_timeout=10.0), secret, connect_timeout=timeout
        )
    except _UNREACHABLE:
        return False
    return _bye(conn, reason, pid)
