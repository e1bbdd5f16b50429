"""The keyed snapshot file (SSKS): round trips against an oracle, corruption, bad values."""

from __future__ import annotations

import io
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamstate.errors import CheckpointError, CorruptCheckpointError
from streamstate.format.codec import CODECS, StateCodec
from streamstate.format.keyed_file import FORMAT_VERSION, KeyedSnapshotReader, write_keyed_snapshot
from streamstate.format.meta import StateMetaInfo
from streamstate.format.snapshot import DELTA_SNAPSHOT, DeltaEntries, SourcesKeyedStateSnapshot
from streamstate.keygroups import KeyGroupRange, assign_to_key_group
from streamstate.namespace import VOID_NAMESPACE
from streamstate.serializers import (
    DictSerializer,
    Int64Serializer,
    ListSerializer,
    StrSerializer,
    TupleSerializer,
    TypeSerializer,
    VoidNamespaceSerializer,
)
from support.checkpoint import ListSource, group_by_key_group

# (state serializer, value strategy) per state kind
KINDS: dict[str, tuple[TypeSerializer[Any], st.SearchStrategy[Any]]] = {
    "value": (Int64Serializer(), st.integers(-(2**63), 2**63 - 1)),
    "list": (
        ListSerializer(StrSerializer()),
        st.lists(st.text(max_size=5), min_size=1, max_size=4),
    ),
    "map": (
        DictSerializer(StrSerializer(), Int64Serializer()),
        st.dictionaries(st.text(max_size=4), st.integers(-1000, 1000), min_size=1, max_size=3),
    ),
    "reducing": (Int64Serializer(), st.integers(-(10**6), 10**6)),
    "aggregating": (
        TupleSerializer(Int64Serializer(), Int64Serializer()),
        st.tuples(st.integers(0, 10**9), st.integers(1, 1000)),
    ),
}
NAMESPACES: dict[str, tuple[TypeSerializer[Any], st.SearchStrategy[Any]]] = {
    "void": (VoidNamespaceSerializer(), st.just(VOID_NAMESPACE)),
    "int": (Int64Serializer(), st.integers(0, 5)),
    "str": (StrSerializer(), st.sampled_from(["w1", "w2", "ώ"])),
}
KEYS: dict[str, tuple[TypeSerializer[Any], st.SearchStrategy[Any]]] = {
    "int": (Int64Serializer(), st.integers(-(2**40), 2**40)),
    "str": (StrSerializer(), st.text(min_size=1, max_size=8)),
}


@st.composite
def snapshots(draw: st.DrawFn) -> dict[str, Any]:
    key_kind = draw(st.sampled_from(sorted(KEYS)))
    key_ser, key_values = KEYS[key_kind]
    max_p = draw(st.integers(1, 300))
    start = draw(st.integers(0, max_p - 1))
    end = draw(st.integers(start, max_p - 1))
    rng = KeyGroupRange(start, end)
    states = []
    for i in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(sorted(KINDS)))
        ns_kind = draw(st.sampled_from(sorted(NAMESPACES)))
        state_ser, values = KINDS[kind]
        ns_ser, namespaces = NAMESPACES[ns_kind]
        entries = draw(st.dictionaries(st.tuples(key_values, namespaces), values, max_size=25))
        in_range = {
            (k, ns): v
            for (k, ns), v in entries.items()
            if rng.contains(assign_to_key_group(k, max_p))
        }
        meta = StateMetaInfo(f"s{i}-{kind}", kind, ns_ser, state_ser)
        states.append((meta, in_range))
    return {"key_serializer": key_ser, "max_p": max_p, "range": rng, "states": states}


def _snapshot(spec: dict[str, Any], kind: str = "full", per_state: Any = None) -> Any:
    sources = []
    for i, (meta, entries) in enumerate(spec["states"]):
        if per_state is not None:
            per_kg = per_state[i]
        else:
            per_kg = group_by_key_group(
                ((k, ns, v) for (k, ns), v in entries.items()), spec["max_p"], spec["range"]
            )
        sources.append(ListSource(meta, per_kg))
    return SourcesKeyedStateSnapshot(
        spec["key_serializer"], spec["max_p"], spec["range"], sources, 7, kind=kind
    )


