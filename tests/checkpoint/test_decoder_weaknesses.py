"""What fuzzing the checkpoint decoders found (SPEC §14.5), one regression test each: a hostile
or damaged input gets the project's error (``CorruptCheckpointError`` and its documented
relatives: ``CheckpointError``, ``StateMigrationException``; ``ProtocolError`` on the host
channel), never a ``KeyError``, ``struct.error``, ``UnicodeDecodeError`` or an allocation sized
by a length field the file cannot hold.

Each input is crafted the way the fuzzer found it, its checksums sealed again (whoever writes the
storage can compute a CRC), so that only the weakness itself is exercised."""

from __future__ import annotations

import io
import struct
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import google_crc32c
import msgspec
import pytest

from streamstate.backends.base import RestoreInput
from streamstate.backends.heap.factory import HeapStateBackend
from streamstate.backends.operator import (
    BroadcastStateSnapshot,
    ListStateSnapshot,
    OperatorStateMode,
    OperatorStateSnapshot,
)
from streamstate.backends.rocksdb.incremental import IncrementalManifest
from streamstate.checkpoint.metadata import decode_metadata
from streamstate.checkpoint.operator_format import read_operator_state, write_operator_state
from streamstate.errors import (
    CheckpointError,
    CorruptCheckpointError,
    KeyGroupOutOfRangeError,
    SerializerSnapshotError,
    StateMigrationException,
)
from streamstate.format.handles import StateFileHandle
from streamstate.format.keyed_file import KeyedSnapshotReader, KeyedSnapshotWriter
from streamstate.format.meta import StateMetaInfo
from streamstate.format.restore import FileKeyedStateRestore
from streamstate.format.snapshot import EncodedEntries
from streamstate.keygroups import KeyGroupRange, assign_to_key_group
from streamstate.namespace import VOID_NAMESPACE
from streamstate.serializers import (
    Int64Serializer,
    StrSerializer,
    VoidNamespaceSerializer,
    serializer_from_snapshot,
)

RANGE = KeyGroupRange(0, 127)
_PREFIX = struct.Struct(">4sHI")
_FRAME = struct.Struct(">III")
_TRAILER = struct.Struct(">II4s")
CHECKPOINT_ERRORS = (CheckpointError, StateMigrationException)


def crc(data: bytes) -> int:
    return int(google_crc32c.value(data))


# ---- keyed snapshot files -------------------------------------------------------------------


def keyed_file(compression: str = "lz4", section: bytes | None = None, count: int = 0) -> bytes:
    """A keyed file with one value state over a few keys (or, with ``section``, one key group
    holding that raw entries section)."""
    meta = StateMetaInfo("v", "value", VoidNamespaceSerializer(), Int64Serializer())
    out = io.BytesIO()
    writer = KeyedSnapshotWriter(
        out,
        path="f",
        key_serializer=StrSerializer(),
        max_parallelism=128,
        key_group_range=RANGE,
        states=[meta],
        compression=compression,
    )
    if section is not None:
        writer.write_key_group(7, [(0, EncodedEntries(section, count))])
    else:
        by_kg: dict[int, list[Any]] = {}
        for i in range(20):
            key = f"k{i}"
            by_kg.setdefault(assign_to_key_group(key, 128), []).append((key, VOID_NAMESPACE, i))
        for kg in sorted(by_kg):
            writer.write_key_group(kg, [(0, by_kg[kg])])
    writer.finish()
    return out.getvalue()


def blocks(data: bytes) -> list[int]:
    """Offsets of every block of a keyed file."""
    _, _, header_len = _PREFIX.unpack_from(data)
    pos = _PREFIX.size + header_len + 4
    _, footer_len, _ = _TRAILER.unpack_from(data, len(data) - _TRAILER.size)
    out = []
    while pos < len(data) - _TRAILER.size - footer_len:
        out.append(pos)
        pos += _FRAME.size + _FRAME.unpack_from(data, pos)[2] + 4
    return out


def reseal_block(buf: bytearray, pos: int) -> None:
    stored = _FRAME.unpack_from(buf, pos)[2]
    end = pos + _FRAME.size + stored
    struct.pack_into(">I", buf, end, crc(bytes(buf[pos:end])))


