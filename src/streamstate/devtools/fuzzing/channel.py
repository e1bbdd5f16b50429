"""The host channel's messages after authentication, as a decoder to fuzz.

The peer is authenticated: every record it sends is sealed with the connection's key, so the
fuzzer mutates what is inside the seals (a message head's body length and header, a body's
bytes) and seals the result, as a peer holding the run secret could. A mutated stream is
decoded the way a state host decodes it: :meth:`~streamstate.spark.wire.protocol.Connection.
recv` for each message, :meth:`~streamstate.spark.host.state_host.StateHost.check_begin` for a
BEGIN (and the Arrow schema it carries), the Arrow record batch of a DATA body against that
schema.

An input is a stream of records, each ``<u32 LE length><plaintext>`` (the length of the
plaintext, not of the sealed record: the seal is added when the stream is sent).
"""

from __future__ import annotations

import socket
import struct
from typing import Any

import msgspec

from streamstate.api.functions import KeyedProcessFunction
from streamstate.devtools.fuzzing.seeds import Seed

__all__ = ["ArrowRefused", "channel_seeds", "decode_channel", "join_records", "split_records"]

_LEN = struct.Struct("<I")
_SECRET = bytes(range(32))
_NONCES = (b"h" * 32, b"c" * 32)
_HOST = "fuzz-host"


def join_records(records: list[bytes]) -> bytes:
    return b"".join(_LEN.pack(len(r)) + r for r in records)


def split_records(data: bytes) -> list[bytes]:
    """The records of an input (a record cut short is kept as it is: the peer sends it)."""
    out, pos = [], 0
    while pos + _LEN.size <= len(data):
        (n,) = _LEN.unpack_from(data, pos)
        pos += _LEN.size
        out.append(data[pos : pos + n])
        pos += n
    return out


def _message(header: Any, body: bytes | None = None) -> list[bytes]:
    head = msgspec.msgpack.encode(header)
    records = [_LEN.pack(0 if body is None else len(body)) + head]
    if body:
        from streamstate.spark.wire.channel import CHUNK

        records += [body[i : i + CHUNK] for i in range(0, len(body), CHUNK)]
    return records


def _job() -> Any:
    import pyarrow as pa

    from streamstate.spark.job import JobSpec, arrow_schema_to_bytes

    schema = pa.schema([("k", pa.string()), ("v", pa.int64()), ("_kg", pa.int32())])
    return JobSpec(
        operator="op",
        parallelism=2,
        max_parallelism=128,
        key_columns=["k"],
        value_columns=["k", "v"],
        input_schema=arrow_schema_to_bytes(schema),
        output_schema=arrow_schema_to_bytes(pa.schema([("out", pa.string())])),
        checkpoint_url="/nonexistent/fuzz-job",
        function_path="functions/x.pkl",
        function_sha="0" * 64,
    )


