"""TTL cleanup strategies: full-snapshot filter, incremental cleanup, sweep hook, restore checks."""

from __future__ import annotations

import pytest

from streamstate import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)
from streamstate.api.descriptors import StateKind
from streamstate.backends.decorators.ttl import (
    IncrementalCleanup,
    TtlCleanupHook,
    TtlPolicy,
    create_ttl_state,
    snapshot_transform,
    sweep,
    ttl_state_serializer,
)
from streamstate.errors import StateMigrationException
from streamstate.format.meta import StateMetaSnapshot
from streamstate.namespace import VOID_NAMESPACE
from streamstate.serializers import VoidNamespaceSerializer

TTL = 100
NS = VoidNamespaceSerializer()


def state_of(backend, descriptor, key):
    backend.set_current_key(key)
    return backend.get_partitioned_state(VOID_NAMESPACE, NS, descriptor)


def snapshot_entries(backend) -> dict[str, dict]:
    """state name -> {(key, namespace): stored state} as written into a snapshot."""
    out: dict[str, dict] = {}
    with backend.snapshot(1) as snap:
        names = [m.name for m in snap.states]
        for kg in snap.key_group_range:
            for index, entries in snap.key_group_entries(kg):
                for key, ns, state in entries:
                    out.setdefault(names[index], {})[(key, ns)] = state
            snap.release_key_group(kg)
        metas = {m.name: m for m in snap.states}
    out["_meta"] = metas
    return out


# ---- full snapshot filter -------------------------------------------------------------------


def test_snapshot_drops_expired_entries_elements_and_values(heap_backend, clock):
    backend = heap_backend
    cfg = StateTtlConfig(ttl=TTL, cleanup_size=0, cleanup_full_snapshot=True)
    v = ValueStateDescriptor("v", int).enable_time_to_live(cfg)
    lst = ListStateDescriptor("l", int).enable_time_to_live(cfg)
    m = MapStateDescriptor("m", str, int).enable_time_to_live(cfg)
    for key in ("old", "young"):
        state_of(backend, v, key).update(1)
        state_of(backend, lst, key).add(1)
        state_of(backend, m, key).put("x", 1)
        if key == "old":
            clock.time = 1060
    state_of(backend, lst, "old").add(2)  # "old" list: [(1000, 1), (1060, 2)]
    state_of(backend, m, "old").put("y", 2)  # "old" map: {x: (1000, 1), y: (1060, 2)}
    clock.time = 1100  # everything written at 1000 has expired

    snap = snapshot_entries(backend)
    assert snap["v"] == {("young", VOID_NAMESPACE): (1060, 1)}
    assert snap["l"] == {
        ("old", VOID_NAMESPACE): [(1060, 2)],
        ("young", VOID_NAMESPACE): [(1060, 1)],
    }
    assert snap["m"] == {
        ("old", VOID_NAMESPACE): {"y": (1060, 2)},
        ("young", VOID_NAMESPACE): {"x": (1060, 1)},
    }
    # the working state is untouched by the filter
    assert backend.state_table("v").size() == 2
    assert backend.state_table("l").map_for_key("old", 8).get("old", VOID_NAMESPACE) == [
        (1000, 1),
        (1060, 2),
    ]
    # the TTL configuration travels with the state's meta information
    meta = snap["_meta"]["v"]
    assert meta.ttl == cfg.to_dict()
    assert meta.to_dict()["ttl"]["ttl"] == TTL
    assert meta.state_serializer.snapshot()["type"] == "ttl_value"

    clock.time = 1160  # now everything has expired
    snap = snapshot_entries(backend)
    assert "v" not in snap and "l" not in snap and "m" not in snap


def test_snapshot_keeps_expired_entries_without_full_snapshot_cleanup(heap_backend, clock):
    backend = heap_backend
    cfg = StateTtlConfig(ttl=TTL, cleanup_size=0, cleanup_full_snapshot=False)
    v = ValueStateDescriptor("v", int).enable_time_to_live(cfg)
    state_of(backend, v, "a").update(1)
    clock.advance(TTL)
    assert snapshot_entries(backend)["v"] == {("a", VOID_NAMESPACE): (1000, 1)}


def test_full_snapshot_cleanup_is_off_by_default_as_in_flink(heap_backend, clock):
    # Flink turns it on only with StateTtlConfig.Builder.cleanupFullSnapshot()
    assert StateTtlConfig(ttl=TTL).cleanup_full_snapshot is False
    assert StateTtlConfig.new_builder(TTL).build().cleanup_full_snapshot is False
    assert StateTtlConfig.new_builder(TTL).cleanup_full_snapshot().build().cleanup_full_snapshot
    backend = heap_backend
    v = ValueStateDescriptor("v", int).enable_time_to_live(StateTtlConfig(ttl=TTL, cleanup_size=0))
    state_of(backend, v, "a").update(1)
    clock.advance(TTL)
    assert backend.state_table("v").snapshot_transformer is None
    assert snapshot_entries(backend)["v"] == {("a", VOID_NAMESPACE): (1000, 1)}


