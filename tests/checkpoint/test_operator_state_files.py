"""Operator state through checkpoint files: Flink's redistribution rules end to end, the SSOS
format with per-element offsets, and state whose type the checkpoint cannot rebuild."""

from __future__ import annotations

import dataclasses
import io
from typing import Any

import pytest

from streamstate import (
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    PickleSerializer,
)
from streamstate.backends.operator import (
    BroadcastStateSnapshot,
    ListStateSnapshot,
    OperatorStateMode,
    OperatorStateSnapshot,
)
from streamstate.checkpoint.operator_format import (
    OperatorStateReader,
    read_operator_state,
    write_operator_state,
)
from streamstate.checkpoint.storage import MemoryCheckpointStorage
from streamstate.errors import CheckpointError, CorruptCheckpointError, StateMigrationException
from streamstate.format.restore import RestoredSerializer
from streamstate.runtime.local import LocalRunner
from streamstate.serializers import Int64Serializer, StrSerializer


class Noop(KeyedProcessFunction):
    def process_element(self, value: Any, ctx: Any) -> None:
        return None


def _runner(p: int, storage: MemoryCheckpointStorage) -> LocalRunner:
    runner = LocalRunner(
        Noop(),
        key_selector=lambda r: r,
        parallelism=p,
        max_parallelism=128,
        key_type=str,
        checkpoint_storage=storage,
    )
    runner._start(p)
    return runner


def _fill(runner: LocalRunner, fill: Any) -> None:
    for op in runner.subtasks:
        fill(op.subtask_index, op.operator_backend)


def _restored(p: int, storage: MemoryCheckpointStorage) -> LocalRunner:
    runner = LocalRunner(
        Noop(), key_selector=lambda r: r, parallelism=p, max_parallelism=128, key_type=str
    )
    runner._use_storage(storage)
    runner.restore()
    return runner


def test_split_distribute_counts_and_rotation_across_state_names() -> None:
    storage = MemoryCheckpointStorage()
    old = _runner(2, storage)

    def fill(i: int, ob: Any) -> None:
        ob.get_list_state(ListStateDescriptor("a", int)).update(range(i * 10, i * 10 + 5))
        ob.get_list_state(ListStateDescriptor("b", int)).update(range(100 + i * 10, 103 + i * 10))

    _fill(old, fill)
    old.checkpoint()
    new = _restored(3, storage)
    a = [
        op.operator_backend.get_list_state(ListStateDescriptor("a", int)).get()
        for op in new.subtasks
    ]
    b = [
        op.operator_backend.get_list_state(ListStateDescriptor("b", int)).get()
        for op in new.subtasks
    ]
    # "a": 10 elements over 3 -> 4, 3, 3 in contiguous runs from subtask 0
    assert a == [[0, 1, 2, 3], [4, 10, 11], [12, 13, 14]]
    # "b": 6 elements -> 2 each, dealt from subtask 1 (the first without an extra for "a")
    assert b == [[111, 112], [100, 101], [102, 110]]


def test_extra_elements_rotate_instead_of_piling_on_subtask_zero() -> None:
    storage = MemoryCheckpointStorage()
    old = _runner(1, storage)

    def fill(i: int, ob: Any) -> None:
        for name in ("s1", "s2", "s3"):
            ob.get_list_state(ListStateDescriptor(name, int)).update([1, 2, 3, 4])

    _fill(old, fill)
    old.checkpoint()
    new = _restored(3, storage)
    counts = {
        name: [
            len(op.operator_backend.get_list_state(ListStateDescriptor(name, int)).get())
            for op in new.subtasks
        ]
        for name in ("s1", "s2", "s3")
    }
    assert counts == {"s1": [2, 1, 1], "s2": [1, 2, 1], "s3": [1, 1, 2]}


def test_union_and_broadcast() -> None:
    storage = MemoryCheckpointStorage()
    old = _runner(3, storage)

    def fill(i: int, ob: Any) -> None:
        ob.get_union_list_state(ListStateDescriptor("u", str)).update([f"s{i}a", f"s{i}b"])
        ob.get_broadcast_state(MapStateDescriptor("rules", str, int)).put("copy", i)

    _fill(old, fill)
    old.checkpoint()
    new = _restored(5, storage)
    for op in new.subtasks:
        union = op.operator_backend.get_union_list_state(ListStateDescriptor("u", str)).get()
        assert union == ["s0a", "s0b", "s1a", "s1b", "s2a", "s2b"]
    copies = [
        op.operator_backend.get_broadcast_state(MapStateDescriptor("rules", str, int)).get("copy")
        for op in new.subtasks
    ]
    assert copies == [0, 1, 2, 0, 1]  # new subtask i gets old subtask i % p


