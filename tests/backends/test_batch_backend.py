"""The batch execution backend: one key's state at a time (SPEC §13.3).

Its states follow the heap backend's semantics for the current key (a model test drives both
with the same random operations, keys visited in runs as sorted input visits them); what differs
is by design: a finished key's state is gone, no key is current before the first one and after
the end of the input, nothing is restored, and the only snapshot is the savepoint of the keys
finished so far.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamstate import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from streamstate.backends.batch import (
    BatchExecutionKeyedStateBackend,
    BatchExecutionStateBackend,
    KeyGroupSpool,
)
from streamstate.backends.batch.timer_queue import SingleKeyTimerQueue
from streamstate.backends.heap import HeapStateBackend
from streamstate.errors import (
    KeyGroupOutOfRangeError,
    NoCurrentKeyError,
    StateAccessError,
    StateBackendError,
    UnsupportedKeyTypeError,
)
from streamstate.format.codec import StateCodec
from streamstate.format.snapshot import EncodedEntries
from streamstate.keygroups import KeyGroupRange, assign_to_key_group
from streamstate.namespace import VOID_NAMESPACE
from streamstate.serializers import Int64Serializer, StrSerializer
from support.checkpoint import Average

DESCRIPTORS = {
    "value": lambda: ValueStateDescriptor("value", int, default=7),
    "list": lambda: ListStateDescriptor("list", int),
    "map": lambda: MapStateDescriptor("map", int, str),
    "reducing": lambda: ReducingStateDescriptor("reducing", lambda a, b: a * 10 + b, int),
    "aggregating": lambda: AggregatingStateDescriptor("aggregating", Average(), tuple[int, int]),
}
NS = Int64Serializer()


def batch_backend(spool: bool = False, **kwargs: Any) -> BatchExecutionKeyedStateBackend:
    backend = BatchExecutionStateBackend(savepoint=spool).create_keyed_backend(
        StrSerializer(), 16, KeyGroupRange(0, 15), **kwargs
    )
    assert isinstance(backend, BatchExecutionKeyedStateBackend)
    return backend


def _apply(backend: Any, states: dict[str, Any], kind: str, op: int, ns: int, v: int) -> Any:
    """One operation on one state; returns what it read (the model compares it)."""
    s = states[kind]
    s.set_current_namespace(ns)
    if kind == "value":
        if op == 0:
            s.update(v)
        elif op == 1:
            s.update(None)
        elif op == 2:
            s.clear()
        return s.value()
    if kind == "list":
        if op == 0:
            s.add(v)
        elif op == 1:
            s.add_all([v, v + 1])
        elif op == 2:
            s.update([] if v % 2 else [v])
        elif op == 3:
            s.merge_namespaces(ns, [(ns + 1) % 3, (ns + 2) % 3])
        elif op == 4:
            s.clear()
        return list(s.get())
    if kind == "map":
        if op == 0:
            s.put(v % 2, f"x{v}")
        elif op == 1:
            s.remove(v % 2)  # often the last mapping: the entry goes
        elif op == 2:
            s.put_all({v % 2: "a", (v + 1) % 2: "b"})
        elif op == 3:
            s.clear()
        return (sorted(s.items()), s.contains(v % 2), s.is_empty(), s.get(v % 2))
    if op == 3:
        s.merge_namespaces(ns, [(ns + 1) % 3, (ns + 2) % 3])
    elif op == 4:
        s.clear()
    elif op == 2 and kind == "aggregating":
        s.add(None)  # clears, as the heap backend
    else:
        s.add(v)
    return s.get()


@settings(max_examples=100, deadline=None)
@given(
    runs=st.lists(
        st.lists(
            st.tuples(
                st.sampled_from(sorted(DESCRIPTORS)),
                st.integers(0, 4),
                st.integers(0, 2),
                st.integers(0, 99),
            ),
            max_size=12,
        ),
        max_size=8,
    )
)
def test_states_behave_as_the_heap_backend_for_keys_visited_in_runs(runs: list[Any]) -> None:
    batch = batch_backend()
    heap = HeapStateBackend().create_keyed_backend(StrSerializer(), 16, KeyGroupRange(0, 15))
    try:
        handles = [
            {k: backend.get_partitioned_state(0, NS, d()) for k, d in DESCRIPTORS.items()}
            for backend in (batch, heap)
        ]
        for i, run in enumerate(runs):
            key = f"key-{i}"  # each key has one run: its state is dropped when the run ends
            for backend in (batch, heap):
                backend.set_current_key(key)
            for kind, op, ns, v in run:
                got = [
                    _apply(b, h, kind, op, ns, v)
                    for b, h in zip((batch, heap), handles, strict=True)
                ]
                assert got[0] == got[1], (key, kind, op, ns, v)
            assert batch.num_entries() == sum(
                1 for n in DESCRIPTORS for ns in range(3) if _heap_has(heap, n, key, ns)
            )
    finally:
        batch.dispose()
        heap.dispose()


def _heap_has(heap: Any, name: str, key: str, ns: int) -> bool:
    return key in list(heap.get_keys(name, ns))


def test_a_finished_key_leaves_nothing_and_setting_the_same_key_keeps_its_state() -> None:
    backend = batch_backend()
    value = backend.get_partitioned_state(VOID_NAMESPACE, None, DESCRIPTORS["value"]())
    lst = backend.get_partitioned_state(1, NS, DESCRIPTORS["list"]())
    backend.set_current_key("a")
    value.update(3)
    lst.add(1)
    lst.set_current_namespace(2)
    lst.add(2)
    backend.set_current_key("a")  # the same key again: nothing ends
    assert value.value() == 3 and lst.get() == [2] and backend.num_entries() == 3
    assert list(backend.get_keys("list", 1)) == ["a"]
    backend.set_current_key("b")
    assert value.value() == 7  # the default
    assert lst.get() == [] and backend.num_entries() == 0
    lst.set_current_namespace(1)
    assert lst.get() == [] and list(backend.get_keys("list", 1)) == []
    assert backend.keys_done == 1


def test_no_current_key_before_the_first_and_after_the_end_of_input() -> None:
    backend = batch_backend()
    value = backend.get_partitioned_state(VOID_NAMESPACE, None, DESCRIPTORS["value"]())
    mapping = backend.get_partitioned_state(VOID_NAMESPACE, None, DESCRIPTORS["map"]())
    with pytest.raises(NoCurrentKeyError, match="'value'"):
        value.value()
    with pytest.raises(NoCurrentKeyError, match="'map'"):
        mapping.put(1, "x")
    backend.set_current_key("a")
    value.update(1)
    late = backend.get_partitioned_state(VOID_NAMESPACE, None, DESCRIPTORS["list"]())
    late.add(5)  # registered while a key is current: usable at once
    backend.end_of_input()
    for call in (value.value, late.get, lambda: mapping.contains(1)):
        with pytest.raises(NoCurrentKeyError):
            call()
    with pytest.raises(NoCurrentKeyError):
        backend.get_current_key()


def test_keys_are_checked_like_every_backend_s() -> None:
    backend = batch_backend()
    backend_range = BatchExecutionStateBackend().create_keyed_backend(
        StrSerializer(), 16, KeyGroupRange(0, 3)
    )
    outside = next(k for k in (f"k{i}" for i in range(100)) if assign_to_key_group(k, 16) > 3)
    with pytest.raises(KeyGroupOutOfRangeError, match=repr(outside)):
        backend_range.set_current_key(outside)
    with pytest.raises(UnsupportedKeyTypeError):
        backend.set_current_key(None)
    value = backend.get_partitioned_state(VOID_NAMESPACE, None, DESCRIPTORS["value"]())
    backend.set_current_key("a")
    with pytest.raises(StateAccessError, match="state 'value' of key 'a'"):
        value.update("not an int")
    with pytest.raises(StateAccessError, match="void namespace"):
        value.set_current_namespace(3)
    with pytest.raises(StateAccessError, match="None cannot be added"):
        backend.get_partitioned_state(VOID_NAMESPACE, None, DESCRIPTORS["list"]()).add(None)


def test_no_restore_no_checkpoint_and_a_savepoint_only_at_the_end() -> None:
    backend = batch_backend()
    with pytest.raises(StateBackendError, match="execution_mode='streaming'"):
        backend.restore([])
    with pytest.raises(StateBackendError, match="spool"):
        backend.snapshot(1)
    spooled = batch_backend(spool=True)
    spooled.set_current_key("a")
    with pytest.raises(StateBackendError, match="key 'a' is still being processed"):
        spooled.snapshot(1)
    spooled.end_of_input()
    assert spooled.snapshot(1).states == []
    spooled.dispose()


def _decoded(snapshot: Any) -> dict[Any, Any]:
    """``(state, key, namespace) -> value`` of a snapshot's entries, checking each key's
    key group."""
    out = {}
    for kg in snapshot.key_group_range:
        for index, entries in snapshot.key_group_entries(kg):
            meta = snapshot.states[index]
            if isinstance(entries, EncodedEntries):
                codec = StateCodec(
                    snapshot.key_serializer, meta.namespace_serializer, meta.state_serializer
                )
                keys, namespaces, values = codec.decode(entries.data)
                assert len(keys) == entries.count
                if len(namespaces) != len(keys):
                    namespaces = namespaces * len(keys)
                triples = zip(keys, namespaces, values, strict=True)
            else:
                triples = iter(entries)
            for key, ns, value in triples:
                assert assign_to_key_group(key, 16) == kg
                out[(meta.name, key, ns)] = value
    return out


@pytest.mark.parametrize("order", ["by key group", "by key", "shuffled"])
@pytest.mark.parametrize("pieces", [(8192, 131072), (3, 10)])
def test_the_savepoint_holds_every_finished_key_as_the_heap_snapshot_does(
    order: str, pieces: tuple[int, int]
) -> None:
    """Whatever order the keys come in, and however small the pieces the spool encodes (so
    that a key group is spooled in several, which the snapshot merges), the savepoint holds
    what the heap backend's snapshot holds; the spool never collects more than its bound."""
    keys = [f"user-{i}" for i in range(60)]
    if order == "by key group":
        keys.sort(key=lambda k: (assign_to_key_group(k, 16), k))
    elif order == "by key":
        keys.sort()
    else:
        random.Random(3).shuffle(keys)
    spool = KeyGroupSpool(
        StrSerializer(), KeyGroupRange(0, 15), piece_entries=pieces[0], max_entries=pieces[1]
    )
    batch = BatchExecutionKeyedStateBackend(StrSerializer(), 16, KeyGroupRange(0, 15), spool=spool)
    heap = HeapStateBackend(table_kind="nested_maps").create_keyed_backend(
        StrSerializer(), 16, KeyGroupRange(0, 15)
    )
    for backend in (batch, heap):
        value = backend.get_partitioned_state(VOID_NAMESPACE, None, DESCRIPTORS["value"]())
        lst = backend.get_partitioned_state(0, NS, DESCRIPTORS["list"]())
        backend.get_partitioned_state(VOID_NAMESPACE, None, DESCRIPTORS["map"]())  # no entry
        for i, key in enumerate(keys):
            backend.set_current_key(key)
            if i % 3:
                value.update(i)
            for ns in range(i % 4):
                lst.set_current_namespace(ns)
                lst.add_all([i, ns])
            assert spool.collected <= pieces[1]
    batch.end_of_input()
    got = _decoded(batch.snapshot(1))
    expected = _decoded(heap.snapshot(1))
    assert got == expected and len(got) > 60
    assert [m.name for m in batch.snapshot(1).states] == ["value", "list", "map"]
    batch.dispose()
    heap.dispose()