def with_footer(data: bytes, edit: Callable[[dict[str, Any]], None]) -> bytes:
    _, footer_len, magic = _TRAILER.unpack_from(data, len(data) - _TRAILER.size)
    start = len(data) - _TRAILER.size - footer_len
    footer = msgspec.msgpack.decode(data[start : len(data) - _TRAILER.size])
    edit(footer)
    tail = msgspec.msgpack.encode(footer)
    return data[:start] + tail + _TRAILER.pack(crc(tail), len(tail), magic)


class _Bytes:
    def __init__(self, data: bytes) -> None:
        self.storage = self
        self.directory = "chk-1"
        self.data = data

    def resolve(self, path: str) -> str:
        return path

    def open_read(self, path: str) -> io.BytesIO:
        return io.BytesIO(self.data)

    def url_of(self, path: str) -> str:
        return f"test://{path}"


def restore_heap(data: bytes) -> None:
    handle = StateFileHandle(
        path="f", size=len(data), checksum=crc(data), kind="full", checkpoint_id=1
    )
    restore = FileKeyedStateRestore(_Bytes(data), handle, RANGE)
    backend = HeapStateBackend().create_keyed_backend(StrSerializer(), 128, RANGE)
    try:
        backend.restore(RestoreInput([restore]))
    finally:
        restore.close()
        backend.dispose()


def peak_while(fn: Callable[[], Any]) -> tuple[int, BaseException | None]:
    """Peak traced allocation while ``fn`` runs, and what it raised."""
    tracemalloc.start()
    raised = None
    try:
        fn()
    except BaseException as exc:
        raised = exc
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak, raised


def test_a_header_length_beyond_the_file_allocates_nothing_for_it(tmp_path: Path) -> None:
    data = bytearray(keyed_file())
    struct.pack_into(">I", data, 6, 0xFFFFFF00)
    path = tmp_path / "f.state"
    path.write_bytes(bytes(data))

    def read() -> None:
        with open(path, "rb") as f:
            KeyedSnapshotReader(f, str(path), len(data))

    peak, raised = peak_while(read)
    assert isinstance(raised, CorruptCheckpointError), raised
    assert "header length" in str(raised)
    assert peak < 1 << 20


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_a_block_raw_length_beyond_its_codec_allocates_nothing_for_it(compression: str) -> None:
    data = bytearray(keyed_file(compression))
    pos = blocks(bytes(data))[0]
    kg, _, stored = _FRAME.unpack_from(data, pos)
    _FRAME.pack_into(data, pos, kg, 0xFFFFFFF0, stored)
    reseal_block(data, pos)
    peak, raised = peak_while(lambda: restore_heap(bytes(data)))
    assert isinstance(raised, CorruptCheckpointError), raised
    assert "cannot hold" in str(raised)
    assert peak < 8 << 20


def test_an_uncompressed_block_must_hold_its_raw_length() -> None:
    data = bytearray(keyed_file("none"))
    pos = blocks(bytes(data))[0]
    kg, raw, stored = _FRAME.unpack_from(data, pos)
    _FRAME.pack_into(data, pos, kg, raw + 1, stored)
    reseal_block(data, pos)
    with pytest.raises(CorruptCheckpointError, match="cannot hold"):
        restore_heap(bytes(data))


def test_a_section_whose_columns_do_not_match_is_refused() -> None:
    """Two keys, one namespace, three values: before, the heap restore's zip raised a
    ValueError of its own."""
    from streamstate.format.codec import StateCodec

    codec = StateCodec(StrSerializer(), VoidNamespaceSerializer(), Int64Serializer())
    keys, namespaces, values = msgspec.msgpack.decode(
        codec.encode([("a", VOID_NAMESPACE, 1), ("b", VOID_NAMESPACE, 2)])
    )
    section = msgspec.msgpack.encode([keys, namespaces, [*values, 3]])
    with pytest.raises(CHECKPOINT_ERRORS, match="columns do not match"):
        restore_heap(keyed_file(section=section, count=2))


def restore_rocksdb(data: bytes, tmp_path: Path) -> None:
    from streamstate.backends.rocksdb.factory import RocksDBStateBackend

    handle = StateFileHandle(
        path="f", size=len(data), checksum=crc(data), kind="full", checkpoint_id=1
    )
    restore = FileKeyedStateRestore(_Bytes(data), handle, RANGE)
    factory = RocksDBStateBackend(working_dir=str(tmp_path / "work"))
    backend = factory.create_keyed_backend(StrSerializer(), 128, RANGE)
    try:
        backend.restore(RestoreInput([restore]))
    finally:
        restore.close()
        backend.dispose()


