"""Sealed frames: every byte a state host and its client exchange after the handshake is
encrypted and authenticated (AES-256-GCM), in order.

A connection's two keys come from its handshake (:func:`~streamstate.spark.wire.security.
session_keys`: the run secret, both nonces, the host id), one per direction. Each direction
numbers its records from 0; a record's GCM nonce is its number, so the receiver, which expects
the next number, refuses a record that was replayed, reordered, dropped before it, injected or
changed: its tag does not verify. A record::

    <u32 LE n>  AES-256-GCM(key, nonce = 0^4 || u64 BE record number, aad = the 4 length bytes)
                of n - 16 plaintext bytes, followed by the 16-byte tag

A message (:mod:`streamstate.spark.wire.protocol`) is one *head* record whose plaintext is
``<u32 LE body length><header bytes>``, then the body in records of at most :data:`CHUNK`
plaintext bytes. The receiver checks every length before it reads the bytes: a head record is
at most the header limit, a body record at most :data:`CHUNK`, the body at most the
connection's body limit, and the body's buffer grows with the bytes that arrive and verify
(an authenticated peer announcing a 1 GiB body and sending nothing costs no 1 GiB).

Deadline: a side may give its channel a ``frame_timeout`` (a state host does: the host's
``frame_timeout``). A message, once its first byte arrived, must then arrive whole within it,
and a message it sends must be taken by the peer within it; past it the message is refused as a
:class:`FrameError` (a peer that stops in the middle of a frame, or trickles it, holds the
receiving thread for that long and no longer). The wait for a message's first byte stays the
socket's own timeout: between two messages a task may be computing its next records.

Cost: the body is encrypted from the Arrow buffer into one reusable record buffer and
decrypted straight into the message's buffer (``encrypt_into``/``decrypt_into``): no copy beyond
the cipher's own output. AES-GCM runs at GB/s with AES-NI (``bench/host_transport.py``).
"""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

from streamstate.spark.wire.security import SessionKeys

__all__ = ["CHUNK", "TAG", "FrameError", "SecureChannel"]

#: largest plaintext of one body record
CHUNK = 256 * 1024
#: bytes of a GCM tag
TAG = 16
_LEN = struct.Struct("<I")
_BODY_LEN = struct.Struct("<I")
_NONCE_PAD = bytes(4)
#: the first allocation for a body; it doubles as verified bytes arrive
_FIRST_BODY_ALLOCATION = 1 << 20


class FrameError(ConnectionError):
    """A sealed frame did not verify or broke the framing rules: the connection is unusable."""


def _nonce(seq: int) -> bytes:
    return _NONCE_PAD + seq.to_bytes(8, "big")


