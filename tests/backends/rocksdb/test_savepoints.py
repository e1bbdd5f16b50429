"""Canonical snapshots (savepoints, SPEC §6.4): heap <-> RocksDB at any parallelism."""

from __future__ import annotations

from typing import Any

import pytest

from streamstate import (
    AggregateFunction,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from streamstate.backends.heap.backend import HeapKeyedStateBackend
from streamstate.format.meta import TIMER_STATE_KIND
from streamstate.keygroups import (
    assign_to_key_group,
    compute_key_group_range_for_operator_index,
    compute_operator_index_for_key_group,
)
from streamstate.namespace import VOID_NAMESPACE
from streamstate.serializers import StrSerializer, serializer_for
from support.rocksdb import (
    canonical_content,
    make_rocks_fixture,  # noqa: F401 - fixtures
    restore_files,
    snapshot_files,
)

MAX_P = 128
NS = StrSerializer()


class Sum(AggregateFunction):
    def create_accumulator(self) -> list[int]:
        return [0]

    def add(self, value: int, acc: list[int]) -> list[int]:
        acc[0] += value
        return acc

    def get_result(self, acc: list[int]) -> int:
        return acc[0]

    def merge(self, a: list[int], b: list[int]) -> list[int]:
        return [a[0] + b[0]]


DESCRIPTORS = {
    "v": ValueStateDescriptor("v", str),
    "l": ListStateDescriptor("l", int),
    "m": MapStateDescriptor("m", str, float),
    "r": ReducingStateDescriptor("r", lambda a, b: a + b, int),
    "a": AggregatingStateDescriptor("a", Sum(), list[int]),
}


def _state(b: Any, name: str, ns: Any = VOID_NAMESPACE) -> Any:
    return b.get_partitioned_state(ns, None if ns is VOID_NAMESPACE else NS, DESCRIPTORS[name])


def _fill(backends: list[Any], n: int) -> None:
    p = len(backends)
    for k in range(n):
        kg = assign_to_key_group(k, MAX_P)
        b = backends[compute_operator_index_for_key_group(MAX_P, p, kg)]
        b.set_current_key(k, kg)
        _state(b, "v").update(f"v{k}")
        _state(b, "l", f"w{k % 2}").add_all([k, k + 1])
        _state(b, "m").put_all({"x": k / 2, f"k{k}": 1.5})
        _state(b, "r", "w").add(k)
        _state(b, "r", "w").add(1)
        _state(b, "a").add(k)


def _check(backends: list[Any], n: int) -> None:
    seen = set()
    for b in backends:
        for k in b.get_keys("v", VOID_NAMESPACE):
            seen.add(k)
            b.set_current_key(k)
            assert _state(b, "v").value() == f"v{k}"
            assert _state(b, "l", f"w{k % 2}").get() == [k, k + 1]
            assert _state(b, "l", f"w{(k + 1) % 2}").get() == []
            assert dict(_state(b, "m").items()) == {"x": k / 2, f"k{k}": 1.5}
            assert _state(b, "r", "w").get() == k + 1
            assert _state(b, "a").get() == k
    assert seen == set(range(n))


def _heap(i: int, p: int) -> HeapKeyedStateBackend:
    return HeapKeyedStateBackend(
        serializer_for(int), MAX_P, compute_key_group_range_for_operator_index(MAX_P, p, i)
    )


def load_into_heap(heap: HeapKeyedStateBackend, snapshots: list[Any]) -> None:
    """Test stand-in for the heap restore of the checkpoint branch: canonical entries -> tables."""
    start = heap.key_group_range.start
    for snap in snapshots:
        overlap = snap.key_group_range.intersection(heap.key_group_range)
        for kg in overlap:
            for index, entries in snap.key_group_entries(kg):
                meta = snap.states[index]
                if meta.kind == TIMER_STATE_KIND:
                    continue
                table = heap.register_state_table(
                    meta.name, meta.kind, meta.namespace_serializer, meta.state_serializer
                )
                for key, ns, state in entries:
                    table.maps[kg - start].put(key, ns, state)


@pytest.mark.parametrize(("p_heap", "p_rocks"), [(2, 3), (1, 1), (3, 1)])
def test_heap_savepoint_restores_into_rocksdb(make_rocks: Any, p_heap: int, p_rocks: int) -> None:
    heaps = [_heap(i, p_heap) for i in range(p_heap)]
    _fill(heaps, 600)
    files = snapshot_files(h.snapshot(1) for h in heaps)
    rocks = [make_rocks(i, p_rocks) for i in range(p_rocks)]
    for r in rocks:
        restore_files(r, files)
    _check(rocks, 600)


@pytest.mark.parametrize(("p_rocks", "p_heap"), [(3, 2), (1, 1), (2, 4)])
def test_rocksdb_savepoint_restores_into_heap(make_rocks: Any, p_rocks: int, p_heap: int) -> None:
    rocks = [make_rocks(i, p_rocks) for i in range(p_rocks)]
    _fill(rocks, 600)
    snaps = [r.snapshot(1) for r in rocks]
    heaps = [_heap(i, p_heap) for i in range(p_heap)]
    for h in heaps:
        load_into_heap(h, snaps)
    for s in snaps:
        s.release()
    _check(heaps, 600)


def test_rocksdb_savepoint_restores_into_rocksdb_at_another_parallelism(make_rocks: Any) -> None:
    rocks = [make_rocks(i, 2) for i in range(2)]
    _fill(rocks, 400)
    files = snapshot_files(r.snapshot(1) for r in rocks)
    again = [make_rocks(i, 3, name=f"again-{i}") for i in range(3)]
    for r in again:
        restore_files(r, files)
    _check(again, 400)


def test_canonical_content_equals_heap_content(make_rocks: Any) -> None:
    heap = _heap(0, 1)
    rocks = make_rocks()
    _fill([heap], 300)
    _fill([rocks], 300)
    with heap.snapshot(1) as hs, rocks.snapshot(1) as rs:
        assert canonical_content(rs) == canonical_content(hs)
        assert [m.to_dict() for m in rs.states] == [m.to_dict() for m in hs.states]


def test_savepoint_scan_is_isolated_from_later_writes_and_compaction(make_rocks: Any) -> None:
    rocks = make_rocks()
    _fill([rocks], 300)
    snap = rocks.snapshot(5)
    expected_keys = 300
    # delete everything, flush and compact the live database: the snapshot must not notice
    for k in range(300):
        rocks.set_current_key(k)
        for name in ("v", "m", "a"):
            _state(rocks, name).clear()
        _state(rocks, "l", f"w{k % 2}").clear()
        _state(rocks, "r", "w").clear()
    rocks.flush()
    rocks.instance.flush()
    for cf in rocks.instance.column_family_names():
        rocks.instance.db.get_column_family(cf).compact_range(None, None)
    content = canonical_content(snap)
    snap.release()
    assert sum(1 for (name, _, _) in content if name == "v") == expected_keys
    assert rocks.num_entries() == 0


def test_unregistered_restored_state_is_kept_in_savepoints(make_rocks: Any) -> None:
    rocks = make_rocks()
    _fill([rocks], 50)
    files = snapshot_files([rocks.snapshot(1)])
    again = make_rocks(name="again")
    restore_files(again, files)
    # only "v" is registered in the new program; the others must survive the next savepoint
    _state(again, "v")
    with again.snapshot(2) as snap:
        content = canonical_content(snap)
    assert {name for name, _, _ in content} == set(DESCRIPTORS)


def test_full_snapshot_applies_the_ttl_transform(make_rocks: Any) -> None:
    """The TTL decorator's hook filters entries written to full snapshots (test double)."""

    class Hook:
        state_name = "l"
        cleanup_full_snapshot = True
        max_entries_per_checkpoint = 0
        cursor = None

        @staticmethod
        def transform(lst: list[int]) -> list[int] | None:
            kept = [x for x in lst if x % 2 == 0]
            return kept or None

    rocks = make_rocks()
    _fill([rocks], 20)
    rocks.register_ttl_cleanup(Hook())
    with rocks.snapshot(1) as snap:
        lists = {k: v for (name, k, _), v in canonical_content(snap).items() if name == "l"}
    assert lists == {k: [k if k % 2 == 0 else k + 1] for k in range(20)}