def test_an_int64_value_beyond_64_signed_bits_is_refused_by_both_backends(tmp_path: Path) -> None:
    """msgpack holds integers up to 2**64 - 1: before, the heap backend took one into an int64
    state and the RocksDB backend failed with a TypeError while storing it."""
    from streamstate.format.codec import StateCodec

    codec = StateCodec(StrSerializer(), VoidNamespaceSerializer(), Int64Serializer())
    keys, namespaces, _ = msgspec.msgpack.decode(codec.encode([("a", VOID_NAMESPACE, 1)]))
    section = msgspec.msgpack.encode([keys, namespaces, [2**64 - 1]])
    data = keyed_file(section=section, count=1)
    with pytest.raises(CHECKPOINT_ERRORS, match="state 'v', key group 7"):
        restore_heap(data)
    with pytest.raises(CHECKPOINT_ERRORS, match="state 'v'"):
        restore_rocksdb(data, tmp_path)
    # and no snapshot writes one: the file would not be read back
    meta = StateMetaInfo("v", "value", VoidNamespaceSerializer(), Int64Serializer())
    writer = KeyedSnapshotWriter(
        io.BytesIO(),
        path="f",
        key_serializer=StrSerializer(),
        max_parallelism=128,
        key_group_range=RANGE,
        states=[meta],
    )
    with pytest.raises(CheckpointError, match="cannot snapshot state 'v'.*18446744073709551615"):
        writer.write_key_group(7, [(0, [("a", VOID_NAMESPACE, 2**64 - 1)])])


@pytest.mark.parametrize(
    "edit",
    [
        lambda f: f.update(offsets=[float(x) for x in f["offsets"]]),
        lambda f: f.update(sizes=["x"] * len(f["sizes"])),
        lambda f: f.pop("entries"),
        lambda f: f.update(first_key_group=None),
    ],
    ids=["float-offsets", "string-sizes", "no-entries", "no-first"],
)
def test_a_key_group_index_of_the_wrong_shape_is_corrupt(edit: Any) -> None:
    with pytest.raises(CorruptCheckpointError, match="key-group index"):
        restore_heap(with_footer(keyed_file(), edit))


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_parallelism", "128"), ("compression", "zzz"), ("kind", "fulx"), ("states", 0)],
)
def test_a_header_of_the_wrong_shape_is_corrupt(field: str, value: Any) -> None:
    def edit(h: dict[str, Any]) -> None:
        h[field] = value

    data = keyed_file()
    _, _, header_len = _PREFIX.unpack_from(data)
    header = msgspec.msgpack.decode(data[_PREFIX.size : _PREFIX.size + header_len])
    edit(header)
    head = msgspec.msgpack.encode(header)
    # the blocks follow the header: rebuild the file around the new header
    rest = data[_PREFIX.size + header_len + 4 :]
    shift = len(head) - header_len

    def move(f: dict[str, Any]) -> None:
        f["offsets"] = [o + shift if o else 0 for o in f["offsets"]]

    fixed = with_footer(
        _PREFIX.pack(b"SSKS", 1, len(head)) + head + struct.pack(">I", crc(head)) + rest, move
    )
    with pytest.raises(CorruptCheckpointError, match="unreadable header"):
        restore_heap(fixed)


@pytest.mark.parametrize(
    "snapshot",
    [{"type": "list"}, "int64", {"type": "tuple", "fields": 3}, {"type": "nope"}, None],
    ids=["no-element", "not-a-map", "fields-not-a-list", "unknown", "none"],
)
def test_a_serializer_the_checkpoint_describes_badly_is_a_migration_error(snapshot: Any) -> None:
    with pytest.raises(SerializerSnapshotError):
        serializer_from_snapshot(snapshot)


def test_a_record_schema_a_checkpoint_gives_decodes_or_is_refused() -> None:
    """Values of a checkpoint described by its schema alone (``read_state``'s way): a record
    whose required field follows an optional one decodes; names no type can have are refused
    with the project's error, a malformed description gives no schema."""
    from streamstate.serializers.schema import FieldSchema, IntSchema, RecordSchema, StrSchema
    from streamstate.serializers.snapshot_schema import decoder_type, schema_of_snapshot

    assert schema_of_snapshot({"type": "tuple", "fields": 3}) is None
    late = RecordSchema(
        "Late", (FieldSchema("a", StrSchema(), False), FieldSchema("b", IntSchema()))
    )
    value = msgspec.msgpack.decode(msgspec.msgpack.encode({"b": 2}), type=decoder_type(late))
    assert (value.a, value.b) == (None, 2)
    for bad in (
        RecordSchema("R", (FieldSchema("not a name", IntSchema()),)),
        RecordSchema("R\x00", (FieldSchema("a", IntSchema()),)),
    ):
        with pytest.raises(SerializerSnapshotError, match="no type decodes"):
            decoder_type(bad)


