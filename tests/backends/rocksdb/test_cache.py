"""The write-back cache in front of RocksDB: correctness against an oracle, eviction, flushes."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from streamstate import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from streamstate.backends.rocksdb.backend import RocksDBKeyedStateBackend
from streamstate.backends.rocksdb.instance import RocksDBConfig
from streamstate.errors import StateBackendError
from streamstate.keygroups import KeyGroupRange
from streamstate.serializers import Int64Serializer, StrSerializer
from support.rocksdb import (
    make_rocks_fixture,  # noqa: F401 - fixtures
    raw_content,
)

NS = StrSerializer()
#: RocksDB syncs files on flush; on tmpfs that is free, which keeps the state machine quick
FAST_TMP = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
V = ValueStateDescriptor("v", int)
L = ListStateDescriptor("l", int)
M = MapStateDescriptor("m", int, str)
R = ReducingStateDescriptor("r", lambda a, b: a + b, int)


def _state(b: Any, d: Any, ns: str) -> Any:
    return b.get_partitioned_state(ns, NS, d)


class CacheMachine(RuleBasedStateMachine):
    """Random operations on four states through a tiny cache, checked against dicts.

    The cache holds at most ``capacity`` entries, so eviction, reload and flushes happen all the
    time; explicit flushes, evictions and snapshots are interleaved as well.
    """

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="cache-machine-", dir=FAST_TMP)
        self.b = RocksDBKeyedStateBackend(
            Int64Serializer(),
            128,
            KeyGroupRange(0, 127),
            options=RocksDBConfig(cache_entries=6, block_cache_size=1 << 20),
            path=self.dir,
        )
        self.value: dict[tuple[int, str], int] = {}
        self.lists: dict[tuple[int, str], list[int]] = {}
        self.maps: dict[tuple[int, str], dict[int, str]] = {}
        self.sums: dict[tuple[int, str], int] = {}
        self.key = 0
        self.b.set_current_key(0)

    def teardown(self) -> None:
        self.b.dispose()
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def here(self) -> tuple[int, str]:
        return self.key

    keys = st.integers(0, 3)
    nss = st.sampled_from(["a", "b"])

    @rule(key=keys)
    def set_key(self, key: int) -> None:
        self.key = key
        self.b.set_current_key(key)

    @rule(ns=nss, v=st.integers(-5, 5) | st.none())
    def value_update(self, ns: str, v: int | None) -> None:
        _state(self.b, V, ns).update(v)
        if v is None:
            self.value.pop((self.key, ns), None)
        else:
            self.value[(self.key, ns)] = v

    @rule(ns=nss)
    def value_read(self, ns: str) -> None:
        assert _state(self.b, V, ns).value() == self.value.get((self.key, ns))

    @rule(ns=nss, v=st.integers(0, 9))
    def list_add(self, ns: str, v: int) -> None:
        _state(self.b, L, ns).add(v)
        self.lists.setdefault((self.key, ns), []).append(v)

    @rule(ns=nss, vs=st.lists(st.integers(0, 9), max_size=3))
    def list_update(self, ns: str, vs: list[int]) -> None:
        _state(self.b, L, ns).update(vs)
        if vs:
            self.lists[(self.key, ns)] = list(vs)
        else:
            self.lists.pop((self.key, ns), None)

    @rule(ns=nss)
    def list_read(self, ns: str) -> None:
        got = _state(self.b, L, ns).get()
        assert got == self.lists.get((self.key, ns), [])
        got.append(99)  # the caller's copy: must not change the state

    @rule(target_ns=nss, source=nss)
    def list_merge(self, target_ns: str, source: str) -> None:
        _state(self.b, L, target_ns).merge_namespaces(target_ns, [source])
        if source != target_ns:
            moved = self.lists.pop((self.key, source), [])
            if moved:
                self.lists.setdefault((self.key, target_ns), []).extend(moved)

    @rule(ns=nss, k=st.integers(0, 2), v=st.text(max_size=2))
    def map_put(self, ns: str, k: int, v: str) -> None:
        _state(self.b, M, ns).put(k, v)
        self.maps.setdefault((self.key, ns), {})[k] = v

    @rule(ns=nss, k=st.integers(0, 2))
    def map_remove(self, ns: str, k: int) -> None:
        _state(self.b, M, ns).remove(k)
        d = self.maps.get((self.key, ns))
        if d is not None:
            d.pop(k, None)
            if not d:
                del self.maps[(self.key, ns)]

    @rule(ns=nss, k=st.integers(0, 2))
    def map_point_read(self, ns: str, k: int) -> None:
        s = _state(self.b, M, ns)
        d = self.maps.get((self.key, ns), {})
        assert s.get(k) == d.get(k)
        assert s.contains(k) == (k in d)

    @rule(ns=nss)
    def map_read_all(self, ns: str) -> None:
        s = _state(self.b, M, ns)
        d = self.maps.get((self.key, ns), {})
        assert s.is_empty() == (not d)
        assert dict(s.items()) == d
        assert sorted(s.keys()) == sorted(d)

    @rule(ns=nss)
    def map_clear(self, ns: str) -> None:
        _state(self.b, M, ns).clear()
        self.maps.pop((self.key, ns), None)

    @rule(ns=nss, v=st.integers(1, 5))
    def reduce_add(self, ns: str, v: int) -> None:
        _state(self.b, R, ns).add(v)
        self.sums[(self.key, ns)] = self.sums.get((self.key, ns), 0) + v

    @rule(ns=nss)
    def reduce_read(self, ns: str) -> None:
        assert _state(self.b, R, ns).get() == self.sums.get((self.key, ns))

    @rule()
    def flush(self) -> None:
        self.b.flush()

    @rule()
    def flush_and_evict_everything(self) -> None:
        self.b.flush()
        self.b.cache.clear()

    @precondition(lambda self: True)
    @rule()
    def snapshot_matches_oracle(self) -> None:
        with self.b.snapshot(1) as snap:
            names = [m.name for m in snap.states]
            found: dict[str, dict[tuple[int, str], Any]] = {n: {} for n in names}
            for kg in snap.key_group_range:
                for idx, entries in snap.key_group_entries(kg):
                    for key, ns, state in entries:
                        found[names[idx]][(key, ns)] = state
        assert found.get("v", {}) == self.value
        assert found.get("l", {}) == self.lists
        assert found.get("m", {}) == self.maps
        assert found.get("r", {}) == self.sums

    @invariant()
    def cache_is_bounded(self) -> None:
        # over the capacity only until the next record boundary (a handful of entries per step)
        assert self.b.cache.size() <= 6 + 16


TestCacheAgainstOracle = CacheMachine.TestCase
# 60 examples: the space is small (4 keys, 2 namespaces, values of a few kinds) and the
# targeted tests below pin the edges (read-your-writes, eviction, flush points, atomic flush,
# copies in and out)
TestCacheAgainstOracle.settings = settings(max_examples=60, stateful_step_count=50, deadline=None)


# ---- targeted tests --------------------------------------------------------------------------


def test_read_your_writes_and_delete_then_read(make_rocks: Any) -> None:
    b = make_rocks(cache_entries=100)
    v = b.get_partitioned_state("w", NS, V)
    b.set_current_key(1)
    v.update(5)
    assert v.value() == 5
    assert raw_content(b)["v"]  # flushed by raw_content
    v.update(None)
    assert v.value() is None  # the delete is only in the cache so far
    b.cache.flush()
    assert raw_content(b)["v"] == {}
    b.cache.clear()
    assert v.value() is None


def test_eviction_keeps_values_readable(make_rocks: Any) -> None:
    b = make_rocks(cache_entries=50)
    v = b.get_partitioned_state("w", NS, V)
    for k in range(1000):
        b.set_current_key(k)
        v.update(k * 2)
    assert b.cache.evictions > 0 and b.cache.flushes > 0
    assert b.cache.size() <= 50 + 64  # one size check every 64 boundaries at most
    for k in range(1000):
        b.set_current_key(k)
        assert v.value() == k * 2
    assert b.num_entries("v") == 1000


def test_flushes_happen_between_records_only(make_rocks: Any) -> None:
    """With capacity 0 the cache is written out at every record boundary, never within one."""
    b = make_rocks(cache_entries=0)
    v = b.get_partitioned_state("w", NS, V)
    s = b.get_partitioned_state("w", NS, R)
    b.set_current_key(1)
    v.update(1)
    s.add(10)
    inst = b.instance
    assert dict(inst.column_family("v").scan(b"", None)) == {}  # nothing written mid-record
    b.set_current_key(2)
    v.value()  # first access after the key change: the boundary
    assert len(dict(inst.column_family("v").scan(b"", None))) == 1
    assert len(dict(inst.column_family("r").scan(b"", None))) == 1


def test_flush_is_atomic_across_states(make_rocks: Any) -> None:
    """A flush that fails (a value that cannot be serialized) writes nothing at all."""
    b = make_rocks(cache_entries=1000)
    v = b.get_partitioned_state("w", NS, V)
    s = b.get_partitioned_state("w", NS, ValueStateDescriptor("other", int))
    b.set_current_key(1)
    v.update(1)
    b.flush()
    before = raw_content(b)
    v.update(2)
    # an int beyond 64 bits passes the check at the write (its class is int) and is refused
    # when serialized ("not an int" is refused at the write itself)
    s.update(2**70)
    with pytest.raises(StateBackendError, match="'other'.*cannot serialize"):
        b.flush()
    inst = b.instance
    after = {n: dict(inst.column_family(n).scan(b"", None)) for n in ("v", "other")}
    assert after == {"v": before["v"], "other": {}}  # v=2 was not written either
    s.update(3)
    b.flush()
    assert v.value() == 2 and s.value() == 3


def test_values_are_copied_in_and_out(make_rocks: Any) -> None:
    b = make_rocks()
    d = b.get_partitioned_state("w", NS, ValueStateDescriptor("d", dict[str, int]))
    m = b.get_partitioned_state("w", NS, MapStateDescriptor("mm", str, list[int]))
    b.set_current_key(1)
    value = {"a": 1}
    d.update(value)
    value["b"] = 2  # mutating after update does not change the state (as RocksDB in Flink)
    assert d.value() == {"a": 1}
    d.value()["c"] = 3
    assert d.value() == {"a": 1}
    items = [1]
    m.put("k", items)
    items.append(2)
    m.get("k").append(3)
    assert m.get("k") == [1]


@pytest.mark.parametrize("key_type", [int, str])
def test_flushed_keys_and_int64_values_are_the_layouts_encoding(
    make_rocks: Any, key_type: Any
) -> None:
    """The flush builds void-namespace keys inline and encodes int64 values with the struct
    directly: the bytes must be exactly what the key layout and the serializer write, and read
    back through misses."""
    from streamstate.keygroups import assign_to_key_group
    from streamstate.namespace import VOID_NAMESPACE
    from streamstate.serializers import VoidNamespaceSerializer

    # the second half of the key groups: the inline key must add the range start
    b = make_rocks(cache_entries=4, key_type=key_type, subtask=1, parallelism=2)
    v = b.get_partitioned_state(VOID_NAMESPACE, VoidNamespaceSerializer(), V)
    ints = [-(2**63), -1, 0, 1, 2**63 - 1, *range(2, 200)]
    keys = [k if key_type is int else f"k{k}" for k in ints]
    values = {k: i * 7 - 2**62 for i, k in enumerate(keys) if assign_to_key_group(k, 128) >= 64}
    assert len(values) > 20
    for k, x in values.items():
        b.set_current_key(k)
        v.update(x)
    layout = b._registered["v"].layout
    ser = Int64Serializer()
    expected = {
        layout.key_prefix(assign_to_key_group(k, 128), k): ser.serialize(x)
        for k, x in values.items()
    }
    assert raw_content(b)["v"] == expected
    b.cache.evict()
    for k, x in values.items():  # misses: read and decode from RocksDB
        b.set_current_key(k)
        assert v.value() == x
