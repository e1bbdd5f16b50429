"""Window behaviour pinned to Flink 2.3's triggers, evictors and assigners (what its classes do,
case by case), on the heap and RocksDB backends."""

from __future__ import annotations

import importlib
from collections import Counter

import pytest

import streamstate
import streamstate.windows
from streamstate import LocalRunner
from streamstate.backends.base import Clock
from streamstate.windows import (
    ContinuousProcessingTimeTrigger,
    CountTrigger,
    EndOfStreamTrigger,
    EventTimeSessionWindows,
    Evictor,
    GlobalWindows,
    NeverTrigger,
    ProcessWindowFunction,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    TimestampedValue,
    TumblingEventTimeWindows,
    WindowStagger,
    window,
)

BACKENDS = ["heap", "rocksdb"]


class FakeClock(Clock):
    def __init__(self, now: int = 0) -> None:
        self.t = now

    def now(self) -> int:
        return self.t


class Seen(ProcessWindowFunction):
    """(key, start, end, elements in the order the window function sees them)."""

    def process(self, key, context, elements):
        w = context.window()
        yield (key, getattr(w, "start", None), getattr(w, "end", None), tuple(elements))


def _leaks(runner: LocalRunner) -> list[tuple[int, int]]:
    return [(op.keyed_backend.num_entries(), op.num_timers()) for op in runner.subtasks]


# ---- ContinuousProcessingTimeTrigger at the window's end ---------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_continuous_processing_time_trigger_behind_processing_time_fires_once(backend):
    """An event-time window whose end processing time has already passed: the first element's
    fire time is capped at the window's max timestamp, that timer fires the window, and (Flink
    2.3) the fire time stays set, so later elements register nothing and fire nothing."""
    clock = FakeClock(20_000)
    fn = (
        window(TumblingEventTimeWindows.of(10_000))
        .trigger(ContinuousProcessingTimeTrigger.of(100))
        .process(Seen())
    )
    runner = LocalRunner(
        fn,
        key_selector=lambda r: r[0],
        timestamp_assigner=lambda r: r[1],
        watermark_delay=60_000,  # the watermark stays behind the window
        clock=clock,
        state_backend=backend,
    )
    out = []
    for i in range(4):  # four elements 400 ms apart
        clock.t = 20_000 + 400 * i
        out += runner.process(("a", 1_000 * (i + 1)))
        out += runner.advance_processing_time(clock.t)
    assert out == [("a", 0, 10_000, (("a", 1_000),))]
    # the window closes with the watermark (this trigger does not fire on event time)
    assert runner.advance_watermark(10_000 + 60_000) == []
    assert _leaks(runner) == [(0, 0)]
    runner.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_continuous_processing_time_trigger_keeps_its_fire_time_after_the_end(backend):
    """While processing time runs through the window: fires every interval and at the window's
    max timestamp; the fire time is then kept until the window is cleaned up."""
    clock = FakeClock(0)
    fn = (
        window(TumblingEventTimeWindows.of(100))
        .trigger(ContinuousProcessingTimeTrigger.of(30))
        .process(Seen())
    )
    runner = LocalRunner(
        fn,
        key_selector=lambda r: r[0],
        timestamp_assigner=lambda r: r[1],
        watermark_delay=1_000,
        clock=clock,
        state_backend=backend,
    )
    runner.process(("a", 5))
    fired = runner.advance_processing_time(200)  # 30, 60, 90, 99
    assert [len(o[3]) for o in fired] == [1, 1, 1, 1]
    for t in (250, 300):  # processing time is past the window: no further firing
        clock.t = t
        runner.process(("a", 6))
        assert runner.advance_processing_time(t) == []
    assert runner.advance_watermark(99) == []
    assert _leaks(runner) == [(0, 0)]
    runner.close()


# ---- evictors: what is left is written back ----------------------------------------------------


class Reverse(Evictor):
    """Changes the order only: reverses the elements after the function ran."""

    def evict_before(self, elements, size, window, ctx):
        return None

    def evict_after(self, elements, size, window, ctx):
        elements.reverse()