def test_metadata_that_is_not_utf8_is_corrupt() -> None:
    data = b'{"format": "streamstate-checkpoint-metadata", "version": 2, "job_id": "\xff"}'
    with pytest.raises(CorruptCheckpointError, match="not valid JSON|malformed"):
        decode_metadata(data, "ck/chk-1/_metadata")


# ---- operator state -------------------------------------------------------------------------


def operator_file() -> bytes:
    out = io.BytesIO()
    lists = {
        "offsets": ListStateSnapshot(
            "offsets", OperatorStateMode.SPLIT_DISTRIBUTE, Int64Serializer(), [1, 2, 3]
        )
    }
    broadcast = {
        "rules": BroadcastStateSnapshot("rules", StrSerializer(), Int64Serializer(), {"r": 1})
    }
    write_operator_state(OperatorStateSnapshot(lists, broadcast), out, path="o")
    return out.getvalue()


def reseal_operator(data: bytes) -> bytes:
    from streamstate.devtools.fuzzing.mutations import reseal_operator as reseal

    return reseal(data)


def _operator_footer(edit: Callable[[dict[str, Any]], None]) -> bytes:
    return reseal_operator(with_footer(operator_file(), edit))


@pytest.mark.parametrize(
    "make",
    [
        lambda: (lambda d: d[:6] + struct.pack(">I", 0x7FFFFFFF) + d[10:])(operator_file()),
        lambda: _operator_footer(lambda f: f["states"][0].update(offset="12")),
        lambda: _operator_footer(lambda f: f["states"][0].pop("length")),
        lambda: _operator_footer(lambda f: f["states"][0].update(element_offsets=[0, 5000])),
        lambda: _operator_footer(lambda f: f["states"][1].update(offset=10**9)),
        lambda: _operator_footer(lambda f: f.update(states=None)),
        lambda: reseal_operator(operator_file().replace(b"offsets", b"offs\xffts")),
        lambda: reseal_operator(operator_file().replace(b"split_distribute", b"split_distribuTE")),
    ],
    ids=[
        "header-length",
        "offset-type",
        "no-length",
        "element-offsets-out-of-range",
        "state-outside-the-data",
        "no-index",
        "name-not-utf8",
        "unknown-mode",
    ],
)
def test_an_operator_state_file_of_the_wrong_shape_is_corrupt(make: Any) -> None:
    with pytest.raises(CorruptCheckpointError, match="corrupt operator-state file"):
        read_operator_state(make(), "o")


# ---- RocksDB manifests ----------------------------------------------------------------------


def manifest(**changes: Any) -> bytes:
    m = IncrementalManifest(
        checkpoint_id=1,
        backend_uid="u",
        key_serializer=StrSerializer().snapshot(),
        max_parallelism=128,
        key_group_range=(0, 63),
        states=[],
        shared=[],
        private=[],
    )
    return msgspec.structs.replace(m, **changes).encode()


def test_a_manifest_that_is_not_utf8_is_corrupt() -> None:
    data = manifest(backend_uid="uuuu")
    bad = data.replace(b"uuuu", b"u\xffuu")
    bad = bad[:6] + struct.pack(">I", crc(bad[10:])) + bad[10:]
    with pytest.raises(CorruptCheckpointError, match="unreadable"):
        IncrementalManifest.decode(bad, "chk-1/op/0-0.state")


@pytest.mark.parametrize(
    "changes",
    [
        {"max_parallelism": 2**40},
        {"key_group_range": (0, 500)},
        {"key_group_range": (-3, 10)},
        {"max_parallelism": 0},
    ],
)
def test_a_manifest_with_key_groups_of_no_max_parallelism_is_corrupt(changes: Any) -> None:
    with pytest.raises(CorruptCheckpointError, match="key groups"):
        IncrementalManifest.decode(manifest(**changes), "chk-1/op/0-0.state")


