"""Window behaviour pinned to Flink 2.3's triggers, evictors and assigners (what its classes do,
case by case), on the heap and RocksDB backends."""

from __future__ import annotations

import pytest

from streamstate import AggregateFunction, LocalRunner
from streamstate.backends.base import Clock
from streamstate.windows import (
    ContinuousProcessingTimeTrigger,
    CountTrigger,
    EventTimeSessionWindows,
    Evictor,
    GlobalWindows,
    NeverTrigger,
    ProcessWindowFunction,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    TimestampedValue,
    TumblingEventTimeWindows,
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


class _Sum(AggregateFunction):
    def create_accumulator(self):
        return 0

    def add(self, value, accumulator):
        return accumulator + value

    def get_result(self, accumulator):
        return accumulator

    def merge(self, a, b):
        return a + b


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
