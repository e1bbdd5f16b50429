"""Window operator behaviour: processing time, triggers, late data, errors, snapshot/restore."""

from __future__ import annotations

import pytest

from streamstate import (
    AggregateFunction,
    KeyedProcessFunction,
    LocalRunner,
    OutputTag,
    Time,
    ValueStateDescriptor,
)
from streamstate.backends.base import Clock
from streamstate.backends.timer_queues import TimerRestore
from streamstate.errors import StateAccessError
from streamstate.runtime.operator import KeyedProcessOperator
from streamstate.serializers import StrSerializer
from streamstate.windows import (
    CountTrigger,
    EventTimeSessionWindows,
    GlobalWindow,
    GlobalWindows,
    GlobalWindowSerializer,
    ProcessingTimeSessionWindows,
    ProcessWindowFunction,
    PurgingTrigger,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    TimeWindow,
    TimeWindowSerializer,
    Trigger,
    TriggerResult,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WindowFunction,
    WindowOperator,
    window,
)


class FakeClock(Clock):
    def __init__(self, now: int = 0) -> None:
        self.t = now

    def now(self) -> int:
        return self.t


class Count(AggregateFunction):
    def create_accumulator(self):
        return 0

    def add(self, value, accumulator):
        return accumulator + 1

    def get_result(self, accumulator):
        return accumulator

    def merge(self, acc_a, acc_b):
        return acc_a + acc_b


class WithWindow(ProcessWindowFunction):
    def process(self, key, context, elements):
        w = context.window()
        yield (key, w.start, w.end, sorted(elements) if len(elements) != 1 else elements[0])


def event_runner(fn, parallelism=1, delay=0):
    return LocalRunner(
        fn,
        key_selector=lambda r: r[0],
        parallelism=parallelism,
        timestamp_assigner=lambda r: r[1],
        watermark_delay=delay,
    )


def no_leak(runner):
    return all(
        op.keyed_backend.num_entries() == 0 and op.num_timers() == 0 for op in runner.subtasks
    )


# ---- time windows and assigners ---------------------------------------------------------------


def test_time_window_basics_and_serializers():
    w = TimeWindow(-10, 0)
    assert w.max_timestamp() == -1
    assert TimeWindow(0, 5).intersects(TimeWindow(5, 9)) and not TimeWindow(0, 5).intersects(
        TimeWindow(6, 9)
    )
    assert sorted([TimeWindow(5, 6), TimeWindow(0, 9)])[0] == TimeWindow(0, 9)
    s = TimeWindowSerializer()
    assert s.deserialize(s.serialize(w)) == w and s.immutable
    assert hash(TimeWindow(1, 2)) == hash(TimeWindow(1, 2))
    g = GlobalWindowSerializer()
    assert g.deserialize(g.serialize(GlobalWindow())) == GlobalWindow()
    assert GlobalWindow().max_timestamp() == (1 << 63) - 1


def test_assigners_follow_flink():
    assert TumblingEventTimeWindows.of(10).assign_windows(None, -3, None) == [TimeWindow(-10, 0)]
    assert TumblingEventTimeWindows.of(Time.hours(1), Time.minutes(15)).assign_windows(
        None, 0, None
    ) == [TimeWindow(-2_700_000, 900_000)]
    assert SlidingEventTimeWindows.of(10, 3).assign_windows(None, 7, None) == [
        TimeWindow(6, 16),
        TimeWindow(3, 13),
        TimeWindow(0, 10),
    ]
    with pytest.raises(ValueError, match="offset"):
        TumblingEventTimeWindows.of(10, 10)
    with pytest.raises(ValueError, match="slide"):
        SlidingEventTimeWindows.of(10, 0)
    with pytest.raises(ValueError, match="gap"):
        EventTimeSessionWindows.with_gap(0)
    with pytest.raises(ValueError, match="no timestamp"):
        TumblingEventTimeWindows.of(10).assign_windows(None, None, None)
    dyn = EventTimeSessionWindows.with_dynamic_gap(lambda e: e * 2)
    assert dyn.assign_windows(4, 100, None) == [TimeWindow(100, 108)]


# ---- functions and triggers -------------------------------------------------------------------


