"""Savepoints (SPEC §6.4) and restore of state the checkpoint cannot decode on its own."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import pytest

from streamstate import (
    HeapStateBackend,
    KeyedProcessFunction,
    ListStateDescriptor,
    PickleSerializer,
    ValueStateDescriptor,
)
from streamstate.checkpoint.storage import FileSystemCheckpointStorage, MemoryCheckpointStorage
from streamstate.errors import StateMigrationException
from streamstate.runtime.local import LocalRunner
from support.checkpoint import AllKinds, all_kinds_records, runner_content


def _runner(storage: Any, p: int, **kw: Any) -> LocalRunner:
    return LocalRunner(
        AllKinds(),
        key_selector=lambda r: r[0],
        parallelism=p,
        max_parallelism=128,
        checkpoint_storage=storage,
        **kw,
    )


@pytest.mark.parametrize(("old_p", "new_p"), [(1, 4), (3, 2), (4, 4)])
def test_savepoint_round_trip_at_another_parallelism(
    tmp_path: Path, old_p: int, new_p: int
) -> None:
    storage = FileSystemCheckpointStorage(str(tmp_path / "a"))
    runner = _runner(storage, old_p, incremental_checkpoints=True)
    runner.run(all_kinds_records(50), final_watermark=False)
    runner.checkpoint()  # an incremental chain exists, the savepoint must not use it
    runner.run(all_kinds_records(60, per_key=1), final_watermark=False)
    runner.checkpoint()
    expected = runner_content(runner)
    sp = runner.savepoint()
    assert sp.is_savepoint and sp.directory == "savepoints/sp-1"
    assert all(not f.path.startswith("..") for f in sp.metadata.files())  # self-contained
    assert all(f.kind in ("full", "operator") for f in sp.metadata.files())
    # move the savepoint somewhere else entirely; delete the job's checkpoints
    moved = tmp_path / "elsewhere" / "sp-1"
    shutil.copytree(tmp_path / "a" / "job" / "savepoints" / "sp-1", moved)
    shutil.rmtree(tmp_path / "a")
    fresh = _runner(MemoryCheckpointStorage(), new_p)
    fresh.restore(str(moved))
    assert runner_content(fresh) == expected


@dataclasses.dataclass
class Order:
    item: str
    quantity: int = 1


class Orders(KeyedProcessFunction):
    """Keeps the last order per key (a record type the checkpoint cannot rebuild on its own)."""

    def __init__(self, register: bool = True) -> None:
        self.register = register

    def open(self, ctx: Any) -> None:
        if self.register:
            self.last = ctx.get_state(ValueStateDescriptor("last", Order))
            self.count = ctx.get_state(ValueStateDescriptor("count", int, default=0))

    def process_element(self, value: tuple[str, str], ctx: Any) -> Any:
        if self.register:
            self.last.update(Order(value[1], len(value[1])))
            self.count.update(self.count.value() + 1)
            yield (value[0], self.last.value(), self.count.value())


def test_record_state_waits_for_registration_and_survives_runs_that_never_register_it() -> None:
    storage = MemoryCheckpointStorage()
    first = LocalRunner(
        Orders(), key_selector=lambda r: r[0], parallelism=2, checkpoint_storage=storage
    )
    first.run([("a", "apple"), ("b", "bread"), ("a", "avocado")])
    first.checkpoint()
    # a run that never registers "last" (nor "count") still carries them into its checkpoints
    blind = LocalRunner(
        Orders(register=False),
        key_selector=lambda r: r[0],
        parallelism=3,
        checkpoint_storage=storage,
    )
    blind.restore()
    pending = blind.subtasks[0].keyed_backend._pending_restore
    assert pending is not None and "last" in pending.states
    blind.run([("c", "cherry")])
    blind.checkpoint()
    blind.rescale(1)
    last = LocalRunner(
        Orders(), key_selector=lambda r: r[0], parallelism=2, checkpoint_storage=storage
    )
    last.restore()
    assert last.run([("a", "apricot"), ("b", "bun")]) == [
        ("a", Order("apricot", 7), 3),
        ("b", Order("bun", 3), 2),
    ]


UNPICKLED: list[int] = []


class Tracked:
    """Counts its own unpickling: restore must not run code from the checkpoint."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __setstate__(self, state: dict[str, Any]) -> None:
        UNPICKLED.append(1)
        self.__dict__.update(state)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tracked) and other.n == self.n


class PickledOpen(KeyedProcessFunction):
    def __init__(self, serializer: Any) -> None:
        self.serializer = serializer

    def open(self, ctx: Any) -> None:
        self.obj = ctx.get_state(ValueStateDescriptor("obj", self.serializer))

    def process_element(self, value: Any, ctx: Any) -> Any:
        if value[1] is not None:
            self.obj.update(Tracked(value[1]))
        yield self.obj.value()


