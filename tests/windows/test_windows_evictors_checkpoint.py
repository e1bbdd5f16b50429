"""Evicting windows' element lists and the continuous and delta triggers' states survive a
checkpoint and restore (with rescaling, across backends): the same outputs as an uninterrupted
run, and nothing left behind."""

from __future__ import annotations

import pytest

from streamstate import AggregateFunction, LocalRunner
from streamstate.backends.base import Clock
from streamstate.windows import (
    ContinuousEventTimeTrigger,
    ContinuousProcessingTimeTrigger,
    CountEvictor,
    DeltaEvictor,
    DeltaTrigger,
    EventTimeSessionWindows,
    GlobalWindows,
    ProcessWindowFunction,
    SlidingEventTimeWindows,
    TimeEvictor,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    window,
)

Record = tuple[str, int, int]


class Summary(ProcessWindowFunction):
    def process(self, key, context, elements):
        w = context.window()
        yield (key, getattr(w, "start", None), getattr(w, "end", None), sorted(elements))


class Sum(AggregateFunction):
    def create_accumulator(self):
        return 0

    def add(self, value, accumulator):
        return accumulator + value[2]

    def get_result(self, accumulator):
        return accumulator

    def merge(self, acc_a, acc_b):
        return acc_a + acc_b


def _reduce(a, b):
    return (a[0], max(a[1], b[1]), a[2] + b[2])


def _delta(old, new):
    return abs(old[2] - new[2])


SPECS = {
    "count-evictor-sliding-reduce": lambda: (
        window(SlidingEventTimeWindows.of(20, 10))
        .allowed_lateness(5)
        .evictor(CountEvictor.of(2))
        .reduce(_reduce, element_type=Record)
    ),
    "time-evictor-sessions-continuous": lambda: (
        window(EventTimeSessionWindows.with_gap(10))
        .trigger(ContinuousEventTimeTrigger.of(4))
        .evictor(TimeEvictor.of(6, do_evict_after=True))
        .process(Summary(), element_type=Record)
    ),
    "continuous-tumbling-aggregate": lambda: (
        window(TumblingEventTimeWindows.of(30))
        .allowed_lateness(10)
        .trigger(ContinuousEventTimeTrigger.of(7))
        .aggregate(Sum())
    ),
    "delta-trigger-delta-evictor": lambda: (
        window(GlobalWindows.create())
        .trigger(DeltaTrigger.of(3, _delta, Record))
        .evictor(DeltaEvictor.of(4, _delta))
        .process(Summary(), element_type=Record)
    ),
}

FIRST = [("a", 1, 1), ("b", 2, 9), ("a", 8, 3), ("a", 30, 4), ("b", 5, 5), ("c", 3, 1)]
SECOND = [("a", 22, 9), ("b", 9, 2), ("c", 12, 8), ("a", 60, 8), ("b", 61, 1), ("c", 70, 1)]


def runner(spec, parallelism, backend="heap"):
    return LocalRunner(
        SPECS[spec](),
        key_selector=lambda r: r[0],
        parallelism=parallelism,
        timestamp_assigner=lambda r: r[1],
        watermark_delay=12,
        state_backend=backend,
    )


@pytest.mark.parametrize("spec", sorted(SPECS))
@pytest.mark.parametrize(
    ("backend_before", "backend_after", "before", "after"),
    [
        ("heap", "heap", 1, 1),
        ("rocksdb", "rocksdb", 2, 3),
        ("rocksdb", "heap", 3, 1),
        ("heap", "rocksdb", 1, 2),
    ],
)
def test_evictor_and_trigger_state_survive_checkpoint_restore_and_rescale(
    spec, backend_before, backend_after, before, after, tmp_path
):
    expected = runner(spec, 1).run(FIRST + SECOND, final_watermark=False)
    r1 = runner(spec, before, backend_before)
    out = r1.run(FIRST, final_watermark=False)
    cp = r1.checkpoint(str(tmp_path))
    r1.close()
    r2 = runner(spec, after, backend_after)
    r2.restore(cp)
    out += r2.run(SECOND, final_watermark=False)
    assert sorted(out, key=repr) == sorted(expected, key=repr)
    assert len(out) > 0
    if spec != "delta-trigger-delta-evictor":  # global windows never end
        r2.advance_watermark(10_000)
        assert all(op.keyed_backend.num_entries() == 0 for op in r2.subtasks)
        assert all(op.num_timers() == 0 for op in r2.subtasks)
    r2.close()


class _Clock(Clock):
    def __init__(self, now: int) -> None:
        self.t = now

    def now(self) -> int:
        return self.t


@pytest.mark.parametrize(
    ("backend_before", "backend_after"), [("heap", "rocksdb"), ("rocksdb", "heap")]
)
def test_continuous_processing_time_trigger_state_survives_restore(
    backend_before, backend_after, tmp_path
):
    def build(clock, backend):
        fn = (
            window(TumblingProcessingTimeWindows.of(20))
            .trigger(ContinuousProcessingTimeTrigger.of(6))
            .evictor(CountEvictor.of(2))
            .process(Summary(), element_type=Record)
        )
        return LocalRunner(fn, key_selector=lambda r: r[0], clock=clock, state_backend=backend)

    clock = _Clock(103)
    r1 = build(clock, backend_before)
    r1.run([("a", 0, 1), ("a", 0, 2), ("a", 0, 3)])
    assert [o[3] for o in r1.advance_processing_time(108)] == [[("a", 0, 2), ("a", 0, 3)]]
    cp = r1.checkpoint(str(tmp_path))
    r1.close()
    r2 = build(_Clock(110), backend_after)
    r2.restore(cp)
    r2.process(("a", 0, 4))
    # the restored fire time 114 and the window's end 119 fire with the restored, evicted list
    out = r2.advance_processing_time(200)
    assert [o[3] for o in out] == [[("a", 0, 3), ("a", 0, 4)]] * 2
    assert all(op.keyed_backend.num_entries() == 0 for op in r2.subtasks)
    assert all(op.num_timers() == 0 for op in r2.subtasks)
    r2.close()


@pytest.mark.parametrize("kind", ["aggregate", "process", "reduce"])
@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_restored_evicting_windows_fire_before_any_new_element(kind: str, backend: str) -> None:
    """The element list's serializer comes back from the checkpoint (no element_type given):
    the first watermark after the restore fires the pending windows."""

    def build():
        w = window(TumblingEventTimeWindows.of(10)).evictor(CountEvictor.of(2))
        if kind == "aggregate":
            return w.aggregate(Sum())
        if kind == "process":
            return w.process(Summary())
        return w.reduce(_reduce)

    def runner(storage=None):
        return LocalRunner(
            build(),
            key_selector=lambda e: e[0],
            timestamp_assigner=lambda e: e[1],
            watermark_delay=0,
            state_backend=backend,
            parallelism=2,
            checkpoint_storage=storage,
        )

    events = [("a", 1, 1), ("a", 2, 2), ("a", 3, 3), ("b", 4, 4)]
    first = runner()
    first.run(events, final_watermark=False)
    cp = first.checkpoint()
    expected = runner()
    expected.run(events, final_watermark=False)
    restored = runner(first.checkpoint_storage)
    restored.restore(cp.checkpoint_id)
    got = restored.advance_watermark(100)
    assert sorted(got) == sorted(expected.advance_watermark(100))
    assert len(got) == 2
