"""The behaviour of keyed state, written once and run against every backend (SPEC §2.2, §4, §5.3).

Parametrized by the ``make_backend`` fixture over every backend kind in ``conftest.BACKEND_KINDS``.
"""

from __future__ import annotations

from typing import Any

import pytest

from streamstate import (
    AggregateFunction,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)
from streamstate.errors import (
    InvalidStateNameError,
    KeyGroupOutOfRangeError,
    NoCurrentKeyError,
    StateAccessError,
    StateMigrationException,
    UnsupportedKeyTypeError,
)
from streamstate.keygroups import KeyGroupRange, assign_to_key_group
from streamstate.namespace import VOID_NAMESPACE
from streamstate.serializers import serializer_for

NS = serializer_for(str)


class Average(AggregateFunction):
    def create_accumulator(self) -> list[int]:
        return [0, 0]

    def add(self, value: int, acc: list[int]) -> list[int]:
        acc[0] += value
        acc[1] += 1
        return acc

    def get_result(self, acc: list[int]) -> float:
        return acc[0] / acc[1]

    def merge(self, a: list[int], b: list[int]) -> list[int]:
        return [a[0] + b[0], a[1] + b[1]]


def value_d(name: str = "v", default: Any = None) -> ValueStateDescriptor:
    return ValueStateDescriptor(name, int, default=default)


def state(
    backend: Any, descriptor: Any, namespace: Any = VOID_NAMESPACE, ns_ser: Any = None
) -> Any:
    return backend.get_partitioned_state(namespace, ns_ser, descriptor)


# ---- value state --------------------------------------------------------------------------------


def test_value_state_per_key(make_backend: Any) -> None:
    b = make_backend()
    s = state(b, value_d())
    b.set_current_key("a")
    assert s.value() is None
    s.update(1)
    b.set_current_key("b")
    assert s.value() is None
    s.update(2)
    b.set_current_key("a")
    assert s.value() == 1
    s.update(None)  # None clears
    assert s.value() is None
    assert list(b.get_keys("v", VOID_NAMESPACE)) == ["b"]


def test_value_state_default_is_returned_and_copied(make_backend: Any) -> None:
    b = make_backend()
    s = state(b, ValueStateDescriptor("d", list[int], default=[]))
    b.set_current_key("k")
    got = s.value()
    assert got == []
    got.append(1)  # mutating the returned default must not change the descriptor's default
    assert s.value() == []
    counter = state(b, value_d("c", default=0))
    assert counter.value() == 0
    counter.update(counter.value() + 1)
    assert counter.value() == 1
    counter.clear()
    assert counter.value() == 0


def test_value_state_mutation_after_update_is_visible(make_backend: Any) -> None:
    b = make_backend()
    s = state(b, ValueStateDescriptor("m", dict[str, int]))
    b.set_current_key("k")
    s.update({"x": 1})
    d = s.value()
    d["y"] = 2
    s.update(d)
    assert s.value() == {"x": 1, "y": 2}


# ---- list state --------------------------------------------------------------------------------


def test_list_state(make_backend: Any) -> None:
    b = make_backend()
    s = state(b, ListStateDescriptor("l", str))
    b.set_current_key("k")
    assert list(s.get()) == []
    s.add("a")
    s.add_all(["b", "c"])
    assert list(s.get()) == ["a", "b", "c"]
    s.update(["x"])
    assert list(s.get()) == ["x"]
    s.update([])  # an empty list clears
    assert list(s.get()) == []
    assert list(b.get_keys("l", VOID_NAMESPACE)) == []
    s.add_all([])
    assert list(b.get_keys("l", VOID_NAMESPACE)) == []
    s.add("z")
    s.clear()
    assert list(s.get()) == []


def test_list_state_refuses_none(make_backend: Any) -> None:
    b = make_backend()
    s = state(b, ListStateDescriptor("names", str))
    b.set_current_key("k")
    with pytest.raises(StateAccessError, match="'names'.*None"):
        s.add(None)
    with pytest.raises(StateAccessError, match="'names'.*None"):
        s.add_all(["a", None])
    with pytest.raises(StateAccessError, match="'names'.*None"):
        s.update(["a", None])
    assert list(s.get()) == []


