"""The compiled heap value state's writes to the copy-on-write map against the reference.

``value()`` / ``update()`` in C (``_value_state.c``) insert new keys and take incremental rehash
steps themselves. Here the same operations run through the compiled methods on one map and
through the pure-Python reference (``HeapValueState`` with ``CopyOnWriteStateMap.get`` / ``put``)
on another, with snapshots taken and released in between and the tables grown through several
doublings: after every step the two maps are equal entry for entry (bucket order, versions,
namespace objects), counter for counter and change record for change record, and hold what a
dict holds; each open snapshot holds what the dict held when it was taken.

Under ``STREAMSTATE_PURE_PYTHON=1`` only the reference exists and these tests are skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from streamstate import ValueStateDescriptor
from streamstate.backends.heap import copy_on_write as cow
from streamstate.backends.heap import states as heap_states
from streamstate.backends.heap.backend import HeapKeyedStateBackend
from streamstate.backends.heap.copy_on_write import NO_HIT, CopyOnWriteStateMap
from streamstate.keygroups import KeyGroupRange
from streamstate.namespace import VOID_NAMESPACE
from streamstate.runtime.record_path import record_path
from streamstate.serializers import PickleSerializer, StrSerializer

pytestmark = pytest.mark.skipif(
    len(heap_states.VALUE_STATE_TYPES) < 2,
    reason="only the pure-Python value state exists (STREAMSTATE_PURE_PYTHON or no build)",
)

COUNT = ValueStateDescriptor("count", int, default=0)
#: mutable values and a default that must be copied: the compiled methods hand more to Python
ITEMS = ValueStateDescriptor("items", list[int], default=[])


def backend_and_states(
    compiled: bool, incremental: bool, namespaced: bool
) -> tuple[HeapKeyedStateBackend, Any, Any]:
    """A one-key-group heap backend and its two value states, of the compiled type or of the
    reference."""
    backend = HeapKeyedStateBackend(
        PickleSerializer(), 1, KeyGroupRange(0, 0), incremental=incremental
    )
    ns_serializer = StrSerializer() if namespaced else None
    ns = "a" if namespaced else VOID_NAMESPACE
    with record_path(compiled):
        count = backend.get_partitioned_state(ns, ns_serializer, COUNT)
        items = backend.get_partitioned_state(ns, ns_serializer, ITEMS)
    expected = heap_states.VALUE_STATE_TYPES[-1 if compiled else 0]
    assert type(count) is expected and type(items) is expected
    return backend, count, items


def chain(head: Any) -> Iterator[Any]:
    while head is not None:
        yield head
        head = head.next


def layout(m: CopyOnWriteStateMap) -> Any:
    """Everything observable about a map's structure, comparable between two maps."""
    tables = [m._primary] + ([m._rehash_table] if m.is_rehashing else [])
    buckets = [
        (t, i, [(e.key, e.namespace, e.state, e.entry_version, e.state_version) for e in chain(h)])
        for t, table in enumerate(tables)
        for i, h in enumerate(table)
        if h is not None
    ]
    # one namespace object per run of equal ones: which entries share the last one
    last = [e.namespace is m._last_namespace for table in tables for h in table for e in chain(h)]
    counters = {
        "len": len(m),
        "capacity": m.capacity,
        "primary_size": m._primary_size,
        "rehash_size": m._rehash_size,
        "rehash_index": m.rehash_index,
        "rehashing": m.is_rehashing,
        "mod_count": m._mod_count,
        "threshold": m._threshold,
        "spare_mark": m._spare_mark,
        "spare": None if m._spare is None else len(m._spare),
        "shared": m._shared,
        "version": m.state_map_version,
        "required": m.highest_required_snapshot_version,
        "last_namespace": m._last_namespace,
        "hit": (m._hit_key is NO_HIT, m._hit_key, m._hit_namespace),
        "hit_entry": None if m._hit is None else (m._hit.key, m._hit.namespace),
    }
    records = None
    if hasattr(m, "void_keys"):
        records = (list(m.void_keys), list(m.void_states), list(m.pairs), list(m.pair_states))
    return buckets, last, counters, records