def test_equal_parallelism_keeps_the_assignment() -> None:
    storage = MemoryCheckpointStorage()
    old = _runner(3, storage)
    _fill(old, lambda i, ob: ob.get_list_state(ListStateDescriptor("a", int)).update([i] * (i + 1)))
    old.checkpoint()
    new = _restored(3, storage)
    got = [
        op.operator_backend.get_list_state(ListStateDescriptor("a", int)).get()
        for op in new.subtasks
    ]
    assert got == [[0], [1, 1], [2, 2, 2]]


def test_equal_parallelism_failover_moves_no_split_or_broadcast_state() -> None:
    # Flink's repartitionState at unchanged parallelism: split-distribute and broadcast state stay
    # with their subtask even when union state exists; only the union state is spread
    storage = MemoryCheckpointStorage()
    old = _runner(3, storage)

    def fill(i: int, ob: Any) -> None:
        ob.get_list_state(ListStateDescriptor("a", int)).update([i] * (i + 1))
        ob.get_union_list_state(ListStateDescriptor("u", str)).update([f"s{i}"])
        ob.get_broadcast_state(MapStateDescriptor("rules", str, int)).put("copy", i)

    _fill(old, fill)
    old.checkpoint()
    new = _restored(3, storage)
    backends = [op.operator_backend for op in new.subtasks]
    assert [b.get_list_state(ListStateDescriptor("a", int)).get() for b in backends] == [
        [0],
        [1, 1],
        [2, 2, 2],
    ]
    for b in backends:
        assert b.get_union_list_state(ListStateDescriptor("u", str)).get() == ["s0", "s1", "s2"]
    rules = MapStateDescriptor("rules", str, int)
    assert [b.get_broadcast_state(rules).get("copy") for b in backends] == [0, 1, 2]


@dataclasses.dataclass
class Offset:
    partition: int
    position: int


def test_record_elements_stay_encoded_until_registered() -> None:
    snap = OperatorStateSnapshot(
        {
            "offsets": ListStateSnapshot(
                "offsets",
                OperatorStateMode.SPLIT_DISTRIBUTE,
                ListStateDescriptor("offsets", Offset).element_serializer,
                [Offset(0, 10), Offset(1, 20), Offset(2, 30)],
            )
        },
        {
            "names": BroadcastStateSnapshot(
                "names", StrSerializer(), PickleSerializer(), {"a": {1, 2}}
            )
        },
    )
    buf = io.BytesIO()
    summary = write_operator_state(snap, buf, path="op")
    assert summary.counts == {"offsets": 3, "names": 1}
    reader = OperatorStateReader(buf.getvalue(), "op")
    assert len(reader.read_encoded("offsets", 1, 3)) == 2  # per-element offsets
    restored = read_operator_state(buf.getvalue(), "op")
    lst = restored.list_states["offsets"]
    assert isinstance(lst.element_serializer, RestoredSerializer)
    assert all(isinstance(e, bytes) for e in lst.elements)
    # carried into a new file unchanged while nobody registers it
    again = io.BytesIO()
    write_operator_state(restored, again, path="op2")
    assert (
        read_operator_state(again.getvalue(), "op2").list_states["offsets"].elements == lst.elements
    )

    from streamstate.backends.operator import OperatorStateBackend

    backend = OperatorStateBackend()
    backend.restore(restored)
    state = backend.get_list_state(ListStateDescriptor("offsets", Offset))
    assert state.get() == [Offset(0, 10), Offset(1, 20), Offset(2, 30)]
    with pytest.raises(StateMigrationException, match="pickle"):
        backend.get_broadcast_state(MapStateDescriptor("names", str, set[int]))
    ok = OperatorStateBackend()
    ok.restore(read_operator_state(buf.getvalue(), "op"))
    names = ok.get_broadcast_state(MapStateDescriptor("names", str, PickleSerializer()))
    assert names.get("a") == {1, 2}


def test_operator_values_are_validated_and_files_checked() -> None:
    bad = OperatorStateSnapshot(
        {"a": ListStateSnapshot("a", OperatorStateMode.UNION, Int64Serializer(), [1, "two"])}
    )
    with pytest.raises(CheckpointError, match=r"operator state 'a': element 'two'"):
        write_operator_state(bad, io.BytesIO(), path="op")
    good = OperatorStateSnapshot(
        {"a": ListStateSnapshot("a", OperatorStateMode.UNION, Int64Serializer(), [1, 2, 3])}
    )
    buf = io.BytesIO()
    write_operator_state(good, buf, path="op")
    data = bytearray(buf.getvalue())
    reader = OperatorStateReader(bytes(data), "op")
    offset = reader._index[0]["offset"]
    data[offset] ^= 0xFF
    with pytest.raises(CorruptCheckpointError, match="corrupt operator-state file op: checksum"):
        read_operator_state(bytes(data), "op")