# ---- map state ---------------------------------------------------------------------------------


def test_map_state(make_backend: Any) -> None:
    b = make_backend()
    s = state(b, MapStateDescriptor("m", str, int))
    b.set_current_key("k")
    assert s.is_empty()
    assert s.get("a") is None and not s.contains("a")
    s.put("a", 1)
    s.put_all({"b": 2, "c": 3})
    assert s.get("b") == 2 and s.contains("c") and "c" in s
    assert sorted(s.keys()) == ["a", "b", "c"]
    assert sorted(s.values()) == [1, 2, 3]
    assert sorted(s.items()) == [("a", 1), ("b", 2), ("c", 3)]
    assert sorted(s) == ["a", "b", "c"]
    for k in s:  # removing while iterating is allowed
        if k != "a":
            s.remove(k)
    assert dict(s.items()) == {"a": 1}
    s.remove("missing")
    s.remove("a")  # removing the last mapping removes the entry
    assert s.is_empty()
    assert list(b.get_keys("m", VOID_NAMESPACE)) == []
    s.put("x", 9)
    s.clear()
    assert s.is_empty() and list(s.items()) == []


# ---- reducing / aggregating --------------------------------------------------------------------


def test_reducing_state(make_backend: Any) -> None:
    b = make_backend()
    s = state(b, ReducingStateDescriptor("sum", lambda x, y: x + y, int))
    b.set_current_key("k")
    assert s.get() is None
    for v in (1, 2, 3):
        s.add(v)
    assert s.get() == 6
    b.set_current_key("j")
    s.add(10)
    assert s.get() == 10
    b.set_current_key("k")
    assert s.get() == 6
    s.add(None)  # as in Flink, adding None clears
    assert s.get() is None


def test_aggregating_state(make_backend: Any) -> None:
    b = make_backend()
    s = state(b, AggregatingStateDescriptor("avg", Average(), list[int]))
    b.set_current_key("k")
    assert s.get() is None
    s.add(2)
    s.add(4)
    assert s.get() == 3.0
    s.clear()
    assert s.get() is None


@pytest.mark.parametrize("ttl", [False, True])
def test_aggregating_add_none_clears(make_backend: Any, ttl: bool) -> None:
    # Flink's HeapAggregatingState.add(null) clears the state; the user's add never sees None
    b = make_backend()
    d = AggregatingStateDescriptor("avg", Average(), list[int])
    if ttl:
        d.enable_time_to_live(StateTtlConfig(ttl=60_000))
    s = state(b, d)
    b.set_current_key("k")
    s.add(2)
    b.set_current_key("j")
    s.add(4)
    s.add(None)
    assert s.get() is None
    b.set_current_key("k")
    assert s.get() == 2.0
    assert b.num_entries("avg") == 1


# ---- namespaces --------------------------------------------------------------------------------


def test_namespaces_are_independent(make_backend: Any) -> None:
    b = make_backend()
    d = ListStateDescriptor("l", int)
    b.set_current_key("k")
    s = state(b, d, "w1", NS)
    s.add(1)
    s = state(b, d, "w2", NS)
    s.add(2)
    assert list(state(b, d, "w1", NS).get()) == [1]
    assert list(state(b, d, "w2", NS).get()) == [2]
    assert s.get_current_namespace() == "w2"
    assert sorted(b.get_keys("l", "w1")) == ["k"]
    state(b, d, "w1", NS).clear()
    assert list(b.get_keys("l", "w1")) == []
    assert list(state(b, d, "w2", NS).get()) == [2]