def _read_all(
    reader: KeyedSnapshotReader, spec: dict[str, Any], rng: KeyGroupRange | None = None
) -> list[dict[tuple[Any, Any], Any]]:
    """Decode the file into one dict per state (full files)."""
    out: list[dict[tuple[Any, Any], Any]] = [{} for _ in spec["states"]]
    codecs = [
        StateCodec(spec["key_serializer"], m.namespace_serializer, m.state_serializer)
        for m, _ in spec["states"]
    ]
    for kg, records in reader.read(rng):
        for r in records:
            keys, nss, values = codecs[r.state_id].decode(r.entries)
            assert len(keys) == r.count
            if len(nss) == 1:
                nss = nss * len(keys)
            for k, ns, v in zip(keys, nss, values, strict=True):
                assert assign_to_key_group(k, spec["max_p"]) == kg
                out[r.state_id][(k, ns)] = v
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=snapshots(), codec=st.sampled_from(CODECS), data=st.data())
def test_round_trip_against_oracle(spec: dict[str, Any], codec: str, data: st.DataObject) -> None:
    buf = io.BytesIO()
    summary = write_keyed_snapshot(_snapshot(spec), buf, path="mem://f", compression=codec)
    assert summary.size == len(buf.getvalue())
    reader = KeyedSnapshotReader(io.BytesIO(buf.getvalue()), "mem://f")
    assert reader.version == FORMAT_VERSION and reader.compression == codec
    assert reader.key_group_range == spec["range"]
    oracle = [entries for _, entries in spec["states"]]
    assert _read_all(reader, spec) == oracle
    assert sum(summary.entries.values()) == sum(len(o) for o in oracle)
    # a sub-range reads exactly the entries of its key groups
    rng = spec["range"]
    s = data.draw(st.integers(rng.start, rng.end))
    e = data.draw(st.integers(s, rng.end))
    sub = KeyGroupRange(s, e)
    expected = [
        {
            (k, ns): v
            for (k, ns), v in o.items()
            if sub.contains(assign_to_key_group(k, spec["max_p"]))
        }
        for o in oracle
    ]
    assert _read_all(reader, spec, sub) == expected


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=snapshots(), codec=st.sampled_from(CODECS), data=st.data())
def test_delta_round_trip(spec: dict[str, Any], codec: str, data: st.DataObject) -> None:
    """Delta files carry upserts and tombstones per state and key group."""
    max_p, rng = spec["max_p"], spec["range"]
    per_state = []
    expected = []
    for _meta, entries in spec["states"]:
        items = sorted(entries.items(), key=repr)
        removed = [kn for kn, _ in items if data.draw(st.booleans())]
        upserts = [(k, ns, v) for (k, ns), v in items if (k, ns) not in removed]
        per_kg: list[Any] = [None] * len(rng)
        for key, ns, v in upserts:
            i = assign_to_key_group(key, max_p) - rng.start
            per_kg[i] = per_kg[i] or DeltaEntries([], [])
            per_kg[i].upserts.append((key, ns, v))
        for key, ns in removed:
            i = assign_to_key_group(key, max_p) - rng.start
            per_kg[i] = per_kg[i] or DeltaEntries([], [])
            per_kg[i].removed.append((key, ns))
        per_state.append(per_kg)
        expected.append(({(k, ns): v for k, ns, v in upserts}, set(removed)))
    buf = io.BytesIO()
    write_keyed_snapshot(
        _snapshot(spec, DELTA_SNAPSHOT, per_state), buf, path="delta", compression=codec
    )
    reader = KeyedSnapshotReader(io.BytesIO(buf.getvalue()), "delta")
    assert reader.kind == DELTA_SNAPSHOT
    got = [({}, set()) for _ in spec["states"]]
    for _kg, records in reader.read():
        for r in records:
            meta = spec["states"][r.state_id][0]
            codec_ = StateCodec(
                spec["key_serializer"], meta.namespace_serializer, meta.state_serializer
            )
            keys, nss, values = codec_.decode(r.entries)
            nss = nss * len(keys) if len(nss) == 1 else nss
            got[r.state_id][0].update(
                {(k, ns): v for k, ns, v in zip(keys, nss, values, strict=True)}
            )
            assert r.removed is not None
            gk, gns = codec_.decode_removed(r.removed)
            gns = gns * len(gk) if len(gns) == 1 else gns
            got[r.state_id][1].update(zip(gk, gns, strict=True))
    assert got == expected


def _small_file(codec: str = "lz4") -> bytes:
    meta = StateMetaInfo("counts", "value", VoidNamespaceSerializer(), Int64Serializer())
    entries = [(f"k{i}", VOID_NAMESPACE, i) for i in range(200)]
    rng = KeyGroupRange(0, 127)
    snap = SourcesKeyedStateSnapshot(
        StrSerializer(), 128, rng, [ListSource(meta, group_by_key_group(entries, 128, rng))]
    )
    buf = io.BytesIO()
    write_keyed_snapshot(snap, buf, path="f", compression=codec)
    return buf.getvalue()


def test_every_key_group_is_released_after_it_is_written() -> None:
    meta = StateMetaInfo("v", "value", VoidNamespaceSerializer(), Int64Serializer())
    rng = KeyGroupRange(10, 19)
    source = ListSource(meta, [[(1, VOID_NAMESPACE, 1)]] + [None] * 9)
    snap = SourcesKeyedStateSnapshot(Int64Serializer(), 128, rng, [source])
    write_keyed_snapshot(snap, io.BytesIO(), path="f")
    assert source.released == set(range(10))


