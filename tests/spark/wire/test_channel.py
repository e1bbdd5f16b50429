"""Sealed frames between a state host and its clients (:mod:`streamstate.spark.wire.channel`): what
one side sends the other reads back exactly, and a frame that was changed, replayed, reordered,
dropped, cut short or sealed for another connection is refused, in either direction. (What the
frames carry, typed: ``test_messages.py``.)"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamstate.spark.wire.channel import CHUNK, TAG
from streamstate.spark.wire.messages import Data, End, Error, Shutdown
from streamstate.spark.wire.protocol import (
    CLIENT_RECEIVES,
    HOST_RECEIVES,
    Connection,
    ProtocolError,
)
from streamstate.spark.wire.security import (
    REPLY_BYTES,
    AuthError,
    ServerHandshake,
    SessionKeys,
    client_handshake,
    new_secret,
    session_keys,
)
from streamstate.spark.wire.step import Begin, StepTask


def _keys(secret: bytes | None = None) -> tuple[SessionKeys, SessionKeys]:
    """A client's and a host's keys of one connection."""
    secret = secret or new_secret()
    host_nonce, client_nonce = os.urandom(32), os.urandom(32)
    return (
        session_keys(secret, "h1", host_nonce, client_nonce, client=True),
        session_keys(secret, "h1", host_nonce, client_nonce, client=False),
    )


class Recorder:
    """A socket stand-in that keeps what a sender writes (the sealed bytes on the wire)."""

    def __init__(self) -> None:
        self.data = bytearray()

    def sendall(self, data: Any) -> None:
        self.data += bytes(data)


def _records(wire: bytes) -> list[bytes]:
    """The sealed records (length prefix included) of a recorded stream."""
    out, i = [], 0
    while i < len(wire):
        (n,) = struct.unpack_from("<I", wire, i)
        out.append(wire[i : i + 4 + n])
        i += 4 + n
    return out


def _sealed(keys: SessionKeys, *messages: tuple[Any, Any]) -> list[bytes]:
    rec = Recorder()
    conn = Connection(rec, keys, HOST_RECEIVES)  # type: ignore[arg-type]
    for header, body in messages:
        conn.send(header, body)
    return _records(bytes(rec.data))


def _reader(
    keys: SessionKeys, wire: bytes, *, close: bool = True, receives: Any = HOST_RECEIVES
) -> Connection:
    """A connection that reads ``wire`` (then EOF if ``close``): a host's, unless
    ``receives`` says otherwise."""
    a, b = socket.socketpair()
    b.settimeout(5)

    def feed() -> None:
        with contextlib.suppress(OSError):  # the reader may stop (and close) first
            a.sendall(wire)
            if close:
                a.shutdown(socket.SHUT_WR)

    threading.Thread(target=feed, daemon=True).start()
    return Connection(b, keys, receives, max_body=1 << 24)


BEGIN = Begin(
    task=StepTask(job=b"j", batch=3, base=2, lineage="a", new_lineage="b"), subtask=0, attempt=1
)
MESSAGES = [
    (BEGIN, None),
    (Data(), os.urandom(CHUNK + 1000)),
    (Data(), os.urandom(17)),
    (End(), None),
]


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.sampled_from([0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 5])))
def test_messages_round_trip_over_sealed_records(sizes: list[int]) -> None:
    client, host = _keys()
    sent = [
        (Data() if n else Shutdown(reason=str(i)), os.urandom(n) if n else None)
        for i, n in enumerate(sizes)
    ]
    records = _sealed(client, *sent)
    # a body of n bytes takes ceil(n / CHUNK) records after its head
    assert len(records) == sum(1 + -(-n // CHUNK) for n in sizes)
    conn = _reader(host, b"".join(records))
    for header, body in sent:
        got, got_body = conn.recv()
        assert got == header
        assert (None if got_body is None else bytes(got_body)) == body
    with pytest.raises(EOFError):
        conn.recv()


def test_the_wire_holds_none_of_the_plaintext() -> None:
    client, _ = _keys()
    secret_value = b"the-record-value-0123456789"
    wire = b"".join(
        _sealed(
            client,
            (Shutdown(reason=secret_value.decode()), None),
            (Data(), secret_value * 99),
        )
    )
    assert secret_value not in wire and secret_value[:12] not in wire


def _refused(
    host: SessionKeys, wire: bytes, expected: str, reads: int = 4, receives: Any = HOST_RECEIVES
) -> None:
    conn = _reader(host, wire, receives=receives)
    with pytest.raises(ProtocolError, match=expected):
        for _ in range(reads):
            conn.recv()


def test_a_changed_record_is_refused_in_either_direction() -> None:
    client, host = _keys()
    records = _sealed(client, *MESSAGES)
    for i, record in enumerate(records):
        for pos in (4, len(record) // 2, len(record) - 1):  # ciphertext, middle, tag
            bad = bytearray(record)
            bad[pos] ^= 0x01
            wire = b"".join([*records[:i], bytes(bad), *records[i + 1 :]])
            _refused(host, wire, "did not verify")
    # the host's answers, read by the client: the same
    answer = _sealed(host, (Error(type="X", message="x" * 100), None))[0]
    bad = bytearray(answer)
    bad[10] ^= 0x80
    _refused(client, bytes(bad), "did not verify", reads=1, receives=CLIENT_RECEIVES)


def test_replayed_reordered_dropped_or_foreign_records_are_refused() -> None:
    client, host = _keys()
    r = _sealed(client, *MESSAGES)  # BEGIN head, DATA head, 2 body, DATA head, body, END
    cases = {
        "replayed": [r[0], r[0], *r[1:]],
        "replayed later": [*r, r[1]],
        "reordered": [r[0], r[2], r[1], *r[3:]],
        "dropped": [r[0], *r[2:]],
        "dropped body record": [*r[:2], r[3], *r[4:]],
    }
    for name, records in cases.items():
        conn = _reader(host, b"".join(records))
        with pytest.raises(ProtocolError, match="did not verify"):
            for _ in range(len(MESSAGES) + 1):
                conn.recv()
        assert name
    # records recorded on another connection (other keys), injected into this one
    other_client, _ = _keys()
    foreign = _sealed(other_client, (BEGIN, None))
    _refused(host, b"".join([r[0], *foreign]), "did not verify")
    # a plaintext frame of the old protocol after the handshake (a relay that took over)
    head = b"\x82\xa1t\xa5BEGIN\xa3job\xc4\x00"
    _refused(host, struct.pack("<II", len(head), 0) + head, "did not verify|sealed record")


def test_lengths_are_checked_before_anything_is_read_or_allocated() -> None:
    client, host = _keys()
    # a record longer than the header limit: refused from its 4-byte prefix alone (the
    # stream stays open: a reader that waited for the bytes would time out instead)
    for prefix in (0xFFFFFFFF, 0, TAG):
        conn = _reader(host, struct.pack("<I", prefix), close=False)
        with pytest.raises(ProtocolError, match=f"a sealed record of {prefix} bytes"):
            conn.recv()
    # a head announcing a body over the limit
    big = _sealed(client, (Data(), None))[0]
    conn = Connection(Recorder(), client, HOST_RECEIVES, max_body=1 << 40)  # type: ignore[arg-type]
    rec = Recorder()
    conn.channel.sock = rec  # type: ignore[assignment]
    conn.channel._send_record(struct.pack("<I", 0xFFFFFFF0) + b"\x81\xa1t\xa4DATA")
    del big
    _refused(host, bytes(rec.data), "body length 4294967280 exceeds the limit", reads=1)
    # a body record larger than a chunk
    rec = Recorder()
    conn = Connection(rec, client, HOST_RECEIVES)  # type: ignore[arg-type]
    conn.channel._send_record(struct.pack("<I", 2 * CHUNK) + b"\x81\xa1t\xa4DATA")
    _refused(host, bytes(rec.data) + struct.pack("<I", 2 * CHUNK + TAG), "sealed record of")


def test_a_cut_frame_is_refused_and_eof_between_messages_is_not() -> None:
    client, host = _keys()
    records = _sealed(client, (Data(), os.urandom(3 * CHUNK)))
    wire = b"".join(records)
    for cut in (2, 4 + 5, len(records[0]) + 3, len(wire) - 1):
        _refused(host, wire[:cut], "truncated frame", reads=1)
    with pytest.raises(EOFError):
        _reader(host, b"").recv()


def test_handshakes_derive_the_same_keys_and_refuse_another_version_clearly() -> None:
    secret = new_secret()
    a, b = socket.socketpair()
    a.settimeout(5)
    b.settimeout(5)
    hs = ServerHandshake(secret, "h1")
    got: dict[str, Any] = {}

    def host_side() -> None:
        b.sendall(hs.challenge())
        reply = b""
        while len(reply) < REPLY_BYTES:
            reply += b.recv(REPLY_BYTES - len(reply))
        proof, got["keys"] = hs.verify(reply)
        b.sendall(proof)

    t = threading.Thread(target=host_side)
    t.start()
    client = client_handshake(a, secret, "h1")
    t.join()
    assert client.send == got["keys"].recv and client.recv == got["keys"].send
    assert client.send != client.recv
    # a version-4 host (an older streamstate on that node: messages as untyped maps)
    a, b = socket.socketpair()
    b.sendall(b"SSHOST\x00\x04" + os.urandom(32))
    with pytest.raises(AuthError, match="speaks state-host protocol version 4, this side 5"):
        client_handshake(a, secret, "h1", timeout=2)
    # a version-4 client, seen by the host
    with pytest.raises(AuthError, match="speaks state-host protocol version 4, this side 5"):
        ServerHandshake.check_prefix(b"SSHOST\x00\x04" + os.urandom(10))
    # a host that never answers: one deadline for the whole handshake
    a, b = socket.socketpair()
    b.sendall(b"SSHOST\x00")  # a byte at a time would not get more time either
    with pytest.raises(TimeoutError, match="within the handshake deadline"):
        client_handshake(a, secret, "h1", timeout=0.3)