def test_snapshot_transform_never_mutates_and_returns_same_object_when_unchanged(clock):
    policy = TtlPolicy(StateTtlConfig(ttl=TTL), clock)
    t_list = snapshot_transform(StateKind.LIST, policy)
    t_map = snapshot_transform(StateKind.MAP, policy)
    t_val = snapshot_transform(StateKind.VALUE, policy)
    lst = [(950, "a"), (1000, "b")]
    d = {"a": (950, 1), "b": (1000, 2)}
    clock.time = 1000
    assert t_list(lst) is lst and t_map(d) is d and t_val((1000, 1)) == (1000, 1)
    clock.time = 1050
    assert t_list(lst) == [(1000, "b")] and lst == [(950, "a"), (1000, "b")]
    assert t_map(d) == {"b": (1000, 2)} and len(d) == 2
    assert t_val((950, 1)) is None
    clock.time = 1100
    assert t_list(lst) is None and t_map(d) is None


# ---- incremental cleanup --------------------------------------------------------------------


def test_incremental_cleanup_removes_expired_entries_on_state_access(heap_backend, clock):
    backend = heap_backend
    cfg = StateTtlConfig(ttl=TTL, cleanup_size=5)
    d = ValueStateDescriptor("v", int).enable_time_to_live(cfg)
    keys = [f"k{i}" for i in range(200)]
    for k in keys:
        state_of(backend, d, k).update(1)
    clock.advance(TTL)
    state_of(backend, d, "fresh").update(1)
    assert 190 < backend.num_entries("v") <= 201  # the write itself ran one step
    s = state_of(backend, d, "fresh")
    groups = len(backend.key_group_range)
    # one pass visits every entry once plus one unit per key group: (n + g) / cleanup_size
    for _ in range((201 + groups) // 5 + 2):
        assert s.value() == 1  # every access runs one bounded step
    assert backend.num_entries("v") == 1
    assert backend.get_current_key() == "fresh"  # cleanup never changes the current key


def test_incremental_cleanup_rewrites_partly_expired_lists_and_maps(heap_backend, clock):
    backend = heap_backend
    cfg = StateTtlConfig(ttl=TTL, cleanup_size=3)
    lst = ListStateDescriptor("l", int).enable_time_to_live(cfg)
    m = MapStateDescriptor("m", str, int).enable_time_to_live(cfg)
    state_of(backend, lst, "a").add(1)
    state_of(backend, m, "a").put("x", 1)
    clock.time = 1060
    state_of(backend, lst, "a").add(2)
    state_of(backend, m, "a").put("y", 2)
    clock.time = 1100
    table_l, table_m = backend.state_table("l"), backend.state_table("m")
    for _ in range(10):  # touch state "b" only; the cursors sweep every key group
        state_of(backend, lst, "b").get()
        state_of(backend, m, "b").get("z")
    assert table_l.map_for_key("a", 8).get("a", VOID_NAMESPACE) == [(1060, 2)]
    assert table_m.map_for_key("a", 8).get("a", VOID_NAMESPACE) == {"y": (1060, 2)}
    # the entries the cleanup removed no longer count (streamstate.format.entries)
    assert backend.num_entries("l") == 1 and backend.num_entries("m") == 1


def test_incremental_cleanup_bounded_work_per_step(heap_backend, make_backend, clock):
    backend = make_backend(max_parallelism=4, clock=clock)
    cfg = StateTtlConfig(ttl=TTL, cleanup_size=0)
    d = ValueStateDescriptor("v", int).enable_time_to_live(cfg)
    for i in range(40):
        state_of(backend, d, f"k{i}").update(i)
    clock.advance(TTL)
    policy = TtlPolicy(cfg, clock)
    cleanup = IncrementalCleanup(
        backend.state_table("v"), snapshot_transform(StateKind.VALUE, policy), 4
    )
    checked = []
    while backend.num_entries("v"):
        checked.append(cleanup.step())
        assert checked[-1] <= 4
        assert len(checked) < 100
    assert sum(checked) == 40
    assert cleanup.step() == 0  # an empty table costs cleanup_size key-group steps, nothing more


def test_incremental_cleanup_disabled_with_cleanup_size_zero(heap_backend, clock):
    backend = heap_backend
    d = ValueStateDescriptor("v", int).enable_time_to_live(StateTtlConfig(ttl=TTL, cleanup_size=0))
    for i in range(20):
        state_of(backend, d, f"k{i}").update(i)
    clock.advance(TTL)
    s = state_of(backend, d, "k0")
    for _ in range(50):
        s.update(1)
    assert backend.num_entries("v") == 20


def test_incremental_cleanup_for_every_record(heap_backend, clock):
    backend = heap_backend
    cfg = (
        StateTtlConfig.new_builder(TTL)
        .cleanup_incrementally(cleanup_size=10, run_cleanup_for_every_record=True)
        .build()
    )
    d = ReducingStateDescriptor("r", lambda a, b: a + b, int).enable_time_to_live(cfg)
    for i in range(30):
        state_of(backend, d, f"k{i}").add(i)
    clock.advance(TTL)
    for i in range(20):  # records of keys that never touch state "r"
        backend.set_current_key(f"other{i}")
    assert backend.num_entries("r") == 0


def test_incremental_cleanup_survives_concurrent_changes(heap_backend, clock):
    backend = heap_backend
    d = ValueStateDescriptor("v", int).enable_time_to_live(StateTtlConfig(ttl=TTL, cleanup_size=2))
    for i in range(30):
        state_of(backend, d, f"k{i}").update(i)
    clock.advance(TTL)
    for i in range(30):
        s = state_of(backend, d, f"k{i}")
        if i % 2:
            s.update(100 + i)  # rewritten: must survive the cursor
        else:
            s.clear()  # removed: the cursor must skip it
    for _ in range(60):
        state_of(backend, d, "k1").value()
    assert backend.num_entries("v") == 15
    assert state_of(backend, d, "k29").value() == 129


# ---- the sweep hook for backends without heap tables -----------------------------------------


class SweepingBackend:
    """A minimal dict backend that registers TTL hooks, as the RocksDB backend will."""

    def __init__(self, inner):
        self.inner = inner
        self.clock = inner.clock
        self.hooks: list[TtlCleanupHook] = []

    def register_ttl_cleanup(self, hook):
        self.hooks.append(hook)

    def _create_internal_state(self, ns, descriptor):
        state = self.inner._create_internal_state(ns, descriptor)
        # no heap table: a subclass whose "table" is None
        state.__class__ = type("Raw", (type(state),), {"__slots__": (), "table": None})
        return state


def test_backends_without_heap_tables_get_a_cleanup_hook(heap_backend, clock):
    inner = heap_backend
    b = SweepingBackend(inner)
    cfg = (
        StateTtlConfig.new_builder(TTL)
        .cleanup_full_snapshot()
        .cleanup_in_rocksdb_compact_filter(3)
        .build()
    )
    d = ValueStateDescriptor("v", int).enable_time_to_live(cfg)
    create_ttl_state(b, NS, d)
    (hook,) = b.hooks
    assert hook.state_name == "v" and hook.max_entries_per_checkpoint == 3
    assert hook.cleanup_full_snapshot is True
    assert inner.state_table("v").snapshot_transformer is None  # not wired as a heap table

    store = {i: ((1000 if i % 2 else 2000), i) for i in range(10)}  # odd keys expire at 1100
    clock.time = 1100
    rounds = 0
    while True:
        start = hook.cursor or 0
        entries = ((k, store[k]) for k in sorted(store) if k >= start)
        cursor = sweep(hook, entries, store.pop, store.__setitem__)
        rounds += 1
        if cursor is None:
            break
    assert sorted(store) == [0, 2, 4, 6, 8]
    assert rounds == 4  # 10 entries, at most 3 per checkpoint


# ---- restore checks -------------------------------------------------------------------------


def _restored(name, kind, state_serializer, ttl):
    return StateMetaSnapshot(name, kind, NS.snapshot(), state_serializer.snapshot(), ttl)


def test_restore_accepts_the_ttl_wrapped_serializer(backend):
    cfg = StateTtlConfig(ttl=TTL)
    d = ListStateDescriptor("l", int).enable_time_to_live(cfg)
    backend._restored_meta["l"] = _restored("l", "list", ttl_state_serializer(d), cfg.to_dict())
    state_of(backend, d, "a").add(1)


def test_restore_accepts_switching_ttl_on_or_off(make_backend):
    # the values migrate (tests/evolution/test_matrix.py restores real entries both ways)
    cfg = StateTtlConfig(ttl=TTL)
    plain = ValueStateDescriptor("v", int)
    with_ttl = ValueStateDescriptor("v", int).enable_time_to_live(cfg)

    b1 = make_backend()
    b1._restored_meta["v"] = _restored("v", "value", plain.serializer, None)
    state_of(b1, with_ttl, "a").update(1)

    b2 = make_backend()
    b2._restored_meta["v"] = _restored("v", "value", ttl_state_serializer(with_ttl), cfg.to_dict())
    state_of(b2, plain, "a").update(1)


def test_restore_refuses_an_incompatible_user_serializer(backend):
    cfg = StateTtlConfig(ttl=TTL)
    old = ValueStateDescriptor("v", str).enable_time_to_live(cfg)
    new = ValueStateDescriptor("v", int).enable_time_to_live(cfg)
    backend._restored_meta["v"] = _restored("v", "value", ttl_state_serializer(old), cfg.to_dict())
    with pytest.raises(StateMigrationException, match="str with time-to-live.*str → int"):
        state_of(backend, new, "a")