def check_structure(m: CopyOnWriteStateMap) -> None:
    """Every entry sits in the bucket its hash selects, in the table the rehash index selects,
    and the sizes count them."""
    mask = len(m._primary) - 1
    primary = [(i, e) for i, h in enumerate(m._primary) for e in chain(h)]
    assert all(hash((e.key, e.namespace)) & mask == i for i, e in primary)
    assert all(i >= m.rehash_index for i, _ in primary), "an entry in a moved primary bucket"
    assert len(primary) == m._primary_size
    if m.is_rehashing:
        rmask = len(m._rehash_table) - 1
        moved = [(i, e) for i, h in enumerate(m._rehash_table) for e in chain(h)]
        assert all(hash((e.key, e.namespace)) & rmask == i for i, e in moved)
        assert all(i & mask < m.rehash_index for i, _ in moved)
        assert len(moved) == m._rehash_size
    else:
        assert m._rehash_size == 0 and m.rehash_index == 0


class Twin:
    """One side: a backend, its two value states and their map."""

    def __init__(self, compiled: bool, incremental: bool, namespaced: bool) -> None:
        self.backend, self.count, self.items = backend_and_states(compiled, incremental, namespaced)
        self.count_map: Any = self.backend.state_table("count").maps[0]
        self.items_map: Any = self.backend.state_table("items").maps[0]

    def at(self, key: Any, ns: Any) -> Twin:
        self.backend.set_current_key(key, 0)
        if ns is not None:
            self.count.set_current_namespace(ns)
            self.items.set_current_namespace(ns)
        return self


#: what the examples reached: the rules must grow the maps, not only exercise tiny ones
GROWTH: dict[str, int] = {}