def _batch() -> tuple[bytes, bytes]:
    import pyarrow as pa

    batch = pa.record_batch(
        [
            pa.array(["a", "bb", None, "dddd"]),
            pa.array([1, 2, 3, None], pa.int64()),
            pa.array([0, 5, 17, 63], pa.int32()),
        ],
        names=["k", "v", "_kg"],
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    schema = batch.schema.serialize().to_pybytes()
    # a DATA body is one record batch message without the schema (protocol.py)
    return schema, batch.serialize().to_pybytes()


def channel_seeds() -> list[Seed]:
    from streamstate.spark.wire.messages import Data, End, Hello, Ping
    from streamstate.spark.wire.security import PROTOCOL_VERSION
    from streamstate.spark.wire.step import Begin, StepTask

    job = _job()
    schema, body = _batch()
    task = StepTask(
        job=msgspec.msgpack.encode(job),
        batch=3,
        base=2,
        lineage="l2",
        new_lineage="l3",
        base_attempts={0: 0, 1: 1},
        watermark=100,
        processing_time=200,
    )
    begin = Begin(task=task, subtask=0, attempt=0, schema=schema)
    batch = [
        *_message(Hello(proto=PROTOCOL_VERSION)),
        *_message(begin),
        *_message(Data(), body),
        *_message(Data(), body),
        *_message(End()),
    ]
    return [
        Seed(join_records(batch), "begin-data-end", {"job": job}),
        Seed(
            join_records(_message(Ping()) + _message(Hello(proto=PROTOCOL_VERSION))),
            "ping-hello",
            {"job": job},
        ),
    ]


def _seal(keys: Any, records: list[bytes]) -> bytes:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    aead = AESGCM(keys.send)
    out = []
    for seq, plain in enumerate(records):
        nonce = bytes(4) + seq.to_bytes(8, "big")
        length = _LEN.pack(len(plain) + 16)
        out.append(length + aead.encrypt(nonce, plain, length))
    return b"".join(out)


def decode_channel(data: bytes, job: Any, max_body: int = 1 << 20) -> None:
    """Send the records of ``data`` sealed to a host-side :class:`Connection` and decode every
    message as a state host does, its records processed by a subtask's runtime. Raises what
    the host's decoding raises: ``ProtocolError``, ``EOFError`` at the end of the stream,
    :class:`ArrowRefused` for a schema or body that is not Arrow IPC (the host fails that batch
    with Arrow's error), the project's errors for records it refuses."""
    from streamstate.checkpoint.storage import MemoryCheckpointStorage
    from streamstate.spark.host.state_host import StateHost
    from streamstate.spark.subtask import SubtaskRuntime
    from streamstate.spark.wire.hosts import HostSpec, JobPin
    from streamstate.spark.wire.protocol import HOST_RECEIVES, Connection
    from streamstate.spark.wire.security import session_keys

    client = session_keys(_SECRET, _HOST, *_NONCES, client=True)
    host_keys = session_keys(_SECRET, _HOST, *_NONCES, client=False)
    wire = _seal(client, split_records(data))
    a, b = socket.socketpair()
    with a, b:
        # the stream is written whole before it is read: give the socket room for it
        for s in (a, b):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, max(len(wire) + 4096, 1 << 16))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, max(len(wire) + 4096, 1 << 16))
        b.settimeout(5.0)
        a.sendall(wire)
        a.shutdown(socket.SHUT_WR)
        conn = Connection(b, host_keys, HOST_RECEIVES, max_body=max_body)
        spec = HostSpec(
            id=_HOST,
            job=job.checkpoint_url,
            operator=job.operator,
            subtask=0,
            parallelism=job.parallelism,
            run_dir="/nonexistent",
        )
        host = StateHost(spec, JobPin.of(job))
        runtime = SubtaskRuntime(job, 0, _Count, storage=MemoryCheckpointStorage())
        runtime.prepare(-1, "l")
        runtime.begin(100, 200)
        schema: list[Any] = [None]
        try:
            while True:
                header, body = conn.recv()
                _serve(host, runtime, header, body, schema)
        finally:
            runtime.close()


def _serve(host: Any, runtime: Any, header: Any, body: Any, schema: list[Any]) -> None:
    """One message, decoded as the host decodes it (``header``: a typed message of
    :mod:`streamstate.spark.wire.messages`; ``schema``: the current BEGIN's, updated)."""
    import pyarrow as pa

    from streamstate.spark.wire.messages import Data
    from streamstate.spark.wire.step import Begin

    if isinstance(header, Begin):
        host.check_begin(header)
        if header.schema is not None:
            schema[0] = _arrow(pa.ipc.read_schema, pa.py_buffer(header.schema))
    elif isinstance(header, Data) and schema[0] is not None and body is not None:
        # as the host reads a DATA body (state_host.py), then hands it to its runtime
        runtime.process(_arrow(pa.ipc.read_record_batch, pa.py_buffer(body), schema[0]))


class _Count(KeyedProcessFunction):  # type: ignore[type-arg]
    """Counts the records it is given (touching no state: a record's own errors are not the
    channel's)."""

    def __init__(self) -> None:
        self.records = 0

    def process_element(self, record: Any, ctx: Any) -> None:
        self.records += 1


class ArrowRefused(Exception):
    """Arrow refused a BEGIN's schema or a DATA body (its own error, which the host reports as
    the batch's error)."""


def _arrow(read: Any, *args: Any) -> Any:
    import pyarrow as pa

    try:
        return read(*args)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise ArrowRefused(f"{type(exc).__name__}: {exc}") from exc