def test_reduce_aggregate_apply_without_and_with_window_functions():
    records = [("a", 1, 5), ("a", 2, 7), ("b", 3, 1), ("a", 12, 2)]

    class Apply(WindowFunction):
        def apply(self, key, w, inputs):
            return [(key, w.start, [r[2] for r in inputs])]

    spec = window(TumblingEventTimeWindows.of(10))
    assert event_runner(spec.reduce(lambda x, y: (x[0], x[1], x[2] + y[2]))).run(records) == [
        ("a", 1, 12),
        ("b", 3, 1),
        ("a", 12, 2),
    ]
    agg = window(TumblingEventTimeWindows.of(10)).aggregate(Count())
    assert sorted(event_runner(agg).run(records)) == [1, 1, 2]
    agg_pwf = window(TumblingEventTimeWindows.of(10)).aggregate(Count(), WithWindow())
    assert sorted(event_runner(agg_pwf).run(records)) == [
        ("a", 0, 10, 2),
        ("a", 10, 20, 1),
        ("b", 0, 10, 1),
    ]
    applied = window(TumblingEventTimeWindows.of(10)).apply(
        Apply(), element_type=tuple[str, int, int]
    )
    assert sorted(event_runner(applied).run(records)) == [
        ("a", 0, [5, 7]),
        ("a", 10, [2]),
        ("b", 0, [1]),
    ]


def test_count_trigger_state_is_cleaned_with_the_window():
    fn = window(TumblingEventTimeWindows.of(100)).trigger(CountTrigger.of(2)).aggregate(Count())
    runner = event_runner(fn, delay=1000)
    out = runner.run([("a", t, 0) for t in (1, 2, 3, 4, 5)], final_watermark=False)
    assert out == [2, 4]  # fires every 2 elements without purging
    op = runner.subtasks[0]
    assert op.keyed_backend.num_entries("trigger-count") == 1  # one element counted
    runner.advance_watermark(10_000)
    assert no_leak(runner)


def test_global_windows_with_a_purging_count_trigger():
    class Contents(ProcessWindowFunction):
        def process(self, key, context, elements):
            assert context.window() == GlobalWindow()
            yield (key, 0, 0, list(elements))

    fn = (
        window(GlobalWindows.create())
        .trigger(PurgingTrigger.of(CountTrigger.of(3)))
        .process(Contents(), element_type=tuple[str, int, int])
    )
    runner = LocalRunner(fn, key_selector=lambda r: r[0])
    out = runner.run([("a", 0, i) for i in range(7)])
    assert [o[3] for o in out] == [
        [("a", 0, 0), ("a", 0, 1), ("a", 0, 2)],
        [("a", 0, 3), ("a", 0, 4), ("a", 0, 5)],
    ]
    assert runner.subtasks[0].keyed_backend.num_entries("window-contents") == 1  # one element left


def test_merging_assigner_needs_a_merging_trigger():
    class NoMerge(Trigger):
        def on_element(self, element, timestamp, window, ctx):
            return TriggerResult.CONTINUE

        def on_processing_time(self, time, window, ctx):
            return TriggerResult.CONTINUE

        def on_event_time(self, time, window, ctx):
            return TriggerResult.CONTINUE

        def clear(self, window, ctx):
            return None

    with pytest.raises(ValueError, match="merges windows"):
        window(EventTimeSessionWindows.with_gap(5)).trigger(NoMerge()).aggregate(Count())


def test_builder_errors():
    ws = window(TumblingEventTimeWindows.of(10))
    with pytest.raises(TypeError):
        window("tumbling")
    with pytest.raises(TypeError):
        ws.aggregate(lambda a, b: a)
    with pytest.raises(TypeError):
        ws.process(object())
    with pytest.raises(ValueError):
        ws.allowed_lateness(-1)
    fn = ws.reduce(lambda a, b: a)
    assert isinstance(fn, WindowOperator) and isinstance(fn, KeyedProcessFunction)
    with pytest.raises(Exception, match="timestamp_assigner"):
        LocalRunner(fn, key_selector=lambda r: r).run(["x"])


# ---- late data --------------------------------------------------------------------------------


def test_late_elements_go_to_the_side_output_or_are_counted():
    tag = OutputTag("late")
    records = [("a", 5, 1), ("a", 22, 2), ("a", 6, 3), ("a", 18, 4)]
    # the watermark after 22 is 21: window [0,10) is closed (lateness 5: cleanup at 14) but
    # [10,20) is still within its lateness (cleanup at 24): 18 fires it at once
    fn = window(TumblingEventTimeWindows.of(10)).allowed_lateness(5).side_output_late_data(tag)
    runner = event_runner(fn.aggregate(Count(), WithWindow()))
    out = runner.run(records)
    assert runner.side_output(tag) == [("a", 6, 3)]
    assert out == [("a", 0, 10, 1), ("a", 10, 20, 1), ("a", 20, 30, 1)]

    dropped = event_runner(window(TumblingEventTimeWindows.of(10)).aggregate(Count()))
    dropped.run(records)
    group = dropped.subtasks[0].metric_group
    assert (
        group.metrics()["keyed-process.0.num_late_records_dropped"].count == 2
    )  # no lateness: 6 and 18


