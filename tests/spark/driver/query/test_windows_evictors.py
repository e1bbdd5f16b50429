"""Evicting windows, continuous and end-of-stream triggers in Spark batch mode, against the
brute-force window oracle and the LocalRunner, on the heap and RocksDB backends."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from streamstate import LocalRunner
from streamstate.spark import keyed_process
from streamstate.windows import (
    ContinuousEventTimeTrigger,
    GlobalWindows,
    ProcessWindowFunction,
    SlidingEventTimeWindows,
    TimeEvictor,
    TumblingEventTimeWindows,
    window,
)
from support.window_oracle import ContinuousOracle, EvictingOracle

pytestmark = pytest.mark.spark

#: Spark hands the function Rows; window elements are kept as plain tuples
ELEMENT = tuple[str, int, int]
SCHEMA = "k string, start long, end long, n long, total long"


class CountAndTotal(ProcessWindowFunction):
    def process(self, key, context, elements):
        w = context.window()
        items = list(elements)
        yield (key, w.start, w.end, len(items), sum(e[2] for e in items))


def _events(n: int, seed: int) -> list[tuple[str, int, int]]:
    rnd = random.Random(seed)
    return [(rnd.choice("abcde"), rnd.randrange(0, 400), rnd.randrange(1, 10)) for _ in range(n)]


def _spark_rows(
    spark: Any, fn: Any, events: list, backend: str, execution_mode: str = "automatic"
) -> Counter:
    df = spark.createDataFrame(events, "k string, ts long, v long")
    out = keyed_process(
        df,
        key="k",
        function=fn,
        output_schema=SCHEMA,
        event_time="ts",
        parallelism=2,
        state_backend=backend,
        execution_mode=execution_mode,
    )
    return Counter(tuple(r) for r in out.collect())


def _expected(fired: list) -> Counter:
    return Counter((key, w.start, w.end, len(els), sum(e[2] for e in els)) for key, w, els in fired)


def test_time_evictor_in_batch_mode_matches_the_oracle(spark: Any) -> None:
    """Also: the user's window function, defined in a module the executors cannot import,
    travels by value inside the window operator."""
    events = _events(500, 7)
    assigner = SlidingEventTimeWindows.of(40, 20)

    def keep_recent(els):
        newest = max(e[1] for e in els)
        return [e for e in els if e[1] > newest - 15]

    # batch mode: no watermark until the input ends, so nothing is late
    oracle = EvictingOracle(0, 10**9, None, keep_recent, after=False)
    for e in events:
        oracle.process(e, e[0], e[1], lambda ts: assigner.assign_windows(None, ts, None))
    oracle.advance((1 << 63) - 1)
    fn = window(assigner).evictor(TimeEvictor.of(15)).process(CountAndTotal(), ELEMENT)
    assert _spark_rows(spark, fn, events, "heap") == _expected(oracle.fired)
    local = LocalRunner(
        window(assigner).evictor(TimeEvictor.of(15)).process(CountAndTotal()),
        key_selector=lambda e: e[0],
        parallelism=2,
        timestamp_assigner=lambda e: e[1],
    )
    assert Counter(local.run(events)) == _expected(oracle.fired)


def test_continuous_trigger_in_batch_mode_matches_the_oracle(spark: Any) -> None:
    events = _events(300, 11)
    assigner = TumblingEventTimeWindows.of(100)
    oracle = ContinuousOracle(0, 10**9, 30)
    for e in events:
        oracle.process(e, e[0], e[1], lambda ts: assigner.assign_windows(None, ts, None))
    oracle.advance((1 << 63) - 1)
    fn = (
        window(assigner)
        .trigger(ContinuousEventTimeTrigger.of(30))
        .process(CountAndTotal(), ELEMENT)
    )
    # streaming execution: the watermark jumps to the end of time when the input ends, and the
    # fire times the trigger registers from its timers are due at once
    got = _spark_rows(spark, fn, events, "rocksdb", execution_mode="streaming")
    assert got == _expected(oracle.fired)
    assert max(got.values()) > 1  # each window fired at 30, 60, 90 and its end: 4 times
    # batch execution (the default), as Flink's BATCH mode: a key's timers fire when its
    # records end, and the next fire time the trigger registers from its timer is ignored
    # (quiesced timer service): a window fires at the fire time its first element registered
    # and at its end (once if they coincide), each time with all its elements
    windows: dict[tuple[str, int, int], list[tuple[str, int, int]]] = {}
    for e in events:
        (w,) = assigner.assign_windows(None, e[1], None)
        windows.setdefault((e[0], w.start, w.end), []).append(e)
    expected: Counter = Counter()
    for (key, start, end), els in windows.items():
        first = min(e[1] for e in els)
        fires = len({min(first - first % 30 + 30, end - 1), end - 1})
        expected[(key, start, end, len(els), sum(e[2] for e in els))] = fires
    assert _spark_rows(spark, fn, events, "rocksdb") == expected
    assert 2 in expected.values()  # twice: at the first fire time and at the end


class KeyTotals(ProcessWindowFunction):
    def process(self, key, context, elements):
        items = list(elements)
        yield (key, len(items), sum(e[2] for e in items))


def test_end_of_stream_trigger_fires_when_the_batch_input_ends(spark: Any) -> None:
    """Without event time: the end of a batch-mode job's input is the final watermark."""
    events = _events(200, 5)
    fn = window(GlobalWindows.create_with_end_of_stream_trigger()).process(KeyTotals(), ELEMENT)
    df = spark.createDataFrame(events, "k string, ts long, v long")
    out = keyed_process(
        df, key="k", function=fn, output_schema="k string, n long, total long", parallelism=2
    )
    expected = Counter()
    for k in {e[0] for e in events}:
        mine = [e for e in events if e[0] == k]
        expected[(k, len(mine), sum(e[2] for e in mine))] += 1
    assert Counter(tuple(r) for r in out.collect()) == expected
