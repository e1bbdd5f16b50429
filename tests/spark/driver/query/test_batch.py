"""Batch mode: keyed_process over a static DataFrame."""

from __future__ import annotations

from typing import Any

import pytest

from streamstate import KeyedProcessFunction, LocalRunner
from streamstate.demo import generate_events, page_views_per_hour
from streamstate.spark import FileSink, keyed_process, read_state
from support.spark_data import final_counts, make_batches, running_counts, write_batches
from support.spark_functions import BadOutput, Count, CountWithRecordLog, Sum

pytestmark = pytest.mark.spark


def test_batch_mode_equals_the_local_runner(any_spark: Any) -> None:
    spark = any_spark
    records = [(f"u{(i * 7) % 13}", i) for i in range(300)]
    df = spark.createDataFrame(records, "user string, v long")
    out = keyed_process(
        df, key="user", function=Count(), output_schema="user string, n long", parallelism=3
    )
    got = sorted(tuple(r) for r in out.collect())
    expected = sorted(LocalRunner(Count(), key_selector=lambda r: r[0], parallelism=3).run(records))
    assert got == expected

    ints = spark.createDataFrame([(i % 17, i) for i in range(200)], "k long, v long")
    sums = keyed_process(ints, key="k", function=Sum(), output_schema="k long, total long")
    by_key = {}
    for r in sums.collect():
        by_key[r.k] = max(by_key.get(r.k, 0), r.total)
    assert by_key == {k: sum(i for i in range(200) if i % 17 == k) for k in range(17)}


def test_windows_in_batch_mode_equal_the_local_runner(any_spark: Any) -> None:
    spark = any_spark
    events = list(generate_events(3_000, apps=3, hours=4))
    df = spark.createDataFrame(events, "app string, ts long")
    runner = LocalRunner(
        page_views_per_hour(),
        key_selector=lambda e: e[0],
        parallelism=2,
        timestamp_assigner=lambda e: e[1],
        watermark_delay=120_000,
    )
    expected = sorted(runner.run(events))
    # batch execution (sorted records), and automatic: the window aggregate folded before the
    # shuffle, its folded rows through the streaming operator
    for mode in ("batch", "automatic"):
        out = keyed_process(
            df,
            key="app",
            function=page_views_per_hour(),
            output_schema="app string, hour long, views long",
            event_time="ts",
            parallelism=2,
            execution_mode=mode,
        )
        assert sorted(tuple(r) for r in out.collect()) == expected, mode
    with pytest.raises(ValueError, match="choose one"):
        keyed_process(
            df,
            key="app",
            function=page_views_per_hour(),
            output_schema="app string, hour long, views long",
            event_time="ts",
            execution_mode="batch",
            pre_aggregate=True,
        )


def test_output_schema_mismatch_names_the_column(any_spark: Any) -> None:
    spark = any_spark
    df = spark.createDataFrame([("a", 1)], "user string, v long")
    out = keyed_process(df, key="user", function=BadOutput(), output_schema="user string, n long")
    with pytest.raises(Exception, match=r"output column 'n' is declared int64 .*'not a number'"):
        out.collect()


def test_savepoint_bootstraps_state_that_read_state_returns(any_spark: Any, tmp_path: Any) -> None:
    spark = any_spark
    df = spark.createDataFrame([(f"u{i % 5}", i) for i in range(50)], "user string, v long")
    savepoint = str(tmp_path / "sp")
    out = keyed_process(
        df,
        key="user",
        function=Count(),
        output_schema="user string, n long",
        parallelism=2,
        savepoint=savepoint,
    )
    assert out.count() == 50
    state = read_state(spark, savepoint, state="n")
    assert sorted((r.key, r.namespace, r.value) for r in state.collect()) == [
        (f"u{i}", None, 10) for i in range(5)
    ]


class BackendName(KeyedProcessFunction):
    """Emits ``(key, the keyed backend's name)`` once per key."""

    def bind_operator(self, context: Any) -> None:
        self.backend = context.keyed_backend.backend_name

    def process_element(self, value: Any, ctx: Any) -> Any:
        yield ctx.get_current_key(), self.backend


