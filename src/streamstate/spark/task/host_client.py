"""The task side of a state host: reach the host, stream one batch, shut hosts down.

Routing (:func:`run_batch`): the driver tells the task of subtask ``i`` where the subtask's
host was at the end of the previous batch (its :class:`~streamstate.spark.wire.messages.
HostLocation`: node id, TCP address, socket path, from the host's HELLO via the
acknowledgement). On that node the task uses the Unix socket; on another node it streams its
records to the host over TCP; if that host cannot be reached (node lost: connection refused or
timed out within ``connect_timeout``, or the handshake fails) it starts a host on its own node,
which reloads the base version from checkpoint storage. Routing never decides what state is
used: the host's version, lineage and attempt checks do
(:meth:`~streamstate.spark.subtask.SubtaskRuntime.prepare`).

Every connection first passes the HMAC handshake (:mod:`streamstate.spark.wire.security`) with
the query run's secret (or, outside a query run, the node's), within one deadline
(:data:`HANDSHAKE_TIMEOUT`); every frame after it is sealed
(:mod:`streamstate.spark.wire.channel`) and every message typed
(:mod:`streamstate.spark.wire.messages`).

Starting is race-free: a task connects to ``<id>.sock``; if nobody listens it takes the spawn
``flock`` (``<id>.spawn``), tries again (another task may have started the host meanwhile), and
only then starts the host (:mod:`streamstate.spark.task.spawn`).
"""

from __future__ import annotations

import fcntl
import itertools
import logging
import os
import socket
import time
from collections.abc import Iterable
from typing import Any

import msgspec

from streamstate.errors import StateHostError
from streamstate.spark.task.spawn import spawn
from streamstate.spark.wire.acks import TaskAck, TaskTimings
from streamstate.spark.wire.hosts import HostSpec, host_paths
from streamstate.spark.wire.messages import (
    Begun,
    Bye,
    Data,
    Done,
    End,
    Error,
    ErrorReport,
    Hello,
    HostHello,
    HostLocation,
    Ok,
    Ping,
    Pong,
    Shutdown,
)
from streamstate.spark.wire.network import split_address, tcp_tune
from streamstate.spark.wire.protocol import (
    CLIENT_RECEIVES,
    PROTOCOL_VERSION,
    Connection,
    ProtocolError,
)
from streamstate.spark.wire.security import (
    AuthError,
    client_handshake,
    node_id,
    node_secret,
    peer_uid,
)
from streamstate.spark.wire.step import Begin, StepTask

__all__ = [
    "PING_TIMEOUT",
    "FunctionFailed",
    "connect",
    "connect_tcp",
    "open_host",
    "ping",
    "run_batch",
    "shutdown",
    "shutdown_remote",
]

log = logging.getLogger(__name__)

#: seconds a handshake may take in all: a host runs handshakes concurrently with its batches,
#: so a live host answers within a round trip or two, busy or not
HANDSHAKE_TIMEOUT = 10.0
#: seconds to wait for the HELLO of a host on another node once authenticated: a host answers
#: HELLO whatever its batches do, but a process short of CPU (a reload can take tens of seconds
#: of it) may answer late; a node that vanished meanwhile is noticed by keepalive. (A host on
#: this node gets the I/O timeout.)
BUSY_TIMEOUT = 120.0


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
) -> tuple[Connection, HostHello]:
    """Handshake (within :data:`HANDSHAKE_TIMEOUT`) and HELLO (within ``hello_timeout``,
    default ``io_timeout``) on a connected socket (closed on failure)."""
    try:
        keys = client_handshake(sock, secret, spec_id, min(HANDSHAKE_TIMEOUT, io_timeout))
        sock.settimeout(hello_timeout or io_timeout)
        conn = Connection(sock, keys, CLIENT_RECEIVES, max_frame)
        conn.send(Hello(proto=PROTOCOL_VERSION))
        hello, _ = conn.recv()
        sock.settimeout(io_timeout)
    except BaseException:
        sock.close()
        raise
    if not isinstance(hello, HostHello):
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
) -> tuple[Connection, HostHello, float | None] | None:
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
) -> tuple[Connection, HostHello]:
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
    location: HostLocation | None = None,
    connect_timeout: float = 3.0,
    pythonpath: str | None = None,
    job: bytes | None = None,
) -> tuple[Connection, HostHello, float | None, str, str | None]:
    """The connection to the host of ``spec``: at ``location`` if that is another node and
    reachable (route ``tcp``), else on this node (``unix``; ``fallback`` if ``location`` could
    not be reached). Returns (connection, HELLO, spawn seconds, route, why it fell back)."""
    if secret is None:
        secret = node_secret(spec.run_dir)
    why = None
    if location is not None and location.tcp and location.node != node_id(spec.run_dir):
        try:
            conn, hello = connect_tcp(location.tcp, spec, secret, connect_timeout=connect_timeout)
            return conn, hello, None, "tcp", None
        except (OSError, EOFError, ProtocolError) as exc:
            why = f"{location.tcp}: {exc!r}"  # node lost, host gone: start one here
    got = connect(spec, pythonpath=pythonpath, secret=secret, job=job)
    assert got is not None
    conn, hello, spawned = got
    return conn, hello, spawned, "unix" if why is None else "fallback", why


