"""Operator state: list (split-distribute), union list and broadcast state, and Flink's
round-robin redistribution rules on rescale (SPEC §7)."""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamstate import ListStateDescriptor, MapStateDescriptor
from streamstate.backends.operator import (
    BroadcastStateSnapshot,
    ListStateSnapshot,
    OperatorStateBackend,
    OperatorStateMode,
    OperatorStateSnapshot,
)
from streamstate.checkpoint.rescale import repartition_operator_state, split_distribute_counts
from streamstate.errors import StateAccessError, StateMigrationException
from streamstate.serializers import Int64Serializer, StrSerializer

SPLIT = OperatorStateMode.SPLIT_DISTRIBUTE
UNION = OperatorStateMode.UNION


def test_list_union_and_broadcast_states() -> None:
    ob = OperatorStateBackend()
    offsets = ob.get_list_state(ListStateDescriptor("offsets", int))
    offsets.add(1)
    offsets.add_all([2, 3])
    assert offsets.get() == [1, 2, 3]
    with pytest.raises(StateAccessError, match="'offsets'.*None"):
        offsets.add(None)
    offsets.update([9])
    assert offsets.get() == [9]
    union = ob.get_union_list_state(ListStateDescriptor("all", str))
    union.add("x")
    rules = ob.get_broadcast_state(MapStateDescriptor("rules", str, int))
    rules.put("a", 1)
    rules.put_all({"b": 2})
    assert (
        rules.get("a") == 1
        and rules.contains("b")
        and sorted(rules.items()) == [("a", 1), ("b", 2)]
    )
    rules.remove("a")
    assert not rules.contains("a")
    assert ob.get_list_state(ListStateDescriptor("offsets", int)) is offsets
    with pytest.raises(StateMigrationException, match="'offsets'.*split_distribute.*union"):
        ob.get_union_list_state(ListStateDescriptor("offsets", int))
    with pytest.raises(StateMigrationException, match="'rules'.*broadcast"):
        ob.get_list_state(ListStateDescriptor("rules", int))


def test_snapshot_is_a_deep_copy_and_restore_round_trips() -> None:
    ob = OperatorStateBackend()
    s = ob.get_list_state(ListStateDescriptor("l", list[int]))
    s.add([1])
    snap = ob.snapshot()
    s.get()[0].append(2)
    assert snap.list_states["l"].elements == [[1]]
    fresh = OperatorStateBackend()
    fresh.restore(snap)
    assert fresh.is_restored
    assert fresh.get_list_state(ListStateDescriptor("l", list[int])).get() == [[1]]
    # restored state this run never touched survives the next snapshot
    fresh2 = OperatorStateBackend()
    fresh2.restore(snap)
    assert fresh2.snapshot().list_states["l"].elements == [[1]]


def test_restore_checks_mode_and_serializer() -> None:
    ob = OperatorStateBackend()
    ob.get_union_list_state(ListStateDescriptor("u", int)).add(1)
    snap = ob.snapshot()
    fresh = OperatorStateBackend()
    fresh.restore(snap)
    with pytest.raises(StateMigrationException, match="'u'.*union.*split_distribute"):
        fresh.get_list_state(ListStateDescriptor("u", int))
    fresh = OperatorStateBackend()
    fresh.restore(snap)
    with pytest.raises(StateMigrationException, match="'u'.*element serializer"):
        fresh.get_union_list_state(ListStateDescriptor("u", str))


def test_restored_operator_state_migrates_under_the_rules_of_schema_evolution() -> None:
    from streamstate.checkpoint.operator_format import read_operator_state, write_operator_state
    from support.evolution_types import Acc, AccAdded

    ob = OperatorStateBackend()
    ob.get_union_list_state(ListStateDescriptor("u", int)).add_all([1, 2])
    ob.get_broadcast_state(MapStateDescriptor("rules", str, Acc)).put("a", Acc(1, "x"))
    buffer = io.BytesIO()
    write_operator_state(ob.snapshot(), buffer, path="mem")
    for snap in (ob.snapshot(), read_operator_state(buffer.getvalue(), "mem")):
        fresh = OperatorStateBackend()
        fresh.restore(snap)
        got = list(fresh.get_union_list_state(ListStateDescriptor("u", float)).get())
        assert got == [1.0, 2.0] and all(type(v) is float for v in got)
        rules = fresh.get_broadcast_state(MapStateDescriptor("rules", str, AccAdded))
        assert rules.get("a") == AccAdded(1, "x")
    fresh = OperatorStateBackend()
    fresh.restore(ob.snapshot())
    with pytest.raises(StateMigrationException, match="'u'"):
        fresh.get_union_list_state(ListStateDescriptor("u", str))


