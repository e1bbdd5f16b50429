"""CopyOnWriteStateMap (SPEC §5.2): constants, incremental rehash, copy-on-write, snapshots."""

from __future__ import annotations

import doctest
import gc
import random
import threading
import weakref
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, event, settings, target
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    rule,
    run_state_machine_as_test,
)

from streamstate.backends.heap import CopyOnWriteStateMap, StateMap, StateMapSnapshot
from streamstate.backends.heap import copy_on_write as cow
from streamstate.backends.heap.copy_on_write import (
    DEFAULT_CAPACITY,
    MAXIMUM_CAPACITY,
    MIN_TRANSFERRED_PER_INCREMENTAL_REHASH,
    MINIMUM_CAPACITY,
    CopyOnWriteStateMapSnapshot,
    PyStateMapEntry,
    StateMapEntry,
)
from streamstate.serializers import Int64Serializer, ListSerializer

try:
    from streamstate.backends.heap import _entry
except ImportError:  # not built: test_entry.py fails on that, this file tests the reference
    _entry = None  # type: ignore[assignment]

NS = "ns"

ENTRY_TYPES = [pytest.param(PyStateMapEntry, id="python-entry")]
if _entry is not None:
    ENTRY_TYPES.append(pytest.param(_entry.StateMapEntry, id="compiled-entry"))