def test_a_spool_names_the_state_and_key_group_of_a_value_its_serializer_cannot_write() -> None:
    from streamstate.errors import CheckpointError
    from streamstate.format.meta import StateMetaInfo
    from streamstate.serializers import VoidNamespaceSerializer

    spool = KeyGroupSpool(StrSerializer(), KeyGroupRange(0, 15))
    spool.register(StateMetaInfo("n", "value", VoidNamespaceSerializer(), Int64Serializer()))
    spool.add(3, "a", "n", [(VOID_NAMESPACE, "not an int")])
    with pytest.raises(CheckpointError, match="state 'n' of key group 3"):
        spool.finish()
    spool.close()


def test_the_timers_of_one_key_fire_in_timestamp_then_registration_order() -> None:
    added = [0]
    q = SingleKeyTimerQueue(added)
    for ts, ns in [(30, "a"), (10, "b"), (30, "c"), (10, "b"), (20, "d"), (10, "e")]:
        q.add(ts, "k", ns, 5)
    assert len(q) == 5 and added == [5] and q.peek_timestamp() == 10
    assert q.remove(20, "k", "d") and not q.remove(20, "k", "d")
    fired: list[Any] = []

    def fire(ts: int, key: Any, ns: Any) -> None:
        fired.append((ts, ns))
        if ns == "e":
            q.remove(30, "k", "c")  # removed while firing: never fires

    assert q.fire_all(fire) == 3
    assert fired == [(10, "b"), (10, "e"), (30, "a")]
    assert len(q) == 0 and q.poll() is None and q.fire_all(fire) == 0


