"""Pre-aggregation on Spark (SPEC §13.2).

* Spark SQL's fold of a built-in aggregate gives the rows the Python fold gives (which the
  tests of ``tests/windows/test_pre_aggregation.py`` hold against the per-record path): the
  same windows for edge timestamps (negative ones, microseconds before 1970, offsets, sliding
  windows with overlaps and gaps), the same late and windowless elements under a watermark, the
  same accumulators (nulls and NaN included).
* End to end: a streaming query pre-aggregated in Spark SQL and one in Python emit what the
  per-record query emits, late side output and dropped counts included, across a restart that
  rescales; a batch-mode job too.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamstate import AggregateFunction, OutputTag
from streamstate.api import aggregates as agg
from streamstate.spark import MemorySink, keyed_process
from streamstate.spark.driver.plan.pre_aggregation import _sql_fold, plan_pre_aggregation
from streamstate.spark.partial_fold import PartialFold
from streamstate.spark.partials import (
    ACCUMULATOR,
    COUNT,
    KIND,
    MAX_TS,
    MIN_TS,
    RECORDS,
    WINDOW,
    element_serializer,
    partial_schema,
    sql_accumulator,
)
from streamstate.windows import (
    ProcessWindowFunction,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    window,
)
from streamstate.windows.partial import LATE as LATE_KIND
from streamstate.windows.partial import PARTIAL

pytestmark = pytest.mark.spark

LATE = OutputTag("late")


def _normal(value: Any) -> Any:
    """Accumulators compared by value (NaN equal to NaN)."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if hasattr(value, "__struct_fields__"):
        return tuple(_normal(getattr(value, f)) for f in value.__struct_fields__)
    return value


def _groups(rows: list[dict[str, Any]], accumulators: list[Any]) -> Counter:
    return Counter(
        (
            r["k"],
            r[KIND],
            r[WINDOW],
            r[COUNT],
            r[RECORDS],
            r[MIN_TS],
            r[MAX_TS],
            _normal(acc) if r[KIND] == PARTIAL else None,
            # a late element's columns (with a late side output)
            (_normal(r.get("ts")), _normal(r.get("v"))) if r[KIND] == LATE_KIND else None,
        )
        for r, acc in zip(rows, accumulators, strict=True)
    )


RECORDS_ = [
    ("a", -1, 1.0),
    ("a", 0, None),
    ("a", -10, 2.5),
    ("b", -11, float("nan")),
    ("b", 9, 7.0),
    ("a", 10, 3.0),
    ("b", 23, -1.0),
    ("a", 24, None),
    ("c", -25, 4.0),
    ("c", 99, 5.0),
    ("a", 57, 6.0),
    ("b", 58, 1.5),
]


ALL = ("count", "count_v", "sum", "min", "max", "avg")


@pytest.mark.parametrize(
    ("assigner", "aggregates", "late_output"),
    [
        (TumblingEventTimeWindows.of(10, -3), ALL, False),
        (TumblingEventTimeWindows.of(7, 2), ("count", "max"), True),
        (SlidingEventTimeWindows.of(10, 4, 1), ("sum", "avg"), False),
        (SlidingEventTimeWindows.of(10, 4, 1), ("count_v",), True),
        # gaps: some elements are in no window
        (SlidingEventTimeWindows.of(4, 10, -2), ("count", "min"), False),
        (SlidingEventTimeWindows.of(4, 10, -2), ("count",), True),
    ],
)
def test_spark_sqls_fold_equals_the_python_fold(
    spark: Any, assigner: Any, aggregates: tuple[str, ...], late_output: bool
) -> None:
    """Without a late side output Spark SQL's fold leaves lateness to the subtask (the Python
    fold does so without a watermark); with one it decides it under the watermark."""
    table = pa.table(
        {
            "k": [r[0] for r in RECORDS_],
            "ts": pa.array([r[1] for r in RECORDS_], pa.int64()),
            "v": pa.array([r[2] for r in RECORDS_], pa.float64()),
        }
    )
    base = spark.createDataFrame(table)
    # timestamps with microseconds, floored to ms (before 1970 too)
    micros = base.selectExpr("k", "timestamp_micros(ts * 1000 + 999) AS ts", "v")
    watermark = 15
    for df in (base, micros):
        arrow = df.toArrow()
        built = {
            "count": agg.count(),
            "count_v": agg.count("v"),
            "sum": agg.sum("v"),
            "min": agg.min("v"),
            "max": agg.max("v"),
            "avg": agg.avg("v"),
        }
        for aggregate in (built[a] for a in aggregates):
            ws = window(assigner).allowed_lateness(4)
            if late_output:
                ws = ws.side_output_late_data(LATE)
            fn = ws.aggregate(aggregate)
            _, plan = plan_pre_aggregation(
                df, fn, True, key_columns=["k"], event_time="ts", streaming=True
            )
            assert plan is not None and plan.mode == "sql"
            fold = PartialFold(
                fn,
                plan.pre,
                key_columns=["k"],
                value_columns=["k", "ts", "v"],
                event_time="ts",
                watermark=watermark if late_output else None,
                output_schema=partial_schema(arrow.schema, ["k"], ["k", "ts", "v"], late_output),
                max_parallelism=128,
            )
            for batch in arrow.to_batches():
                fold.add(batch)
            python = [r for b in fold.batches() for r in b.to_pylist()]
            decode = element_serializer(fn).deserialize
            expected = _groups(
                python, [None if r[ACCUMULATOR] is None else decode(r[ACCUMULATOR]) for r in python]
            )
            got = _sql_fold(df, plan, watermark).toArrow().to_pylist()
            n = len(aggregate.partials())
            found = _groups(
                got,
                [
                    aggregate.accumulator_from_partials(
                        tuple(r[sql_accumulator(i)] for i in range(n))
                    )
                    for r in got
                ],
            )
            assert found == expected, (aggregate, df.schema)
            if late_output:
                assert any(r[KIND] == LATE_KIND for r in got)


