"""Evictors, continuous and delta triggers and window stagger against brute-force oracles:
random out-of-order streams with late events, on the heap and RocksDB backends."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamstate import AggregateFunction, LocalRunner, OutputTag
from streamstate.backends.base import Clock
from streamstate.windows import (
    ContinuousEventTimeTrigger,
    ContinuousProcessingTimeTrigger,
    CountEvictor,
    DeltaEvictor,
    DeltaTrigger,
    EventTimeSessionWindows,
    GlobalWindow,
    GlobalWindows,
    GlobalWindowSerializer,
    ProcessingTimeSessionWindows,
    ProcessWindowFunction,
    SlidingEventTimeWindows,
    TimeEvictor,
    TimestampedValue,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WindowStagger,
    window,
)
from support.window_oracle import ContinuousOracle, EvictingOracle

LATE = OutputTag("late")

records_strategy = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 150), st.integers(1, 9)),
    min_size=1,
    max_size=50,
)
hyp = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class FakeClock(Clock):
    def __init__(self, now: int = 0) -> None:
        self.t = now

    def now(self) -> int:
        return self.t


class _NoBounds:
    """The bounds of a GlobalWindow in the outputs."""

    start = end = None


class Describe(ProcessWindowFunction):
    """(key, start, end, what) per firing: the sorted elements, or the one reduced/aggregated
    value's payload."""

    def __init__(self, single: bool = False) -> None:
        self.single = single

    def process(self, key, context, elements):
        w = context.window()
        if not hasattr(w, "start"):
            w = _NoBounds
        items = list(elements)
        if self.single:
            (what,) = items
            yield (key, w.start, w.end, what)
        else:
            yield (key, w.start, w.end, tuple(sorted(items)))


class CountAndSum(AggregateFunction):
    def create_accumulator(self):
        return (0, 0)

    def add(self, value, accumulator):
        return (accumulator[0] + 1, accumulator[1] + value[2])

    def get_result(self, accumulator):
        return accumulator

    def merge(self, acc_a, acc_b):
        return (acc_a[0] + acc_b[0], acc_a[1] + acc_b[1])


def _sum3(a, b):
    return (a[0], max(a[1], b[1]), a[2] + b[2])


def finish(ws, kind):
    """The window function of ``kind`` on the window specification ``ws``."""
    if kind == "process":
        return ws.process(Describe())
    if kind == "reduce":
        return ws.reduce(_sum3, _Payload())
    return ws.aggregate(CountAndSum(), Describe(single=True))


class _Payload(ProcessWindowFunction):
    def process(self, key, context, elements):
        (reduced,) = elements
        w = context.window()
        yield (key, w.start, w.end, reduced[2])


def expected(fired, kind):
    out = Counter()
    for key, w, elems in fired:
        if kind == "process":
            what = tuple(sorted(elems))
        elif kind == "reduce":
            what = sum(e[2] for e in elems)
        else:
            what = (len(elems), sum(e[2] for e in elems))
        out[(key, w.start, w.end, what)] += 1
    return out


def run(fn, records, delay, parallelism, horizon, backend):
    runner = LocalRunner(
        fn,
        key_selector=lambda r: r[0],
        parallelism=parallelism,
        timestamp_assigner=lambda r: r[1],
        watermark_delay=delay,
        state_backend=backend,
    )
    out = runner.run(records, final_watermark=False)
    out += runner.advance_watermark(horizon)
    late = runner.side_output(LATE)
    leaks = [(op.keyed_backend.num_entries(), op.num_timers()) for op in runner.subtasks]
    runner.close()
    return out, late, leaks


# ---- evictors ---------------------------------------------------------------------------------


def evictor_and_model(which, n, after):
    """The evictor under test and an independent model of it on the oracle's element lists."""
    if which == "count":
        return CountEvictor.of(n, after), lambda els: els[len(els) - n :] if len(els) > n else els
    if which == "time":

        def keep_recent(els):
            newest = max(e[1] for e in els)
            return [e for e in els if e[1] > newest - n]

        return TimeEvictor.of(n, after), keep_recent

    def delta(old, new):  # elements far from the last one in payload are evicted
        return abs(old[2] - new[2])

    return DeltaEvictor.of(n, delta, after), lambda els: [
        e for e in els if abs(e[2] - els[-1][2]) < n
    ]