def twin_machine(incremental: bool, namespaced: bool) -> type[RuleBasedStateMachine]:
    keys = st.integers(0, 120) | st.integers(0, 30).map(lambda k: f"k{k}")

    class ValueStateTwins(RuleBasedStateMachine):
        snapshots = Bundle("snapshots")

        def __init__(self) -> None:
            super().__init__()
            self.compiled = Twin(True, incremental, namespaced)
            self.reference = Twin(False, incremental, namespaced)
            self.counts: dict[tuple[Any, Any], int] = {}
            self.items: dict[tuple[Any, Any], list[int]] = {}
            self.open: dict[int, tuple[Any, dict[Any, int]]] = {}
            self.fresh_key = 1000
            self.ns: Any = "a" if namespaced else None

        @property
        def map_ns(self) -> Any:
            return VOID_NAMESPACE if self.ns is None else self.ns

        def both(self, key: Any) -> tuple[Twin, Twin]:
            m = self.compiled.count_map
            GROWTH["ops_mid_rehash"] += m.is_rehashing
            GROWTH["ops_under_snapshot"] += bool(self.open) and not m._shared
            return self.compiled.at(key, self.map_ns), self.reference.at(key, self.map_ns)

        def increment(self, key: Any, by: int) -> None:
            """A keyed count's read-modify-write (a new key: value() misses, update() inserts)."""
            seen = [side.count.value() for side in self.both(key)]
            assert seen[0] == seen[1] == self.counts.get((key, self.map_ns), 0)
            for side, n in zip(self.both(key), seen, strict=True):
                side.count.update(n + by)
            self.counts[(key, self.map_ns)] = seen[0] + by

        @rule(key=keys, by=st.integers(1, 5))
        def touch(self, key: Any, by: int) -> None:
            self.increment(key, by)

        @rule(n=st.integers(1, 120), blind=st.booleans())
        def new_keys(self, n: int, blind: bool) -> None:
            """First touches, enough to cross the doubling thresholds (97, 193, 385, ...)."""
            for key in range(self.fresh_key, self.fresh_key + n):
                if blind:  # update() without value() first: no last hit to write to
                    for side in self.both(key):
                        side.count.update(key)
                    self.counts[(key, self.map_ns)] = key
                else:
                    self.increment(key, 1)
            self.fresh_key += n

        @rule(keys=st.lists(keys, max_size=12))
        def grow_until_rehashing(self, keys: list[Any]) -> None:
            """New keys until a doubling starts, then reads and writes of those keys: an
            incremental rehash in progress is not left to chance."""
            m = self.compiled.count_map
            while not m.is_rehashing and len(m) < 1500:
                self.increment(self.fresh_key, 1)
                self.fresh_key += 1
            for key in keys:
                self.increment(key, 1)

        @rule(key=keys, value=st.integers(-5, 5))
        def write(self, key: Any, value: int) -> None:
            for side in self.both(key):
                side.count.update(value)
            self.counts[(key, self.map_ns)] = value

        @rule(key=keys)
        def clear(self, key: Any) -> None:
            for side in self.both(key):
                side.count.update(None)
            self.counts.pop((key, self.map_ns), None)

        @rule(key=keys, element=st.integers(0, 9), in_place=st.booleans())
        def append(self, key: Any, element: int, in_place: bool) -> None:
            """A mutable value: its default is copied, a shared value is copied on read."""
            for side in self.both(key):
                got = side.items.value()
                if in_place and got:
                    got.append(element)
                else:
                    side.items.update([*got, element])
            self.items.setdefault((key, self.map_ns), []).append(element)
            expected = self.items[(key, self.map_ns)]
            assert [side.items.value() for side in self.both(key)] == [expected, expected]

        @precondition(lambda self: self.ns is not None)
        @rule(ns=st.sampled_from(["a", "b"]))
        def switch_namespace(self, ns: str) -> None:
            # an equal namespace object that is not the last one: inserts canonicalise it
            self.ns = "".join(list(ns))

        @rule(target=snapshots)
        def snapshot(self) -> Any:
            snaps: tuple[Any, Any] = (
                self.compiled.count_map.snapshot(),
                self.reference.count_map.snapshot(),
            )
            assert snaps[0].version == snaps[1].version
            self.open[snaps[0].version] = (snaps, dict(self.counts))
            return snaps[0].version

        @rule(version=consumes(snapshots))
        def release(self, version: int) -> None:
            snaps, expected = self.open.pop(version)
            for snap in snaps:
                assert {(k, ns): s for k, ns, s in snap} == expected
                snap.release()

        @precondition(lambda self: incremental)
        @rule()
        def take_changes(self) -> None:
            """An incremental checkpoint's capture: the same last record of each entry."""
            for name in ("count_map", "items_map"):
                sides = (self.compiled, self.reference)
                changes = [getattr(side, name).take_changes_split() for side in sides]
                assert changes[0] == changes[1]

        @invariant()
        def same_maps(self) -> None:
            for name in ("count_map", "items_map"):
                compiled = getattr(self.compiled, name)
                reference = getattr(self.reference, name)
                assert layout(compiled) == layout(reference), name
            m = self.compiled.count_map
            check_structure(m)
            GROWTH["capacity"] = max(GROWTH["capacity"], m.capacity)
            GROWTH["spare_grown"] += m._spare is not None and len(m._spare) > m.capacity // 2
            assert {(k, ns): s for k, ns, s in m} == self.counts
            for snaps, expected in self.open.values():
                assert len(snaps[0]) == len(expected)

        def teardown(self) -> None:
            for snaps, _ in self.open.values():
                for snap in snaps:
                    snap.release()

    return ValueStateTwins