class TimesTen(Evictor):
    """Replaces every element (value * 10, same timestamp) before the function runs."""

    def evict_before(self, elements, size, window, ctx):
        elements[:] = [TimestampedValue(e.value * 10, e.timestamp) for e in elements]

    def evict_after(self, elements, size, window, ctx):
        return None


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_evictor_that_reorders_is_written_back(backend):
    fn = (
        window(GlobalWindows.create())
        .trigger(CountTrigger.of(1))
        .evictor(Reverse())
        .process(Seen(), element_type=int)
    )
    runner = LocalRunner(fn, key_selector=lambda r: "k", state_backend=backend)
    seen = [o[3] for o in runner.run([1, 2, 3], final_watermark=False)]
    assert seen == [(1,), (1, 2), (2, 1, 3)]
    runner.restore(runner.checkpoint())  # the written-back order is what is checkpointed
    assert [o[3] for o in runner.run([4], final_watermark=False)] == [(3, 1, 2, 4)]
    runner.close()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["process", "reduce", "aggregate"])
def test_an_evictor_that_replaces_elements_is_written_back(backend, kind):
    ws = window(GlobalWindows.create()).trigger(CountTrigger.of(1)).evictor(TimesTen())
    if kind == "process":
        fn = ws.process(Seen(), element_type=int)
        expected = [(10,), (100, 20), (1000, 200, 30)]
    elif kind == "reduce":
        fn = ws.reduce(lambda a, b: a + b, element_type=int)
        expected = [10, 120, 1230]
    else:
        fn = ws.aggregate(_Sum(), accumulator_type=int)
        expected = [10, 120, 1230]
    runner = LocalRunner(
        fn, key_selector=lambda r: "k", timestamp_assigner=lambda r: r, state_backend=backend
    )
    out = runner.run([1, 2, 3], final_watermark=False)
    assert [o[3] if kind == "process" else o for o in out] == expected
    runner.close()


class _Sum(streamstate.AggregateFunction):
    def create_accumulator(self):
        return 0

    def add(self, value, accumulator):
        return accumulator + value

    def get_result(self, accumulator):
        return accumulator

    def merge(self, a, b):
        return a + b


# ---- event-time tumbling windows with a stagger ------------------------------------------------


class _Now:
    """An assigner context at a fixed processing time."""

    def __init__(self, t: int) -> None:
        self.t = t

    def get_current_processing_time(self) -> int:
        return self.t


def test_event_time_stagger_is_chosen_at_the_first_element_from_processing_time():
    natural = TumblingEventTimeWindows.of(100, 0, WindowStagger.NATURAL)
    # stagger = 1234 - 1200 = 34, chosen from processing time; windows stay in event time
    assert natural.assign_windows(None, 5_000, _Now(1_234))[0].start == 4_934
    assert natural.assign_windows(None, 5_040, _Now(9_999))[0].start == 5_034
    with_offset = TumblingEventTimeWindows.of(100, 10, WindowStagger.NATURAL)
    assert with_offset.assign_windows(None, 5_000, _Now(1_234))[0].start == 4_944
    negative = TumblingEventTimeWindows.of(100, -90, WindowStagger.NATURAL)
    assert negative.assign_windows(None, -5, _Now(1_250))[0].start == -40  # (-90 + 50) % 100
    rnd = TumblingEventTimeWindows.of(100, 0, WindowStagger.RANDOM)
    first = rnd.assign_windows(None, 0, _Now(0))[0].start % 100
    assert {rnd.assign_windows(None, t, _Now(t))[0].start % 100 for t in range(0, 900, 7)} == {
        first
    }
    aligned = TumblingEventTimeWindows.of(100, 0, WindowStagger.ALIGNED)
    assert aligned.assign_windows(None, 5_034, None)[0].start == 5_000
    assert TumblingEventTimeWindows.of(100).window_stagger is WindowStagger.ALIGNED
    with pytest.raises(TypeError, match="WindowStagger"):
        TumblingEventTimeWindows.of(100, 0, "natural")