def check_evicting(assigner, assign, gap, records, kind, which, n, after, lateness, delay, p, be):
    horizon = 150 + 100 + lateness + 10
    evictor, model = evictor_and_model(which, n, after)
    oracle = EvictingOracle(lateness, delay, gap, model, after)
    for r in records:
        oracle.process(r, r[0], r[1], assign)
    oracle.advance(horizon)
    ws = window(assigner).allowed_lateness(lateness).side_output_late_data(LATE).evictor(evictor)
    out, late, leaks = run(finish(ws, kind), records, delay, p, horizon, be)
    assert Counter(out) == expected(oracle.fired, kind)
    assert Counter(late) == Counter(oracle.late)
    assert leaks == [(0, 0)] * p


evict_common = dict(
    records=records_strategy,
    kind=st.sampled_from(["process", "reduce", "aggregate"]),
    after=st.booleans(),
    lateness=st.sampled_from([0, 7, 25]),
    delay=st.sampled_from([0, 4, 30]),
    parallelism=st.sampled_from([1, 2]),
)


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
@hyp
@given(
    shape=st.sampled_from([(10, None), (17, None), (10, 5), (12, 4)]),
    evict=st.sampled_from([("count", 1), ("count", 3), ("time", 4), ("time", 9), ("delta", 3)]),
    **evict_common,
)
def test_evictors_on_time_windows_match_the_oracle(
    backend, shape, evict, records, kind, after, lateness, delay, parallelism
):
    size, slide = shape
    if slide is None:
        assigner = TumblingEventTimeWindows.of(size)
    else:
        assigner = SlidingEventTimeWindows.of(size, slide)

    def assign(ts):
        return assigner.assign_windows(None, ts, None)

    check_evicting(
        assigner, assign, None, records, kind, *evict, after, lateness, delay, parallelism, backend
    )


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
@hyp
@given(gap=st.sampled_from([3, 8, 20]), size=st.sampled_from([2, 6, 15]), **evict_common)
def test_time_evictor_on_merged_sessions_matches_the_oracle(
    backend, gap, size, records, kind, after, lateness, delay, parallelism
):
    """Sessions merge their element lists; the TimeEvictor does not depend on list order."""
    check_evicting(
        EventTimeSessionWindows.with_gap(gap),
        None,
        gap,
        records,
        kind,
        "time",
        size,
        after,
        lateness,
        delay,
        parallelism,
        backend,
    )


def test_evicting_window_keeps_the_timestamped_element_list():
    """Flink's layout: a reduce with an evictor keeps every element (with its timestamp) and
    reduces the evicted list when the window fires."""
    fn = (
        window(GlobalWindows.create())
        .trigger(DeltaTrigger.of(0, lambda a, b: 1, int))  # fires on every element but the 1st
        .evictor(CountEvictor.of(2))
        .reduce(lambda a, b: a + b)
    )
    runner = LocalRunner(fn, key_selector=lambda r: "k", timestamp_assigner=lambda r: r * 10)
    assert runner.run([1, 2, 3, 4], final_watermark=False) == [3, 5, 7]
    (op,) = runner.subtasks
    backend = op.keyed_backend
    assert sorted(backend.registered_state_names()) == ["last-element", "window-contents"]
    descriptor = backend.get_state_descriptor("window-contents")
    assert type(descriptor).__name__ == "ListStateDescriptor"
    backend.set_current_key("k")
    contents = backend.get_partitioned_state(GlobalWindow(), GlobalWindowSerializer(), descriptor)
    assert contents.get() == [(30, 3), (40, 4)]  # evicted before: the list stays at 2


def test_evict_after_runs_after_the_function():
    out = (
        window(GlobalWindows.create())
        .trigger(DeltaTrigger.of(0, lambda a, b: 1, tuple[str, int, int]))
        .evictor(CountEvictor.of(1, do_evict_after=True))
        .process(Describe())
    )
    runner = LocalRunner(out, key_selector=lambda r: "k")
    got = runner.run([("k", 0, 1), ("k", 0, 2), ("k", 0, 3)])
    # fires on the 2nd element with both, keeps the 2nd, fires on the 3rd with 2nd and 3rd
    assert [o[3] for o in got] == [(("k", 0, 1), ("k", 0, 2)), (("k", 0, 2), ("k", 0, 3))]