@pytest.fixture
def small_spare_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables of 256 slots and more are pre-built in chunks of 32: the spare marks at which an
    insert grows the next table are reached within a few hundred keys."""
    monkeypatch.setattr(cow, "_INCREMENTAL_ALLOC_MIN", 256)
    monkeypatch.setattr(cow, "_ALLOC_CHUNK", 32)
    monkeypatch.setattr(cow, "_NONE_CHUNK", [None] * 32)


@pytest.mark.usefixtures("small_spare_tables")
@pytest.mark.parametrize(
    ("incremental", "namespaced"),
    [(False, True), (True, False)],
    ids=["plain-map-namespaces", "tracking-map"],
)
def test_compiled_writes_equal_the_reference(incremental: bool, namespaced: bool) -> None:
    GROWTH.update(capacity=0, ops_mid_rehash=0, spare_grown=0, ops_under_snapshot=0)
    run_state_machine_as_test(
        twin_machine(incremental, namespaced),
        settings=settings(
            max_examples=25,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
    assert GROWTH["capacity"] >= 512
    assert GROWTH["ops_mid_rehash"] >= 300
    assert GROWTH["spare_grown"] >= 5
    # after the first write copied the arrays, with the snapshot still open (inserts in C)
    assert GROWTH["ops_under_snapshot"] >= 100


@pytest.mark.usefixtures("small_spare_tables")
@pytest.mark.parametrize("incremental", [False, True], ids=["plain-map", "tracking-map"])
def test_inserts_and_rehash_steps_stay_in_c(
    incremental: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A count over new keys (value() then update() per key) through several doublings: the
    Python insert runs only for the inserts that double the table or grow the next one, and
    the Python rehash step only for the steps that finish a rehash; the map equals the
    reference's all along."""
    calls = {"_add_entry": 0, "_incremental_rehash": 0, "_grow_spare": 0, "_double_capacity": 0}
    for name in calls:
        original = getattr(CopyOnWriteStateMap, name)

        def counted(self: Any, *args: Any, _name: str = name, _f: Any = original) -> Any:
            calls[_name] += 1
            return _f(self, *args)

        monkeypatch.setattr(CopyOnWriteStateMap, name, counted)
    compiled = Twin(True, incremental, False)
    for key in range(3000):
        compiled.at(key, None)
        compiled.count.update(compiled.count.value() + 1)
    doublings = calls["_double_capacity"]
    assert doublings == 5  # 128 -> 4096 slots
    assert calls["_grow_spare"] > 0
    # the insert that doubles, each that grows the next table, and at most one per rehash that
    # its finishing step made
    python_inserts = calls["_add_entry"] - doublings - calls["_grow_spare"]
    assert 0 <= python_inserts <= doublings
    assert calls["_incremental_rehash"] == doublings
    calls.update(dict.fromkeys(calls, 0))
    reference = Twin(False, incremental, False)
    for key in range(3000):
        reference.at(key, None)
        reference.count.update(reference.count.value() + 1)
    assert calls["_add_entry"] == 3000
    assert layout(compiled.count_map) == layout(reference.count_map)
    check_structure(compiled.count_map)


def test_insert_under_an_open_snapshot_after_the_arrays_are_copied() -> None:
    """The first insert after a snapshot copies the bucket arrays (Python's); the next ones
    are inserted in C while the snapshot is open, and the snapshot keeps its content."""
    compiled, reference = Twin(True, False, False), Twin(False, False, False)
    for side in (compiled, reference):
        for key in range(50):
            side.at(key, None).count.update(key)
    snaps = [side.count_map.snapshot() for side in (compiled, reference)]
    for side in (compiled, reference):
        for key in range(50, 90):
            side.at(key, None).count.update(side.count.value() + key)
    assert layout(compiled.count_map) == layout(reference.count_map)
    for snap in snaps:
        assert {k: s for k, _, s in snap} == {k: k for k in range(50)}
        snap.release()
    assert {k: s for k, _, s in compiled.count_map} == {k: k for k in range(90)}