def test_sql_windows_are_the_assigners_on_edge_values(spark: Any) -> None:
    """A direct look at the windows Spark SQL assigns: Flink's start with offset for negative
    timestamps, as the Python assigner."""
    stamps = [-21, -20, -11, -10, -9, -1, 0, 1, 9, 10, 19, 20]
    longs = spark.createDataFrame([("k", t, 1.0) for t in stamps], "k string, ts long, v double")
    # timestamps 1 µs before each millisecond: the event time is the millisecond below
    stamps_ms = [t - 1 for t in stamps]
    timestamps = longs.selectExpr("k", "timestamp_micros(ts * 1000 - 999) AS ts", "v")
    for assigner in (TumblingEventTimeWindows.of(10, 3), SlidingEventTimeWindows.of(10, 5, -2)):
        fn = window(assigner).aggregate(agg.count())
        for df, ms in ((longs, stamps), (timestamps, stamps_ms)):
            _, plan = plan_pre_aggregation(
                df, fn, True, key_columns=["k"], event_time="ts", streaming=True
            )
            got: Counter = Counter()
            for r in _sql_fold(df, plan, None).collect():
                got[r[WINDOW]] += r[COUNT]
            expected = Counter(w.start for t in ms for w in assigner.assign_windows(None, t, None))
            assert got == expected, (assigner, df.schema)


# ---- end to end ----------------------------------------------------------------------------

SIZE, LATENESS = 10, 0
# micro-batch b's watermark is the largest event time of the batches before it, minus 1
BATCHES = [
    [("a", 1, 1), ("b", 3, 2), ("a", 12, 3), ("b", 30, 4), ("c", -7, 5)],
    [("a", 4, 6), ("a", 25, 7), ("b", 31, 8), ("a", 60, 9), ("c", 33, 1)],  # a@4, c: late
    [("b", 2, 2), ("a", 49, 3), ("b", 44, 4), ("a", 61, 5), ("b", 90, 6)],
    [("a", 85, 7), ("b", 89, 8), ("a", 50, 9), ("c", 95, 1), ("a", 200, 2)],
    [("b", 300, 3), ("a", 301, 4)],
]


class PerWindow(ProcessWindowFunction):
    def process(self, key, context, elements):
        (result,) = elements
        yield key, context.window().start, result


def _write(directory: str, batches: list[list[Any]], first: int = 0) -> None:
    os.makedirs(directory, exist_ok=True)
    for i, rows in enumerate(batches, start=first):
        path = os.path.join(directory, f"part-{i:04d}.parquet")
        table = pa.table(
            {
                "k": [r[0] for r in rows],
                "ts": pa.array([r[1] for r in rows], pa.int64()),
                "v": pa.array([r[2] for r in rows], pa.int64()),
            }
        )
        pq.write_table(table, path)
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))  # the source orders by mtime


def _tuples(sink: MemorySink) -> list[tuple[Any, ...]]:
    return [tuple(r.values()) for r in sink.rows()]


def _query(spark: Any, data: str, ck: str, aggregate: Any, pre: Any, p: int) -> Any:
    fn = (
        window(TumblingEventTimeWindows.of(SIZE, -2))
        .allowed_lateness(LATENESS)
        .side_output_late_data(LATE)
        .aggregate(aggregate, PerWindow())
    )
    src = (
        spark.readStream.schema("k string, ts long, v long")
        .option("maxFilesPerTrigger", 1)
        .parquet(data)
    )
    main, late = MemorySink(), MemorySink()
    query = keyed_process(
        src,
        key="k",
        function=fn,
        output_schema="k string, start long, result long",
        event_time="ts",
        watermark_delay=0,
        checkpoint=ck,
        parallelism=p,
        pre_aggregate=pre,
        side_outputs={LATE: "k string, ts long, v long"},
    ).write_stream(main, trigger={"availableNow": True}, side_sinks={LATE: late})
    query.await_termination()
    return query, main, late