def test_merge_namespaces_list(make_backend: Any) -> None:
    b = make_backend()
    d = ListStateDescriptor("l", int)
    b.set_current_key("k")
    for ns, vals in (("a", [1, 2]), ("b", [3]), ("t", [0])):
        state(b, d, ns, NS).add_all(vals)
    s = state(b, d, "t", NS)
    s.merge_namespaces("t", ["a", "b", "missing"])
    assert sorted(state(b, d, "t", NS).get()) == [0, 1, 2, 3]
    assert list(state(b, d, "a", NS).get()) == []
    assert list(state(b, d, "b", NS).get()) == []
    # merging into an absent target creates it
    state(b, d, "c", NS).add(7)
    s.merge_namespaces("new", ["c"])
    assert list(state(b, d, "new", NS).get()) == [7]


def test_merge_namespaces_reducing_and_aggregating(make_backend: Any) -> None:
    b = make_backend()
    r = ReducingStateDescriptor("r", lambda x, y: x + y, int)
    a = AggregatingStateDescriptor("a", Average(), list[int])
    b.set_current_key("k")
    for ns, v in (("x", 1), ("y", 2), ("z", 4)):
        state(b, r, ns, NS).add(v)
        state(b, a, ns, NS).add(v)
    state(b, r, "x", NS).merge_namespaces("x", ["y", "z"])
    assert state(b, r, "x", NS).get() == 7
    assert state(b, r, "y", NS).get() is None
    state(b, a, "z", NS).merge_namespaces("z", ["x", "y"])
    assert state(b, a, "z", NS).get() == pytest.approx(7 / 3)
    assert state(b, a, "x", NS).get() is None
    state(b, r, "q", NS).merge_namespaces("q", ["nothing"])
    assert state(b, r, "q", NS).get() is None


# ---- whole-backend operations ------------------------------------------------------------------


def test_get_keys_and_apply_to_all_keys(make_backend: Any) -> None:
    b = make_backend()
    d = value_d()
    s = state(b, d)
    keys = [f"k{i}" for i in range(50)]
    for i, k in enumerate(keys):
        b.set_current_key(k)
        s.update(i)
    assert sorted(b.get_keys("v", VOID_NAMESPACE)) == sorted(keys)
    seen: dict[str, int] = {}

    def visit(key: str, st: Any) -> None:
        seen[key] = st.value()
        if int(key[1:]) % 2 == 0:
            st.clear()  # clearing during the traversal is allowed

    b.set_current_key("k3")
    b.apply_to_all_keys(VOID_NAMESPACE, None, d, visit)
    assert seen == {k: i for i, k in enumerate(keys)}
    assert sorted(b.get_keys("v", VOID_NAMESPACE)) == sorted(k for k in keys if int(k[1:]) % 2)
    assert b.get_current_key() == "k3"  # the current key is restored afterwards
    assert b.num_entries("v") == 25
    assert list(b.get_keys("unknown", VOID_NAMESPACE)) == []


def test_many_keys_and_states_model(make_backend: Any) -> None:
    """A mixed workload checked against a dict oracle (crosses copy-on-write rehashes)."""
    import random

    rnd = random.Random(7)
    b = make_backend(key_type=int)
    v = state(b, value_d("v"))
    lst = state(b, ListStateDescriptor("l", int))
    m = state(b, MapStateDescriptor("m", int, str))
    oracle_v: dict[int, int] = {}
    oracle_l: dict[int, list[int]] = {}
    oracle_m: dict[int, dict[int, str]] = {}
    for step in range(20000):
        k = rnd.randrange(3000)
        b.set_current_key(k)
        op = rnd.randrange(6)
        if op == 0:
            v.update(step)
            oracle_v[k] = step
        elif op == 1:
            v.clear()
            oracle_v.pop(k, None)
        elif op == 2:
            lst.add(step)
            oracle_l.setdefault(k, []).append(step)
        elif op == 3:
            m.put(step % 5, str(step))
            oracle_m.setdefault(k, {})[step % 5] = str(step)
        elif op == 4:
            m.remove(step % 5)
            if k in oracle_m:
                oracle_m[k].pop(step % 5, None)
                if not oracle_m[k]:
                    del oracle_m[k]
        else:
            assert v.value() == oracle_v.get(k)
            assert list(lst.get()) == oracle_l.get(k, [])
            assert dict(m.items()) == oracle_m.get(k, {})
    for k in range(3000):
        b.set_current_key(k)
        assert v.value() == oracle_v.get(k)
        assert list(lst.get()) == oracle_l.get(k, [])
        assert dict(m.items()) == oracle_m.get(k, {})
    # entries as streamstate.format.entries counts them: lists by element, maps by mapping
    assert b.num_entries("v") == len(oracle_v)
    assert b.num_entries("l") == sum(map(len, oracle_l.values()))
    assert b.num_entries("m") == sum(map(len, oracle_m.values()))


