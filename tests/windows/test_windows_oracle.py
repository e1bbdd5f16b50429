"""Windows against a brute-force oracle: random out-of-order streams with late events."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamstate import AggregateFunction, LocalRunner, OutputTag, ValueStateDescriptor
from streamstate.windows import (
    EventTimeSessionWindows,
    ProcessWindowFunction,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    window,
)
from support.window_oracle import Oracle

LATE = OutputTag("late")

records_strategy = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 150), st.integers(1, 9)),
    min_size=1,
    max_size=60,
)


class Describe(ProcessWindowFunction):
    """(key, start, end, contents) for every firing; with ``count_firings`` also the number of
    the firing, kept in per-window state (``window_state()``) and cleared in ``clear``."""

    FIRINGS = ValueStateDescriptor("firings", int, default=0)

    def __init__(self, sort: bool = False, count_firings: bool = False) -> None:
        self.sort = sort
        self.count_firings = count_firings

    def process(self, key, context, elements):
        w = context.window()
        items = list(elements)
        described = (key, w.start, w.end, tuple(sorted(items) if self.sort else items))
        if self.count_firings:
            firings = context.window_state().get_state(self.FIRINGS)
            firings.update(firings.value() + 1)
            described += (firings.value(),)
        yield described

    def clear(self, context):
        if self.count_firings:
            context.window_state().get_state(self.FIRINGS).clear()


class DescribeAggregate(ProcessWindowFunction):
    """(key, start, end, aggregate) for every firing of an incrementally aggregated window."""

    def process(self, key, context, elements):
        (result,) = elements
        w = context.window()
        yield (key, w.start, w.end, result)


class CountAndSum(AggregateFunction):
    def create_accumulator(self):
        return (0, 0)

    def add(self, value, accumulator):
        return (accumulator[0] + 1, accumulator[1] + value[2])

    def get_result(self, accumulator):
        return accumulator

    def merge(self, acc_a, acc_b):
        return (acc_a[0] + acc_b[0], acc_a[1] + acc_b[1])


def run_windows(fn, records, delay, parallelism, end_watermark):
    runner = LocalRunner(
        fn,
        key_selector=lambda r: r[0],
        parallelism=parallelism,
        timestamp_assigner=lambda r: r[1],
        watermark_delay=delay,
    )
    out = runner.run(records, final_watermark=False)
    out += runner.advance_watermark(end_watermark)
    late = runner.side_output(LATE)
    leaks = [(op.keyed_backend.num_entries(), op.num_timers()) for op in runner.subtasks]
    return out, late, leaks, runner


def expected(oracle, kind, count_firings=False):
    out = Counter()
    firings = Counter()
    for key, w, elems in oracle.fired:
        if kind == "process":
            what = tuple(sorted(elems))
        elif kind == "reduce":
            what = sum(e[2] for e in elems)
        else:
            what = (len(elems), sum(e[2] for e in elems))
        firings[(key, w)] += 1
        extra = (firings[(key, w)],) if count_firings else ()
        out[(key, w.start, w.end, what, *extra)] += 1
    return out


def build(assigner, kind, lateness, count_firings=False):
    ws = window(assigner).allowed_lateness(lateness).side_output_late_data(LATE)
    if kind == "process":
        return ws.process(Describe(sort=True, count_firings=count_firings))
    if kind == "reduce":
        return ws.reduce(lambda a, b: (a[0], max(a[1], b[1]), a[2] + b[2]), _ReduceDescribe())
    return ws.aggregate(CountAndSum(), DescribeAggregate())


class _ReduceDescribe(ProcessWindowFunction):
    def process(self, key, context, elements):
        (reduced,) = elements
        w = context.window()
        yield (key, w.start, w.end, reduced[2])


def check(assigner, assign, gap, records, kind, lateness, delay, parallelism):
    horizon = 150 + 100 + lateness + 10  # beyond every window's cleanup time
    oracle = Oracle(lateness, delay, gap)
    for r in records:
        oracle.process(r, r[0], r[1], assign)
    oracle.advance(horizon)
    # per-window state (not allowed with merging windows) must be cleaned up with its window too
    count_firings = kind == "process" and gap is None
    out, late, leaks, _ = run_windows(
        build(assigner, kind, lateness, count_firings), records, delay, parallelism, horizon
    )
    assert Counter(out) == expected(oracle, kind, count_firings)
    assert Counter(late) == Counter(oracle.late)
    assert leaks == [(0, 0)] * parallelism  # no state and no timer of a closed window is left


common = dict(
    records=records_strategy,
    kind=st.sampled_from(["process", "reduce", "aggregate"]),
    lateness=st.sampled_from([0, 7, 25]),
    delay=st.sampled_from([0, 4, 30]),
    parallelism=st.sampled_from([1, 2]),
)
hyp = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@hyp
@given(size=st.sampled_from([5, 10, 17]), offset=st.sampled_from([0, 3]), **common)
def test_tumbling_windows_match_the_oracle(
    size, offset, records, kind, lateness, delay, parallelism
):
    assigner = TumblingEventTimeWindows.of(size, offset % size)
    check(
        assigner,
        lambda ts: assigner.assign_windows(None, ts, None),
        None,
        records,
        kind,
        lateness,
        delay,
        parallelism,
    )


@hyp
@given(shape=st.sampled_from([(10, 5), (12, 4), (6, 6), (5, 10)]), **common)
def test_sliding_windows_match_the_oracle(shape, records, kind, lateness, delay, parallelism):
    assigner = SlidingEventTimeWindows.of(*shape)
    check(
        assigner,
        lambda ts: assigner.assign_windows(None, ts, None),
        None,
        records,
        kind,
        lateness,
        delay,
        parallelism,
    )


@hyp
@given(gap=st.sampled_from([3, 8, 20]), **common)
def test_session_windows_match_the_oracle(gap, records, kind, lateness, delay, parallelism):
    check(
        EventTimeSessionWindows.with_gap(gap),
        None,
        gap,
        records,
        kind,
        lateness,
        delay,
        parallelism,
    )


def test_tumbling_process_contents_keep_arrival_order():
    records = [("a", 5, 1), ("a", 3, 2), ("a", 8, 3), ("a", 20, 4)]
    fn = window(TumblingEventTimeWindows.of(10)).process(Describe())
    out, late, leaks, _ = run_windows(fn, records, 100, 1, 1000)
    assert out == [
        ("a", 0, 10, (("a", 5, 1), ("a", 3, 2), ("a", 8, 3))),
        ("a", 20, 30, (("a", 20, 4),)),
    ]
    assert late == [] and leaks == [(0, 0)]


@pytest.mark.parametrize("parallelism", [1, 3])
def test_no_leak_while_the_stream_goes_on(parallelism):
    """State stays bounded by the windows in flight, whatever the total number of windows."""
    fn = window(SlidingEventTimeWindows.of(20, 10)).allowed_lateness(5).aggregate(CountAndSum())
    runner = LocalRunner(
        fn,
        key_selector=lambda r: r[0],
        parallelism=parallelism,
        timestamp_assigner=lambda r: r[1],
        watermark_delay=0,
    )
    keys = [f"k{i}" for i in range(5)]
    sizes = []
    for t in range(0, 2000):
        runner.process((keys[t % 5], t, 1))
        sizes.append(sum(op.keyed_backend.num_entries() for op in runner.subtasks))
    # 5 keys x at most 3 in-flight windows (2 open, 1 within lateness)
    assert max(sizes) <= 5 * 3
    runner.advance_watermark(10_000)
    assert all(op.keyed_backend.num_entries() == 0 for op in runner.subtasks)
    assert all(op.num_timers() == 0 for op in runner.subtasks)
