"""A state host's front door: it accepts connections and runs their handshakes concurrently, so
that peers who do not hold the secret never delay a batch.

One thread (:class:`Acceptor`) owns the listening sockets and every connection that has not
finished its handshake, all non-blocking in one selector. Each pending handshake has one overall
deadline from its accept (not one per read: a peer trickling a byte at a time gets no longer).

Caps, for a flood: at most ``max_pending`` handshakes are pending in all, and at most
``max_per_address`` of those that have sent part of an answer per source address (a Unix-socket
peer counts as the address ``unix``). A new connection beyond ``max_pending`` closes the pending
handshake that is oldest among those that have sent nothing, wherever it comes from (each is
read first, oldest first: an answer that arrived but was not read yet completes its handshake
instead); only if every one has sent bytes, the oldest. A real client answers the challenge at
once, in one piece, so it is never the one closed unless ``max_pending`` connections arrive
before its answer does, even in a flood from its own address. A peer that has sent part of an
answer beyond ``max_per_address`` of its address closes that address's oldest such one: a
trickling flood from one address cannot fill the table either. The connections closed are
logged as refusals.

The Unix socket is served first: its events are handled before TCP's, and its authenticated
connections go ahead of TCP ones in the ready queue that the host's main thread takes them from
(:mod:`streamstate.spark.host.state_host`).

Refusals go through :class:`RefusalLog`: one line each, with the peer's address, cut at
:data:`MAX_LINE` characters, at most ``limit`` lines per ``window`` seconds and then one line
saying how many were not logged. A refusal does not count as use of the host (its idle timer
runs on).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from streamstate.spark.wire.network import tcp_tune
from streamstate.spark.wire.protocol import HOST_RECEIVES, Connection
from streamstate.spark.wire.security import REPLY_BYTES, AuthError, ServerHandshake, peer_uid

__all__ = ["MAX_LINE", "Acceptor", "Ready", "RefusalLog"]

#: longest refusal line logged (a peer chooses part of the text)
MAX_LINE = 300
#: which pending handshake the cap drops (by whether one had sent nothing)
_WHICH = {True: "the oldest that sent nothing", False: "the oldest (every one sent bytes)"}


class RefusalLog:
    """Refusal lines with a rate limit (thread-safe)."""

    def __init__(self, log: Callable[[str], None], limit: int = 20, window: float = 10.0) -> None:
        self._log = log
        self.limit = limit
        self.window = window
        self._lock = threading.Lock()
        self._start = time.monotonic()
        self._count = 0
        self._suppressed = 0
        #: refusals since the host started (logged or not)
        self.total = 0

    def __call__(self, peer: str, what: str, reason: object) -> None:
        line = f"refused {what} ({peer}): {reason}"
        if len(line) > MAX_LINE:
            line = line[: MAX_LINE - 3] + "..."
        with self._lock:
            self.total += 1
            self._roll(time.monotonic())
            if self._count < self.limit:
                self._count += 1
                self._log(line)
            else:
                self._suppressed += 1

    def tick(self, *, final: bool = False) -> None:
        """Close the window if it is over, or now if ``final`` (the host exits): says how many
        refusals were not logged."""
        with self._lock:
            self._roll(time.monotonic(), final)

    def _roll(self, now: float, final: bool = False) -> None:
        if now - self._start < self.window and not final:
            return
        if self._suppressed:
            self._log(
                f"{self._suppressed} more refusals not logged (limit {self.limit} per "
                f"{self.window:.0f} s)"
            )
        self._start, self._count, self._suppressed = now, 0, 0


class Ready:
    """An authenticated connection waiting for the host's main thread."""

    __slots__ = ("conn", "kind", "peer")

    def __init__(self, conn: Connection, kind: str, peer: str) -> None:
        self.conn = conn
        self.kind = kind
        self.peer = peer


class _Pending:
    __slots__ = ("address", "buf", "deadline", "handshake", "kind", "peer", "sock")

    def __init__(
        self, sock: socket.socket, kind: str, peer: str, address: str, deadline: float, hs: Any
    ) -> None:
        self.sock = sock
        self.kind = kind
        self.peer = peer
        self.address = address
        self.deadline = deadline
        self.handshake = hs
        self.buf = bytearray()