class SecureChannel:
    """Sealed records over a connected socket, with one key and one record counter per
    direction (not thread-safe: one sender and one receiver at a time)."""

    __slots__ = (
        "_deadline",
        "_open",
        "_recv_seq",
        "_seal",
        "_send_buf",
        "_send_seq",
        "_slot",
        "frame_timeout",
        "sock",
    )

    def __init__(
        self, sock: socket.socket, keys: SessionKeys, frame_timeout: float | None = None
    ) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self.sock = sock
        #: seconds a message has from its first byte (None: only the socket's timeout)
        self.frame_timeout = frame_timeout
        self._deadline: float | None = None
        self._seal = AESGCM(keys.send)
        self._open = AESGCM(keys.recv)
        self._send_seq = 0
        self._recv_seq = 0
        #: one record being sent: length prefix, ciphertext, tag
        self._send_buf = bytearray(_LEN.size + CHUNK + TAG)
        #: one body record being received (ciphertext and tag)
        self._slot = bytearray(CHUNK + TAG)

    # ---- sending --------------------------------------------------------------------------------

    def _send_record(self, plain: Any) -> None:
        """Seal ``plain`` (a contiguous unsigned-byte buffer of at most :data:`CHUNK` bytes or
        a head) and send it."""
        n = len(plain) + TAG
        buf = self._send_buf
        if _LEN.size + n > len(buf):
            buf = bytearray(_LEN.size + n)  # a head larger than a chunk (rare: BEGIN)
        _LEN.pack_into(buf, 0, n)
        view = memoryview(buf)
        self._seal.encrypt_into(
            _nonce(self._send_seq), plain, view[: _LEN.size], view[_LEN.size : _LEN.size + n]
        )
        self._send_seq += 1
        self.sock.sendall(view[: _LEN.size + n])

    def send(self, head: bytes, body: Any = None) -> None:
        """Send one message: ``head`` (the encoded header), then ``body`` (any buffer: bytes,
        a pyarrow ``Buffer``; None for none) in sealed chunks."""
        size = 0 if body is None else memoryview(body).nbytes
        timeout = None
        if self.frame_timeout is not None:
            timeout = self.sock.gettimeout()
            self.sock.settimeout(self.frame_timeout)
        try:
            self._send_record(_BODY_LEN.pack(size) + head)
            if size:
                view = memoryview(body).cast("B")
                for start in range(0, size, CHUNK):
                    self._send_record(view[start : start + CHUNK])
        except TimeoutError:
            if self.frame_timeout is None:
                raise
            raise FrameError(
                f"the peer did not take a message within {self.frame_timeout:g} s (the frame "
                "deadline): dropped"
            ) from None
        finally:
            if self.frame_timeout is not None:
                self.sock.settimeout(timeout)

    # ---- receiving ------------------------------------------------------------------------------

    def _read_into(self, view: memoryview, what: str) -> None:
        got, n = 0, len(view)
        while got < n:
            if self._deadline is not None:
                left = self._deadline - time.monotonic()
                if left <= 0:
                    raise self._late(what)
                self.sock.settimeout(left)
            try:
                r = self.sock.recv_into(view[got:], n - got)
            except TimeoutError:
                if self._deadline is None:
                    raise
                raise self._late(what) from None
            if r == 0:
                if got == 0 and what == "the next message":
                    raise EOFError("the peer closed the connection")
                raise FrameError(f"truncated frame: the peer closed inside {what}")
            got += r
            if self._deadline is None and self.frame_timeout is not None:
                self._deadline = time.monotonic() + self.frame_timeout

    def _late(self, what: str) -> FrameError:
        return FrameError(
            f"a message not complete within {self.frame_timeout:g} s of its first byte (the "
            f"frame deadline; the peer stopped inside {what}): dropped"
        )

    def _record_length(self, limit: int, what: str) -> int:
        prefix = bytearray(_LEN.size)
        self._read_into(memoryview(prefix), what)
        n = _LEN.unpack(prefix)[0]
        if not TAG < n <= limit + TAG:
            raise FrameError(
                f"a sealed record of {n} bytes in {what} (limit {limit + TAG}): refused"
            )
        return n

    def _open_record(self, sealed: memoryview, out: memoryview, n: int, what: str) -> None:
        from cryptography.exceptions import InvalidTag

        try:
            self._open.decrypt_into(_nonce(self._recv_seq), sealed, _LEN.pack(n), out)
        except InvalidTag:
            raise FrameError(
                f"a sealed record of {what} did not verify: modified, replayed, reordered, "
                "dropped or injected on the way (or not sealed with this connection's key)"
            ) from None
        self._recv_seq += 1

    def recv(self, max_head: int, max_body: int) -> tuple[bytes, bytearray | None]:
        """The next message's header bytes and body (None if it has none). ``EOFError`` if the
        peer closed between messages; :class:`FrameError` for a record that does not verify, a
        length over its limit, a frame cut short or past the frame deadline."""
        if self.frame_timeout is None:
            return self._recv(max_head, max_body)
        timeout = self.sock.gettimeout()
        try:
            return self._recv(max_head, max_body)
        finally:
            self._deadline = None
            self.sock.settimeout(timeout)

    def _recv(self, max_head: int, max_body: int) -> tuple[bytes, bytearray | None]:
        n = self._record_length(_BODY_LEN.size + max_head, "the next message")
        sealed = bytearray(n)
        self._read_into(memoryview(sealed), "a message head")
        plain = bytearray(n - TAG)
        self._open_record(memoryview(sealed), memoryview(plain), n, "a message head")
        if len(plain) < _BODY_LEN.size:
            raise FrameError(f"a message head of {len(plain)} bytes has no body length: refused")
        size = _BODY_LEN.unpack_from(plain)[0]
        head = bytes(plain[_BODY_LEN.size :])
        if size > max_body:
            raise FrameError(f"body length {size} exceeds the limit {max_body}: refused")
        if not size:
            return head, None
        body = bytearray(min(size, _FIRST_BODY_ALLOCATION))
        got = 0
        slot = memoryview(self._slot)
        while got < size:
            n = self._record_length(min(CHUNK, size - got), "a message body")
            if got + n - TAG > len(body):  # grow with the bytes that arrived and verified
                body.extend(bytes(min(size, max(2 * len(body), got + n - TAG)) - len(body)))
            self._read_into(slot[:n], "a message body")
            self._open_record(slot[:n], memoryview(body)[got : got + n - TAG], n, "a message body")
            got += n - TAG
        return head, body