@pytest.fixture(autouse=True, params=ENTRY_TYPES)
def entry_type(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> type:
    """Every test runs with the pure-Python reference entry and with the compiled one: the
    map's code is the same, only the type of the entries it creates differs."""
    monkeypatch.setattr(cow, "StateMapEntry", request.param)
    return request.param  # type: ignore[no-any-return]


def live_entry_count(entry_type: type) -> int:
    """Entries of ``entry_type`` alive in the process (the compiled entry is not tracked by
    the cyclic GC, so ``gc.get_objects`` cannot see it; its module counts its instances)."""
    gc.collect()
    if entry_type is PyStateMapEntry:
        return sum(1 for o in gc.get_objects() if type(o) is PyStateMapEntry)
    return _entry.live_entries()


class Box(list):
    """A list state that supports weak references (plain lists do not)."""

    __slots__ = ("__weakref__",)


def bucket_of(m: CopyOnWriteStateMap, key: Any, ns: Any = NS) -> int:
    return hash((key, ns)) & (m.capacity - 1)


def colliding_keys(m: CopyOnWriteStateMap, n: int, ns: Any = NS) -> list[int]:
    """``n`` int keys that land in the same primary bucket."""
    first = bucket_of(m, 0, ns)
    keys = [k for k in range(100_000) if bucket_of(m, k, ns) == first]
    return keys[:n]


def chain(head: StateMapEntry | None) -> list[StateMapEntry]:
    out = []
    while head is not None:
        out.append(head)
        head = head.next
    return out


def content(it: Any) -> dict[tuple[Any, Any], Any]:
    out: dict[tuple[Any, Any], Any] = {}
    for k, ns, s in it:
        assert (k, ns) not in out, f"duplicate entry {(k, ns)}"
        out[(k, ns)] = s
    return out


def check_structure(m: CopyOnWriteStateMap) -> None:
    """Every entry sits in the bucket its hash selects, in the table the rehash index selects.
    (The model-based test calls it after every step: the chains are walked inline, the empty
    buckets, most of them, skipped at once.)"""
    primary = m._primary
    ri = m.rehash_index
    mask = len(primary) - 1
    count = 0
    for i, e in enumerate(primary):
        if e is None:
            continue
        assert i >= ri, "a moved primary bucket still holds entries"
        while e is not None:
            assert e.hash == hash((e.key, e.namespace))
            assert e.hash & mask == i
            count += 1
            e = e.next
    assert count == m._primary_size
    if m.is_rehashing:
        rt = m._rehash_table
        assert len(rt) == 2 * len(primary)
        rmask = len(rt) - 1
        rcount = 0
        for i, e in enumerate(rt):
            if e is None:
                continue
            assert (i & mask) < ri, "an entry in a bucket not moved yet"
            while e is not None:
                assert e.hash & rmask == i
                rcount += 1
                e = e.next
        assert rcount == m._rehash_size
    else:
        assert m._rehash_size == 0 and ri == 0
    assert len(m) == m._primary_size + m._rehash_size


# -- constants and construction --------------------------------------------------------------------


def test_constants() -> None:
    assert DEFAULT_CAPACITY == 128
    assert MINIMUM_CAPACITY == 4
    assert MAXIMUM_CAPACITY == 2**30
    assert MIN_TRANSFERRED_PER_INCREMENTAL_REHASH == 4
    m = CopyOnWriteStateMap()
    assert isinstance(m, StateMap)
    assert m.capacity == 128 and m._threshold == 96 and not m.is_rehashing
    assert m.state_map_version == 0 and m.highest_required_snapshot_version == 0


@pytest.mark.parametrize(
    ("asked", "got"), [(0, 4), (1, 4), (4, 4), (5, 8), (100, 128), (129, 256), (2**31, 2**30)]
)
def test_capacity_is_rounded_to_a_power_of_two(asked: int, got: int) -> None:
    if got == 2**30:  # do not allocate a 2**30 slot table: check the rule only
        assert min(max(asked, MINIMUM_CAPACITY), MAXIMUM_CAPACITY) == got
        return
    m = CopyOnWriteStateMap(capacity=asked)
    assert m.capacity == got
    assert m._threshold == (got >> 1) + (got >> 2)


def test_negative_capacity_rejected() -> None:
    with pytest.raises(ValueError, match="negative"):
        CopyOnWriteStateMap(capacity=-1)


def test_doctests() -> None:
    result = doctest.testmod(cow, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 20 and result.failed == 0


# -- incremental rehash ----------------------------------------------------------------------------


def test_98th_distinct_insert_starts_a_rehash() -> None:
    m = CopyOnWriteStateMap()
    for k in range(97):
        m.put(k, NS, k)
    assert not m.is_rehashing and m.capacity == 128 and len(m) == 97
    m.put(0, NS, "overwrite")  # not an insert: no rehash
    assert not m.is_rehashing
    m.put(97, NS, 97)  # size 97 > threshold 96
    assert m.is_rehashing
    assert len(m._rehash_table) == 256 and m.capacity == 128 and m.rehash_index == 0
    assert m._threshold == 192
    check_structure(m)


def start_rehash(entries: int = 97) -> CopyOnWriteStateMap:
    m = CopyOnWriteStateMap()
    for k in range(entries):
        m.put(k, NS, k)
    m.put(-1, NS, -1)
    assert m.is_rehashing and m.rehash_index == 0
    return m


def test_bucket_i_splits_into_i_and_i_plus_old_len() -> None:
    m = start_rehash()
    before = {i: {e.key for e in chain(h)} for i, h in enumerate(m._primary)}
    old_len = m.capacity
    while m.is_rehashing:
        m.contains(0, NS)
        ri = m.rehash_index or old_len
        rt = m._primary if not m.is_rehashing else m._rehash_table
        for i in range(ri):
            moved = {e.key for e in chain(rt[i])} | {e.key for e in chain(rt[i + old_len])}
            assert moved == before[i]
            assert all(e.hash & (old_len - 1) == i for e in chain(rt[i + old_len]))
    assert m.capacity == 2 * old_len


def test_rehash_step_moves_whole_buckets_and_at_least_four_entries() -> None:
    m = start_rehash()
    steps = 0
    while m.is_rehashing:
        r0 = m.rehash_index
        primary = m._primary
        sizes = [len(chain(primary[i])) for i in range(len(primary))]
        m.get(123456, NS)  # a miss: a read advances the rehash too
        steps += 1
        if not m.is_rehashing:
            assert all(x is None for x in primary)  # the old table is left empty
            break
        r1 = m.rehash_index
        assert r1 > r0
        moved = sum(sizes[r0:r1])
        assert moved >= MIN_TRANSFERRED_PER_INCREMENTAL_REHASH
        # it stops at the first bucket boundary at or after 4 entries
        assert sum(sizes[r0 : r1 - 1]) < MIN_TRANSFERRED_PER_INCREMENTAL_REHASH
        assert all(primary[i] is None for i in range(r1))
        assert [len(chain(primary[i])) for i in range(r1, len(primary))] == sizes[r1:]
        check_structure(m)
    assert steps > 1


@pytest.mark.parametrize(
    "op",
    [
        lambda m: m.get(0, NS),
        lambda m: m.get(10**9, NS),
        lambda m: m.contains(1, NS),
        lambda m: m.put(2, NS, 2),
        lambda m: m.remove(10**9, NS),
        lambda m: m.remove_and_get_old(3, NS),
        lambda m: m.put_and_get_old(4, NS, 4),
        lambda m: m.transform(5, NS, 1, lambda s, v: v),
    ],
    ids=["get", "get-miss", "contains", "put", "remove-miss", "remove", "put_old", "transform"],
)
def test_every_operation_advances_the_rehash(op: Any) -> None:
    m = start_rehash()
    op(m)
    assert m.rehash_index > 0
    check_structure(m)


def test_rehash_step_scans_empty_buckets_until_four_entries() -> None:
    m = CopyOnWriteStateMap(capacity=128)
    keys = [k for k in range(10_000) if bucket_of(m, k) >= 120][:97]
    for k in keys:
        m.put(k, NS, k)
    m.put(keys[0], NS, 0)
    other = next(k for k in range(10_000, 20_000) if bucket_of(m, k) >= 120)
    m.put(other, NS, 0)
    assert m.is_rehashing
    m.contains(0, NS)
    assert m.rehash_index > 120  # 120 empty buckets scanned in one step


def test_growth_to_several_doublings_keeps_content() -> None:
    m = CopyOnWriteStateMap(capacity=4)
    for k in range(5000):
        m.put(k * 1024, NS, k)  # multiples of a power of two must still spread
        if k % 97 == 0:
            check_structure(m)
    assert m.capacity >= 4096
    lengths = [len(chain(h)) for h in m._primary]
    assert max(lengths) < 12
    assert content(m) == {(k * 1024, NS): k for k in range(5000)}


def test_large_tables_are_prebuilt_from_the_retired_one() -> None:
    m = CopyOnWriteStateMap(Int64Serializer())
    k = 0
    while m.capacity < 2**16 or m.is_rehashing:
        m.put(k, NS, k)
        k += 1
    spare = m._spare
    assert spare is not None and all(x is None for x in spare)
    while not m.is_rehashing:
        m.put(k, NS, k)
        k += 1
    assert m._rehash_table is spare and len(spare) == 2**17
    while m.is_rehashing:
        m.get(0, NS)
    assert m.capacity == 2**17
    check_structure(m)
    assert len(m) == k


def test_max_capacity_stops_doubling() -> None:
    m = CopyOnWriteStateMap(capacity=4)
    m._primary = [None] * 4
    original = cow.MAXIMUM_CAPACITY
    try:
        cow.MAXIMUM_CAPACITY = 4
        m._double_capacity()
        assert not m.is_rehashing
    finally:
        cow.MAXIMUM_CAPACITY = original


def test_double_capacity_during_rehash_is_an_error() -> None:
    m = start_rehash()
    with pytest.raises(RuntimeError, match="already a rehash"):
        m._double_capacity()


# -- copy-on-write ---------------------------------------------------------------------------------


def test_head_insertion() -> None:
    m = CopyOnWriteStateMap()
    a, b, c = colliding_keys(m, 3)
    for k in (a, b, c):
        m.put(k, NS, k)
    assert [e.key for e in chain(m._primary[bucket_of(m, a)])] == [c, b, a]


def test_insert_after_snapshot_copies_nothing() -> None:
    m = CopyOnWriteStateMap()
    a, b, c = colliding_keys(m, 3)
    m.put(a, NS, [a])
    m.put(b, NS, [b])
    old = chain(m._primary[bucket_of(m, a)])
    snap = m.snapshot()
    m.put(c, NS, [c])
    now = chain(m._primary[bucket_of(m, a)])
    assert now[0].key == c and now[0].entry_version == snap.version
    assert now[1] is old[0] and now[2] is old[1]
    snap.release()


def test_copy_on_write_copies_exactly_the_chain_prefix() -> None:
    m = CopyOnWriteStateMap()
    keys = colliding_keys(m, 4)
    for k in keys:
        m.put(k, NS, [k])
    bucket = bucket_of(m, keys[0])
    before = chain(m._primary[bucket])  # head insertion: keys[3], keys[2], keys[1], keys[0]
    snap = m.snapshot()
    m.put(keys[2], NS, ["new"])  # second link of the chain
    after = chain(m._primary[bucket])
    assert [e.key for e in after] == [e.key for e in before]
    assert after[0] is not before[0] and after[1] is not before[1]  # copied prefix
    assert after[2] is before[2] and after[3] is before[3]  # shared suffix
    assert after[0].entry_version == after[1].entry_version == snap.version
    assert after[0].state is before[0].state  # copying an entry keeps its state object
    assert after[1].state == ["new"] and before[1].state == [keys[2]]
    # the snapshot still walks the old chain
    assert chain(snap.bucket_heads()[bucket]) == before
    # a second write to the copied entry copies nothing more
    m.put(keys[2], NS, ["newer"])
    assert chain(m._primary[bucket]) == after
    snap.release()


def test_get_copies_the_prefix_and_the_state() -> None:
    m = CopyOnWriteStateMap()
    keys = colliding_keys(m, 3)
    for k in keys:
        m.put(k, NS, [k])
    bucket = bucket_of(m, keys[0])
    before = chain(m._primary[bucket])
    snap = m.snapshot()
    got = m.get(keys[1], NS)  # the middle link
    after = chain(m._primary[bucket])
    assert after[0] is not before[0] and after[1] is not before[1] and after[2] is before[2]
    assert got == before[1].state and got is not before[1].state
    assert after[1].state is got and after[1].state_version == snap.version
    assert after[0].state is before[0].state and after[0].state_version < snap.version
    got.append("mutated")
    assert content(snap)[(keys[1], NS)] == [keys[1]]
    # the copied head still shares its state: a read copies the state but no entry
    head_state = m.get(keys[2], NS)
    assert head_state is not before[0].state and chain(m._primary[bucket])[0] is after[0]
    # once the state is private, reads return it as is
    assert m.get(keys[1], NS) is got
    snap.release()


def test_contains_never_copies() -> None:
    m = CopyOnWriteStateMap()
    keys = colliding_keys(m, 3)
    for k in keys:
        m.put(k, NS, [k])
    before = chain(m._primary[bucket_of(m, keys[0])])
    snap = m.snapshot()
    assert m.contains(keys[0], NS)
    assert chain(m._primary[bucket_of(m, keys[0])]) == before
    snap.release()


def test_remove_head_relinks_the_bucket_and_middle_copies_the_prefix() -> None:
    m = CopyOnWriteStateMap()
    keys = colliding_keys(m, 4)
    for k in keys:
        m.put(k, NS, [k])
    bucket = bucket_of(m, keys[0])
    before = chain(m._primary[bucket])  # keys 3, 2, 1, 0
    snap = m.snapshot()
    m.remove(keys[3], NS)  # head: no copy
    assert chain(m._primary[bucket]) == before[1:]
    assert m.remove_and_get_old(keys[1], NS) == [keys[1]]  # third link of the original
    after = chain(m._primary[bucket])
    assert [e.key for e in after] == [keys[2], keys[0]]
    assert after[0] is not before[1] and after[1] is before[3]
    assert chain(snap.bucket_heads()[bucket]) == before
    assert content(snap) == {(k, NS): [k] for k in keys}
    snap.release()


def test_old_states_returned_by_writes_are_copies_when_shared() -> None:
    m = CopyOnWriteStateMap()
    m.put(1, NS, [1])
    m.put(2, NS, [2])
    m.put(3, NS, [3])
    snap = m.snapshot()
    old = m.put_and_get_old(1, NS, [10])
    old.append("x")
    removed = m.remove_and_get_old(2, NS)
    removed.append("x")
    m.transform(3, NS, 30, lambda s, v: s.append(v) or s)
    assert m.get(3, NS) == [3, 30]
    assert content(snap) == {(1, NS): [1], (2, NS): [2], (3, NS): [3]}
    snap.release()
    # without a snapshot nothing is copied
    s = m.get(1, NS)
    assert m.put_and_get_old(1, NS, [11]) is s


def test_immutable_serializer_never_copies() -> None:
    class Frozen:
        pass

    ser = Int64Serializer()
    assert ser.immutable
    m = CopyOnWriteStateMap(ser)
    state = Frozen()
    m.put(1, NS, state)
    snap = m.snapshot()
    assert m.get(1, NS) is state
    assert m.put_and_get_old(1, NS, 2) is state
    snap.release()


def test_serializer_copy_is_used() -> None:
    ser = ListSerializer(Int64Serializer())
    m = CopyOnWriteStateMap(ser)
    m.put(1, NS, [1, 2])
    snap = m.snapshot()
    got = m.get(1, NS)
    assert got == [1, 2] and got is not next(iter(snap))[2]
    snap.release()


def test_transform_failure_leaves_the_map_unchanged() -> None:
    m = CopyOnWriteStateMap()
    m.put(1, NS, [1])

    def boom(s: Any, v: Any) -> Any:
        raise KeyError("boom")

    with pytest.raises(KeyError):
        m.transform(2, NS, 0, boom)
    with pytest.raises(KeyError):
        m.transform(1, NS, 0, boom)
    assert content(m) == {(1, NS): [1]}


def test_namespace_objects_are_deduplicated_on_insert() -> None:
    m = CopyOnWriteStateMap()
    ns1 = ("window", 0, 10)
    ns2 = tuple(["window", 0, 10])
    assert ns1 == ns2 and ns1 is not ns2
    m.put(1, ns1, 1)
    m.put(2, ns2, 2)
    namespaces = [ns for _, ns, _ in m]
    assert namespaces[0] is namespaces[1]


# -- snapshots -------------------------------------------------------------------------------------


def test_snapshot_while_rehashing_takes_the_three_slices() -> None:
    m = start_rehash()
    for _ in range(5):
        m.contains(0, NS)
    ri, old_len = m.rehash_index, m.capacity
    assert 0 < ri < old_len
    expected = content(m)
    snap = m.snapshot()
    assert isinstance(snap, CopyOnWriteStateMapSnapshot) and isinstance(snap, StateMapSnapshot)
    heads = snap.bucket_heads()
    assert len(heads) == (old_len - ri) + ri + ri
    assert heads[: old_len - ri] == m._primary[ri:]
    half = len(m._rehash_table) // 2
    assert heads[old_len - ri :] == m._rehash_table[:ri] + m._rehash_table[half : half + ri]
    for k in range(500, 700):  # finish the rehash and start the next one
        m.put(k, NS, k)
        m.remove(k - 400, NS)
    assert content(snap) == expected and len(snap) == len(expected)
    snap.release()


def test_snapshot_shares_the_bucket_array_until_the_first_bucket_write() -> None:
    m = CopyOnWriteStateMap()
    for k in range(50):
        m.put(k, NS, [k])
    table = m._primary
    snap = m.snapshot()
    assert snap._primary is table  # O(1): nothing copied, no entry touched
    m.contains(1, NS)
    assert m._primary is table  # reads do not copy
    m.put(1000, NS, [1000])  # the first bucket write copies the array
    assert m._primary is not table and snap._primary is table
    copied = m._primary
    m.put(1001, NS, [1001])
    assert m._primary is copied  # once
    assert content(snap) == {(k, NS): [k] for k in range(50)}
    snap.release()


@pytest.mark.parametrize(
    "write",
    [
        lambda m: m.put(999, NS, [0]),  # insert
        lambda m: m.remove(m._primary[next(i for i, h in enumerate(m._primary) if h)].key, NS),
        lambda m: m.get(m._primary[next(i for i, h in enumerate(m._primary) if h)].key, NS),
        lambda m: m.put(m._primary[next(i for i, h in enumerate(m._primary) if h)].key, NS, []),
    ],
    ids=["insert", "remove-head", "get-head", "put-head"],
)
def test_every_bucket_write_after_a_snapshot_copies_the_array(write: Any) -> None:
    m = CopyOnWriteStateMap()
    for k in range(50):
        m.put(k, NS, [k])
    table = m._primary
    snap = m.snapshot()
    write(m)
    assert m._primary is not table
    assert content(snap) == {(k, NS): [k] for k in range(50)}
    snap.release()


def test_released_snapshot_leaves_the_array_uncopied() -> None:
    m = CopyOnWriteStateMap()
    m.put(1, NS, [1])
    table = m._primary
    first, second = m.snapshot(), m.snapshot()
    first.release()
    m.put(2, NS, [2])  # the second snapshot still holds the array
    assert m._primary is not table
    second.release()
    table = m._primary
    m.snapshot().release()
    m.put(3, NS, [3])
    assert m._primary is table  # nobody holds it any more


def test_snapshot_while_rehashing_shares_both_tables() -> None:
    m = start_rehash()
    m.contains(0, NS)
    primary, rehash_table = m._primary, m._rehash_table
    snap = m.snapshot()
    m.contains(1, NS)  # a rehash step writes both tables: both are copied first
    assert m._primary is not primary and m._rehash_table is not rehash_table
    assert snap._primary is primary and snap._rehash_table is rehash_table
    snap.release()


def test_several_snapshots_released_in_any_order() -> None:
    m = CopyOnWriteStateMap()
    m.put(1, NS, [0])
    snaps = []
    for i in range(1, 4):
        snaps.append(m.snapshot())
        m.get(1, NS).append(i)
    assert [s.version for s in snaps] == [1, 2, 3]
    assert m.snapshot_versions == (1, 2, 3) and m.highest_required_snapshot_version == 3
    snaps[2].release()
    assert m.highest_required_snapshot_version == 2
    snaps[0].release()
    assert m.highest_required_snapshot_version == 2 and m.snapshot_versions == (2,)
    assert list(snaps[1]) == [(1, NS, [0, 1])]
    snaps[1].release()
    assert m.highest_required_snapshot_version == 0 and m.state_map_version == 3
    assert m.get(1, NS) == [0, 1, 2, 3]


def test_releasing_an_unknown_version_raises() -> None:
    m = CopyOnWriteStateMap()
    with pytest.raises(ValueError, match="unknown snapshot version 7"):
        m.release_snapshot(7)
    snap = m.snapshot()
    m.release_snapshot(snap.version)
    with pytest.raises(ValueError, match="unknown snapshot version"):
        m.release_snapshot(snap.version)


def test_released_snapshot_cannot_be_read_and_release_is_idempotent() -> None:
    m = CopyOnWriteStateMap()
    m.put(1, NS, 1)
    snap = m.snapshot()
    snap.release()
    snap.release()
    assert snap.is_released
    with pytest.raises(RuntimeError, match="released"):
        list(snap)


def test_snapshot_transformer_and_chunks() -> None:
    m = CopyOnWriteStateMap()
    for k in range(10):
        m.put(k, NS, k)
    snap = m.snapshot()
    odd_times_ten = snap.iter_transformed(lambda s: s * 10 if s % 2 else None)
    kept = {(k, ns): s for k, ns, s in odd_times_ten}
    assert kept == {(k, NS): k * 10 for k in range(1, 10, 2)}
    chunks = list(snap.chunks(4))
    assert [len(c) for c in chunks] == [4, 4, 2]
    assert sorted(x for c in chunks for x in c) == sorted(snap)
    assert sum(len(c) for c in snap.chunks(3, transformer=lambda s: s or None)) == 9
    with pytest.raises(ValueError):
        next(snap.chunks(0))
    snap.release()


def test_released_versions_leave_nothing_reachable(entry_type: type) -> None:
    before = live_entry_count(entry_type)
    m = CopyOnWriteStateMap()
    for k in range(300):  # several chains of several entries
        m.put(k, NS, Box([k]))
    snap = m.snapshot()
    old_states = [weakref.ref(s) for _, _, s in snap]
    for k in range(0, 300, 3):
        m.get(k, NS).append("x")  # copies state and chain prefix
    for k in range(1, 300, 3):
        m.put(k, NS, Box(["new"]))
    for k in range(2, 300, 6):
        m.remove(k, NS)
    for k in range(300, 400):  # inserts and a rehash after the snapshot
        m.put(k, NS, Box([k]))
    assert any(r() is not None for r in old_states)
    snap.release()
    del snap
    gc.collect()
    assert live_entry_count(entry_type) - before == len(m)
    alive = {id(s) for _, _, s in m}
    for r in old_states:
        s = r()
        assert s is None or id(s) in alive  # only states still mapped survive
    dead = sum(r() is None for r in old_states)
    assert dead == 100 + 100 + 50  # read-copied, overwritten, removed


def test_iterating_the_live_map_during_a_change_raises() -> None:
    m = CopyOnWriteStateMap()
    for k in range(10):
        m.put(k, NS, k)
    it = iter(m)
    next(it)
    m.put(100, NS, 0)
    with pytest.raises(RuntimeError, match="changed during iteration"):
        list(it)
    assert sorted(m.keys(NS)) == [*range(10), 100]
    assert list(m.keys("other")) == []


@pytest.mark.parametrize(
    "op",
    [
        lambda m, k, n: m.get(k, n),
        lambda m, k, n: m.contains(k, n),
        lambda m, k, n: m.put(k, n, 1),
        lambda m, k, n: m.put_and_get_old(k, n, 1),
        lambda m, k, n: m.remove(k, n),
        lambda m, k, n: m.remove_and_get_old(k, n),
        lambda m, k, n: m.transform(k, n, 1, lambda s, v: v),
    ],
    ids=["get", "contains", "put", "put_old", "remove", "remove_old", "transform"],
)
@pytest.mark.parametrize(("key", "ns"), [(None, NS), (1, None)], ids=["key", "namespace"])
def test_none_key_or_namespace_rejected(op: Any, key: Any, ns: Any) -> None:
    m = CopyOnWriteStateMap()
    m.put(1, NS, 1)
    with pytest.raises(ValueError, match="must not be None"):
        op(m, key, ns)
    assert content(m) == {(1, NS): 1}


def test_gc_policy_freezes_before_young_collections_after_large_tables() -> None:
    gc.collect()
    cow.install_gc_policy()
    try:
        gc.collect(0)
        frozen = gc.get_freeze_count()
        m = CopyOnWriteStateMap(capacity=cow.FRESH_TABLE_SLOTS_BEFORE_FREEZE)
        gc.collect(0)  # a young collection: the fresh table is frozen instead of walked
        assert gc.get_freeze_count() > frozen
        assert cow._fresh_table_slots == 0
        frozen = gc.get_freeze_count()
        small = [[i] for i in range(100)]
        gc.collect(0)  # no large fresh table: an ordinary young collection
        assert gc.get_freeze_count() == frozen
        del m, small
    finally:
        cow.uninstall_gc_policy()
        gc.unfreeze()


def test_gc_policy_freezes_before_full_collections() -> None:
    gc.collect()
    cow.install_gc_policy()
    cow.install_gc_policy()  # idempotent
    try:
        junk = [[i] for i in range(1000)]
        gc.collect()  # a full collection: everything is frozen first
        assert gc.get_freeze_count() >= 1000
        del junk
    finally:
        cow.uninstall_gc_policy()
        gc.unfreeze()
    assert cow._gc_policy_callback not in gc.callbacks


# -- model-based test ------------------------------------------------------------------------------

KEYS = st.one_of(st.integers(0, 150), st.integers(0, 40).map(lambda k: k * 1024))
NAMESPACES = st.sampled_from(["a", "b"])
GROWTH: dict[str, int] = {"max_capacity": 0, "rehashes_seen": 0, "snapshots_mid_rehash": 0}


def append_fn(state: Any, value: Any) -> Any:
    if state is None:
        return [value]
    state.append(value)  # mutates what it gets: the map must hand over a private copy
    return state


class CopyOnWriteMachine(RuleBasedStateMachine):
    """Random operations and snapshots against an oracle dict and oracle copies per snapshot."""

    snapshots = Bundle("snapshots")

    def __init__(self) -> None:
        super().__init__()
        self.map = CopyOnWriteStateMap(capacity=4)
        self.model: dict[tuple[Any, str], list[Any]] = {}
        self.open: dict[int, tuple[CopyOnWriteStateMapSnapshot, dict[Any, Any]]] = {}
        self.counter = 0
        self.was_rehashing = False

    def fresh(self) -> list[Any]:
        self.counter += 1
        return [self.counter]

    @rule(key=KEYS, ns=NAMESPACES)
    def put(self, key: int, ns: str) -> None:
        value = self.fresh()
        self.map.put(key, ns, list(value))
        self.model[(key, ns)] = value

    @rule(start=st.integers(0, 150), n=st.integers(1, 40), ns=NAMESPACES)
    def put_many(self, start: int, n: int, ns: str) -> None:
        for key in range(start, start + n):
            value = self.fresh()
            self.map.put(key, ns, list(value))
            self.model[(key, ns)] = value

    @rule(key=KEYS, ns=NAMESPACES)
    def get_and_mutate(self, key: int, ns: str) -> None:
        got = self.map.get(key, ns)
        assert got == self.model.get((key, ns))
        if got is not None:
            self.counter += 1
            got.append(-self.counter)
            self.model[(key, ns)].append(-self.counter)

    @rule(key=KEYS, ns=NAMESPACES)
    def transform(self, key: int, ns: str) -> None:
        self.counter += 1
        self.map.transform(key, ns, self.counter, append_fn)
        self.model.setdefault((key, ns), []).append(self.counter)

    @rule(key=KEYS, ns=NAMESPACES)
    def remove(self, key: int, ns: str) -> None:
        self.map.remove(key, ns)
        self.model.pop((key, ns), None)

    @rule(key=KEYS, ns=NAMESPACES)
    def remove_and_get_old(self, key: int, ns: str) -> None:
        old = self.map.remove_and_get_old(key, ns)
        assert old == self.model.pop((key, ns), None)
        if old is not None:
            old.append("caller owns this")

    @rule(key=KEYS, ns=NAMESPACES)
    def put_and_get_old(self, key: int, ns: str) -> None:
        value = self.fresh()
        old = self.map.put_and_get_old(key, ns, list(value))
        assert old == self.model.get((key, ns))
        self.model[(key, ns)] = value
        if old is not None:
            old.append("caller owns this")

    @rule(key=KEYS, ns=NAMESPACES)
    def contains(self, key: int, ns: str) -> None:
        assert self.map.contains(key, ns) == ((key, ns) in self.model)

    @rule(target=snapshots)
    def snapshot(self) -> int:
        if self.map.is_rehashing:
            GROWTH["snapshots_mid_rehash"] += 1
            event("snapshot taken mid-rehash")
        snap = self.map.snapshot()
        # the model's states are lists of ints: copying each list is a deep copy
        self.open[snap.version] = (snap, {k: list(v) for k, v in self.model.items()})
        return snap.version

    @rule(target=snapshots, start=st.integers(0, 150), ns=NAMESPACES)
    def grow_then_snapshot(self, start: int, ns: str) -> int:
        """Insert until a rehash starts (while the map is small), then snapshot: snapshots
        taken in the middle of an incremental rehash are not left to chance."""
        key = start
        while not self.map.is_rehashing and len(self.map) < 1024:
            value = self.fresh()
            self.map.put(key, ns, list(value))
            self.model[(key, ns)] = value
            key += 1
        return self.snapshot()

    @rule(version=consumes(snapshots))
    def release(self, version: int) -> None:
        snap, expected = self.open.pop(version)
        assert content(snap) == expected
        snap.release()
        assert version not in self.map.snapshot_versions

    @invariant()
    def matches_model(self) -> None:
        assert len(self.map) == len(self.model)
        assert content(self.map) == self.model
        check_structure(self.map)
        versions = sorted(self.open)
        assert self.map.snapshot_versions == tuple(versions)
        assert self.map.highest_required_snapshot_version == (versions[-1] if versions else 0)
        for snap, expected in self.open.values():
            assert len(snap) == len(expected)
            assert content(snap) == expected
        if self.map.is_rehashing and not self.was_rehashing:
            GROWTH["rehashes_seen"] += 1
        self.was_rehashing = self.map.is_rehashing

    def teardown(self) -> None:
        capacity = self.map.capacity
        GROWTH["max_capacity"] = max(GROWTH["max_capacity"], capacity)
        target(float(capacity), label="capacity")
        event(f"capacity {capacity}")
        for snap, expected in self.open.values():
            assert content(snap) == expected
            snap.release()
        assert self.map.highest_required_snapshot_version == 0


# about a minute of CPU per entry type (the growth it must reach): make test runs it, make check not
@pytest.mark.slow
def test_model_based() -> None:
    GROWTH.update(max_capacity=0, rehashes_seen=0, snapshots_mid_rehash=0)
    run_state_machine_as_test(
        CopyOnWriteMachine,
        settings=settings(
            max_examples=120,
            stateful_step_count=80,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
    # the examples must exercise growth, not only tiny maps
    assert GROWTH["max_capacity"] >= 256
    assert GROWTH["rehashes_seen"] >= 100
    assert GROWTH["snapshots_mid_rehash"] >= 10


# -- concurrency -----------------------------------------------------------------------------------


class Handover:
    """Two threads taking turns: the writer thread pauses in the middle of a snapshot's
    iteration and the processing thread changes the maps until it hands the turn back."""

    def __init__(self) -> None:
        self.processing_turn = threading.Event()
        self.writer_turn = threading.Event()
        self.writer_done = False

    def pause_writer(self) -> None:
        self.writer_turn.clear()
        self.processing_turn.set()
        if not self.writer_turn.wait(60):
            raise TimeoutError("the processing thread did not hand the turn back")

    def finish_writer(self) -> None:
        self.writer_done = True
        self.processing_turn.set()

    def wait_for_processing_turn(self) -> None:
        if not self.processing_turn.wait(60):
            raise TimeoutError("the writer thread did not hand over the turn")
        self.processing_turn.clear()


def write_snapshots(
    snapshots: list[CopyOnWriteStateMapSnapshot],
    out: list[bytes],
    errors: list[BaseException],
    handover: Handover,
) -> None:
    """The asynchronous phase: encode key group by key group, chunked; after every chunk the
    iteration pauses (in the middle of a bucket's chain, the chunks being of a prime size) and
    the processing thread changes the maps."""
    try:
        encode = msgspec.msgpack.Encoder().encode
        for snap in snapshots:
            for chunk in snap.chunks(61):
                out.append(encode(chunk))
                handover.pause_writer()
            snap.release()
    except BaseException as exc:  # surfaced by the main thread
        errors.append(exc)
    finally:
        handover.finish_writer()


def test_snapshot_written_by_another_thread_while_the_map_changes() -> None:
    """The snapshot's iteration is paused deterministically about 500 times, and every time
    the maps change under it (reads that mutate the state objects, overwrites, removals,
    transforms, inserts driving incremental rehashes on); what is written is the content as
    of the snapshot."""
    groups, per_group = 16, 2048  # 32k entries over 16 key-group maps
    rng = random.Random(7)
    maps = [CopyOnWriteStateMap(capacity=128) for _ in range(groups)]
    for g, m in enumerate(maps):
        for i in range(per_group):
            m.put(i * groups + g, i % 3, [i])
    assert sum(len(m) for m in maps) == groups * per_group
    expected = {(k, ns): list(s) for m in maps for k, ns, s in m}
    # every 4th map is mid-rehash when the snapshot is taken
    growing = list(range(0, groups, 4))
    for g in growing:
        i = per_group
        while not maps[g].is_rehashing:
            maps[g].put(i * groups + g, 0, [i])
            expected[(i * groups + g, 0)] = [i]
            i += 1
    rehash_index_at_snapshot = {g: maps[g].rehash_index for g in growing}

    snapshots = [m.snapshot() for m in maps]
    out: list[bytes] = []
    errors: list[BaseException] = []
    handover = Handover()
    writer = threading.Thread(target=write_snapshots, args=(snapshots, out, errors, handover))
    writer.start()
    ops = turns = 0
    next_key = 10**9
    while True:
        handover.wait_for_processing_turn()
        if handover.writer_done:
            break
        turns += 1
        for _ in range(50):
            g = rng.choice(growing) if rng.random() < 0.3 else rng.randrange(groups)
            m = maps[g]
            key = rng.randrange(per_group) * groups + g
            ns = (key // groups) % 3
            r = rng.random()
            if r < 0.3:
                state = m.get(key, ns)
                if state is not None:
                    state.append(-1)
                    state[0] = -1
            elif r < 0.5:
                m.put(key, ns, ["overwritten"])
            elif r < 0.6:
                m.remove(key, ns)
            elif r < 0.7:
                m.transform(key, ns, 0, append_fn)
            else:
                next_key += 1
                m.put(next_key, 0, [next_key])  # inserts: the rehash goes on as the writer reads
            ops += 1
        handover.writer_turn.set()
    writer.join()
    assert not errors, errors
    assert turns >= 500 and ops >= 25_000
    for g in growing:  # the rehash went on while the writer was reading
        m = maps[g]
        assert not m.is_rehashing or m.rehash_index > rehash_index_at_snapshot[g] + 100

    decoder = msgspec.msgpack.Decoder(list[tuple[int, int, list[Any]]])
    written: dict[tuple[int, int], list[Any]] = {}
    for blob in out:
        for k, ns, s in decoder.decode(blob):
            assert (k, ns) not in written
            written[(k, ns)] = s
    assert written == expected
    assert all(m.highest_required_snapshot_version == 0 for m in maps)


def test_bulk_load_equals_repeated_puts_and_keeps_working() -> None:
    import random

    rnd = random.Random(3)
    keys = [rnd.randrange(3000) for _ in range(5000)]
    nss = [rnd.choice(["a", "b"]) for _ in keys]
    states = [[i] for i in range(len(keys))]
    bulk = CopyOnWriteStateMap()
    bulk.put_all(keys, nss, states)
    oracle = {}
    for k, ns, s in zip(keys, nss, states, strict=True):
        oracle[(k, ns)] = s
    assert len(bulk) == len(oracle)
    assert {(k, ns): s for k, ns, s in bulk} == oracle
    assert not bulk.is_rehashing and bulk.capacity >= len(oracle) * 4 // 3
    # the loaded map behaves like any other: snapshots, copy-on-write, growth
    snap = bulk.snapshot()
    bulk.get(keys[0], nss[0]).append(-1)
    for k in range(3000, 20000):
        bulk.put(k, "c", [k])
    assert {(k, ns): s for k, ns, s in snap} == oracle
    snap.release()
    assert len(bulk) == len(oracle) + 17000
    # into a non-empty map (a delta over a full snapshot) it is plain puts
    bulk.put_all([keys[0]] * 100, ["x"], list(range(100)))
    assert bulk.get(keys[0], "x") == 99
    with pytest.raises(ValueError):
        CopyOnWriteStateMap().put_all(list(range(100)), [None], list(range(100)))


# -- the last-hit cache (a get followed by a put of the same key and namespace objects) -----------


def test_put_after_get_writes_the_live_entry_after_a_rehash_copied_it() -> None:
    """A get remembers its entry for the next put; a rehash step that copies that entry (it is
    shared with a snapshot) must make the put look it up again, even once the snapshot is
    released and the old entry's version would pass the check."""
    m = CopyOnWriteStateMap(capacity=128)
    key, ns = "key-0", "ns"
    m.put(key, ns, [0])
    for k in range(1, 96):
        m.put(f"key-{k}", ns, [k])
    assert m.get(key, ns) == [0]  # the hit
    snap = m.snapshot()
    while not m.is_rehashing:
        m.put(f"more-{len(m)}", ns, [])
    while m.is_rehashing:  # every operation moves buckets: each shared entry is copied
        m.contains(key, ns)
    snap.release()
    m.put(key, ns, [1])
    assert m.get(key, ns) == [1]
    assert dict(((k, n), s) for k, n, s in m)[(key, ns)] == [1]


def test_put_after_get_writes_the_live_entry_after_a_chain_copy() -> None:
    m = CopyOnWriteStateMap(capacity=4)
    key, ns = 7, "ns"
    m.put(key, ns, [0])
    assert m.get(key, ns) == [0]
    snap = m.snapshot()
    m.get(key, ns).append(1)  # copy-on-read: the entry is replaced by a private copy
    snap.release()
    m.put(key, ns, [2])
    assert m.get(key, ns) == [2]


def test_put_after_get_of_a_removed_entry_inserts_again() -> None:
    m = CopyOnWriteStateMap(capacity=4)
    key, ns = "k", "ns"
    m.put(key, ns, 1)
    assert m.get(key, ns) == 1
    m.remove(key, ns)
    m.put(key, ns, 2)
    assert len(m) == 1 and m.get(key, ns) == 2


def test_put_after_get_still_advances_the_rehash() -> None:
    """The put of a read-modify-write (same key and namespace objects as the get before it)
    owes its own rehash step, like every operation."""
    m = start_rehash()
    key = 2
    assert m.get(key, NS) is not None
    after_get = m.rehash_index
    m.put(key, NS, 7)
    assert m.rehash_index > after_get
    assert m.get(key, NS) == 7
    check_structure(m)


def test_a_key_is_found_by_identity_as_a_dict_finds_it() -> None:
    """A key object that is not equal to itself (a float NaN) is found by identity, as a dict
    (and the compiled value state) finds it: every access of it reaches its one entry."""
    nan = float("nan")
    m = CopyOnWriteStateMap()
    m.put(nan, "ns", 1)
    assert m.get(nan, "ns") == 1 and m.contains(nan, "ns")
    m.put(nan, "ns", 2)
    assert len(m) == 1 and m.get(nan, "ns") == 2
    assert m.put_and_get_old(nan, "ns", 3) == 2
    m.transform(nan, "ns", 4, lambda old, value: old + value)
    assert m.get(nan, "ns") == 7
    m.remove(nan, "ns")
    assert len(m) == 0 and m.get(nan, "ns") is None