class Acceptor:
    """Accepts on ``listeners`` (``(socket, "unix" | "tcp")``), runs each connection's
    handshake with ``secret`` for host ``host_id`` within ``deadline`` seconds, and puts each
    authenticated connection (blocking, ``io_timeout``, body limit ``max_frame``, frame
    deadline ``frame_timeout``) into :attr:`ready`: a priority queue of ``(priority,
    sequence, Ready)``, Unix first."""

    def __init__(
        self,
        listeners: list[tuple[socket.socket, str]],
        secret: bytes,
        host_id: str,
        refusals: RefusalLog,
        *,
        deadline: float = 5.0,
        max_pending: int = 256,
        max_per_address: int = 16,
        io_timeout: float = 600.0,
        max_frame: int = 1 << 30,
        frame_timeout: float | None = None,
    ) -> None:
        self.secret = secret
        self.host_id = host_id
        self.refusals = refusals
        self.deadline = deadline
        self.max_pending = max_pending
        self.max_per_address = max_per_address
        self.io_timeout = io_timeout
        self.max_frame = max_frame
        self.frame_timeout = frame_timeout
        self.ready: queue.PriorityQueue[tuple[int, int, Ready]] = queue.PriorityQueue()
        self._seq = itertools.count()
        self._selector = selectors.DefaultSelector()
        for listener, kind in listeners:
            listener.setblocking(False)
            self._selector.register(listener, selectors.EVENT_READ, kind)
        #: every pending handshake, oldest first
        self._pending: dict[socket.socket, _Pending] = {}
        #: source address -> its pending handshakes that have sent bytes, oldest first
        self._talking: dict[str, collections.deque[_Pending]] = {}
        self._uid = os.getuid()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def run(self, stop: threading.Event) -> None:
        """The thread's loop, until ``stop`` is set; then every pending handshake is closed."""
        try:
            while not stop.is_set():
                timeout = 0.5
                if self._pending:
                    first = min(p.deadline for p in self._pending.values())
                    timeout = max(0.0, min(timeout, first - time.monotonic()))
                events = self._selector.select(timeout)
                # the Unix socket first, and answers before new connections: an answer that
                # arrived is read before a burst of connections could make room by closing it
                events.sort(
                    key=lambda e: (self._kind_of(e[0].data) != "unix", isinstance(e[0].data, str))
                )
                for key, _ in events:
                    if isinstance(key.data, str):
                        self._accept(key.fileobj, key.data)  # type: ignore[arg-type]
                    elif key.data.sock in self._pending:
                        self._advance(key.data)
                self._expire(time.monotonic())
                self.refusals.tick()
        finally:
            for p in list(self._pending.values()):
                self._drop(p)
            self._selector.close()

    @staticmethod
    def _kind_of(data: Any) -> str:
        return data if isinstance(data, str) else str(data.kind)

    # ---- one connection ---------------------------------------------------------------------

    def _accept(self, listener: socket.socket, kind: str) -> None:
        for _ in range(64):  # drain the backlog, a bounded amount per turn
            try:
                sock, addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors, a connection reset before accept
                return
            if kind == "unix":
                peer, address = "unix", "unix"
            else:
                peer, address = f"tcp {addr[0]}:{addr[1]}", f"tcp {addr[0]}"
            try:
                if kind == "unix":
                    uid = peer_uid(sock)
                    peer = f"unix uid {uid}"
                    if uid != self._uid:
                        raise AuthError(f"peer uid {uid} is not the host's uid {self._uid}")
                else:
                    tcp_tune(sock)
                sock.setblocking(False)
                hs = ServerHandshake(self.secret, self.host_id)
                challenge = hs.challenge()
                if sock.send(challenge) != len(challenge):
                    raise AuthError("the challenge did not fit the socket buffer")
            except (AuthError, OSError) as exc:
                self.refusals(peer, "connection", exc)
                sock.close()
                continue
            self._make_room()
            p = _Pending(sock, kind, peer, address, time.monotonic() + self.deadline, hs)
            self._pending[sock] = p
            self._selector.register(sock, selectors.EVENT_READ, p)

    def _make_room(self) -> None:
        """Close a pending handshake if ``max_pending`` are: the oldest that has sent nothing
        (:meth:`_victim`)."""
        if len(self._pending) < self.max_pending:
            return
        victim, silent = self._victim(list(self._pending.values()))
        if victim is not None and len(self._pending) >= self.max_pending:
            self._refuse(
                victim,
                f"{len(self._pending)} handshakes pending, the most allowed; "
                f"{_WHICH[silent]} is dropped",
            )

    def _victim(self, candidates: list[_Pending]) -> tuple[_Pending | None, bool]:
        """The handshake to drop among ``candidates`` (oldest first), and whether it has sent
        nothing: the oldest that has sent nothing, else the oldest. Each is read first, up to
        the first that has sent nothing: a client whose answer arrived but was not read yet
        completes its handshake instead of being dropped (a real client answers at once, so
        only the newest silent peers can be real ones)."""
        for p in candidates:
            if p.sock not in self._pending:
                continue
            if not p.buf:
                self._advance(p)
            if p.sock in self._pending and not p.buf:
                return p, True
        left = [p for p in candidates if p.sock in self._pending]
        return (left[0] if left else None), False

    def _advance(self, p: _Pending) -> None:
        try:
            chunk = p.sock.recv(REPLY_BYTES - len(p.buf))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._refuse(p, exc)
            return
        if not chunk:
            if p.buf:
                self._refuse(
                    p, f"truncated the client's handshake: {len(p.buf)} of {REPLY_BYTES} bytes"
                )
            else:
                self._refuse(p, "the client closed the connection without a handshake")
            return
        first = not p.buf
        p.buf += chunk
        try:
            ServerHandshake.check_prefix(bytes(p.buf))
            if len(p.buf) < REPLY_BYTES:
                if first:
                    self._talks(p)
                return
            proof, keys = p.handshake.verify(bytes(p.buf))
        except AuthError as exc:
            self._refuse(p, exc)
            return
        self._forget(p)
        try:
            p.sock.setblocking(True)
            p.sock.settimeout(self.io_timeout)
            p.sock.sendall(proof)
        except OSError as exc:
            self.refusals(p.peer, "connection", exc)
            p.sock.close()
            return
        conn = Connection(p.sock, keys, HOST_RECEIVES, self.max_frame, self.frame_timeout)
        ready = Ready(conn, p.kind, p.peer)
        self.ready.put((0 if p.kind == "unix" else 1, next(self._seq), ready))

    def _talks(self, p: _Pending) -> None:
        """``p`` has sent part of an answer: beyond ``max_per_address`` such handshakes of its
        address, the oldest is closed."""
        same = self._talking.setdefault(p.address, collections.deque())
        same.append(p)
        if len(same) > self.max_per_address:
            self._refuse(
                same[0],
                f"{len(same) - 1} handshakes with part of an answer pending from {p.address}, "
                "the most allowed; the oldest is dropped",
            )

    def _expire(self, now: float) -> None:
        for p in [p for p in self._pending.values() if p.deadline <= now]:
            self._refuse(
                p,
                f"no complete handshake within {self.deadline:g} s ({len(p.buf)} of "
                f"{REPLY_BYTES} bytes)",
            )

    # ---- bookkeeping ------------------------------------------------------------------------

    def _forget(self, p: _Pending) -> None:
        self._pending.pop(p.sock, None)
        same = self._talking.get(p.address)
        if same is not None and p.buf:
            with contextlib.suppress(ValueError):
                same.remove(p)
            if not same:
                del self._talking[p.address]
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(p.sock)

    def _drop(self, p: _Pending) -> None:
        self._forget(p)
        p.sock.close()

    def _refuse(self, p: _Pending, reason: object) -> None:
        self.refusals(p.peer, "connection", reason)  # logged first: the close tells the peer
        self._drop(p)