def test_state_handles_are_cached_per_name(make_backend: Any) -> None:
    b = make_backend()
    d = value_d()
    assert state(b, d) is state(b, d)
    assert b.registered_state_names() == ["v"]


def test_snapshot_contains_exactly_the_state(make_backend: Any) -> None:
    b = make_backend(key_type=int)
    v = state(b, value_d("v"))
    lst = state(b, ListStateDescriptor("l", int))
    for k in range(200):
        b.set_current_key(k)
        v.update(k * 10)
        if k % 3 == 0:
            lst.add_all([k, k + 1])
    snap = b.snapshot(1)
    try:
        # mutations after the synchronous phase must not show up in the snapshot
        for k in range(200):
            b.set_current_key(k)
            v.update(-1)
            lst.add(99)
        names = [m.name for m in snap.states]
        found: dict[str, dict[int, Any]] = {n: {} for n in names}
        for kg in snap.key_group_range:
            for idx, entries in snap.key_group_entries(kg):
                for key, ns, value in entries:
                    assert assign_to_key_group(key, 128) == kg
                    assert ns == VOID_NAMESPACE
                    found[names[idx]][key] = value
            snap.release_key_group(kg)
        assert found["v"] == {k: k * 10 for k in range(200)}
        assert found["l"] == {k: [k, k + 1] for k in range(0, 200, 3)}
    finally:
        snap.release()


# ---- errors (SPEC §12) -------------------------------------------------------------------------


def test_no_current_key(make_backend: Any) -> None:
    b = make_backend()
    s = state(b, value_d("visits"))
    with pytest.raises(NoCurrentKeyError, match="'visits'.*no current key"):
        s.value()
    with pytest.raises(NoCurrentKeyError):
        s.update(1)
    with pytest.raises(NoCurrentKeyError, match="no current key"):
        b.get_current_key()


def test_key_group_outside_range(make_backend: Any) -> None:
    b = make_backend(max_parallelism=128, key_group_range=KeyGroupRange(0, 63))
    key = next(k for k in range(1000) if assign_to_key_group(k, 128) >= 64)
    kg = assign_to_key_group(key, 128)
    with pytest.raises(
        KeyGroupOutOfRangeError, match=rf"key {key}.*key group {kg}.*KeyGroupRange\(0, 63\)"
    ):
        b.set_current_key(key)
    with pytest.raises(KeyGroupOutOfRangeError, match="non-deterministic"):
        b.set_current_key("x", 100)


def test_unsupported_keys(make_backend: Any) -> None:
    b = make_backend()
    with pytest.raises(UnsupportedKeyTypeError, match="None"):
        b.set_current_key(None)
    with pytest.raises(UnsupportedKeyTypeError, match="no stable hash"):
        b.set_current_key(object())
    with pytest.raises(TypeError):
        b.set_current_key(["unhashable"])


def test_kind_change_is_refused(make_backend: Any) -> None:
    b = make_backend()
    state(b, value_d("x"))
    with pytest.raises(StateMigrationException, match="'x'.*value.*list"):
        state(b, ListStateDescriptor("x", int))


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "non-empty"),
        ("default", "reserved"),
        ("a/b", "path separator"),
        ("a\\b", "path separator"),
        ("tab\there", "control character"),
        ("x" * 201, "at most 200"),
        ("..", "path separator"),
    ],
)
def test_invalid_state_names(name: str, message: str) -> None:
    with pytest.raises(InvalidStateNameError, match=message):
        ValueStateDescriptor(name, int)