class TimerQueueOracle:
    """The timers of one key as a plain list: set semantics on ``(timestamp, namespace)``,
    timestamp then registration order."""

    def __init__(self) -> None:
        self.timers: list[tuple[int, int, Any]] = []  # (timestamp, registration, namespace)
        self.seq = 0

    def _find(self, ts: int, ns: Any) -> int:
        return next((i for i, (t, _, n) in enumerate(self.timers) if (t, n) == (ts, ns)), -1)

    def add(self, ts: int, ns: Any) -> bool:
        if self._find(ts, ns) >= 0:
            return False
        self.timers.append((ts, self.seq, ns))
        self.seq += 1
        return True

    def remove(self, ts: int, ns: Any) -> bool:
        i = self._find(ts, ns)
        if i >= 0:
            del self.timers[i]
        return i >= 0

    def poll_until(self, until: int) -> tuple[int, Any, Any, int] | None:
        if not self.timers or min(self.timers)[0] > until:
            return None
        ts, _, ns = min(self.timers)
        self.timers.remove(min(self.timers))
        return ts, "k", ns, 0

    def fire_all(self, target: Any) -> int:
        fired = 0
        while self.timers:
            ts, _, ns = first = min(self.timers)
            self.timers.remove(first)
            target(ts, "k", ns)
            fired += 1
        return fired