class FunctionFailed(StateHostError):
    """The host reported a function error (:func:`~streamstate.spark.failures.
    is_function_error`): ``report`` describes it as plain data, for the driver to raise."""

    def __init__(self, message: str, report: ErrorReport) -> None:
        super().__init__(message)
        self.report = report


def _raise_remote(spec: HostSpec, msg: Any) -> None:
    """Raise what the host's answer ``msg`` (an ERROR, or a message out of place) says."""
    if not isinstance(msg, Error):
        raise ProtocolError(
            f"the state host of {spec.operator!r} subtask {spec.subtask} answered with "
            f"{type(msg).__name__}"
        )
    if msg.report is not None:
        raise FunctionFailed(
            f"the function of {spec.operator!r} subtask {spec.subtask} raised "
            f"{msg.report.type}: {msg.report.message}",
            msg.report,
        )
    raise StateHostError(
        f"the state host of {spec.operator!r} subtask {spec.subtask} failed: {msg.type}: "
        f"{msg.message}\n{msg.traceback}"
    )


def run_batch(
    spec: HostSpec,
    task: StepTask,
    attempt: int,
    batches: Iterable[Any],
    *,
    pythonpath: str | None = None,
    secret: bytes | None = None,
    location: HostLocation | None = None,
    connect_timeout: float = 3.0,
) -> TaskAck:
    """Stream one micro-batch of one subtask through its host.

    ``task`` is the step (sent in the BEGIN message with ``attempt``, the task attempt that
    runs it); ``batches`` the subtask's Arrow record batches; ``location`` where the driver
    last saw the subtask's host (see :func:`open_host`). Returns the subtask's
    acknowledgement: its ``BatchResult``, how the records got there (``route``, timings) and
    where its host is now. Raises :class:`FunctionFailed` if the function raised, and
    :class:`StateHostError` if the host reports another error or goes away (the host has then
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
    where = hello.location.tcp if route == "tcp" else host_paths(spec.id, spec.run_dir)["log"]
    try:
        it = (b for b in batches if b.num_rows)
        first = next(it, None)
        schema = None if first is None else bytes(first.schema.serialize())
        conn.send(Begin(task=task, subtask=spec.subtask, attempt=attempt, schema=schema))
        begun, _ = conn.recv()
        if not isinstance(begun, Begun):
            _raise_remote(spec, begun)
        t_begin = time.perf_counter()
        for batch in itertools.chain(() if first is None else (first,), it):
            conn.send(Data(), batch.serialize())
            reply, _ = conn.recv()
            if not isinstance(reply, Ok):
                _raise_remote(spec, reply)
        conn.send(End())
        done, _ = conn.recv()
        if not isinstance(done, Done):
            _raise_remote(spec, done)
        timings = TaskTimings(
            connect_ms=t_connect * 1e3,
            spawn_ms=None if spawned is None else spawned * 1e3,
            stream_ms=(time.perf_counter() - t_begin) * 1e3,
            route=route,
            fallback=why,
        )
        return TaskAck(
            subtask=spec.subtask, result=done.result, timings=timings, location=hello.location
        )
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


def _error_before_close(conn: Connection) -> Error | None:
    """The ERROR a host sent before closing the connection, if it is there to read: a host
    whose batch fails at its start (a timer the watermark fires raises) reports and closes
    while the task may still be sending (END, a DATA frame), which then breaks its pipe first."""
    try:
        conn.sock.settimeout(1.0)
        msg, _ = conn.recv()
    except (OSError, EOFError, ProtocolError):
        return None
    return msg if isinstance(msg, Error) else None


#: what a client of a host that is gone, busy past the timeout or not ours may raise
_UNREACHABLE = (StateHostError, EOFError, OSError, ProtocolError)


#: seconds :func:`ping` waits for a host (a host answers PING whatever its batches do)
PING_TIMEOUT = 5.0


def ping(spec: HostSpec, secret: bytes | None = None, timeout: float = PING_TIMEOUT) -> Pong | None:
    """The host's PONG, or None if it is not running or does not answer within ``timeout``
    seconds (or the spec's I/O timeout if shorter; it never raises for that)."""
    spec = msgspec.structs.replace(spec, io_timeout=min(timeout, spec.io_timeout))
    try:
        got = connect(spec, start=False, secret=secret)
    except _UNREACHABLE:
        return None
    if got is None:
        return None
    conn = got[0]
    try:
        conn.send(Ping())
        pong = conn.recv()[0]
    except (EOFError, OSError, ProtocolError):
        return None
    finally:
        conn.close()
    return pong if isinstance(pong, Pong) else None


def _bye(conn: Connection, reason: str, pid: int | None = None) -> bool:
    try:
        conn.send(Shutdown(reason=reason, pid=pid))
        reply, _ = conn.recv()
        return isinstance(reply, Bye) and not reply.ignored
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