def test_execution_mode_is_batch_for_a_static_dataframe_unless_asked(spark: Any) -> None:
    df = spark.createDataFrame([("a", 1), ("b", 2)], "user string, v long")

    def backends(**kwargs: Any) -> set[str]:
        out = keyed_process(
            df, key="user", function=BackendName(), output_schema="user string, b string", **kwargs
        )
        return {r.b for r in out.collect()}

    assert backends() == {"batch"}
    assert backends(execution_mode="streaming", state_backend="rocksdb") == {"rocksdb"}
    with pytest.raises(ValueError, match="execution_mode must be one of"):
        backends(execution_mode="BATCH")
    with pytest.raises(ValueError, match="initial_state= needs execution_mode='streaming'"):
        backends(execution_mode="batch", initial_state="/nowhere")
    stream = spark.readStream.format("rate").load()
    with pytest.raises(ValueError, match="needs a bounded input"):
        keyed_process(
            stream,
            key="value",
            function=Count(),
            output_schema="value long, n long",
            checkpoint="/tmp/unused",
            execution_mode="batch",
        )


def test_a_batch_savepoint_bootstraps_a_streaming_query_at_another_parallelism(
    spark: Any, tmp_path: Any
) -> None:
    """Batch execution at parallelism 2 writes keyed and operator state as its keys finish; a
    streaming query on RocksDB with one subtask starts from it and continues every count, and
    its one subtask holds both batch subtasks' operator state."""
    history = make_batches(1, 500, users=40, seed=3)[0]
    later = make_batches(2, 200, users=50, seed=4)
    savepoint = str(tmp_path / "sp")
    df = spark.createDataFrame(history, "user string, v long")
    out = keyed_process(
        df,
        key="user",
        function=CountWithRecordLog(),
        output_schema="user string, n long, seen long",
        parallelism=2,
        savepoint=savepoint,
    )
    assert sorted((r.user, r.n) for r in out.collect()) == running_counts([history])
    write_batches(str(tmp_path / "in"), later)
    query = keyed_process(
        spark.readStream.schema("user string, v long")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(tmp_path / "in")),
        key="user",
        function=CountWithRecordLog(),
        output_schema="user string, n long, seen long",
        checkpoint=str(tmp_path / "ck"),
        parallelism=1,
        state_backend="rocksdb",
        initial_state=savepoint,
    ).write_stream("parquet", path=str(tmp_path / "out"), trigger={"availableNow": True})
    query.await_termination()
    assert query.batches[0]["restore"] == ["initial"]
    rows = FileSink(str(tmp_path / "out")).read_arrow().to_pylist()
    continued = set(running_counts([history, *later])) - set(running_counts([history]))
    assert sorted((r["user"], r["n"]) for r in rows) == sorted(continued)
    assert max(r["seen"] for r in rows) == len(history) + sum(len(b) for b in later)
    state = read_state(spark, str(tmp_path / "ck"), state="n").collect()
    assert {r.key: r.value for r in state} == final_counts([history, *later])


def test_a_batch_result_is_an_ordinary_dataframe(spark: Any) -> None:
    """A batch-mode result on either side of a union, in exceptAll and intersect, cached and
    read again, coalesced: its tasks take their subtask from the records, not from where Spark
    numbers their partition in the larger plan (the same task runs both execution modes and
    Spark Connect)."""
    records = [(f"u{(i * 7) % 13}", i) for i in range(300)]
    df = spark.createDataFrame(records, "user string, v long")
    out = keyed_process(df, key="user", function=Count(), output_schema="user string, n long")
    expected = sorted(LocalRunner(Count(), key_selector=lambda r: r[0], parallelism=2).run(records))
    extra = [("x", -1), ("y", -2), ("z", -3)]
    other = spark.createDataFrame(extra, "user string, n long")
    ref = spark.createDataFrame(expected[:50], "user string, n long")

    def rows(frame: Any) -> list[tuple[Any, ...]]:
        return sorted(tuple(r) for r in frame.collect())

    assert rows(other.union(out)) == sorted(extra + expected)
    assert rows(out.exceptAll(ref)) == expected[50:]
    assert rows(out.intersect(ref)) == sorted(set(expected[:50]))
    cached = out.cache()
    try:
        assert rows(cached.union(other)) == sorted(expected + extra)
        assert rows(cached) == expected
    finally:
        cached.unpersist()
    assert rows(out.coalesce(1)) == expected


