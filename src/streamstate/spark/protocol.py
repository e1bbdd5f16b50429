"""The wire protocol between a Spark task and its subtask's state host.

One message is ``<u32 header length><u32 body length><msgpack header><body>``; the header is a
dict whose ``"t"`` names the message, the body (optional) is one Arrow record batch in IPC
stream format without its schema (the schema travels once, in BEGIN)::

    task -> host                                  host -> task
    HELLO    {proto}                              HELLO  {pid, version, lineage, rlimit_as}
    BEGIN    {job, batch, base, lineage,          BEGUN  {restore, restore_ms}
              new_lineage, base_attempt, attempt,
              watermark, processing_time}
    DATA     + record batch                       OK                      (one per DATA)
    END                                           DONE   {result}         (a BatchResult)
    PING                                          PONG   {version}
    SHUTDOWN {reason}                             BYE
    (any error)                                   ERROR  {type, message, traceback}

DATA is answered before the next DATA is sent (lock-step), so a host never buffers more than
one Arrow batch of a partition and a failure stops the stream at once.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

import msgspec

__all__ = ["PROTOCOL_VERSION", "Connection", "ProtocolError"]

PROTOCOL_VERSION = 1
_PREFIX = struct.Struct("<II")
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode


class ProtocolError(RuntimeError):
    """A peer sent something the protocol does not allow."""


class Connection:
    """A framed, blocking connection over a Unix socket."""

    __slots__ = ("sock",)

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def send(self, header: dict[str, Any], body: Any = None) -> None:
        head = _encode(header)
        size = 0 if body is None else (body.size if hasattr(body, "size") else len(body))
        self.sock.sendall(_PREFIX.pack(len(head), size) + head)
        if size:
            self.sock.sendall(body)

    def _read_exactly(self, n: int) -> bytearray:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            r = self.sock.recv_into(view[got:], n - got)
            if r == 0:
                raise EOFError("the peer closed the connection")
            got += r
        return buf

    def recv(self) -> tuple[dict[str, Any], bytearray | None]:
        head_len, body_len = _PREFIX.unpack(self._read_exactly(8))
        header = _decode(self._read_exactly(head_len))
        if not isinstance(header, dict) or "t" not in header:
            raise ProtocolError(f"malformed message header {header!r}")
        body = self._read_exactly(body_len) if body_len else None
        return header, body

    def close(self) -> None:
        self.sock.close()