def test_pickle_state_is_refused_unless_declared() -> None:
    storage = MemoryCheckpointStorage()
    writer = LocalRunner(
        PickledOpen(PickleSerializer()), key_selector=lambda r: r[0], checkpoint_storage=storage
    )
    writer.run([("k", 1), ("j", 2)])
    writer.checkpoint()
    UNPICKLED.clear()
    typed = LocalRunner(PickledOpen(int), key_selector=lambda r: r[0], checkpoint_storage=storage)
    with pytest.raises(StateMigrationException, match=r"state 'obj'.*PickleSerializer"):
        typed.restore()
    assert UNPICKLED == []  # nothing was unpickled
    declared = LocalRunner(
        PickledOpen(PickleSerializer()), key_selector=lambda r: r[0], checkpoint_storage=storage
    )
    declared.restore()
    assert declared.run([("k", None)]) == [Tracked(1)]


class ListThenValue(KeyedProcessFunction):
    def __init__(self, as_list: bool) -> None:
        self.as_list = as_list

    def open(self, ctx: Any) -> None:
        if self.as_list:
            self.s = ctx.get_list_state(ListStateDescriptor("s", int))
        else:
            self.s = ctx.get_state(ValueStateDescriptor("s", int))

    def process_element(self, value: Any, ctx: Any) -> None:
        if self.as_list:
            self.s.add(1)


def test_kind_and_key_serializer_are_checked_on_restore() -> None:
    storage = MemoryCheckpointStorage()
    runner = LocalRunner(ListThenValue(True), key_selector=lambda r: r, checkpoint_storage=storage)
    runner.run(["a", "b"])
    runner.checkpoint()
    other = LocalRunner(ListThenValue(False), key_selector=lambda r: r, checkpoint_storage=storage)
    with pytest.raises(StateMigrationException, match="state 's' was checkpointed as list state"):
        other.restore()
    wrong_keys = LocalRunner(
        ListThenValue(True), key_selector=lambda r: r, key_type=int, checkpoint_storage=storage
    )
    with pytest.raises(StateMigrationException, match="the key type was checkpointed as"):
        wrong_keys.restore()


def test_nested_maps_backend_round_trip() -> None:
    storage = MemoryCheckpointStorage()
    runner = _runner(storage, 2, state_backend=HeapStateBackend(table_kind="nested_maps"))
    runner.run(all_kinds_records(30), final_watermark=False)
    expected = runner_content(runner)
    runner.savepoint()
    fresh = _runner(storage, 5, state_backend="heap-nested")
    fresh.restore("savepoints/sp-1")
    assert runner_content(fresh) == expected


class _Sink:
    def on_event_time(self, timestamp: int, key: Any, namespace: Any) -> None:
        return None

    def on_processing_time(self, timestamp: int, key: Any, namespace: Any) -> None:
        return None


def _late_service(op: Any) -> Any:
    from streamstate.serializers import Int64Serializer
    from streamstate.timers import InternalTimerService

    return InternalTimerService(
        "windows", op.keyed_backend, _Sink(), namespace_serializer=Int64Serializer()
    )


@pytest.mark.parametrize("backend", ["heap", "rocksdb", "rocksdb-files"])
def test_timers_of_a_service_created_after_restore_are_kept_and_handed_over(
    backend: str, tmp_path: Any
) -> None:
    # both backends restore the timers into their own queues and carry them through checkpoints
    # taken before the service exists (RocksDB natively and from snapshot files)
    from streamstate.backends.rocksdb.factory import RocksDBStateBackend

    def state_backend() -> Any:  # one per runner (a RocksDB backend locks its directory)
        return RocksDBStateBackend(incremental=False) if backend == "rocksdb-files" else backend

    storage = FileSystemCheckpointStorage(str(tmp_path))
    runner = LocalRunner(
        ListThenValue(True),
        key_selector=lambda r: r,
        key_type=str,
        checkpoint_storage=storage,
        state_backend=state_backend(),
    )
    runner._start(1)
    op = runner.subtasks[0]
    service = _late_service(op)
    for key, window in (("a", 10), ("b", 20)):
        op.keyed_backend.set_current_key(key)
        service.register_event_time_timer(window, window + 99)
    runner.checkpoint()
    # a run restores before its window operator exists, and checkpoints meanwhile
    second = LocalRunner(
        ListThenValue(True),
        key_selector=lambda r: r,
        key_type=str,
        checkpoint_storage=storage,
        state_backend=state_backend(),
    )
    second.restore()
    second.checkpoint()
    third = LocalRunner(
        ListThenValue(True),
        key_selector=lambda r: r,
        key_type=str,
        checkpoint_storage=storage,
        state_backend=state_backend(),
    )
    third.restore()
    op3 = third.subtasks[0]
    late = _late_service(op3)
    assert late.num_event_time_timers() == 2  # restored into the backend's queue already
    assert sorted((ts, k, ns) for ts, k, ns, _ in late.event_time_timers) == [
        (109, "a", 10),
        (119, "b", 20),
    ]