def changes_apply(queue: Any, changes: Any) -> bool:
    """The next change of ``changes`` (an add or a remove) made to ``queue`` (a
    :class:`SingleKeyTimerQueue` or the oracle); True if it added a timer."""
    op, ts, ns = next(changes, ("none", 0, None))
    single = isinstance(queue, SingleKeyTimerQueue)
    if op == "add":
        return bool(queue.add(ts, "k", ns) if single else queue.add(ts, ns))
    if op == "remove":
        queue.remove(ts, "k", ns) if single else queue.remove(ts, ns)
    return False


def fire_with_changes(queue: Any, changes: list[Any]) -> tuple[int, list[Any]]:
    """``queue.fire_all``, each timer fired making the next of ``changes``: how many fired and
    ``(timestamp, key, namespace, whether the change added a timer)`` of each."""
    fired: list[Any] = []
    pending = iter(changes)

    def target(ts: int, key: Any, ns: Any) -> None:
        fired.append((ts, key, ns, changes_apply(queue, pending)))

    return queue.fire_all(target), fired


timer_op = st.tuples(
    st.sampled_from(["add", "add", "add", "remove", "contains", "poll", "fire", "clear"]),
    st.integers(0, 3),
    st.sampled_from([None, "a", "b"]),
)


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(timer_op, max_size=30), while_firing=st.lists(timer_op, max_size=6))
def test_a_single_key_timer_queue_behaves_as_a_list_of_timers(
    ops: list[Any], while_firing: list[Any]
) -> None:
    """Every operation, from no timer through one (kept in its own slot) to several, with
    timers added and removed while others fire, against the plain list."""
    added = [0]
    q, oracle = SingleKeyTimerQueue(added), TimerQueueOracle()
    adds = 0
    for op, ts, ns in ops:
        if op == "add":
            got = q.add(ts, "k", ns, 3)
            assert got == oracle.add(ts, ns)
            adds += got
        elif op == "remove":
            assert q.remove(ts, "k", ns) == oracle.remove(ts, ns)
        elif op == "contains":
            assert q.contains(ts, "k", ns) == (oracle._find(ts, ns) >= 0)
        elif op == "poll":
            assert q.poll_until(ts) == oracle.poll_until(ts)
        elif op == "clear":
            q.clear()
            oracle.timers.clear()
        else:
            # each timer fired makes the next change of while_firing, in the queue and in the
            # oracle alike
            count, fired = fire_with_changes(q, while_firing)
            assert (count, fired) == fire_with_changes(oracle, while_firing)
            adds += sum(got for *_, got in fired)
        assert len(q) == len(oracle.timers) and bool(q) == bool(oracle.timers)
        in_order = sorted(oracle.timers, key=lambda t: t[1])
        assert q.timers_of_key_group(0) == [(t, "k", n) for t, _, n in in_order]
        assert list(q) == [(t, "k", n, 0) for t, _, n in in_order]
        assert q.peek_timestamp() == (min(oracle.timers)[0] if oracle.timers else None)
    assert added == [adds]


