"""The local runner and the keyed process operator: routing, outputs, timers, operator state."""

from __future__ import annotations

from typing import Any

import pytest

from streamstate import (
    CheckpointedFunction,
    KeyedProcessFunction,
    ListStateDescriptor,
    LocalRunner,
    MapStateDescriptor,
    OutputTag,
    ValueStateDescriptor,
)
from streamstate.errors import StateAccessError
from streamstate.keygroups import assign_to_key_group, compute_key_group_range_for_operator_index
from streamstate.namespace import VOID_NAMESPACE

LATE = OutputTag("odd")


class CountPerKey(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", int, default=0))
        self.subtask = ctx.index_of_this_subtask

    def process_element(self, value: Any, ctx: Any) -> Any:
        n = self.count.value() + 1
        self.count.update(n)
        if n % 2:
            ctx.output(LATE, ctx.get_current_key())
        yield (ctx.get_current_key(), n)


@pytest.mark.parametrize("parallelism", [1, 2, 3, 7])
@pytest.mark.parametrize("backend", ["heap", "heap-nested"])
def test_results_do_not_depend_on_parallelism(parallelism: int, backend: str) -> None:
    records = [f"k{i % 37}" for i in range(500)]
    runner = LocalRunner(
        CountPerKey(), key_selector=lambda r: r, parallelism=parallelism, state_backend=backend
    )
    out = runner.run(records)
    expected = []
    seen: dict[str, int] = {}
    for r in records:
        seen[r] = seen.get(r, 0) + 1
        expected.append((r, seen[r]))
    assert out == expected
    assert sorted(runner.side_output(LATE)) == sorted(r for r, n in expected if n % 2)
    # each key's state lives exactly in the subtask owning its key group
    for i, op in enumerate(runner.subtasks):
        rng = compute_key_group_range_for_operator_index(runner.max_parallelism, parallelism, i)
        keys = set(op.keyed_backend.get_keys("count", VOID_NAMESPACE))
        assert all(rng.contains(assign_to_key_group(k, runner.max_parallelism)) for k in keys)
    all_keys = [
        k for op in runner.subtasks for k in op.keyed_backend.get_keys("count", VOID_NAMESPACE)
    ]
    assert sorted(all_keys) == sorted(set(records))
    runner.close()


class SessionTimeout(KeyedProcessFunction):
    """Emits (key, events) once no event arrived for 10 ms of event time."""

    def open(self, ctx: Any) -> None:
        self.events = ctx.get_list_state(ListStateDescriptor("events", int))
        self.timer = ctx.get_state(ValueStateDescriptor("timer", int))

    def process_element(self, value: Any, ctx: Any) -> None:
        self.events.add(value[1])
        old = self.timer.value()
        if old is not None:
            ctx.timer_service().delete_event_time_timer(old)
        t = ctx.timestamp() + 10
        ctx.timer_service().register_event_time_timer(t)
        self.timer.update(t)

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        assert ctx.time_domain() == "event_time"
        yield (ctx.get_current_key(), timestamp, sorted(self.events.get()))
        self.events.clear()
        self.timer.clear()


def test_event_time_timers_fire_in_order_with_their_key() -> None:
    records = [("a", 1), ("b", 2), ("a", 5), ("b", 30), ("c", 31), ("a", 100)]
    runner = LocalRunner(
        SessionTimeout(),
        key_selector=lambda r: r[0],
        parallelism=2,
        timestamp_assigner=lambda r: r[1],
        watermark_delay=0,
    )
    out = runner.run(records)
    # b@30 is processed before the watermark it raises (29), so b's timer moves from 12 to 40
    assert out == [
        ("a", 15, [1, 5]),
        ("b", 40, [2, 30]),
        ("c", 41, [31]),
        ("a", 110, [100]),
    ]
    for op in runner.subtasks:
        assert op.timer_service.num_event_time_timers() == 0
        assert op.keyed_backend.num_entries() == 0


class ProcTimer(KeyedProcessFunction):
    def process_element(self, value: Any, ctx: Any) -> None:
        ts = ctx.timer_service()
        ts.register_processing_time_timer(ts.current_processing_time() + 100)
        ts.register_processing_time_timer(ts.current_processing_time() + 100)  # set semantics

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        assert ctx.time_domain() == "processing_time"
        return [(ctx.get_current_key(), timestamp)]


def test_processing_time_timers(clock: Any) -> None:
    runner = LocalRunner(ProcTimer(), key_selector=lambda r: r, parallelism=2, clock=clock)
    runner.run(["x", "y"])
    assert runner.advance_processing_time(clock.time + 50) == []
    assert sorted(runner.advance_processing_time(clock.time + 100)) == [
        ("x", clock.time + 100),
        ("y", clock.time + 100),
    ]


class Buffering(KeyedProcessFunction, CheckpointedFunction):
    """Keeps a per-subtask buffer in operator state."""

    def initialize_state(self, context: Any) -> None:
        self.buffer = context.operator_state_store.get_list_state(
            ListStateDescriptor("buffer", str)
        )
        self.restored = context.is_restored()
        self.keyed_store = context.keyed_state_store

    def snapshot_state(self, context: Any) -> None:
        self.buffer.update(["snap"])

    def process_element(self, value: Any, ctx: Any) -> None:
        self.buffer.add(value)


def test_checkpointed_function_sees_operator_state() -> None:
    runner = LocalRunner(Buffering(), key_selector=lambda r: r, parallelism=1)
    runner.run(["a", "b"])
    op = runner.subtasks[0]
    assert op.function.restored is False
    assert op.function.buffer.get() == ["a", "b"]
    assert op.function.keyed_store is not None
    snap = op.snapshot(1)
    assert snap.operator.list_states["buffer"].elements == ["snap"]
    snap.keyed.release()


class ReturnsTuple(KeyedProcessFunction):
    def process_element(self, value: Any, ctx: Any) -> Any:
        return ("a", 1)


class ReturnsInt(KeyedProcessFunction):
    def process_element(self, value: Any, ctx: Any) -> Any:
        return 3


def test_bad_return_values_are_clear_errors() -> None:
    with pytest.raises(StateAccessError, match="process_element returned a tuple.*yield"):
        LocalRunner(ReturnsTuple(), key_selector=lambda r: r).run(["a"])
    with pytest.raises(StateAccessError, match="not iterable"):
        LocalRunner(ReturnsInt(), key_selector=lambda r: r).run(["a"])


class RaisesWhileYielding(KeyedProcessFunction):
    def process_element(self, value: Any, ctx: Any) -> Any:
        yield value, 1
        if value[1] == "bad":
            yield value + None  # the body's own TypeError, raised while its generator is drained


class RaisesInTimer(KeyedProcessFunction):
    def process_element(self, value: Any, ctx: Any) -> Any:
        ctx.timer_service().register_event_time_timer(10)
        return None

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        raise KeyError("no such page")


def test_an_error_raised_by_a_generator_body_surfaces_as_itself() -> None:
    runner = LocalRunner(RaisesWhileYielding(), key_selector=lambda r: r[0])
    with pytest.raises(TypeError, match="can only concatenate tuple") as e:
        runner.run([("a", "ok"), ("b", "bad")])
    assert "not iterable" not in str(e.value)
    notes = getattr(e.value, "__notes__", [])
    assert notes == ["streamstate: raised in process_element of key 'b', record ('b', 'bad')"]


def test_an_error_raised_by_on_timer_names_the_key_and_timer() -> None:
    runner = LocalRunner(
        RaisesInTimer(), key_selector=lambda r: r, timestamp_assigner=lambda r: 1, watermark_delay=0
    )
    with pytest.raises(KeyError, match="no such page") as e:
        runner.run(["k"])
        runner.advance_watermark(100)
    assert e.value.__notes__ == ["streamstate: raised in on_timer of key 'k', event-time timer 10"]


def test_function_type_and_parallelism_are_checked() -> None:
    with pytest.raises(TypeError, match="KeyedProcessFunction"):
        LocalRunner(lambda x: x, key_selector=lambda r: r).run(["a"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exceeds max_parallelism"):
        LocalRunner(CountPerKey(), key_selector=lambda r: r, parallelism=10, max_parallelism=8)
    with pytest.raises(ValueError, match="parallelism must be"):
        LocalRunner(CountPerKey(), key_selector=lambda r: r, parallelism=0)


class MapUser(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.m = ctx.get_map_state(MapStateDescriptor("m", str, int))

    def process_element(self, value: Any, ctx: Any) -> Any:
        self.m.put(value[1], self.m.get(value[1]) or 0 + 1)
        yield dict(self.m.items())


def test_runtime_context_information() -> None:
    class Info(KeyedProcessFunction):
        def open(self, ctx: Any) -> None:
            self.info = (
                ctx.get_index_of_this_subtask(),
                ctx.get_number_of_parallel_subtasks(),
                ctx.get_max_number_of_parallel_subtasks(),
                ctx.get_task_name(),
                ctx.get_metrics_group() is not None,
            )

        def process_element(self, value: Any, ctx: Any) -> Any:
            yield self.info

    runner = LocalRunner(Info(), key_selector=lambda r: r, parallelism=3, operator_name="info")
    out = set(runner.run([f"k{i}" for i in range(50)]))
    assert out == {(i, 3, 128, "info", True) for i in range(3)}
    runner2 = LocalRunner(MapUser(), key_selector=lambda r: r[0])
    assert runner2.run([("a", "x"), ("a", "y")]) == [{"x": 1}, {"x": 1, "y": 1}]


class _Owner(KeyedProcessFunction):
    """Emits the key, its count and the subtask that processed it."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", int, default=0))
        self.subtask = ctx.index_of_this_subtask

    def process_element(self, value: Any, ctx: Any) -> Any:
        n = self.count.value() + 1
        self.count.update(n)
        yield (ctx.get_current_key(), n, self.subtask)


def _expected_owner(key: Any, max_parallelism: int, parallelism: int) -> int:
    kg = assign_to_key_group(key, max_parallelism)
    return kg * parallelism // max_parallelism


@pytest.mark.parametrize("method", ["run", "process"])
def test_key_group_cache_follows_a_restored_max_parallelism(method: str) -> None:
    """Key groups are cached per distinct key; a restore that changes max_parallelism must not
    route by key groups of the old max_parallelism."""
    keys = [f"k{i}" for i in range(300)]
    writer = LocalRunner(_Owner(), key_selector=lambda r: r, parallelism=2, max_parallelism=256)
    writer.run(keys)
    cp = writer.checkpoint()

    runner = LocalRunner(_Owner(), key_selector=lambda r: r, parallelism=3)
    assert runner.max_parallelism == 128
    runner.run(keys)  # fills the cache with key groups out of 128
    runner.restore(cp)
    assert runner.max_parallelism == 256
    out = runner.run(keys) if method == "run" else [o for k in keys for o in runner.process(k)]
    assert out == [(k, 2, _expected_owner(k, 256, 3)) for k in keys]


def test_key_group_cache_distinguishes_equal_keys_of_other_types() -> None:
    """``1`` and ``True`` are equal dict keys with different key groups in Flink's hashing."""
    runner = LocalRunner(_Owner(), key_selector=lambda r: r, parallelism=4, key_type=int)
    assert runner.key_group_of(1) == assign_to_key_group(1, runner.max_parallelism)
    assert runner.key_group_of(True) == assign_to_key_group(True, runner.max_parallelism)
    assert runner.key_group_of(1.0) == assign_to_key_group(1.0, runner.max_parallelism)


class EmitsAndYields(KeyedProcessFunction):
    """Main outputs through the operator context (as windows do) interleaved with yields, and a
    side output per record."""

    def bind_operator(self, context: Any) -> None:
        self.internal = context

    def process_element(self, value: Any, ctx: Any) -> Any:
        yield ("before", value)
        self.internal.emit(("emitted", value))
        ctx.output(LATE, value)
        yield ("after", value)


def test_run_keeps_the_order_of_yields_emits_and_side_outputs_across_subtasks() -> None:
    records = [f"k{i % 11}" for i in range(60)]
    runner = LocalRunner(EmitsAndYields(), key_selector=lambda r: r, parallelism=3)
    out = runner.run(records)
    assert out == [o for r in records for o in (("before", r), ("emitted", r), ("after", r))]
    # side outputs in record order, not grouped by subtask
    assert runner.side_output(LATE) == records
    assert all(op.output == [] and op.side_outputs == {} for op in runner.subtasks)
    assert runner.process("k1") == [("before", "k1"), ("emitted", "k1"), ("after", "k1")]
    assert runner.side_output(LATE) == ["k1"]


def test_run_after_a_rescale_routes_keys_to_the_new_subtasks() -> None:
    records = [f"k{i % 23}" for i in range(100)]
    runner = LocalRunner(CountPerKey(), key_selector=lambda r: r, parallelism=2)
    runner.run(records)
    runner.rescale(5)
    out = runner.run(records)
    assert out == [
        (r, 100 // 23 + (i % 23 < 100 % 23) + 1 + i // 23) for i, r in enumerate(records)
    ]
    for i, op in enumerate(runner.subtasks):
        rng = compute_key_group_range_for_operator_index(runner.max_parallelism, 5, i)
        keys = set(op.keyed_backend.get_keys("count", VOID_NAMESPACE))
        assert all(rng.contains(assign_to_key_group(k, runner.max_parallelism)) for k in keys)
    runner.close()