def test_streaming_pre_aggregated_equals_per_record_across_a_rescale(
    spark: Any, tmp_path: Any, monkeypatch: Any
) -> None:
    """The built-in count folded by Spark SQL, its rows delivered to the hosts by the driver
    (a local master); a Python aggregate folded in Python, its rows shuffled to tasks that
    stream them to the hosts (what a cluster does); per record."""
    from streamstate.demo.job import CountViews
    from streamstate.spark.driver.query.streaming import KeyedStreamingQuery

    delivery_jvm = KeyedStreamingQuery._delivery_jvm

    def tasks_deliver_python_folds(self: Any) -> Any:
        pre = self.options.pre_aggregation
        folded_in_python = pre is not None and pre.mode == "python"
        return None if folded_in_python else delivery_jvm(self)

    monkeypatch.setattr(KeyedStreamingQuery, "_delivery_jvm", tasks_deliver_python_folds)

    data = str(tmp_path / "in")
    _write(data, BATCHES[:3])
    runs = {
        "sql": (agg.count(), None),
        "python": (CountViews(), None),
        "per-record": (CountViews(), False),
    }
    seen = {}
    for name, (aggregate, pre) in runs.items():
        ck = str(tmp_path / f"ck-{name}")
        q1, main1, late1 = _query(spark, data, ck, aggregate, pre, 2)
        assert q1.job.pre_aggregation == ("" if name == "per-record" else name)
        seen[name] = [q1.batches, _tuples(main1), _tuples(late1)]
    # more input, and the queries restart at parallelism 3 (rescaled by key group)
    _write(data, BATCHES[3:], first=3)
    for name, (aggregate, pre) in runs.items():
        ck = str(tmp_path / f"ck-{name}")
        q2, main2, late2 = _query(spark, data, ck, aggregate, pre, 3)
        seen[name] += [q2.batches, _tuples(main2), _tuples(late2)]
    base = seen["per-record"]
    assert Counter(base[1] + base[4]), "the per-record run emitted windows"
    assert Counter(base[2] + base[5]), "and late elements"
    for name in ("sql", "python"):
        got = seen[name]
        assert Counter(got[1] + got[4]) == Counter(base[1] + base[4]), name
        assert Counter(got[2] + got[5]) == Counter(base[2] + base[5]), name
        for key in ("rows", "late_records_dropped"):
            assert [b[key] for b in got[0] + got[3]] == [b[key] for b in base[0] + base[3]]
        assert all(b["partials"] <= b["rows"] for b in got[0] + got[3])
        by_driver = name == "sql"
        assert all(("deliver_ms" in b) == by_driver for b in got[0] + got[3]), name


class SumV(AggregateFunction):
    """The built-in sum of ``v`` as a Python aggregate (folded by the Python fold)."""

    def create_accumulator(self):
        return 0

    def add(self, value, accumulator):
        return accumulator + value[2]

    def get_result(self, accumulator):
        return accumulator

    def merge(self, acc_a, acc_b):
        return acc_a + acc_b


def test_batch_mode_pre_aggregated_equals_per_record(spark: Any) -> None:
    rows = [r for batch in BATCHES for r in batch]
    df = spark.createDataFrame(rows, "k string, ts long, v long")
    outs = {}
    for name, aggregate, pre in (
        ("sql", agg.sum("v"), None),
        ("python", SumV(), None),
        ("per-record", SumV(), False),
    ):
        fn = window(SlidingEventTimeWindows.of(10, 5)).aggregate(aggregate, PerWindow())
        out = keyed_process(
            df,
            key="k",
            function=fn,
            output_schema="k string, start long, result long",
            event_time="ts",
            parallelism=2,
            pre_aggregate=pre,
        )
        outs[name] = Counter(tuple(r) for r in out.collect())
    assert outs["sql"] == outs["per-record"] == outs["python"]
    assert len(outs["sql"]) > 10


def test_string_key_groups_in_sql_equal_the_runtimes(spark: Any) -> None:
    """A string key's group is computed in Spark SQL (``String.hashCode`` through ``reflect``,
    then Spark's Murmur3Hash): the pre-aggregated rows and the per-record path place strings
    without a Python pass."""
    from streamstate.keygroups import assign_key_groups_for_columns
    from streamstate.spark.driver.plan import placement

    keys = ["", "a", "hello", "é", "\U0001f600", "app-123", "ß" * 40, "x" * 1000]
    df = spark.createDataFrame([(k,) for k in keys], "k string")
    placed = placement.place(df, ["k"], 3, 128)
    plan = placed._jdf.queryExecution().analyzed().toString()
    assert placement.JAVA_OBJECTS_CLASS in plan and "PythonMapInArrow" not in plan
    # the murmur mix of the hash code: Spark's own expression, not a second reflect
    assert placement.MURMUR3_CLASS not in plan and "hash(" in plan
    expected = dict(
        zip(keys, assign_key_groups_for_columns([pa.array(keys)], 128).tolist(), strict=True)
    )
    for i, rows in enumerate(placed.rdd.glom().collect()):
        for r in rows:
            assert r[placement.KEY_GROUP_COLUMN] == expected[r.k]
            assert r[placement.KEY_GROUP_COLUMN] * 3 // 128 == i