def test_a_single_key_timer_queue_polls_only_what_is_due() -> None:
    q = SingleKeyTimerQueue([0])
    for ts, ns in [(30, "a"), (10, "b"), (20, "c"), (10, "d")]:
        q.add(ts, "k", ns, 5)
    q.remove(10, "k", "b")  # its heap entry is skipped
    assert q.poll_until(5) is None and len(q) == 3
    assert q.poll_until(10) == (10, "k", "d", 0)
    assert q.poll_until(15) is None
    assert [q.poll_until(30), q.poll_until(30), q.poll_until(30)] == [
        (20, "k", "c", 0),
        (30, "k", "a", 0),
        None,
    ]
    assert len(q) == 0


def test_latency_tracking_wraps_batch_states() -> None:
    from streamstate.metrics import MetricGroup

    group = MetricGroup("op")
    backend = BatchExecutionStateBackend(latency_tracking=True).create_keyed_backend(
        StrSerializer(), 16, KeyGroupRange(0, 15), metric_group=group
    )
    value = backend.get_partitioned_state(VOID_NAMESPACE, None, DESCRIPTORS["value"]())
    backend.set_current_key("a")
    value.update(1)
    assert value.value() == 1
    assert any(name.endswith("value_state_update_latency") for name in group.metrics())


def test_a_queue_no_timer_service_fires_is_emptied_when_its_key_ends() -> None:
    backend = batch_backend()
    queue = backend.create_timer_queue("_timers.direct.event", Int64Serializer())
    backend.set_current_key("a")
    queue.add(5, "a", 0, 0)
    backend.set_current_key("b")
    assert len(queue) == 0