def test_timers_that_cannot_be_read_are_corrupt() -> None:
    from streamstate.backends.rocksdb.incremental import TimerBlock
    from streamstate.backends.timer_queues import TimerRestore
    from streamstate.format.meta import StateMetaSnapshot

    meta = StateMetaSnapshot(
        name="_timers.event",
        kind="timer",
        namespace_serializer=VoidNamespaceSerializer().snapshot(),
        state_serializer=Int64Serializer().snapshot(),
    )
    block = TimerBlock(meta, [(3, b"\xa2\xff\xfe", b"\xc0", 100)])  # a key that is not UTF-8
    backend = HeapStateBackend().create_keyed_backend(StrSerializer(), 128, RANGE)
    try:
        restore = TimerRestore(backend.timer_queues, backend.key_serializer)  # type: ignore[attr-defined]
        with pytest.raises(CorruptCheckpointError, match="timer cannot be read"):
            restore.add_native(block.meta, block.entries)
    finally:
        backend.dispose()


# ---- the host channel -----------------------------------------------------------------------


def _connection_receiving(records: list[bytes]) -> Any:
    """A host-side connection that receives ``records`` (plaintexts), each sealed as an
    authenticated peer seals it."""
    import socket

    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from streamstate.spark.wire.protocol import HOST_RECEIVES, Connection
    from streamstate.spark.wire.security import session_keys

    secret, nonces = bytes(32), (b"h" * 32, b"c" * 32)
    client = session_keys(secret, "h", *nonces, client=True)
    aead = AESGCM(client.send)
    wire = b""
    for seq, plain in enumerate(records):
        length = struct.pack("<I", len(plain) + 16)
        wire += length + aead.encrypt(bytes(4) + seq.to_bytes(8, "big"), plain, length)
    a, b = socket.socketpair()
    a.sendall(wire)
    a.close()
    b.settimeout(5)
    return Connection(b, session_keys(secret, "h", *nonces, client=False), HOST_RECEIVES)


@pytest.mark.parametrize(
    "record",
    [
        b"\x00\x00",
        b"\x00\x00\x00\x00" + msgspec.msgpack.encode({"t": "PING"})[:-4] + b"\xa4\xff\xfe\xfd\xfc",
    ],
    ids=["head-without-body-length", "header-not-utf8"],
)
def test_a_sealed_head_that_does_not_decode_is_a_protocol_error(record: bytes) -> None:
    from streamstate.spark.wire.protocol import ProtocolError

    conn = _connection_receiving([record])
    try:
        with pytest.raises(ProtocolError):
            conn.recv()
    finally:
        conn.close()


def _runtime() -> Any:
    import pyarrow as pa

    from streamstate.api.functions import KeyedProcessFunction
    from streamstate.checkpoint.storage import MemoryCheckpointStorage
    from streamstate.spark.job import JobSpec, arrow_schema_to_bytes
    from streamstate.spark.subtask import SubtaskRuntime

    class Count(KeyedProcessFunction):  # type: ignore[type-arg]
        def process_element(self, record: Any, ctx: Any) -> None:
            return None

    schema = pa.schema([("k", pa.string()), ("v", pa.int64()), ("_kg", pa.int32())])
    job = JobSpec(
        operator="op",
        parallelism=2,
        max_parallelism=128,
        key_columns=["k"],
        value_columns=["k", "v"],
        input_schema=arrow_schema_to_bytes(schema),
        output_schema=arrow_schema_to_bytes(pa.schema([("out", pa.string())])),
    )
    runtime = SubtaskRuntime(job, 0, Count, storage=MemoryCheckpointStorage())
    runtime.prepare(-1, "l")
    runtime.begin(0, 0)
    return runtime


