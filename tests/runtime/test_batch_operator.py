"""The batch runtime's operator and timer service (Flink's ``BatchExecutionInternalTimeService``):
a key's timers fire when its records end, event time before processing time, the watermark at the
end of time while they fire and at its minimum otherwise (SPEC §13.3)."""

from __future__ import annotations

from typing import Any

import pytest

from streamstate import (
    CheckpointedFunction,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    TimeDomain,
    ValueStateDescriptor,
)
from streamstate.backends.batch import BatchExecutionStateBackend
from streamstate.checkpoint.storage import MemoryCheckpointStorage
from streamstate.checkpoint.writer import SubtaskCheckpointer
from streamstate.runtime.batch import MAX_WATERMARK, BatchKeyedProcessOperator
from streamstate.runtime.operator import KeyedProcessOperator
from streamstate.serializers import StrSerializer
from streamstate.timers import MIN_WATERMARK


class Timers(KeyedProcessFunction):
    """Each record ``(op, t)`` registers or deletes a timer; timers report what they see."""

    def process_element(self, value: Any, ctx: Any) -> Any:
        op, t = value
        timers = ctx.timer_service()
        assert timers.current_watermark() == MIN_WATERMARK
        if op == "event":
            timers.register_event_time_timer(t)
        elif op == "processing":
            timers.register_processing_time_timer(t)
        elif op == "delete-event":
            timers.delete_event_time_timer(t)
        return None

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        if timestamp == 5:  # an earlier timer deletes a later one of the same key
            ctx.timer_service().delete_event_time_timer(6)
        yield (
            ctx.get_current_key(),
            ctx.time_domain(),
            timestamp,
            ctx.timer_service().current_watermark(),
        )


def _operator(function: Any, **kwargs: Any) -> BatchKeyedProcessOperator:
    op = BatchKeyedProcessOperator(function, StrSerializer(), **kwargs)
    op.open()
    op.advance_processing_time(1_000)
    return op


def test_a_keys_timers_fire_when_its_records_end_event_time_first() -> None:
    op = _operator(Timers())
    a = [
        ("processing", 2_000_000),  # far in the future: fires anyway when the key ends
        ("event", 30),
        ("processing", 500),
        ("event", 5),
        ("event", 6),
        ("event", 30),  # set semantics
        ("event", 10),
        ("event", 10),
        ("delete-event", 10),
    ]
    op.process_runs(["a", "b"], [None, None], [len(a), 1], [*a, ("event", 1)])
    out = op.drain_output()
    ev, pt = TimeDomain.EVENT_TIME, TimeDomain.PROCESSING_TIME
    assert out == [
        ("a", ev, 5, MAX_WATERMARK),
        ("a", ev, 30, MAX_WATERMARK),  # 6 was deleted by the timer at 5, 10 by a record
        ("a", pt, 500, MAX_WATERMARK),  # then processing time, in timestamp order
        ("a", pt, 2_000_000, MAX_WATERMARK),
    ]
    assert op.advance_watermark(1_000_000) == 0  # only the end of time ends the input
    assert op.drain_output() == []
    op.advance_watermark(MAX_WATERMARK)
    assert op.drain_output() == [("b", ev, 1, MAX_WATERMARK)]
    assert op.timer_service.current_watermark == MIN_WATERMARK
    op.dispose()


def test_a_keys_only_timer_fires_in_either_domain() -> None:
    """A key with one timer (a queue keeps it apart from its heap) fires it, in either domain,
    alone or beside one of the other domain."""
    op = _operator(Timers())
    runs = {
        "a": [("processing", 700)],
        "b": [("event", 3)],
        "c": [("event", 4), ("processing", 800)],
        "d": [("processing", 900), ("processing", 900)],
    }
    op.process_runs(
        list(runs),
        [None] * len(runs),
        [len(r) for r in runs.values()],
        [r for rs in runs.values() for r in rs],
    )
    op.end_of_input()
    ev, pt = TimeDomain.EVENT_TIME, TimeDomain.PROCESSING_TIME
    assert op.drain_output() == [
        ("a", pt, 700, MAX_WATERMARK),
        ("b", ev, 3, MAX_WATERMARK),
        ("c", ev, 4, MAX_WATERMARK),
        ("c", pt, 800, MAX_WATERMARK),
        ("d", pt, 900, MAX_WATERMARK),
    ]
    op.dispose()


