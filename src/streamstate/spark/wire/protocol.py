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
frame is refused). A message is a msgpack header, one ``msgspec.Struct`` of
:mod:`streamstate.spark.wire.messages` whose ``"t"`` names it, and an optional body: one Arrow
record batch in IPC stream format without its schema (the schema travels once, in BEGIN). The
header is at most :data:`MAX_HEADER_BYTES`, the body at most the connection's limit, both
checked before the bytes are read; a header is decoded once, into the type its receiver expects
(a host :data:`~streamstate.spark.wire.messages.ToHost`, a client
:data:`~streamstate.spark.wire.messages.ToClient`)::

    task -> host                                  host -> task
    Hello    {proto}                              HostHello {proto, location, version,
                                                             lineage, rlimit_as, started}
    Begin    {task: StepTask, subtask, attempt,   Begun     {restore, restore_ms}
              schema}
    Data     + record batch                       Ok                     (one per Data)
    End                                           Done      {result: BatchResult}
    Ping                                          Pong      {version}
    Shutdown {reason, pid?}                       Bye       {ignored}   (pid not its own)
    (any error)                                   Error     {type, message, traceback,
                                                             report?: ErrorReport}

DATA is answered before the next DATA is sent (lock-step), so a host never buffers more than
one Arrow batch of a partition and a failure stops the stream at once. A host serves only the
job it was started for: a BEGIN naming another checkpoint, operator, function or storage
options is refused (:mod:`streamstate.spark.host.state_host`).

Version 5 (this one) types every message both ways (a host's HELLO carries its location as one
field, DONE the result itself, ERROR a typed report); version 4 typed the step in BEGIN, 3
sealed every frame after the handshake, 2 added the handshake, the frame limits, the location
fields of HELLO and ``subtask`` in BEGIN. The hosts and the tasks of one install always speak
the same version (a host is started from the task's own interpreter and ``PYTHONPATH``); a peer
of another version fails the handshake with a message naming both versions (its first bytes
carry its version).
"""

from __future__ import annotations

from typing import Any

import msgspec

from streamstate.spark.wire.channel import FrameError, SecureChannel
from streamstate.spark.wire.messages import ToClient, ToHost
from streamstate.spark.wire.security import PROTOCOL_VERSION, SessionKeys

__all__ = [
    "CLIENT_RECEIVES",
    "HOST_RECEIVES",
    "MAX_BODY_BYTES",
    "MAX_HEADER_BYTES",
    "PROTOCOL_VERSION",
    "Connection",
    "MalformedMessage",
    "ProtocolError",
]

#: a header is a small map (BEGIN carries the JobSpec and the Arrow schema: a few KiB)
MAX_HEADER_BYTES = 1 << 20
#: default limit of one body (one Arrow record batch of a partition)
MAX_BODY_BYTES = 1 << 30
_encode = msgspec.msgpack.Encoder().encode
#: what a state host's connection decodes, and what a client's does
HOST_RECEIVES = msgspec.msgpack.Decoder(ToHost)
CLIENT_RECEIVES = msgspec.msgpack.Decoder(ToClient)


class ProtocolError(RuntimeError):
    """A peer sent something the protocol does not allow."""


class MalformedMessage(ProtocolError):
    """A sealed frame verified but its header is not a message the receiver takes (the
    channel is still in step: the receiver may answer with an ERROR)."""


def _kind(head: bytes) -> str:
    """What a header that did not decode into its type calls itself (for the error only)."""
    try:
        header = msgspec.msgpack.decode(head)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return "message"
    kind = header.get("t") if isinstance(header, dict) else None
    return str(kind)[:40] if isinstance(kind, str) else "message"


class Connection:
    """A framed, blocking, sealed connection over a connected and authenticated socket;
    ``receives`` decodes the headers the peer sends (:data:`HOST_RECEIVES` on a host,
    :data:`CLIENT_RECEIVES` on its client); ``frame_timeout``: the seconds a message has once
    begun, sent or received (:class:`~streamstate.spark.wire.channel.SecureChannel`)."""

    __slots__ = ("_decode", "channel", "max_body", "sock")

    def __init__(
        self,
        sock: Any,
        keys: SessionKeys,
        receives: msgspec.msgpack.Decoder[Any],
        max_body: int = MAX_BODY_BYTES,
        frame_timeout: float | None = None,
    ) -> None:
        self.sock = sock
        self.channel = SecureChannel(sock, keys, frame_timeout)
        self.max_body = max_body
        self._decode = receives.decode

    def send(self, header: msgspec.Struct, body: Any = None) -> None:
        """Send a message: ``header`` one of :mod:`streamstate.spark.wire.messages` (or
        :class:`~streamstate.spark.wire.step.Begin`), ``body`` an Arrow record batch's bytes."""
        head = _encode(header)
        size = 0 if body is None else memoryview(body).nbytes
        if len(head) > MAX_HEADER_BYTES:
            raise ProtocolError(
                f"message {type(header).__name__} has a {len(head)}-byte header; the limit is "
                f"{MAX_HEADER_BYTES}"
            )
        if size > self.max_body:
            raise ProtocolError(
                f"a {size}-byte message body exceeds the state host's frame limit of "
                f"{self.max_body} bytes (make Arrow batches smaller: "
                "spark.sql.execution.arrow.maxRecordsPerBatch)"
            )
        self.channel.send(head, body if size else None)

    def recv(self) -> tuple[Any, bytearray | None]:
        """The next message, decoded into its type; raises :class:`ProtocolError` for a frame
        that does not verify, an oversized length (before reading it) or a truncated frame,
        :class:`MalformedMessage` for a header that is not a message this side takes, and
        ``EOFError`` if the peer closed between two messages."""
        try:
            head, body = self.channel.recv(MAX_HEADER_BYTES, self.max_body)
        except FrameError as exc:
            raise ProtocolError(str(exc)) from exc
        try:
            return self._decode(head), body
        except msgspec.ValidationError as exc:
            raise MalformedMessage(f"malformed {_kind(head)}: {exc}") from exc
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise MalformedMessage(f"malformed message header: {exc}") from exc

    def close(self) -> None:
        self.sock.close()