@pytest.mark.parametrize("backend", BACKENDS)
def test_event_time_stagger_per_subtask_and_again_after_a_restore(backend):
    """Each subtask staggers its event-time windows by its first element's processing-time lag;
    the stagger is not checkpointed, so a restored subtask chooses again while its restored
    windows still fire at their own ends."""
    clock = FakeClock(3)
    fn = window(TumblingEventTimeWindows.of(10, 0, WindowStagger.NATURAL)).process(Seen())
    runner = LocalRunner(
        fn,
        key_selector=lambda r: r[0],
        timestamp_assigner=lambda r: r[1],
        watermark_delay=1_000,
        parallelism=2,
        clock=clock,
        state_backend=backend,
    )
    keys = ["a", "b", "c", "d", "e", "f"]
    by_subtask: dict[int, list[str]] = {}
    for k in keys:
        by_subtask.setdefault(runner.subtask_for_key(k), []).append(k)
    assert len(by_subtask) == 2
    (k0, *_), (k1, *_) = by_subtask.values()
    runner.process((k0, 100))  # stagger 3 on k0's subtask
    clock.t = 7
    runner.process((k1, 100))  # stagger 7 on k1's subtask
    runner.process((k0, 101))
    runner.restore(runner.checkpoint())
    clock.t = 5
    runner.process((k0, 104))  # restored: stagger 5 now
    out = runner.advance_watermark(1_000)
    assert Counter(out) == Counter(
        [
            (k0, 93, 103, ((k0, 100), (k0, 101))),
            (k1, 97, 107, ((k1, 100),)),
            (k0, 95, 105, ((k0, 104),)),
        ]
    )
    assert _leaks(runner) == [(0, 0), (0, 0)]
    runner.close()


# ---- GlobalWindows with the end-of-stream trigger ----------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("timestamps", [False, True])
def test_global_window_with_the_end_of_stream_trigger_fires_once_when_the_input_ends(
    backend, timestamps
):
    assigner = GlobalWindows.create_with_end_of_stream_trigger()
    assert isinstance(assigner.get_default_trigger(), EndOfStreamTrigger)
    assert isinstance(GlobalWindows.create().get_default_trigger(), NeverTrigger)
    fn = window(assigner).reduce(lambda a, b: (a[0], a[1] + b[1]))
    runner = LocalRunner(
        fn,
        key_selector=lambda r: r[0],
        timestamp_assigner=(lambda r: r[1]) if timestamps else None,
        watermark_delay=0 if timestamps else None,
        state_backend=backend,
    )
    records = [("a", 1), ("b", 2), ("a", 3), ("c", 4)]
    assert runner.run(records[:2], final_watermark=False) == []
    runner.restore(runner.checkpoint())  # the end-of-stream timer is checkpointed
    assert runner.run(records[2:], final_watermark=False) == []
    assert sorted(runner.run([])) == [("a", 4), ("b", 2), ("c", 4)]
    runner.close()


def test_end_of_stream_trigger_is_flinks():
    trigger = EndOfStreamTrigger()
    assert not trigger.can_merge()
    assert repr(trigger) == "EndOfStreamTrigger()"
    with pytest.raises(ValueError, match="merges windows"):
        window(EventTimeSessionWindows.with_gap(5)).trigger(trigger).reduce(lambda a, b: a)


# ---- other points where Flink 2.3 decides -------------------------------------------------------


def test_never_trigger_does_not_merge_as_flinks():
    assert not NeverTrigger().can_merge()
    with pytest.raises(ValueError, match="merges windows"):
        window(EventTimeSessionWindows.with_gap(5)).trigger(NeverTrigger()).reduce(lambda a, b: a)


def test_sliding_event_time_windows_refuse_more_than_ten_million_windows_per_element():
    SlidingEventTimeWindows.of(10_000_000, 1)  # exactly the limit
    with pytest.raises(ValueError, match="size / slide <= 10000000"):
        SlidingEventTimeWindows.of(10_000_001 * 3, 3)
    SlidingProcessingTimeWindows.of(10_000_001 * 3, 3)  # Flink checks event time only


# ---- exports ---------------------------------------------------------------------------------

#: streamstate.windows names that are the operator's machinery, not the user's API
INTERNAL = {
    "EvictingWindowOperator",
    "GlobalWindowSerializer",
    "MergingWindowSet",
    "TimeWindowSerializer",
    "WindowOperator",
}


def test_every_public_window_name_is_exported():
    for module in (
        "streamstate.windows.assigners",
        "streamstate.windows.evictors",
        "streamstate.windows.functions",
        "streamstate.serializers.window_namespaces",  # TimeWindow, GlobalWindow
        "streamstate.windows.triggers",
        "streamstate.windows.windowed_stream",
    ):
        mod = importlib.import_module(module)
        public = {
            n
            for n in mod.__all__
            if isinstance(getattr(mod, n), type) and not n.startswith("Internal")
        }
        assert public <= set(streamstate.windows.__all__), module
    for name in streamstate.windows.__all__:
        assert getattr(streamstate.windows, name) is not None
    missing = set(streamstate.windows.__all__) - INTERNAL - set(streamstate.__all__)
    assert missing == set()
    assert streamstate.TimestampedValue is TimestampedValue
    assert streamstate.EvictorContext is streamstate.windows.EvictorContext