def test_process_runs_gives_the_streaming_operator_the_same_outputs_as_process_elements() -> None:
    class Count(KeyedProcessFunction):
        def open(self, ctx: Any) -> None:
            self.n = ctx.get_state(ValueStateDescriptor("n", int, default=0))

        def process_element(self, value: Any, ctx: Any) -> Any:
            self.n.update(self.n.value() + value)
            yield ctx.get_current_key(), self.n.value(), ctx.timestamp()

    keys = ["a", "a", "b", "a", "c", "c"]
    values = [1, 2, 3, 4, 5, 6]
    stamps = [10, 11, 12, 13, 14, 15]
    one = KeyedProcessOperator(Count(), StrSerializer())
    one.open()
    one.process_elements(keys, values, stamps, [None] * 6)
    runs = KeyedProcessOperator(Count(), StrSerializer())
    runs.open()
    runs.process_runs(["a", "b", "a", "c"], [None] * 4, [2, 1, 1, 2], values, stamps)
    assert runs.drain_output() == one.drain_output()


def test_an_error_names_the_key_and_record_of_its_run() -> None:
    class Fail(KeyedProcessFunction):
        def process_element(self, value: Any, ctx: Any) -> Any:
            if value == 3:
                raise ValueError("three")
            return None

    op = _operator(Fail())
    with pytest.raises(ValueError, match="three") as info:
        op.process_runs(["a", "b"], [None, None], [2, 2], [1, 2, 3, 4])
    assert info.value.__notes__ == ["streamstate: raised in process_element of key 'b', record 3"]


class Seen(KeyedProcessFunction, CheckpointedFunction):
    """Operator state (records seen by the subtask) beside keyed state."""

    def initialize_state(self, context: Any) -> None:
        self.restored = context.is_restored()
        store = context.get_operator_state_store()
        self.seen_state = store.get_list_state(ListStateDescriptor("seen", int))
        self.last_key = store.get_broadcast_state(MapStateDescriptor("last-key", str, str))
        self.seen = 0

    def snapshot_state(self, context: Any) -> None:
        self.seen_state.update([self.seen])

    def open(self, ctx: Any) -> None:
        self.n = ctx.get_state(ValueStateDescriptor("n", int, default=0))

    def process_element(self, value: Any, ctx: Any) -> Any:
        self.seen += 1
        self.n.update(self.n.value() + 1)
        self.last_key.put("last", ctx.get_current_key())
        return None


def test_operator_state_and_checkpointed_functions_work_and_go_into_the_savepoint() -> None:
    function = Seen()
    op = _operator(function, state_backend=BatchExecutionStateBackend(savepoint=True))
    assert function.restored is False
    op.process_runs(["a", "b"], [None, None], [3, 2], range(5))
    op.end_of_input()
    storage = MemoryCheckpointStorage()
    checkpointer = SubtaskCheckpointer(storage, op)
    handle = checkpointer.savepoint("sp", 1).result()
    checkpointer.close()
    assert handle.operator_state is not None
    assert handle.operator_state.states == ["last-key", "seen"]
    assert [(f.kind, dict(f.entries)) for f in handle.keyed] == [
        ("full", {kg: 1 for kg in sorted({_kg("a"), _kg("b")})})
    ]
    snapshot = op.operator_backend.snapshot()
    assert snapshot.list_states["seen"].elements == [5]
    assert dict(snapshot.broadcast_states["last-key"].entries) == {"last": "b"}
    op.dispose()


def _kg(key: str) -> int:
    from streamstate.keygroups import assign_to_key_group

    return assign_to_key_group(key, 128)


def test_the_batch_operator_refuses_another_state_backend() -> None:
    with pytest.raises(TypeError, match="BatchExecutionStateBackend"):
        BatchKeyedProcessOperator(Timers(), StrSerializer(), state_backend="heap")  # type: ignore[arg-type]


def test_the_batch_state_backend_refuses_an_operator_of_unsorted_input() -> None:
    with pytest.raises(TypeError, match="needs its input sorted by key"):
        KeyedProcessOperator(Timers(), StrSerializer(), state_backend=BatchExecutionStateBackend())