def _split(name: str, elements: list[int]) -> ListStateSnapshot:
    return ListStateSnapshot(name, SPLIT, Int64Serializer(), elements)


def test_split_distribute_counts_rotate() -> None:
    # 7 elements over 3: [3, 2, 2]; next state starts at subtask 1 (the first without an extra)
    assert split_distribute_counts(7, 3, 0) == ([3, 2, 2], 1)
    assert split_distribute_counts(7, 3, 1) == ([2, 3, 2], 2)
    assert split_distribute_counts(6, 3, 2) == ([2, 2, 2], 2)
    assert split_distribute_counts(1, 4, 3) == ([0, 0, 0, 1], 0)


def test_split_distribute_rotation_across_state_names() -> None:
    old = [
        OperatorStateSnapshot({"a": _split("a", [1, 2, 3, 4]), "b": _split("b", [10, 11, 12, 13])}),
    ]
    new = repartition_operator_state(old, 3)
    # "a" (visited first): subtask 0 gets the extra element; "b" is dealt from subtask 1 on
    # (1, 2, 0), so the extra element lands on subtask 1
    assert [s.list_states["a"].elements for s in new] == [[1, 2], [3], [4]]
    assert [s.list_states["b"].elements for s in new] == [[13], [10, 11], [12]]


def test_union_and_broadcast_rules() -> None:
    old = [
        OperatorStateSnapshot(
            {"u": ListStateSnapshot("u", UNION, StrSerializer(), [f"s{i}"])},
            {"b": BroadcastStateSnapshot("b", StrSerializer(), Int64Serializer(), {"copy": i})},
        )
        for i in range(3)
    ]
    new = repartition_operator_state(old, 5)
    for snap in new:
        assert snap.list_states["u"].elements == ["s0", "s1", "s2"]
    assert [s.broadcast_states["b"].entries["copy"] for s in new] == [0, 1, 2, 0, 1]
    # equal parallelism with union state still redistributes (every subtask gets all)
    same = repartition_operator_state(old, 3)
    assert all(s.list_states["u"].elements == ["s0", "s1", "s2"] for s in same)


def test_equal_parallelism_without_union_keeps_assignment() -> None:
    old = [OperatorStateSnapshot({"a": _split("a", [i] * (i + 1))}) for i in range(3)]
    assert repartition_operator_state(old, 3) == old


def test_equal_parallelism_with_union_keeps_split_and_broadcast_state() -> None:
    old = [
        OperatorStateSnapshot(
            {
                "a": _split("a", [i] * (i + 1)),
                "u": ListStateSnapshot("u", UNION, StrSerializer(), [f"s{i}"]),
            },
            {"b": BroadcastStateSnapshot("b", StrSerializer(), Int64Serializer(), {"copy": i})},
        )
        for i in range(3)
    ]
    new = repartition_operator_state(old, 3)
    assert [s.list_states["a"].elements for s in new] == [[0], [1, 1], [2, 2, 2]]
    assert all(s.list_states["u"].elements == ["s0", "s1", "s2"] for s in new)
    assert [s.broadcast_states["b"].entries["copy"] for s in new] == [0, 1, 2]
    # the old snapshots are not modified
    assert [s.list_states["u"].elements for s in old] == [["s0"], ["s1"], ["s2"]]
    # a subtask without broadcast state (it had none) keeps having none
    old[1].broadcast_states.clear()
    assert "b" not in repartition_operator_state(old, 3)[1].broadcast_states


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 100), max_size=8), min_size=1, max_size=6),
    st.lists(st.lists(st.integers(0, 100), max_size=8), min_size=1, max_size=6),
    st.integers(1, 9),
)
def test_split_distribute_properties(a: list[list[int]], b: list[list[int]], p: int) -> None:
    n = max(len(a), len(b))
    a = a + [[]] * (n - len(a))
    b = b + [[]] * (n - len(b))
    old = [
        OperatorStateSnapshot({"a": _split("a", a[i]), "b": _split("b", b[i])}) for i in range(n)
    ]
    new = repartition_operator_state(old, p)
    assert len(new) == p
    for name, parts in (("a", a), ("b", b)):
        flat = [e for part in parts for e in part]
        got = [s.list_states[name].elements if name in s.list_states else [] for s in new]
        if n == p:
            assert got == parts  # unchanged assignment
            continue
        # every element exactly once, sizes differ by at most one
        assert sorted(e for g in got for e in g) == sorted(flat)
        sizes = [len(g) for g in got]
        assert max(sizes) - min(sizes) <= 1
        assert sum(sizes) == len(flat)
        # contiguous runs: some rotation of the subtasks concatenates back to the original order
        assert any([e for j in range(p) for e in got[(j + r) % p]] == flat for r in range(p))