def test_the_batch_sort_is_pysparks_sort_within_partitions(spark: Any) -> None:
    """The sort of batch execution is built once per JVM and handed to the JVM in one call;
    the plan is the one PySpark's ``sortWithinPartitions`` makes, with every sort column."""
    from streamstate.spark.driver.plan.placement import place
    from streamstate.spark.driver.query.batch import _sorted_within_partitions

    df = spark.createDataFrame([(3, 1, 2), (1, 2, 1), (3, 0, 1)], "k long, v long, ts long")
    placed = place(df, ["k"], 2, 128)
    for columns in (["k"], ["k", "ts"], ["_kg", "k", "ts"]):

        def plan(sorted_df: Any) -> str:
            return str(sorted_df._jdf.queryExecution().analyzed().toString())

        ours = _sorted_within_partitions(placed, columns)
        assert plan(ours) == plan(placed.sortWithinPartitions(*columns))
        assert _sorted_within_partitions(placed, columns).collect() == ours.collect()


def test_jobs_over_one_input_share_its_placement_until_its_layout_changes(spark: Any) -> None:
    """The input placed and sorted is made once per DataFrame and layout: a second job over the
    same DataFrame (another function, or the same again) reuses it; another parallelism, key,
    sort (event time) or execution mode, or another DataFrame of the same rows, makes its own;
    an entry goes with its DataFrame."""
    import gc
    import weakref

    from streamstate.spark.driver.query import batch

    rows = [(i % 11, i, i * 10) for i in range(120)]
    df = spark.createDataFrame(rows, "k long, v long, ts long")

    def run(data: Any, function: Any, key: str = "k", **kwargs: Any) -> list[Any]:
        schema = f"{key} long, n long" if not isinstance(function, Sum) else "k long, total long"
        out = keyed_process(data, key=key, function=function, output_schema=schema, **kwargs)
        return sorted(tuple(r) for r in out.collect())

    def expected(function: Any, parallelism: int) -> list[Any]:
        records = [(k, v) for k, v, _ in rows]
        runner = LocalRunner(function, key_selector=lambda r: r[0], parallelism=parallelism)
        return sorted(runner.run(records))

    counts = run(df, Count(), parallelism=2)
    assert counts == expected(Count(), 2)
    placed = dict(batch._PLACED[df])
    assert len(placed) == 1
    # another function over the same input and layout, then the same again: the same placed
    # DataFrame
    totals: dict[int, int] = {}
    for k, total in run(df, Sum(), parallelism=2):
        totals[k] = max(totals.get(k, 0), total)
    assert totals == {k: sum(v for key, v, _ in rows if key == k) for k in range(11)}
    assert run(df, Count(), parallelism=2) == counts
    assert batch._PLACED[df] == placed
    assert all(batch._PLACED[df][layout] is found for layout, found in placed.items())
    # any change of the layout: a placement of its own, each job still right
    assert run(df, Count(), parallelism=3) == expected(Count(), 3)
    assert run(df, Count(), key="v", parallelism=2) == [(v, 1) for _, v, _ in rows]
    assert run(df, Count(), parallelism=2, event_time="ts") == counts
    assert run(df, Count(), parallelism=2, execution_mode="streaming") == counts
    assert {(layout[0], layout[1], layout[3]) for layout in batch._PLACED[df]} == {
        (("k",), 2, ("k",)),
        (("k",), 3, ("k",)),
        (("v",), 2, ("v",)),
        (("k",), 2, ("k", "ts")),
        (("k",), 2, None),
    }
    # another DataFrame of the same rows: its own
    again = spark.createDataFrame(rows, "k long, v long, ts long")
    assert run(again, Count(), parallelism=2) == counts
    assert batch._PLACED[again] is not batch._PLACED[df]
    # the cache does not keep a DataFrame alive, and its entry goes with it (other tests'
    # DataFrames in this worker may go at the same collection: the count falls by one at least)
    entries = len(batch._PLACED)
    gone = weakref.ref(again)
    del again
    gc.collect()
    assert gone() is None
    assert len(batch._PLACED) <= entries - 1
    assert batch._PLACED[df] is not None