def test_allowed_lateness_fires_again_with_updated_contents():
    fn = (
        window(TumblingEventTimeWindows.of(10))
        .allowed_lateness(20)
        .aggregate(Count(), WithWindow())
    )
    runner = event_runner(fn)
    out = runner.run(
        [("a", 1, 0), ("a", 15, 0), ("a", 2, 0), ("a", 3, 0), ("a", 40, 0)], final_watermark=False
    )
    assert out == [("a", 0, 10, 1), ("a", 0, 10, 2), ("a", 0, 10, 3), ("a", 10, 20, 1)]
    runner.advance_watermark(1000)
    assert no_leak(runner)


# ---- processing time --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "assigner",
    [
        TumblingProcessingTimeWindows.of(10),
        SlidingProcessingTimeWindows.of(10, 5),
        ProcessingTimeSessionWindows.with_gap(10),
    ],
)
def test_processing_time_windows(assigner):
    clock = FakeClock(100)
    runner = LocalRunner(
        window(assigner).aggregate(Count(), WithWindow()), key_selector=lambda r: r, clock=clock
    )
    assert runner.run(["a", "b", "a"]) == []
    clock.t = 103
    runner.process("a")
    out = runner.advance_processing_time(200)
    counts = {(o[0], o[1]): o[3] for o in out}
    if isinstance(assigner, SlidingProcessingTimeWindows):
        assert counts == {("a", 95): 3, ("a", 100): 3, ("b", 95): 1, ("b", 100): 1}
    elif isinstance(assigner, ProcessingTimeSessionWindows):
        assert counts == {("a", 100): 3, ("b", 100): 1}
        assert sorted((o[0], o[2]) for o in out) == [("a", 113), ("b", 110)]  # a's merged
    else:
        assert counts == {("a", 100): 3, ("b", 100): 1}
    assert no_leak(runner)


# ---- sessions, checkpointing of the merging window set ---------------------------------------


class SessionSummary(ProcessWindowFunction):
    def process(self, key, context, elements):
        w = context.window()
        yield (key, w.start, w.end, sorted(e[2] for e in elements))


def session_fn():
    return window(EventTimeSessionWindows.with_gap(10)).process(
        SessionSummary(), element_type=tuple[str, int, int]
    )


def make_operator(fn):
    op = KeyedProcessOperator(fn, StrSerializer(), max_parallelism=16, state_backend="heap-nested")
    return op


def feed(op, records, delay=0, watermark=None):
    out = []
    wm = watermark
    for r in records:
        op.process_element(r[0], r, r[1])
        out += op.drain_output()
        if wm is None or r[1] - delay - 1 > wm:
            wm = r[1] - delay - 1
            op.advance_watermark(wm)
            out += op.drain_output()
    return out, wm


def test_session_windows_survive_snapshot_and_restore():
    first = [("a", 1, 1), ("b", 2, 2), ("a", 8, 3), ("a", 30, 4), ("b", 5, 5)]
    second = [("a", 22, 6), ("b", 9, 7), ("a", 60, 8), ("b", 61, 9)]

    # uninterrupted run
    ref = make_operator(session_fn())
    ref.open()
    expected, wm = feed(ref, first, delay=25)
    more, _ = feed(ref, second, delay=25, watermark=wm)
    ref.advance_watermark(10_000)
    expected += more + ref.drain_output()

    # run, snapshot, restore into a fresh operator, continue
    op = make_operator(session_fn())
    op.open()
    out, wm = feed(op, first, delay=25)
    snap = op.keyed_backend.snapshot(1)
    metas = {m.name: m for m in snap.states}
    assert metas["window-contents"].namespace_serializer.snapshot()["type"] == "time_window"
    assert "merging-window-set" in metas and "_timers.window-timers.event" in metas
    entries: dict[str, list] = {}
    for kg in snap.key_group_range:
        for index, es in snap.key_group_entries(kg):
            entries.setdefault(snap.states[index].name, []).extend((kg, *e) for e in es)
    snap.release()
    assert {e[1] for e in entries["merging-window-set"]} == {"a", "b"}

    restored = make_operator(session_fn())
    backend = restored.keyed_backend
    for name, rows in entries.items():
        meta = metas[name]
        if meta.kind == "timer":
            continue
        table = backend.register_state_table(
            name, meta.kind, meta.namespace_serializer, meta.state_serializer, meta.ttl
        )
        for kg, key, ns, state in rows:
            table.map_for_key_group(kg).put(key, ns, state)
        table.recount()  # entries put into the maps directly, as a restore does
    restored.open()
    restored.advance_watermark(wm)
    timers = TimerRestore(backend.timer_queues, backend.key_serializer)
    for kg, key, ns, ts in entries["_timers.window-timers.event"]:
        timers.add_timers(metas["_timers.window-timers.event"], kg, [(key, ns, ts)])
    timers.install()
    more, _ = feed(restored, second, delay=25, watermark=wm)
    restored.advance_watermark(10_000)
    out += more + restored.drain_output()
    assert sorted(out) == sorted(expected)
    assert restored.keyed_backend.num_entries() == 0 and restored.num_timers() == 0


