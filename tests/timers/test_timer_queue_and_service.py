"""Timers (SPEC §9): the key-grouped queue and the internal timer service."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamstate.backends.heap.backend import HeapKeyedStateBackend
from streamstate.backends.timer_queues import TimerRestore
from streamstate.errors import (
    KeyGroupOutOfRangeError,
    NoCurrentKeyError,
    StateAccessError,
    StateMigrationException,
)
from streamstate.keygroups import KeyGroupRange, assign_to_key_group
from streamstate.namespace import VOID_NAMESPACE
from streamstate.serializers import Int64Serializer, StrSerializer, serializer_for
from streamstate.timers import (
    MIN_WATERMARK,
    InternalTimerService,
    KeyGroupedTimerQueue,
    UserTimerService,
)
from support.memory_restore import MemoryRestore

MAX_P = 16


class Recorder:
    """A triggerable that records (domain, timestamp, key, namespace, current key)."""

    def __init__(self, backend):
        self.backend = backend
        self.fired: list[tuple] = []
        self.on_fire = None

    def on_event_time(self, timestamp, key, namespace):
        self.fired.append(("event", timestamp, key, namespace, self.backend.get_current_key()))
        if self.on_fire:
            self.on_fire(timestamp, key, namespace)

    def on_processing_time(self, timestamp, key, namespace):
        self.fired.append(("proc", timestamp, key, namespace, self.backend.get_current_key()))
        if self.on_fire:
            self.on_fire(timestamp, key, namespace)


FULL_RANGE = KeyGroupRange(0, MAX_P - 1)


def make_backend(kg_range=FULL_RANGE):
    return HeapKeyedStateBackend(StrSerializer(), MAX_P, kg_range, table_kind="nested_maps")


def make_service(backend=None, name="t"):
    backend = backend or make_backend()
    rec = Recorder(backend)
    svc = InternalTimerService(name, backend, rec, namespace_serializer=Int64Serializer())
    return backend, rec, svc


def register(backend, svc, key, ns, ts, domain="event"):
    backend.set_current_key(key)
    if domain == "event":
        svc.register_event_time_timer(ns, ts)
    else:
        svc.register_processing_time_timer(ns, ts)


# ---- queue ------------------------------------------------------------------------------------


def test_queue_orders_by_timestamp_then_insertion():
    q = KeyGroupedTimerQueue(4)
    q.add(30, "a", 0, 0)
    q.add(10, "b", 0, 3)
    q.add(20, "c", 0, 1)
    q.add(10, "a", 1, 0)
    assert [q.poll()[:3] for _ in range(4)] == [
        (10, "b", 0),
        (10, "a", 1),
        (20, "c", 0),
        (30, "a", 0),
    ]
    assert q.poll() is None and q.peek_timestamp() is None and len(q) == 0


def test_queue_set_semantics_and_removal():
    q = KeyGroupedTimerQueue(2)
    assert q.add(5, "k", "ns", 1) is True
    assert q.add(5, "k", "ns", 1) is False  # same (timestamp, key, namespace)
    assert q.add(5, "k", "other", 1) is True
    assert len(q) == 2 and q.contains(5, "k", "ns", 1)
    assert q.remove(5, "k", "ns", 1) is True
    assert q.remove(5, "k", "ns", 1) is False
    assert q.add(5, "k", "ns", 1) is True  # re-adding after removal works
    assert sorted(q.timers_of_key_group(1)) == [(5, "k", "ns"), (5, "k", "other")]
    assert [t[:3] for t in iter(lambda: q.poll(), None)] == [(5, "k", "other"), (5, "k", "ns")]


def test_queue_compacts_after_many_removals():
    q = KeyGroupedTimerQueue(1)
    for i in range(10_000):
        q.add(i, "k", 0, 0)
        if i >= 10:
            q.remove(i - 10, "k", 0, 0)
    assert len(q) == 10
    assert q.heap_size() <= 2 * len(q) + KeyGroupedTimerQueue.COMPACT_SLACK + 1
    assert [q.poll()[0] for _ in range(10)] == list(range(9990, 10_000))


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "remove", "poll", "poll_until", "compact"]),
            st.integers(0, 20),
            st.sampled_from(["a", "b", "c"]),
            st.integers(0, 2),
        ),
        max_size=80,
    )
)
def test_queue_matches_a_sorted_set_model(ops):
    q = KeyGroupedTimerQueue(3)
    model: dict[tuple, int] = {}  # (ts, key, ns) -> insertion order
    order = 0
    for op, ts, key, ns in ops:
        kg = ns  # any deterministic key-group index
        ident = (ts, key, ns)
        if op == "add":
            assert q.add(ts, key, ns, kg) is (ident not in model)
            if ident not in model:
                model[ident] = order
                order += 1
        elif op == "remove":
            assert q.remove(ts, key, ns, kg) is (ident in model)
            model.pop(ident, None)
        elif op == "compact":  # drops the entries of removed timers, keeps the order
            q.compact()
            assert q.heap_size() == len(model)
        elif op == "poll":
            got = q.poll()
            if not model:
                assert got is None
            else:
                first = min(model, key=lambda t: (t[0], model[t]))
                assert got[:3] == first
                del model[first]
        else:  # the earliest timer only if it is due by ``ts``
            got = q.poll_until(ts)
            due = [t for t in model if t[0] <= ts]
            if not due:
                assert got is None
            else:
                first = min(due, key=lambda t: (t[0], model[t]))
                assert got == (*first, first[2])
                del model[first]
        assert len(q) == len(model)
        assert q.peek_timestamp() == (min(t[0] for t in model) if model else None)


# ---- service ----------------------------------------------------------------------------------


def test_event_timers_fire_in_order_with_key_and_namespace():
    backend, rec, svc = make_service()
    register(backend, svc, "a", 1, 30)
    register(backend, svc, "b", 2, 10)
    register(backend, svc, "c", 3, 20)
    register(backend, svc, "a", 4, 10)
    assert svc.num_event_time_timers() == 4
    assert svc.advance_watermark(20) == 3
    assert rec.fired == [
        ("event", 10, "b", 2, "b"),
        ("event", 10, "a", 4, "a"),
        ("event", 20, "c", 3, "c"),
    ]
    assert backend.ctx.key_group == assign_to_key_group("c", MAX_P)
    assert svc.advance_watermark(100) == 1
    assert rec.fired[-1] == ("event", 30, "a", 1, "a")
    assert svc.num_event_time_timers() == 0


def test_duplicate_registration_fires_once_and_deletion_prevents_firing():
    backend, rec, svc = make_service()
    for _ in range(3):
        register(backend, svc, "a", 0, 10)
    register(backend, svc, "a", 1, 10)
    register(backend, svc, "b", 0, 10)
    backend.set_current_key("b")
    svc.delete_event_time_timer(0, 10)
    svc.delete_event_time_timer(0, 999)  # not registered: no-op
    backend.set_current_key("a")
    svc.delete_processing_time_timer(1, 10)  # other domain: no-op
    svc.advance_watermark(10)
    assert [(f[2], f[3]) for f in rec.fired] == [("a", 0), ("a", 1)]


def test_processing_time_timers_and_monotonic_clocks():
    backend, rec, svc = make_service()
    register(backend, svc, "a", 0, 100, "proc")
    register(backend, svc, "b", 0, 50, "proc")
    register(backend, svc, "a", 0, 100, "event")  # other domain, same identity
    assert svc.advance_processing_time(60) == 1
    assert svc.current_processing_time() == 60
    assert svc.advance_processing_time(10) == 0  # processing time never goes back
    assert svc.current_processing_time() == 60
    assert svc.advance_processing_time(100) == 1
    assert [f[:3] for f in rec.fired] == [("proc", 50, "b"), ("proc", 100, "a")]
    assert svc.num_event_time_timers() == 1

    assert svc.current_watermark == MIN_WATERMARK
    svc.advance_watermark(200)
    svc.advance_watermark(150)  # the watermark never goes back
    assert svc.current_watermark == 200
    register(backend, svc, "a", 0, 180)  # registered behind the watermark: fires at next advance
    assert svc.advance_watermark(150) == 1


def test_processing_time_from_the_clock_until_advanced_manually():
    backend = make_backend()
    rec = Recorder(backend)
    svc = InternalTimerService("t", backend, rec, processing_time=lambda: 42)
    assert svc.current_processing_time() == 42
    register(backend, svc, "a", VOID_NAMESPACE, 40, "proc")
    assert svc.fire_due_processing_time_timers() == 1


def test_timers_registered_while_firing():
    backend, rec, svc = make_service()

    def chain(ts, key, ns):
        if ts < 50:
            svc.register_event_time_timer(ns, ts + 10)  # due within this advance: fires too
            svc.register_event_time_timer(ns, ts + 1000)  # not due

    rec.on_fire = chain
    register(backend, svc, "k", 0, 10)
    assert svc.advance_watermark(55) == 5  # 10, 20, 30, 40, 50
    assert [f[1] for f in rec.fired] == [10, 20, 30, 40, 50]
    assert svc.num_event_time_timers() == 4  # 1010, 1020, 1030, 1040


def test_timer_errors_name_the_service():
    backend, _, svc = make_service(name="windows")
    with pytest.raises(NoCurrentKeyError, match="windows"):
        svc.register_event_time_timer(0, 1)
    backend.set_current_key("a")
    with pytest.raises(StateAccessError, match="namespace must not be None"):
        svc.register_event_time_timer(None, 1)
    # the service's queues are the backend's, named after the service and the time domain
    assert backend.timer_queues.names() == ["_timers.windows.event", "_timers.windows.processing"]


def test_user_timer_service_uses_the_void_namespace():
    backend, rec, svc = make_service()
    user = UserTimerService(svc)
    backend.set_current_key("a")
    user.register_event_time_timer(5)
    user.register_processing_time_timer(6)
    user.delete_processing_time_timer(6)
    assert user.current_watermark() == MIN_WATERMARK
    svc.advance_watermark(5)
    svc.advance_processing_time(6)
    assert rec.fired == [("event", 5, "a", VOID_NAMESPACE, "a")]
    assert user.current_processing_time() == 6


# ---- snapshot and restore ---------------------------------------------------------------------


def timers_from_snapshot(snapshot) -> dict[str, list]:
    out: dict[str, list] = {}
    names = [m.name for m in snapshot.states]
    for kg in snapshot.key_group_range:
        for index, entries in snapshot.key_group_entries(kg):
            for key, ns, ts in entries:
                out.setdefault(names[index], []).append((kg, key, ns, ts))
    return out


@pytest.mark.parametrize("service_first", [True, False], ids=["service-first", "restore-first"])
@pytest.mark.parametrize("new_parallelism", [1, 2])
def test_timers_survive_snapshot_and_restore_into_fresh_services(new_parallelism, service_first):
    backend, _, svc = make_service()
    keys = [f"k{i}" for i in range(40)]
    for i, k in enumerate(keys):
        register(backend, svc, k, i % 3, 100 + i)
        register(backend, svc, k, i % 3, 100 + i)  # duplicate
        register(backend, svc, k, 0, 500 + i, "proc")
    backend.set_current_key("k0")
    svc.delete_event_time_timer(0, 100)

    file_snapshot = backend.snapshot(6)  # written after the changes below
    with backend.snapshot(7) as snap:
        timers = timers_from_snapshot(snap)
        metas = {m.name: m for m in snap.states}
    assert set(timers) == {"_timers.t.event", "_timers.t.processing"}
    assert metas["_timers.t.event"].kind == "timer"
    assert len(timers["_timers.t.event"]) == 39 and len(timers["_timers.t.processing"]) == 40
    # the snapshot is a copy: later changes do not leak into it
    register(backend, svc, "late", 0, 1)

    # restore into `new_parallelism` fresh backends, each reading only its key groups; the
    # backend restores its timer queues itself, whether the service exists already or not
    fired = []
    data = MemoryRestore.write(file_snapshot)
    for i in range(new_parallelism):
        start = i * MAX_P // new_parallelism
        end = (i + 1) * MAX_P // new_parallelism - 1
        kg_range = KeyGroupRange(start, end)
        backend2 = make_backend(kg_range)
        if service_first:
            _, rec2, svc2 = make_service(backend2)
        backend2.restore([MemoryRestore(data, kg_range)])
        if not service_first:
            _, rec2, svc2 = make_service(backend2)
        svc2.advance_watermark(10_000)
        svc2.advance_processing_time(10_000)
        fired += rec2.fired
        for _, _, key, _, current in rec2.fired:
            assert key == current and start <= assign_to_key_group(key, MAX_P) <= end
    expected_event = sorted((100 + i, k, i % 3) for i, k in enumerate(keys) if i)
    assert sorted((f[1], f[2], f[3]) for f in fired if f[0] == "event") == expected_event
    assert sorted(f[1] for f in fired if f[0] == "proc") == [500 + i for i in range(40)]


def test_restore_refuses_a_timer_outside_the_range():
    backend, _, _ = make_service(make_backend(KeyGroupRange(0, 7)))
    restore = TimerRestore(backend.timer_queues, backend.key_serializer)
    meta = backend.timer_queues.get("_timers.t.event").meta()
    with pytest.raises(KeyGroupOutOfRangeError, match="key group 9"):
        restore.add_timers(meta, 9, [("x", 0, 5)])


def test_snapshot_sources_release():
    backend, _, svc = make_service()
    register(backend, svc, "a", 0, 1)
    sources = backend.timer_queues.snapshot_sources()
    kgi = assign_to_key_group("a", MAX_P)
    assert list(sources[0].entries(kgi)) == [("a", 0, 1)]
    sources[0].release_key_group(kgi)
    assert sources[0].entries(kgi) is None
    sources[1].release()


@dataclasses.dataclass(frozen=True)
class Pane:
    """A namespace type whose serializer a restore does not rebuild (it would import it)."""

    start: int


def test_timers_with_a_custom_namespace_stay_encoded_until_their_queue_is_created(tmp_path):
    from streamstate.backends.rocksdb.backend import RocksDBKeyedStateBackend
    from streamstate.errors import CheckpointError

    panes = serializer_for(Pane)
    backend = make_backend()
    rec = Recorder(backend)
    svc = InternalTimerService("p", backend, rec, namespace_serializer=panes)
    for key, start in (("a", 1), ("b", 2)):
        backend.set_current_key(key)
        svc.register_event_time_timer(Pane(start), 10 + start)
    data = MemoryRestore.write(backend.snapshot(1))

    # heap: the restored queue keeps its namespaces encoded and goes through checkpoints as is
    blind = make_backend()
    blind.restore([MemoryRestore(data, FULL_RANGE)])
    assert blind.timer_queues.unbound_names() == ["_timers.p.event"]
    again = MemoryRestore.write(blind.snapshot(2))
    fresh = make_backend()
    fresh.restore([MemoryRestore(again, FULL_RANGE)])
    rec2 = Recorder(fresh)
    svc2 = InternalTimerService("p", fresh, rec2, namespace_serializer=panes)
    assert fresh.timer_queues.unbound_names() == []
    svc2.advance_watermark(100)
    assert sorted(f[1:4] for f in rec2.fired) == [(11, "a", Pane(1)), (12, "b", Pane(2))]

    # RocksDB: refuses to checkpoint such a queue until its service exists, naming it
    rocks = RocksDBKeyedStateBackend(
        StrSerializer(), MAX_P, FULL_RANGE, path=str(tmp_path / "rocks")
    )
    try:
        rocks.restore([MemoryRestore(data, FULL_RANGE)])
        with pytest.raises(CheckpointError, match=r"_timers\.p\.event"):
            rocks.snapshot(3)
        rec3 = Recorder(rocks)
        svc3 = InternalTimerService("p", rocks, rec3, namespace_serializer=panes)
        rocks.snapshot(4).release()
        svc3.advance_watermark(100)
        assert sorted(f[1:4] for f in rec3.fired) == [(11, "a", Pane(1)), (12, "b", Pane(2))]
    finally:
        rocks.dispose()


def test_a_timer_queue_refuses_an_incompatible_namespace_serializer():
    backend, _, svc = make_service()  # Int64 namespaces
    register(backend, svc, "a", 5, 50)
    data = MemoryRestore.write(backend.snapshot(1))
    fresh = make_backend()
    fresh.restore([MemoryRestore(data, FULL_RANGE)])
    with pytest.raises(StateMigrationException, match=r"timer queue '_timers\.t\.event'"):
        InternalTimerService("t", fresh, Recorder(fresh), namespace_serializer=StrSerializer())