def test_records_a_host_cannot_read_are_refused_before_they_are_read() -> None:
    import pyarrow as pa

    from streamstate.spark.wire.protocol import ProtocolError

    runtime = _runtime()
    try:
        keys = pa.StringArray.from_buffers(
            2, pa.py_buffer(struct.pack("<3i", 0, 2, 4)), pa.py_buffer(b"a\xff\xfeb")
        )  # the bytes of a key are not UTF-8
        ints, kgs = pa.array([1, 2], pa.int64()), pa.array([1, 2], pa.int32())
        bad_text = pa.record_batch([keys, ints, kgs], names=["k", "v", "_kg"])
        with pytest.raises(ProtocolError, match="malformed record batch"):
            runtime.process(bad_text)
        keys = pa.array(["a", "b"])
        no_kg = pa.record_batch([keys, ints], names=["k", "v"])
        with pytest.raises(ProtocolError, match="'_kg' as no such column"):
            runtime.process(no_kg)
        other = pa.record_batch([keys, ints, kgs.cast(pa.string())], names=["k", "v", "_kg"])
        with pytest.raises(ProtocolError, match="'_kg' as string"):
            runtime.process(other)
        foreign = pa.record_batch([keys, ints, pa.array([3, 100], pa.int32())], ["k", "v", "_kg"])
        with pytest.raises(KeyGroupOutOfRangeError, match="key groups 3-100"):
            runtime.process(foreign)
        runtime.process(pa.record_batch([keys, ints, kgs], names=["k", "v", "_kg"]))
    finally:
        runtime.close()


def test_the_fixed_regressions_leave_real_files_readable() -> None:
    for compression in ("none", "lz4", "zstd"):
        restore_heap(keyed_file(compression))
    assert read_operator_state(operator_file(), "o").list_states["offsets"].elements == [1, 2, 3]


# ---- RocksDB snapshots whose files verify but do not fit ------------------------------------


def _rocksdb_checkpoint(tmp_path: Path) -> Any:
    from streamstate.checkpoint.storage import FileSystemCheckpointStorage
    from streamstate.runtime.local import LocalRunner
    from support.checkpoint import AllKinds, all_kinds_records

    storage = FileSystemCheckpointStorage(str(tmp_path / "ck"), "job")
    runner = LocalRunner(
        AllKinds(),
        key_selector=lambda r: r[0],
        parallelism=1,
        max_parallelism=128,
        checkpoint_storage=storage,
        state_backend="rocksdb",
    )
    runner.run(all_kinds_records(30), final_watermark=False)
    runner.checkpoint()
    runner.close()
    return storage


def _restore_rocksdb_checkpoint(storage: Any, backend: str) -> None:
    from streamstate.format.keyed_file import write_keyed_snapshot
    from streamstate.runtime.local import LocalRunner
    from support.checkpoint import AllKinds

    runner = LocalRunner(
        AllKinds(), key_selector=lambda r: r[0], max_parallelism=128, state_backend=backend
    )
    try:
        runner.restore(storage.load(1))
        for op in runner.subtasks:  # what the next checkpoint would write
            write_keyed_snapshot(op.keyed_backend.snapshot(2), io.BytesIO(), path="next")
    finally:
        runner.close()


@pytest.mark.parametrize("backend", ["rocksdb", "heap"])
def test_database_files_rocksdb_refuses_are_a_corrupt_checkpoint(
    tmp_path: Path, backend: str
) -> None:
    """The manifest's MANIFEST file replaced by garbage with its size and CRC in order: before,
    a RocksDB backend raised StateBackendError and the heap backend rocksdict's bare Exception."""
    from support.tampering import edit_manifest, replaced

    storage = _rocksdb_checkpoint(tmp_path)

    def garbage(m: Any) -> Any:
        private = []
        for p in m.private:
            if p.name.startswith("MANIFEST-"):
                data = b"not a rocksdb manifest" * 8
                p = replaced(p, data=data, size=len(data), crc32c=crc(data))
            private.append(p)
        return replaced(m, private=private)

    edit_manifest(storage, "chk-1", garbage)
    with pytest.raises(CorruptCheckpointError, match="does not open"):
        _restore_rocksdb_checkpoint(storage, backend)


def test_values_that_do_not_fit_the_state_described_are_a_migration_error(tmp_path: Path) -> None:
    """The manifest says the "value" state holds lists; its SST files hold integers. Before,
    reading them (the heap backend restores a RocksDB checkpoint through its canonical view)
    raised msgspec's ValidationError."""
    from support.tampering import edit_manifest, replaced

    storage = _rocksdb_checkpoint(tmp_path)

    def retype(m: Any) -> Any:
        states = [
            replaced(s, state_serializer={"type": "list", "element": {"type": "str"}})
            if s.name == "value"
            else s
            for s in m.states
        ]
        return replaced(m, states=states)

    edit_manifest(storage, "chk-1", retype)
    with pytest.raises(StateMigrationException, match="state 'value'"):
        _restore_rocksdb_checkpoint(storage, "heap")