def test_reduce_over_an_emptied_window_yields_none_as_flink():
    fn = (
        window(GlobalWindows.create())
        .trigger(DeltaTrigger.of(0, lambda a, b: 1, int))
        .evictor(CountEvictor.of(0))
        .reduce(lambda a, b: a + b)
    )
    assert LocalRunner(fn, key_selector=lambda r: "k").run([1, 2]) == [None]


def test_time_evictor_without_timestamps_evicts_nothing():
    fn = (
        window(GlobalWindows.create())
        .trigger(DeltaTrigger.of(0, lambda a, b: 1, int))
        .evictor(TimeEvictor.of(1))
        .reduce(lambda a, b: a + b)
    )
    assert LocalRunner(fn, key_selector=lambda r: "k").run([1, 2, 3]) == [3, 6]


def test_evictor_unit_rules():
    els = [TimestampedValue(v, t) for v, t in [(1, 5), (2, 1), (3, 9), (10, 7)]]
    DeltaEvictor.of(5, lambda a, b: abs(a - b)).evict_before(els, 4, None, None)
    assert [e.value for e in els] == [10]  # |1-10|, |2-10|, |3-10| >= 5
    els = [TimestampedValue(v, t) for v, t in [(1, 5), (2, 1), (3, 9)]]
    TimeEvictor.of(4).evict_before(els, 3, None, None)
    assert [e.value for e in els] == [3]  # evicts timestamps <= 9 - 4
    TimeEvictor.of(4, do_evict_after=True).evict_before(els, 2, None, None)
    CountEvictor.of(1, do_evict_after=True).evict_before(els, 2, None, None)
    assert len(els) == 1
    with pytest.raises(TypeError, match="Evictor"):
        window(GlobalWindows.create()).evictor("no")


# ---- continuous event-time trigger -------------------------------------------------------------


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
@hyp
@given(
    shape=st.sampled_from([(10, None), (30, None), (20, 10)]),
    interval=st.sampled_from([3, 7, 40]),
    records=records_strategy,
    kind=st.sampled_from(["process", "reduce", "aggregate"]),
    lateness=st.sampled_from([0, 7, 25]),
    delay=st.sampled_from([0, 4, 30]),
    parallelism=st.sampled_from([1, 2]),
)
def test_continuous_event_time_trigger_matches_the_oracle(
    backend, shape, interval, records, kind, lateness, delay, parallelism
):
    size, slide = shape
    assigner = (
        TumblingEventTimeWindows.of(size)
        if slide is None
        else SlidingEventTimeWindows.of(size, slide)
    )
    horizon = 150 + 100 + lateness + 10
    oracle = ContinuousOracle(lateness, delay, interval)
    for r in records:
        oracle.process(r, r[0], r[1], lambda ts: assigner.assign_windows(None, ts, None))
    oracle.advance(horizon)
    ws = (
        window(assigner)
        .trigger(ContinuousEventTimeTrigger.of(interval))
        .allowed_lateness(lateness)
        .side_output_late_data(LATE)
    )
    out, late, leaks = run(finish(ws, kind), records, delay, parallelism, horizon, backend)
    assert Counter(out) == expected(oracle.fired, kind)
    assert Counter(late) == Counter(oracle.late)
    assert leaks == [(0, 0)] * parallelism


def test_continuous_event_time_fire_times_use_javas_remainder():
    """Flink aligns the first fire time with Java's ``%``: -7 - (-7 % 5) + 5 = 0, not -5."""
    fn = (
        window(GlobalWindows.create()).trigger(ContinuousEventTimeTrigger.of(5)).process(Describe())
    )
    runner = LocalRunner(fn, key_selector=lambda r: r[0], timestamp_assigner=lambda r: r[1])
    runner.process(("k", -7, 1))
    assert runner.advance_watermark(-1) == []
    assert runner.advance_watermark(0) == [("k", None, None, (("k", -7, 1),))]
    runner2 = LocalRunner(fn, key_selector=lambda r: r[0], timestamp_assigner=lambda r: r[1])
    runner2.process(("k", -7, 1))
    assert runner2.advance_watermark(-5) == []  # Python's floor remainder would fire at -5


