"""The wire protocol between a Spark task (or the driver) and a subtask's state host.

Transport: a Unix socket in the node's run directory (a task on the host's node) or TCP (a
task on another node; :mod:`streamstate.spark.task.host_client`). Both carry the same bytes.

**Handshake** (:mod:`streamstate.spark.wire.security`), before any framed message: every connection
authenticates with an HMAC-SHA256 challenge-response over the job's secret, which itself never
crosses the connection::

    host -> client   MAGIC (8 bytes: "SSHOST", 0, version) + host nonce (32)
    client -> host   MAGIC + client nonce (32) + HMAC(secret, "client", host id, nonces)
    host -> client   HMAC(secret, "host", host id, nonces)      (or the host closes: refused)

The host id is inside both MACs, so a client reaches only the host it means (the subtask's)
and the client knows the host holds the secret too. A Unix-socket peer must also run as the
host's uid (``SO_PEERCRED``). Both sides then derive the connection's two AES-256-GCM keys
(HKDF of the secret, both nonces and the host id).

**Messages** after the handshake are sealed (:mod:`streamstate.spark.wire.channel`: encrypted,
authenticated, numbered per direction, so a replayed, reordered, dropped, injected or changed
frame is refused). A message is a msgpack header (a map whose ``"t"`` names it) and an
optional body: one Arrow record batch in IPC stream format without its schema (the schema
travels once, in BEGIN). The header is at most :data:`MAX_HEADER_BYTES`, the body at most the
connection's limit, both checked before the bytes are read::

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
one Arrow batch of a partition and a failure stops the stream at once. A host serves only the
job it was started for: a BEGIN naming another checkpoint, operator, function or storage
options is refused (:mod:`streamstate.spark.host.state_host`).

Version 3 (this one) seals every frame after the handshake; version 2 added the handshake, the
frame limits, the location fields of HELLO and ``subtask`` in BEGIN. A peer of another version
fails the handshake with a message naming both versions (its first bytes carry its version).
"""

from __future__ import annotations

from typing import Any

import msgspec

from streamstate.spark.wire.channel import FrameError, SecureChannel
from streamstate.spark.wire.security import PROTOCOL_VERSION, SessionKeys

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_HEADER_BYTES",
    "PROTOCOL_VERSION",
    "Connection",
    "ProtocolError",
]

#: a header is a small map (BEGIN carries the JobSpec and the Arrow schema: a few KiB)
MAX_HEADER_BYTES = 1 << 20
#: default limit of one body (one Arrow record batch of a partition)
MAX_BODY_BYTES = 1 << 30
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode


def _kind(header: dict[str, Any] | msgspec.Struct) -> Any:
    return header.get("t") if isinstance(header, dict) else getattr(header, "t", None)


class ProtocolError(RuntimeError):
    """A peer sent something the protocol does not allow."""


class Connection:
    """A framed, blocking, sealed connection over a connected and authenticated socket."""

    __slots__ = ("channel", "max_body", "sock")

    def __init__(self, sock: Any, keys: SessionKeys, max_body: int = MAX_BODY_BYTES) -> None:
        self.sock = sock
        self.channel = SecureChannel(sock, keys)
        self.max_body = max_body

    def send(self, header: dict[str, Any] | msgspec.Struct, body: Any = None) -> None:
        """Send a message: ``header`` a msgpack map with ``"t"`` (a dict, or a tagged
        ``msgspec.Struct`` such as :class:`~streamstate.spark.wire.step.Begin`)."""
        head = _encode(header)
        size = 0 if body is None else memoryview(body).nbytes
        if len(head) > MAX_HEADER_BYTES:
            raise ProtocolError(
                f"message {_kind(header)!r} has a {len(head)}-byte header; the limit is "
                f"{MAX_HEADER_BYTES}"
            )
        if size > self.max_body:
            raise ProtocolError(
                f"a {size}-byte message body exceeds the state host's frame limit of "
                f"{self.max_body} bytes (make Arrow batches smaller: "
                "spark.sql.execution.arrow.maxRecordsPerBatch)"
            )
        self.channel.send(head, body if size else None)

    def recv(self) -> tuple[dict[str, Any], bytearray | None]:
        """The next message; raises :class:`ProtocolError` for a frame that does not verify,
        an oversized length (before reading it), a truncated frame or a header that is not a
        msgpack map with ``"t"``, and ``EOFError`` if the peer closed between two messages."""
        try:
            head, body = self.channel.recv(MAX_HEADER_BYTES, self.max_body)
        except FrameError as exc:
            raise ProtocolError(str(exc)) from exc
        try:
            header = _decode(head)
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise ProtocolError(f"malformed message header: {exc}") from exc
        if not isinstance(header, dict) or not isinstance(header.get("t"), str):
            raise ProtocolError(f"malformed message header {str(header)[:100]!r}")
        return header, body

    def close(self) -> None:
        self.sock.close()