def test_namespace_must_not_be_none(make_backend: Any) -> None:
    b = make_backend()
    with pytest.raises(StateAccessError, match="namespace"):
        state(b, value_d("n"), None)


def test_namespace_serializer_is_inferred_and_void_refuses_namespaces(make_backend: Any) -> None:
    b = make_backend()
    b.set_current_key("k")
    s = state(b, value_d("by_hour"), 3)  # no serializer given: inferred from the namespace
    s.update(30)
    s.set_current_namespace(4)
    s.update(40)
    assert sorted(b.get_keys("by_hour", 3)) == ["k"]
    snap = b.snapshot(1)
    try:
        (meta,) = snap.states
        assert meta.namespace_serializer == serializer_for(int)
        entries = [
            (key, ns, value)
            for kg in snap.key_group_range
            for _, part in snap.key_group_entries(kg)
            for key, ns, value in part
        ]
        assert sorted(entries) == [("k", 3, 30), ("k", 4, 40)]
    finally:
        snap.release()
    void = state(b, value_d("plain"))
    with pytest.raises(StateAccessError, match="'plain'.*void namespace serializer.*'w1'"):
        void.set_current_namespace("w1")
    void.update(1)  # the refused namespace left the state usable in the void one
    assert void.value() == 1


def test_namespace_serializer_that_cannot_be_inferred(make_backend: Any) -> None:
    class Opaque:
        pass

    b = make_backend()
    b.set_current_key("k")
    with pytest.raises(StateAccessError, match="'odd'.*namespace serializer.*Opaque"):
        state(b, value_d("odd"), Opaque())


def test_disposed_backend(make_backend: Any) -> None:
    from streamstate.errors import StateBackendError

    b = make_backend()
    b.dispose()
    with pytest.raises(StateBackendError, match="disposed"):
        state(b, value_d("late"))


# ---- a value of the wrong type is refused where it is written --------------------------------


def test_a_value_of_the_wrong_type_raises_at_the_write(make_backend: Any) -> None:
    from streamstate import StateTtlConfig, Time
    from streamstate.errors import StateAccessError

    b = make_backend()
    value = state(b, value_d("count"))
    lst = state(b, ListStateDescriptor("pages", str))
    mapping = state(b, MapStateDescriptor("per-page", str, int))
    reducing = state(b, ReducingStateDescriptor("total", lambda x, y: x + y, float))
    ttl = StateTtlConfig.new_builder(Time.seconds(10)).build()
    with_ttl = state(b, ValueStateDescriptor("last", int).enable_time_to_live(ttl))
    pair = state(b, ValueStateDescriptor("pair", tuple[int, int]))
    b.set_current_key("user-7")
    writes = [
        (lambda: value.update("x"), r"state 'count' of key 'user-7': the value 'x' "),
        (lambda: lst.add(3), r"state 'pages' of key 'user-7': the element 3 "),
        (lambda: lst.add_all(["a", 3]), r"state 'pages' .* the element 3 "),
        (lambda: lst.update(["a", b"b"]), r"state 'pages' .* the element b'b' "),
        (lambda: mapping.put(1, 2), r"state 'per-page' .* the map key 1 "),
        (lambda: mapping.put("/", "x"), r"state 'per-page' .* the map value 'x' "),
        (lambda: mapping.put_all({"/": 1, "/a": "x"}), r"the map value 'x' "),
        (lambda: reducing.add("x"), r"state 'total' .* the value 'x' "),
        (lambda: with_ttl.update("x"), r"state 'last' of key 'user-7': the value 'x' "),
        (lambda: pair.update("x"), r"state 'pair' .* the value 'x' "),
    ]
    for write, message in writes:
        with pytest.raises(StateAccessError, match=message):
            write()
    # nothing was written, and values of the declared types (ints into a float state too) are
    assert value.value() is None and lst.get() == [] and mapping.is_empty()
    value.update(3)
    reducing.add(1)
    reducing.add(0.5)
    lst.add_all(["a", "b"])
    mapping.put_all({"/": 1})
    pair.update((1, 2))
    with_ttl.update(4)
    assert (value.value(), reducing.get(), lst.get(), dict(mapping.items())) == (
        3,
        1.5,
        ["a", "b"],
        {"/": 1},
    )
    assert (pair.value(), with_ttl.value()) == ((1, 2), 4)