def test_continuous_event_time_trigger_merges_sessions_to_the_earliest_fire_time():
    fn = (
        window(EventTimeSessionWindows.with_gap(10))
        .trigger(ContinuousEventTimeTrigger.of(4))
        .process(Describe())
    )
    runner = LocalRunner(fn, key_selector=lambda r: r[0], timestamp_assigner=lambda r: r[1])
    runner.process(("a", 1, 1))  # session [1, 11), fire time 4
    runner.process(("a", 15, 2))  # session [15, 25), fire time 16
    runner.process(("a", 9, 3))  # bridges both: [1, 25), fire time min(4, 16) = 4
    out = runner.advance_watermark(4)
    assert out == [("a", 1, 25, (("a", 1, 1), ("a", 9, 3), ("a", 15, 2)))]
    assert runner.advance_watermark(7) == []
    assert [o[1:3] for o in runner.advance_watermark(8)] == [(1, 25)]  # then every 4
    assert [o[1:3] for o in runner.advance_watermark(100)] == [(1, 25)] * 4  # 12, 16, 20, 24
    assert all(op.keyed_backend.num_entries() == 0 for op in runner.subtasks)


# ---- continuous processing-time trigger --------------------------------------------------------


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_continuous_processing_time_trigger(backend):
    clock = FakeClock(103)
    fn = (
        window(TumblingProcessingTimeWindows.of(20))
        .trigger(ContinuousProcessingTimeTrigger.of(6))
        .aggregate(CountAndSum(), Describe(single=True))
    )
    runner = LocalRunner(fn, key_selector=lambda r: r[0], clock=clock, state_backend=backend)
    runner.process(("a", 0, 1))  # window [100, 120): first fire at 102 - 102 % 6 + 6... 108
    clock.t = 105
    runner.process(("a", 0, 2))
    assert runner.advance_processing_time(107) == []
    assert runner.advance_processing_time(108) == [("a", 100, 120, (2, 3))]
    runner.process(("a", 0, 4))
    # 114, then min(120, 119) = 119 (the window's end, also its cleanup)
    out = runner.advance_processing_time(200)
    assert out == [("a", 100, 120, (3, 7))] * 2
    assert all(op.keyed_backend.num_entries() == 0 for op in runner.subtasks)
    assert all(op.num_timers() == 0 for op in runner.subtasks)


def test_continuous_processing_time_trigger_on_an_event_time_window_fires_once_at_the_end():
    """The timer at the window's max timestamp fires without registering another (Flink 2.3),
    although the watermark has not closed the window."""
    clock = FakeClock(0)
    fn = (
        window(TumblingEventTimeWindows.of(10))
        .trigger(ContinuousProcessingTimeTrigger.of(4))
        .process(Describe())
    )
    runner = LocalRunner(
        fn, key_selector=lambda r: r[0], timestamp_assigner=lambda r: r[1], clock=clock
    )
    runner.process(("a", 3, 1))
    out = runner.advance_processing_time(50)  # 4, 8, 9
    assert len(out) == 3


def test_continuous_processing_time_trigger_merges_sessions():
    clock = FakeClock(0)
    fn = (
        window(ProcessingTimeSessionWindows.with_gap(10))
        .trigger(ContinuousProcessingTimeTrigger.of(5))
        .process(Describe())
    )
    runner = LocalRunner(fn, key_selector=lambda r: r[0], clock=clock)
    runner.process(("a", 0, 1))  # [0, 10), fire time 5
    clock.t = 3
    runner.process(("a", 0, 2))  # merged into [0, 13), fire time stays 5
    assert [o[1:3] for o in runner.advance_processing_time(5)] == [(0, 13)]
    out = runner.advance_processing_time(100)  # 10, 12 (end)
    assert [o[1:3] for o in out] == [(0, 13), (0, 13)]
    assert all(op.num_timers() == 0 for op in runner.subtasks)


