"""How a state host serves its authenticated connections: each on a thread of its own (at most
:data:`MAX_CONNECTIONS` at once), HELLO, PING and SHUTDOWN answered whatever a batch does, a BEGIN
run as the subtask's batch when its turn comes (:meth:`StateHost.take_batch
<streamstate.spark.host.state_host.StateHost.take_batch>`), and every refused frame logged and its
connection closed while the host goes on serving (:mod:`streamstate.spark.host.state_host`)."""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
import traceback
from typing import TYPE_CHECKING

import msgspec

from streamstate.errors import StateHostError
from streamstate.spark.host.acceptor import Acceptor, Ready, RefusalLog
from streamstate.spark.host.run_dir import SocketFile
from streamstate.spark.host.startup import log_line
from streamstate.spark.wire.messages import Bye, Error, Hello, Ping, Pong, Shutdown
from streamstate.spark.wire.protocol import (
    PROTOCOL_VERSION,
    Connection,
    MalformedMessage,
    ProtocolError,
)
from streamstate.spark.wire.step import Begin

if TYPE_CHECKING:
    from streamstate.spark.host.state_host import StateHost

__all__ = ["MAX_CONNECTIONS", "send_error", "serve_connections", "tag_of"]

#: authenticated connections served at once, each on a thread (their peers hold the run's
#: secret; beyond, the next waits for one to end)
MAX_CONNECTIONS = 64


def tag_of(message: msgspec.Struct) -> str:
    """The ``t`` of a message (``DATA``)."""
    return str(message.__struct_config__.tag)


def serve_connections(
    host: StateHost,
    acceptor: Acceptor,
    socket_file: SocketFile,
    refusals: RefusalLog,
    stop: dict[str, str | None],
) -> None:
    """Hand each authenticated connection to a thread of its own until a reason to stop comes
    (in ``stop``): a SHUTDOWN, a signal, or ``idle_timeout`` seconds without a connection."""
    slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
    while stop["why"] is None:
        if host.serving:
            left = host.spec.idle_timeout
        else:
            left = host.spec.idle_timeout - (time.monotonic() - host.last_use)
        if left <= 0:
            stop["why"] = "idle timeout"
            break
        try:
            _, _, ready = acceptor.ready.get(timeout=min(left, 0.5))
        except queue.Empty:
            continue
        while not slots.acquire(timeout=0.5):
            if stop["why"] is not None:
                ready.conn.close()
                return
        host.opened(ready.conn)
        threading.Thread(
            target=_serve_one,
            args=(host, ready, socket_file, refusals, stop, slots),
            name=f"streamstate-connection ({ready.peer})",
            daemon=True,
        ).start()


def _serve_one(
    host: StateHost,
    ready: Ready,
    socket_file: SocketFile,
    refusals: RefusalLog,
    stop: dict[str, str | None],
    slots: threading.BoundedSemaphore,
) -> None:
    """A connection's thread: serve it, close it, and pass on a reason to stop the host."""
    reason = None
    try:
        reason = _handle(host, ready.conn, socket_file, ready.peer, refusals)
    except Exception as exc:  # a connection's failure is never the host's
        log_line(f"connection ({ready.peer}) failed: {exc!r}")
    finally:
        ready.conn.close()
        host.closed(ready.conn)
        slots.release()
    if reason is not None and stop["why"] is None:
        stop["why"] = reason


def _handle(
    host: StateHost, conn: Connection, socket_file: SocketFile, peer: str, refusals: RefusalLog
) -> str | None:
    """Serve one authenticated connection; returns a reason to stop the host, or None."""
    while True:
        try:
            msg, _ = conn.recv()
        except MalformedMessage as exc:  # the frame verified: the client may hear why
            refusals(peer, "frame", exc)
            send_error(conn, exc)
            return None
        except ProtocolError as exc:
            refusals(peer, "frame", exc)
            return None
        except (EOFError, ConnectionError, TimeoutError, OSError):
            return None
        if isinstance(msg, Hello):
            if msg.proto != PROTOCOL_VERSION:
                refusals(peer, "client", f"protocol {msg.proto!r}")
                send_error(conn, ProtocolError(f"protocol {msg.proto!r} is not mine"))
                return None
            conn.send(host.hello())
        elif isinstance(msg, Ping):
            conn.send(Pong(version=host.version))
        elif isinstance(msg, Shutdown):
            if msg.pid is not None and msg.pid != os.getpid():
                # meant for an earlier host of this subtask at this address (a reused port)
                conn.send(Bye(ignored=True))
                return None
            socket_file.unlink()  # no new connection reaches a host that is going away
            conn.send(Bye())
            return "shutdown: " + msg.reason
        elif isinstance(msg, Begin):
            if not _serve_batch(host, conn, msg, peer, refusals):
                return None
        else:
            refusals(peer, "frame", f"unexpected message {tag_of(msg)} outside a batch")
            send_error(conn, ProtocolError(f"unexpected message {tag_of(msg)} outside a batch"))
            return None


def _serve_batch(
    host: StateHost, conn: Connection, begin: Begin, peer: str, refusals: RefusalLog
) -> bool:
    """Run one BEGIN's batch; False when the connection is done (refused, lost or failed)."""
    try:
        job = host.check_begin(begin)
    except ProtocolError as exc:
        refusals(peer, "frame", exc)
        send_error(conn, exc)
        return False
    batch = begin.task.batch
    if not host.take_batch(conn, peer, batch):
        spec = host.spec
        send_error(
            conn,
            StateHostError(
                f"the state host of {spec.operator!r} subtask {spec.subtask} is busy with "
                f"another batch of the subtask for more than {spec.io_timeout:g} s"
            ),
        )
        return False
    try:
        host.run_batch(conn, begin, job)
    except ProtocolError as exc:  # a frame inside the batch: the channel is not safe
        refusals(peer, "frame", f"in batch {batch}: {exc}")
        return False
    except (EOFError, ConnectionError, TimeoutError) as exc:
        log_line(f"batch {batch} aborted by the task ({exc!r})")
        return False
    except Exception as exc:
        log_line(f"batch {batch} failed: {exc!r}")
        spec = host.spec
        send_error(
            conn,
            exc,
            f"in the state host of {spec.operator!r} subtask {spec.subtask} (micro-batch {batch})",
        )
        return False
    finally:
        host.release_batch()
    return True


def send_error(conn: Connection, exc: BaseException, where: str = "") -> None:
    """Report ``exc`` to the client. A function error (:func:`~streamstate.spark.failures.
    is_function_error`) carries its ``report`` as plain data: the task hands it to the driver
    instead of failing (Spark does not retry a deterministic error)."""
    from streamstate.spark.failures import is_function_error, task_error_report

    error_report = task_error_report(exc, where) if where and is_function_error(exc) else None
    message = Error(
        type=type(exc).__name__,
        message=str(exc),
        traceback=traceback.format_exc(),
        report=error_report,
    )
    with contextlib.suppress(OSError, ProtocolError):
        conn.send(message)