@pytest.mark.parametrize(
    "options",
    [{}, {"cache_entries": 4}, {"incremental": True}],
    ids=["default", "small-cache", "change-tracking"],
)
def test_the_entry_count_follows_a_model_of_the_state(make_backend: Any, options: Any) -> None:
    """The backend's live count of entries (``state_figures().rows``, kept as states change:
    the heap's list and map handles, RocksDB's flushes) against a model, counted as
    ``streamstate.format.entries`` says: a value per (key, namespace), a list's elements, a
    map's mappings. The canonical snapshot, counted with the same definition, agrees."""
    import random

    from streamstate.format.entries import count_entries
    from streamstate.serializers import StrSerializer

    b = make_backend(key_type=int)
    if "cache_entries" in options and not hasattr(b, "cache"):
        pytest.skip("a write-back cache is RocksDB's")
    if "incremental" in options and not hasattr(b, "incremental"):
        pytest.skip("change tracking is the heap's")
    if options:
        b = make_backend(key_type=int, **options)
    rnd = random.Random(11)
    v = state(b, value_d("v"))
    lst = state(b, ListStateDescriptor("l", int), "w0", StrSerializer())
    m = state(b, MapStateDescriptor("m", int, str))
    model_v: dict[int, int] = {}
    model_l: dict[tuple[int, str], list[int]] = {}
    model_m: dict[int, dict[int, str]] = {}

    def expected() -> int:
        lists = sum(map(len, model_l.values()))
        return len(model_v) + lists + sum(map(len, model_m.values()))

    b.state_figures()  # counted from here on by the changes alone
    for step in range(6000):
        k = rnd.randrange(300)
        b.set_current_key(k)
        ns = f"w{rnd.randrange(3)}"
        lst.set_current_namespace(ns)
        op = rnd.randrange(11)
        if op == 0:
            v.update(step)
            model_v[k] = step
        elif op == 1:
            v.clear()
            model_v.pop(k, None)
        elif op == 2:
            lst.add(step)
            model_l.setdefault((k, ns), []).append(step)
        elif op == 3:
            more = [step] * rnd.randrange(3)
            lst.add_all(more)
            if more:
                model_l.setdefault((k, ns), []).extend(more)
        elif op == 4:
            new = [step] * rnd.randrange(3)
            lst.update(new)
            model_l.pop((k, ns), None)
            if new:
                model_l[(k, ns)] = new
        elif op == 5:
            lst.clear()
            model_l.pop((k, ns), None)
        elif op == 6:
            lst.merge_namespaces("w0", [ns])
            merged = model_l.pop((k, ns), [])
            if merged:
                model_l.setdefault((k, "w0"), []).extend(merged)
        elif op == 7:
            m.put(step % 7, "x")
            model_m.setdefault(k, {})[step % 7] = "x"
        elif op == 8:
            m.put_all({step % 7: "y", (step + 1) % 7: "z"})
            model_m.setdefault(k, {}).update({step % 7: "y", (step + 1) % 7: "z"})
        elif op == 9:
            m.remove(step % 7)
            model_m.get(k, {}).pop(step % 7, None)
            if k in model_m and not model_m[k]:
                del model_m[k]
        else:
            m.clear()
            model_m.pop(k, None)
        if step % 997 == 0:
            assert b.state_figures().rows == expected(), step
        if step % 1999 == 0:
            b.snapshot(step).release()
    assert b.state_figures().rows == expected()
    snap = b.snapshot(10_000)
    try:
        counted = 0
        for kg in snap.key_group_range:
            for index, entries in snap.key_group_entries(kg):
                meta = snap.states[index]
                if meta.kind != "timer":
                    counted += count_entries(meta.kind, (e[2] for e in entries))
    finally:
        snap.release()
    assert counted == expected()