# ---- delta trigger ------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
@hyp
@given(
    records=records_strategy,
    threshold=st.sampled_from([0, 2, 5]),
    keep=st.sampled_from([None, 2]),
    parallelism=st.sampled_from([1, 2]),
)
def test_delta_trigger_matches_the_oracle(backend, records, threshold, keep, parallelism):
    def delta(old, new):
        return abs(old[2] - new[2])

    ws = window(GlobalWindows.create()).trigger(
        DeltaTrigger.of(threshold, delta, tuple[str, int, int])
    )
    if keep is not None:
        ws = ws.evictor(CountEvictor.of(keep))
    runner = LocalRunner(
        ws.process(Describe()),
        key_selector=lambda r: r[0],
        parallelism=parallelism,
        state_backend=backend,
    )
    out = runner.run(records)
    runner.close()
    # oracle: per key the elements so far and the element of the last firing
    lists: dict = {}
    last: dict = {}
    fired = Counter()
    for r in records:
        els = lists.setdefault(r[0], [])
        els.append(r)
        if r[0] not in last:
            last[r[0]] = r
        elif delta(last[r[0]], r) > threshold:
            last[r[0]] = r
            if keep is not None and len(els) > keep:
                del els[: len(els) - keep]
            fired[(r[0], tuple(sorted(els)))] += 1
    assert Counter((o[0], o[3]) for o in out) == fired


def test_delta_trigger_needs_a_state_type_and_refuses_merging():
    with pytest.raises(ValueError, match="last-element"):
        DeltaTrigger.of(1, lambda a, b: 0, None)
    with pytest.raises(ValueError, match="merges windows"):
        window(EventTimeSessionWindows.with_gap(3)).trigger(
            DeltaTrigger.of(1, lambda a, b: 0, int)
        ).reduce(lambda a, b: a)


# ---- window stagger -----------------------------------------------------------------------------


def test_window_stagger_offsets_as_flink():
    assert WindowStagger.ALIGNED.get_stagger_offset(500, 5000) == 0
    assert WindowStagger.NATURAL.get_stagger_offset(5500, 5000) == 500
    assert WindowStagger.NATURAL.get_stagger_offset(-4500, 5000) == 500
    draws = {WindowStagger.RANDOM.get_stagger_offset(0, 5000) for _ in range(200)}
    assert all(0 <= d < 5000 for d in draws) and len(draws) > 100


class _Clock:
    def __init__(self, t):
        self.t = t

    def get_current_processing_time(self):
        return self.t


def test_stagger_is_chosen_once_per_assigner_copy():
    natural = TumblingProcessingTimeWindows.of(100, 0, WindowStagger.NATURAL)
    assert natural.assign_windows(None, None, _Clock(1234))[0].start == 1234
    # later elements keep the offset chosen at the first: windows [1234 + k*100, ...)
    assert natural.assign_windows(None, None, _Clock(1500))[0].start == 1434
    offset = TumblingProcessingTimeWindows.of(100, 10, WindowStagger.NATURAL)
    assert offset.assign_windows(None, None, _Clock(1234))[0].start == 1244 - 100
    rnd = TumblingProcessingTimeWindows.of(100, 0, WindowStagger.RANDOM)
    first = rnd.assign_windows(None, None, _Clock(1000))[0]
    assert all(
        rnd.assign_windows(None, None, _Clock(t))[0].start % 100 == first.start % 100
        for t in range(1000, 1400, 7)
    )
    aligned = TumblingProcessingTimeWindows.of(100)
    assert aligned.assign_windows(None, None, _Clock(1234))[0].start == 1200


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_natural_stagger_per_subtask_against_the_oracle(backend):
    """Each subtask's windows start at the processing time of its first element."""
    clock = FakeClock(0)
    fn = window(TumblingProcessingTimeWindows.of(10, 0, WindowStagger.NATURAL)).aggregate(
        CountAndSum(), Describe(single=True)
    )
    runner = LocalRunner(
        fn, key_selector=lambda r: r[0], parallelism=2, clock=clock, state_backend=backend
    )
    keys = ["a", "b", "c", "d", "e", "f"]
    first_seen: dict[int, int] = {}
    expected_out = Counter()
    for t, key in enumerate(keys * 3):
        clock.t = 3 * t + 1
        sub = runner.subtask_for_key(key)
        first = first_seen.setdefault(sub, clock.t)
        offset = first % 10
        start = clock.t - (clock.t - offset) % 10
        expected_out[(key, start, start + 10)] += 1
        runner.process((key, 0, 1))
    out = runner.advance_processing_time(10_000)
    got = Counter()
    for key, start, end, (count, _) in out:
        got[(key, start, end)] += count
    assert got == expected_out
    assert len({v % 10 for v in first_seen.values()}) > 1  # the subtasks are staggered