def test_window_state_and_global_state_of_process_window_functions():
    class Firings(ProcessWindowFunction):
        def process(self, key, context, elements):
            per_window = context.window_state().get_state(ValueStateDescriptor("n", int, default=0))
            per_window.update(per_window.value() + 1)
            total = context.global_state().get_state(ValueStateDescriptor("total", int, default=0))
            total.update(total.value() + 1)
            yield (context.window().start, per_window.value(), total.value())

        def clear(self, context):
            context.window_state().get_state(ValueStateDescriptor("n", int)).clear()

    fn = window(TumblingEventTimeWindows.of(10)).allowed_lateness(50).process(Firings())
    runner = event_runner(fn)
    out = runner.run([("a", 1, 0), ("a", 12, 0), ("a", 2, 0), ("a", 100, 0)])
    assert out == [(0, 1, 1), (0, 2, 2), (10, 1, 3), (100, 1, 4)]
    backend = runner.subtasks[0].keyed_backend
    assert backend.num_entries("n") == 0  # cleared by clear() at cleanup
    assert backend.num_entries("total") == 1


def test_per_window_state_is_refused_with_merging_windows():
    # Flink's MergingWindowStateStore: a merge would strand the windows' per-window state
    class PerSession(ProcessWindowFunction):
        def process(self, key, context, elements):
            context.window_state().get_state(ValueStateDescriptor("n", int, default=0))
            yield key

    fn = window(EventTimeSessionWindows.with_gap(10)).process(PerSession())
    runner = event_runner(fn)
    with pytest.raises(
        StateAccessError,
        match="Per-window state is not allowed when using merging windows.*'n'",
    ):
        runner.run([("a", 1, 0), ("a", 5, 0), ("a", 100, 0)])

    class GlobalOnly(ProcessWindowFunction):
        def process(self, key, context, elements):
            total = context.global_state().get_state(ValueStateDescriptor("total", int, default=0))
            total.update(total.value() + len(elements))
            yield key, total.value()

    runner = event_runner(window(EventTimeSessionWindows.with_gap(10)).process(GlobalOnly()))
    assert runner.run([("a", 1, 0), ("a", 5, 0), ("a", 100, 0)]) == [("a", 2), ("a", 3)]


def test_spark_rows_as_window_elements_are_kept_as_tuples():
    # a Spark record (a tuple subclass without a class msgspec can rebuild) is inferred as the
    # tuple of its fields, as element_type=tuple[...] would give
    from collections import namedtuple

    from streamstate.spark.records import row_class
    from streamstate.windows.contents import infer_serializer

    row = row_class(["user", "v"])(("a", 3))
    ser = infer_serializer(row)
    assert type(ser).__name__ == "TupleSerializer"
    assert ser.deserialize(ser.serialize(row)) == ("a", 3)
    point = namedtuple("Point", ["x", "y"])
    assert type(infer_serializer(point(1, 2))).__name__ == "StructSerializer"

    class Sizes(ProcessWindowFunction):
        def process(self, key, context, elements):
            yield key, context.window().start, sorted(e[1] for e in elements)

    make = row_class(["user", "v"])
    fn = window(TumblingEventTimeWindows.of(10)).process(Sizes())
    runner = LocalRunner(
        fn,
        key_selector=lambda r: r[0],
        timestamp_assigner=lambda r: r[1],
        watermark_delay=0,
        state_backend="rocksdb",
    )
    assert runner.run([make(("a", 1)), make(("a", 4)), make(("b", 12))]) == [
        ("a", 0, [1, 4]),
        ("b", 10, [12]),
    ]
