"""Pre-aggregated window aggregates against the per-record path (SPEC §13.2), without Spark.

Random window jobs (tumbling and sliding windows with offsets, gaps and negative timestamps,
out-of-order input, late data within and beyond the allowed lateness, a late side output or
not, aggregate, built-in aggregates and reduce) run micro-batch by micro-batch through the state
host's code (``SubtaskRuntime``) twice: every record shuffled and processed, and folded per
(key, window) by the pre-shuffle stage's Python fold over random map partitions. On the heap and
RocksDB backends, at parallelism 1 and 3, with the state reloaded from a checkpoint or rescaled
in the middle:

* where pre-aggregation is on by default, every micro-batch emits the same outputs (as a
  multiset), the same late elements, drops and counts the same, and reports the same records
  and latest event time;
* where it is opt-in (allowed lateness, ``ContinuousEventTimeTrigger``), the last firing of
  every window is the same (with a purging trigger: the sum over its firings);
* in batch mode, the outputs are the same.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from micro_batches import MicroBatches

from streamstate import AggregateFunction, OutputTag, ValueStateDescriptor
from streamstate.api import aggregates as agg
from streamstate.errors import PreAggregationError
from streamstate.windows import (
    ContinuousEventTimeTrigger,
    CountTrigger,
    EventTimeSessionWindows,
    EventTimeTrigger,
    ProcessingTimeTrigger,
    ProcessWindowFunction,
    PurgingTrigger,
    SlidingEventTimeWindows,
    TimeEvictor,
    TumblingEventTimeWindows,
    window,
)
from streamstate.windows.pre_aggregation import choose_pre_aggregation, pre_aggregation_of

LATE = OutputTag("late")
FLUSH = 1_000_000  # a timestamp beyond every window of the tests


class CountAndSum(AggregateFunction):
    def create_accumulator(self):
        return (0, 0)

    def add(self, value, accumulator):
        return (accumulator[0] + 1, accumulator[1] + value[2])

    def get_result(self, accumulator):
        return accumulator

    def merge(self, acc_a, acc_b):
        return (acc_a[0] + acc_b[0], acc_a[1] + acc_b[1])


class Describe(ProcessWindowFunction):
    """(key, start, end, result, firing number) as strings; the firing number is per-window
    state, cleared with the window."""

    FIRINGS = ValueStateDescriptor("firings", int, default=0)

    def __init__(self, pick: Any = None) -> None:
        self.pick = pick

    def process(self, key, context, elements):
        (result,) = elements
        if self.pick is not None:
            result = self.pick(result)
        firings = context.window_state().get_state(self.FIRINGS)
        firings.update(firings.value() + 1)
        w = context.window()
        yield (key, str(w.start), str(w.end), str(result), str(firings.value()))

    def clear(self, context):
        context.window_state().get_state(self.FIRINGS).clear()


def _third(r: Any) -> Any:
    return r[2]


def _reduce(a: Any, b: Any) -> Any:
    return (a[0], a[1] if a[1] >= b[1] else b[1], a[2] + b[2])


CONTENTS = ["aggregate", "count", "count_v", "sum", "min", "max", "avg", "reduce"]


def build(assigner: Any, trigger: Any, lateness: int, late: bool, contents: str) -> Any:
    ws = window(assigner).allowed_lateness(lateness)
    if trigger is not None:
        ws = ws.trigger(trigger)
    if late:
        ws = ws.side_output_late_data(LATE)
    if contents == "reduce":
        return ws.reduce(_reduce, Describe(_third), element_type=tuple[str, int, int])
    aggregates = {
        "aggregate": CountAndSum(),
        "count": agg.count(),
        "count_v": agg.count("v"),
        "sum": agg.sum("v"),
        "min": agg.min("v"),
        "max": agg.max("v"),
        "avg": agg.avg("v"),
    }
    return ws.aggregate(aggregates[contents], Describe())


records_strategy = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.integers(-60, 150), st.integers(1, 9)),
    min_size=1,
    max_size=50,
)
assigners = st.one_of(
    st.builds(TumblingEventTimeWindows.of, st.sampled_from([5, 10, 17]), st.integers(-4, 4)),
    st.sampled_from([(10, 5, 0), (12, 4, 3), (6, 6, -2), (5, 10, 1), (10, 3, -1)]).map(
        lambda s: SlidingEventTimeWindows.of(*s)
    ),
)
jobs = dict(
    assigner=assigners,
    records=records_strategy,
    cuts=st.lists(st.integers(0, 50), max_size=5),
    contents=st.sampled_from(CONTENTS),
    late=st.booleans(),
    delay=st.sampled_from([0, 4, 30]),
    parallelism=st.sampled_from([1, 3]),
    backend=st.sampled_from(["heap", "rocksdb"]),
    event=st.sampled_from(["none", "reload", "rescale"]),
    seed=st.integers(0, 1000),
)
hyp = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def _batches(records: list[Any], cuts: list[int]) -> list[list[Any]]:
    bounds = sorted({c for c in cuts if 0 < c < len(records)})
    return [records[a:b] for a, b in zip([0, *bounds], [*bounds, len(records)], strict=True)]


def _run(
    tmp: Any,
    name: str,
    fn: Any,
    pre: Any,
    batches: list[list[Any]],
    parallelism: int,
    backend: str,
    delay: int,
    late: bool,
    event: str,
    seed: int,
) -> list[dict[str, Any]]:
    job = MicroBatches(
        fn,
        pre,
        str(tmp / name),
        parallelism=parallelism,
        backend=backend,
        delay=delay,
        late_tag=LATE.tag_id if late else None,
        seed=seed,
        # as Spark SQL's fold without a late side output: the subtask decides lateness
        defer_lateness=not late and seed % 2 == 0,
    )
    out = []
    try:
        middle = len(batches) // 2
        for i, batch in enumerate(batches):
            if i == middle and event == "reload":
                job.reload()
            elif i == middle and event == "rescale":
                job.rescale(4 - parallelism)
            out.append(job.run(batch, processing_time=1000 + i))
    finally:
        job.close()
    return out


def _comparable(result: dict[str, Any]) -> dict[str, Any]:
    return {**result, "outputs": Counter(result["outputs"]), "late": Counter(result["late"])}


@hyp
@given(**jobs)
def test_pre_aggregated_batches_equal_the_per_record_ones(
    tmp_path_factory: Any,
    assigner: Any,
    records: list[Any],
    cuts: list[int],
    contents: str,
    late: bool,
    delay: int,
    parallelism: int,
    backend: str,
    event: str,
    seed: int,
) -> None:
    """No allowed lateness, the default trigger (or a processing-time one, which never looks at
    elements either): pre-aggregation is on by default, and every micro-batch is the same."""
    tmp = tmp_path_factory.mktemp("pre")
    trigger = ProcessingTimeTrigger.create() if seed % 5 == 0 else None
    fn = build(assigner, trigger, 0, late, contents)
    pre = choose_pre_aggregation(fn, None)
    assert pre is not None and pre.exact
    batches = [*_batches(records, cuts), [("z", FLUSH, 0)], [("z", FLUSH + 1, 0)]]
    args = (batches, parallelism, backend, delay, late, event, seed)
    per_record = _run(tmp, "records", fn, None, *args)
    folded = _run(tmp, "folded", fn, pre, *args)
    assert [_comparable(r) for r in folded] == [_comparable(r) for r in per_record]
    # what the last batch fired holds every window of the input
    assert sum(r["records"] for r in per_record) == len(records) + 2


def _last_firings(results: list[dict[str, Any]], purging: bool) -> dict[Any, Any]:
    last: dict[Any, Any] = {}
    for r in results:
        for key, start, end, result, _ in r["outputs"]:
            if purging:
                n, total = last.get((key, start, end), (0, 0))
                got = eval(result)  # (count, sum) of CountAndSum
                last[(key, start, end)] = (n + got[0], total + got[1])
            else:
                last[(key, start, end)] = result
    return last


@pytest.mark.slow
@hyp
@given(
    lateness=st.sampled_from([3, 25]),
    trigger=st.sampled_from(["event", "continuous", "purging"]),
    **jobs,
)
def test_opt_in_pre_aggregation_gives_the_same_final_window_results(
    tmp_path_factory: Any,
    lateness: int,
    trigger: str,
    assigner: Any,
    records: list[Any],
    cuts: list[int],
    contents: str,
    late: bool,
    delay: int,
    parallelism: int,
    backend: str,
    event: str,
    seed: int,
) -> None:
    """Allowed lateness (late firings: one per window per micro-batch) and the continuous
    event-time trigger (its first fire time): opt-in; the last firing of every window is the
    same, and so are late data and counts."""
    tmp = tmp_path_factory.mktemp("opt")
    triggers = {
        "event": EventTimeTrigger.create(),
        "continuous": ContinuousEventTimeTrigger.of(7),
        "purging": PurgingTrigger.of(EventTimeTrigger.create()),
    }
    purging = trigger == "purging"
    if purging:
        contents = "aggregate"
    fn = build(assigner, triggers[trigger], lateness, late, contents)
    assert choose_pre_aggregation(fn, None) is None  # not by default
    pre = choose_pre_aggregation(fn, True)
    assert pre is not None and not pre.exact and pre.differs
    batches = [*_batches(records, cuts), [("z", FLUSH, 0)], [("z", FLUSH + 1, 0)]]
    args = (batches, parallelism, backend, delay, late, event, seed)
    per_record = _run(tmp, "records", fn, None, *args)
    folded = _run(tmp, "folded", fn, pre, *args)
    assert _last_firings(folded, purging) == _last_firings(per_record, purging)
    for a, b in zip(folded, per_record, strict=True):
        assert Counter(a["late"]) == Counter(b["late"])
        assert (a["dropped"], a["records"], a["max_event_time"]) == (
            b["dropped"],
            b["records"],
            b["max_event_time"],
        )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    assigner=assigners,
    records=records_strategy,
    contents=st.sampled_from(CONTENTS),
    lateness=st.sampled_from([0, 25]),
    parallelism=st.sampled_from([1, 3]),
    seed=st.integers(0, 1000),
)
def test_batch_mode_pre_aggregation_equals_the_per_record_outputs(
    tmp_path_factory: Any,
    assigner: Any,
    records: list[Any],
    contents: str,
    lateness: int,
    parallelism: int,
    seed: int,
) -> None:
    """A bounded input: nothing is behind the watermark until the end, so even allowed lateness
    gives the per-record outputs (pre-aggregation on by default)."""
    tmp = tmp_path_factory.mktemp("bounded")
    fn = build(assigner, None, lateness, False, contents)
    pre = choose_pre_aggregation(fn, None, bounded=True)
    assert pre is not None and pre.exact
    outs = []
    for name, p in (("records", None), ("folded", pre)):
        job = MicroBatches(
            fn, p, str(tmp / name), parallelism=parallelism, backend="heap", delay=0, seed=seed
        )
        try:
            outs.append(Counter(job.bounded(records)))
        finally:
            job.close()
    assert outs[0] == outs[1]


# ---- where pre-aggregation does not apply ----------------------------------------------------


@pytest.mark.parametrize(
    ("fn", "reason"),
    [
        (
            window(TumblingEventTimeWindows.of(10))
            .evictor(TimeEvictor.of(5))
            .aggregate(CountAndSum()),
            "evictor",
        ),
        (
            window(TumblingEventTimeWindows.of(10))
            .trigger(CountTrigger.of(2))
            .aggregate(CountAndSum()),
            "may look at each element",
        ),
        (window(TumblingEventTimeWindows.of(10)).process(Describe()), r"process\(\) and apply\(\)"),
        (window(EventTimeSessionWindows.with_gap(10)).aggregate(CountAndSum()), "merges windows"),
    ],
)
def test_pre_aggregation_is_refused_with_its_reason(fn: Any, reason: str) -> None:
    assert choose_pre_aggregation(fn, None) is None
    assert choose_pre_aggregation(fn, False) is None
    with pytest.raises(PreAggregationError, match=reason):
        choose_pre_aggregation(fn, True)


def test_what_is_exact_and_what_is_opt_in() -> None:
    tumbling = window(TumblingEventTimeWindows.of(10))
    assert pre_aggregation_of(tumbling.aggregate(agg.count())).exact
    assert pre_aggregation_of(
        tumbling.trigger(ProcessingTimeTrigger.create()).reduce(_reduce)
    ).exact
    late = window(TumblingEventTimeWindows.of(10)).allowed_lateness(5).aggregate(agg.count())
    assert not pre_aggregation_of(late).exact
    assert "allowed lateness" in pre_aggregation_of(late).differs
    assert pre_aggregation_of(late, bounded=True).exact
    continuous = (
        window(TumblingEventTimeWindows.of(10))
        .trigger(ContinuousEventTimeTrigger.of(3))
        .aggregate(agg.count())
    )
    assert "first fire time" in pre_aggregation_of(continuous, bounded=True).differs