@pytest.mark.parametrize("codec", CODECS)
def test_flipped_byte_in_a_block_names_file_and_key_group(codec: str) -> None:
    data = bytearray(_small_file(codec))
    reader = KeyedSnapshotReader(io.BytesIO(bytes(data)), "f")
    kg = reader.key_groups()[5]
    offset = reader._offsets[kg]
    data[offset + 14] ^= 0x40  # inside the stored bytes of that block
    reader = KeyedSnapshotReader(io.BytesIO(bytes(data)), "/ck/chk-1/op/0-0.state")
    before = reader.key_groups()[:5]
    seen = []
    with pytest.raises(CorruptCheckpointError, match=rf"/ck/chk-1/op/0-0.state \(key group {kg}\)"):
        for got_kg, _ in reader.read():
            seen.append(got_kg)
    assert seen == before  # nothing of the corrupt key group was yielded
    # other key groups can still be read on their own
    assert reader.read_key_group(before[0])


@pytest.mark.parametrize(
    ("where", "message"),
    [(0, "not a keyed snapshot"), (12, "header checksum"), (-3, "end magic"), (-9, "footer")],
)
def test_corrupt_header_footer_and_magic(where: int, message: str) -> None:
    data = bytearray(_small_file())
    data[where] ^= 0x01
    with pytest.raises(CorruptCheckpointError, match=message):
        KeyedSnapshotReader(io.BytesIO(bytes(data)), "f")


def test_truncated_file_is_corrupt() -> None:
    data = _small_file()
    for cut in (5, len(data) // 2, len(data) - 1):
        with pytest.raises(CorruptCheckpointError):
            KeyedSnapshotReader(io.BytesIO(data[:cut]), "f")


def test_newer_format_version_is_refused_clearly() -> None:
    data = bytearray(_small_file())
    struct.pack_into(">H", data, 4, FORMAT_VERSION + 1)
    with pytest.raises(CheckpointError, match="version 2 is not supported.*upgrade"):
        KeyedSnapshotReader(io.BytesIO(bytes(data)), "f")


@pytest.mark.parametrize(
    ("serializer", "bad", "detail"),
    [
        (Int64Serializer(), "seven", "Expected `int`, got `str`"),
        (Int64Serializer(), True, "Expected `int`, got `bool`"),
        (Int64Serializer(), 2**70, "cannot be encoded"),
        (ListSerializer(StrSerializer()), ["a", 1], "Expected `str`, got `int`"),
        (
            TupleSerializer(Int64Serializer(), Int64Serializer()),
            (1,),
            "Expected `array` of length 2",
        ),
        (Int64Serializer(), object(), "cannot be encoded"),
    ],
)
def test_value_not_matching_its_serializer_fails_the_snapshot(
    serializer: TypeSerializer[Any], bad: Any, detail: str
) -> None:
    meta = StateMetaInfo("orders", "value", VoidNamespaceSerializer(), serializer)
    rng = KeyGroupRange(0, 127)
    entries = [("bad-key", VOID_NAMESPACE, bad)]
    snap = SourcesKeyedStateSnapshot(
        StrSerializer(), 128, rng, [ListSource(meta, group_by_key_group(entries, 128, rng))]
    )
    kg = assign_to_key_group("bad-key", 128)
    with pytest.raises(CheckpointError) as info:
        write_keyed_snapshot(snap, io.BytesIO(), path="/ck/chk-2/op/0-0.state")
    msg = str(info.value)
    assert f"state 'orders' in key group {kg}" in msg
    assert "/ck/chk-2/op/0-0.state" in msg and "'bad-key'" in msg and detail in msg


def test_large_key_group_is_encoded_in_chunks_and_reads_back() -> None:
    meta = StateMetaInfo("big", "value", VoidNamespaceSerializer(), Int64Serializer())
    n = 40_000  # more than two 16k chunks in one key group
    pauses = []
    snap = SourcesKeyedStateSnapshot(
        Int64Serializer(),
        1,
        KeyGroupRange(0, 0),
        [ListSource(meta, [[(i, VOID_NAMESPACE, i * 2) for i in range(n)]])],
    )
    buf = io.BytesIO()
    write_keyed_snapshot(snap, buf, path="f", pause=lambda: pauses.append(1))
    assert len(pauses) >= 4
    reader = KeyedSnapshotReader(io.BytesIO(buf.getvalue()), "f")
    (record,) = reader.read_key_group(0)
    keys, nss, values = StateCodec(
        Int64Serializer(), VoidNamespaceSerializer(), Int64Serializer()
    ).decode(record.entries)
    assert keys == list(range(n)) and values == [i * 2 for i in range(n)]
    assert nss == [VOID_NAMESPACE]
