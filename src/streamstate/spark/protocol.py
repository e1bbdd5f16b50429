"""The wire protocol between a Spark task (or the driver) and a subtask's state host.

Transport: a Unix socket in the node's run directory (a task on the host's node) or TCP (a
task on another node; :mod:`streamstate.spark.host_client`). Both carry the same bytes.

**Handshake** (:mod:`streamstate.spark.security`), before any framed message: every connection
authenticates with an HMAC-SHA256 challenge-response over the job's secret, which itself never
crosses the connection::

    host -> client   MAGIC (8 bytes) + host nonce (32)
    client -> host   MAGIC + client nonce (32) + HMAC(secret, "client", host id, nonces)
    host -> client   HMAC(secret, "host", host id, nonces)      (or the host closes: refused)

The host id is inside both MACs, so a client reaches only the host it means (the subtask's)
and the client knows the host holds the secret too. A Unix-socket peer must also run as the
host's uid (``SO_PEERCRED``).

**Messages** after the handshake: ``<u32 header length><u32 body length><msgpack header>
<body>``. The header is a map whose ``"t"`` names the message; the body (optional) is one
Arrow record batch in IPC stream format without its schema (the schema travels once, in
BEGIN). Lengths are checked against :data:`MAX_HEADER_BYTES` and the connection's body limit
before anything is allocated::

    task -> host                                  host -> task
    HELLO    {proto}                              HELLO  {pid, version, lineage, rlimit_as,
                                                          id, node, tcp, unix}
    BEGIN    {subtask, job, batch, base, lineage, BEGUN  {restore, restore_ms}
              new_lineage, base_attempt, attempt,
              watermark, processing_time, schema}
    DATA     + record batch                       OK                      (one per DATA)
    END                                           DONE   {result}         (a BatchResult)
    PING                                          PONG   {version}
    SHUTDOWN {reason, pid?}                       BYE    (ignored if pid is not its own)
    (any error)                                   ERROR  {type, message, traceback}

DATA is answered before the next DATA is sent (lock-step), so a host never buffers more than
one Arrow batch of a partition and a failure stops the stream at once.

Version 2 (this one) added the handshake, the frame limits, the location fields of HELLO and
``subtask`` in BEGIN; a version-1 peer fails the handshake (its first bytes are not MAGIC).
"""

from __future__ import annotations

import socket
import struct
from typing import Any

import msgspec

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_HEADER_BYTES",
    "PROTOCOL_VERSION",
    "Connection",
    "ProtocolError",
]

PROTOCOL_VERSION = 2
#: a header is a small map (BEGIN carries the JobSpec and the Arrow schema: a few KiB)
MAX_HEADER_BYTES = 1 << 20
#: default limit of one body (one Arrow record batch of a partition)
MAX_BODY_BYTES = 1 << 30
_PREFIX = struct.Struct("<II")
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode


class ProtocolError(RuntimeError):
    """A peer sent something the protocol does not allow."""


class Connection:
    """A framed, blocking connection over a connected (and authenticated) socket."""

    __slots__ = ("max_body", "sock")

    def __init__(self, sock: socket.socket, max_body: int = MAX_BODY_BYTES) -> None:
        self.sock = sock
        self.max_body = max_body

    def send(self, header: dict[str, Any], body: Any = None) -> None:
        head = _encode(header)
        size = 0 if body is None else (body.size if hasattr(body, "size") else len(body))
        if len(head) > MAX_HEADER_BYTES:
            raise ProtocolError(
                f"message {header.get('t')!r} has a {len(head)}-byte header; the limit is "
                f"{MAX_HEADER_BYTES}"
            )
        if size > self.max_body:
            raise ProtocolError(
                f"a {size}-byte message body exceeds the state host's frame limit of "
                f"{self.max_body} bytes (make Arrow batches smaller: "
                "spark.sql.execution.arrow.maxRecordsPerBatch)"
            )
        self.sock.sendall(_PREFIX.pack(len(head), size) + head)
        if size:
            self.sock.sendall(body)

    def read_exactly(self, n: int) -> bytearray:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            r = self.sock.recv_into(view[got:], n - got)
            if r == 0:
                if got:
                    raise ProtocolError(
                        f"truncated frame: the peer closed after {got} of {n} bytes"
                    )
                raise EOFError("the peer closed the connection")
            got += r
        return buf

    def recv(self) -> tuple[dict[str, Any], bytearray | None]:
        """The next message; raises :class:`ProtocolError` for an oversized length (before
        allocating it), a truncated frame or a header that is not a msgpack map with ``"t"``,
        and ``EOFError`` if the peer closed between two messages."""
        head_len, body_len = _PREFIX.unpack(self.read_exactly(_PREFIX.size))
        if head_len == 0 or head_len > MAX_HEADER_BYTES:
            raise ProtocolError(
                f"header length {head_len} is outside 1..{MAX_HEADER_BYTES}: refused"
            )
        if body_len > self.max_body:
            raise ProtocolError(
                f"body length {body_len} exceeds the limit {self.max_body}: refused"
            )
        try:
            header = _decode(self.read_exactly(head_len))
        except EOFError as exc:
            raise ProtocolError("truncated frame: the peer closed inside a message") from exc
        except msgspec.DecodeError as exc:
            raise ProtocolError(f"malformed message header: {exc}") from exc
        if not isinstance(header, dict) or not isinstance(header.get("t"), str):
            raise ProtocolError(f"malformed message header {str(header)[:100]!r}")
        body = None
        if body_len:
            try:
                body = self.read_exactly(body_len)
            except EOFError as exc:
                raise ProtocolError("truncated frame: the peer closed inside a body") from exc
        return header, body

    def close(self) -> None:
        self.sock.close()
