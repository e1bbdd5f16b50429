"""A streaming query's state figures in Spark's own progress (SPEC §13.5): every micro-batch's
``observedMetrics["streamstate"]`` in ``query.last_progress`` / ``recent_progress`` and, on a
classic session, in what a ``StreamingQueryListener`` receives; checked against the input."""

from __future__ import annotations

import time
from typing import Any

import pytest

from streamstate.spark import keyed_process
from streamstate.spark.driver.monitor.progress import (
    FIGURES,
    OBSERVATION,
    ProgressPublisher,
    observe_state,
)
from streamstate.spark.driver.session import is_connect
from support.spark_data import make_batches, write_batches
from support.spark_functions import Count, Visits

pytestmark = pytest.mark.spark


def test_every_micro_batch_reports_its_state_figures_to_spark(
    any_spark: Any, tmp_path: Any
) -> None:
    spark = any_spark
    batches = make_batches(3, 200, users=40, seed=7)
    write_batches(str(tmp_path / "in"), batches)
    events: list[Any] = []
    listener = None
    if not is_connect(spark):
        from pyspark.sql.streaming import StreamingQueryListener

        class Progress(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - PySpark's names
                pass

            def onQueryProgress(self, event: Any) -> None:  # noqa: N802 - PySpark's names
                events.append(event.progress)

            def onQueryIdle(self, event: Any) -> None:  # noqa: N802 - PySpark's names
                pass

            def onQueryTerminated(self, event: Any) -> None:  # noqa: N802 - PySpark's names
                pass

        listener = Progress()
        spark.streams.addListener(listener)
    try:
        query = keyed_process(
            spark.readStream.schema("user string, v long")
            .option("maxFilesPerTrigger", 1)
            .parquet(str(tmp_path / "in")),
            key="user",
            function=Count(),
            output_schema="user string, n long",
            checkpoint=str(tmp_path / "ck"),
            parallelism=2,
        ).write_stream("memory", trigger={"availableNow": True})
        query.await_termination()
        progress = {p["batchId"]: p for p in query.recent_progress}
        deadline = time.monotonic() + 20
        while listener is not None and len(events) < len(batches) and time.monotonic() < deadline:
            time.sleep(0.2)  # the listener bus delivers after the query's thread
    finally:
        if listener is not None:
            spark.streams.removeListener(listener)
    # the oracle: distinct users so far (state entries) and in the batch (entries written)
    seen: set[str] = set()
    for b, rows in enumerate(batches):
        users = {u for u, _ in rows}
        seen |= users
        expected = {
            "checkpointId": b,
            "numSteps": 1,
            "numInputRows": len(rows),
            "numOutputRows": len(rows),
            "numRowsTotal": len(seen),
            "numRowsUpdated": len(users),
            "numRowsRemoved": 0,
            "numRowsDroppedByWatermark": 0,
            "numTimersPending": 0,
            "numTimersFired": 0,
            "numHotSubtasks": 0 if b == 0 else 2,
            "watermarkMs": None,
        }
        if listener is not None:  # classic: Spark's own figure of the source stays right
            assert progress[b]["numInputRows"] == len(rows), b
        figures = progress[b]["observedMetrics"][OBSERVATION].asDict()
        assert list(figures) == list(FIGURES)
        assert {k: figures[k] for k in expected} == expected, b
        assert figures["checkpointBytes"] > 0
        assert figures["checkpointFullBytes"] >= figures["checkpointBytes"]
        assert figures["memoryUsedBytes"] > 0
        assert figures["stateBytes"] is None  # the heap backend
        # the same figures as query.batches
        assert query.batches[b]["state"] == figures
        if listener is not None:
            heard = {e["batchId"]: e for e in events}
            assert heard[b]["observedMetrics"][OBSERVATION].asDict() == figures
    assert query.last_progress["batchId"] == len(batches) - 1
    assert query.last_progress["observedMetrics"][OBSERVATION]["numRowsTotal"] == len(seen)


def _scopes(jrdd: Any) -> set[str]:
    """The scope names (the plan nodes that made them) of an RDD and of everything it reads."""
    names: set[str] = set()
    todo, seen = [jrdd], set()
    while todo:
        rdd = todo.pop()
        if rdd.id() in seen:
            continue
        seen.add(rdd.id())
        scope = rdd.scope()
        if not scope.isEmpty():
            names.add(scope.get().name())
        dependencies = rdd.dependencies()
        todo.extend(dependencies.apply(i).rdd() for i in range(dependencies.size()))
    return names


def test_the_micro_batch_jobs_read_the_same_rows_past_the_observation(
    spark: Any, tmp_path: Any
) -> None:
    """The observation only carries the figures the driver sets: the micro-batch's jobs read
    the same scan's rows without running it (each task would update its buffer for nothing),
    and Spark's own figures of the micro-batch stay right."""
    batches = make_batches(3, 150, users=20, seed=3)
    write_batches(str(tmp_path / "in"), batches)
    publisher = ProgressPublisher()
    seen: list[tuple[int, list[Any], list[Any], set[str], set[str]]] = []

    def run(df: Any, batch_id: int) -> None:
        past = publisher.unobserved(df)
        seen.append(
            (
                batch_id,
                sorted(past.collect()),
                sorted(df.collect()),
                _scopes(past._jdf.queryExecution().toRdd()),
                _scopes(df._jdf.queryExecution().toRdd()),
            )
        )

    source = spark.readStream.schema("user string, v long").option("maxFilesPerTrigger", 1)
    query = (
        observe_state(source.parquet(str(tmp_path / "in")))
        .writeStream.foreachBatch(run)
        .trigger(availableNow=True)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    query.awaitTermination()
    assert not publisher._read_through
    assert [b for b, *_ in seen] == [0, 1, 2]
    for (b, past, through, past_scopes, through_scopes), rows in zip(seen, batches, strict=True):
        assert [tuple(r) for r in past] == sorted(rows), b
        assert past == through, b
        assert "CollectMetrics" in through_scopes, b  # the check can fail
        assert "CollectMetrics" not in past_scopes, b
    # each micro-batch's input was read twice above: once past the node, once through it
    assert [p["numInputRows"] for p in query.recentProgress] == [2 * len(r) for r in batches]


def test_an_unexpected_plan_is_read_as_it_is(spark: Any) -> None:
    """A DataFrame whose plan is not a micro-batch's observed input comes back unchanged, with
    one warning; the publisher does not look again."""
    publisher = ProgressPublisher()
    df = spark.range(5)
    assert publisher.unobserved(df) is df
    assert publisher._read_through
    assert publisher.unobserved(df) is df


def test_the_entry_counts_agree_on_one_checkpoint(spark: Any, tmp_path: Any) -> None:
    """``numRowsTotal``, ``streamstate checkpoints inspect``, the ``streamstate-metadata``
    format's ``entries`` and the state read back counted by the one definition (a value per key
    and namespace, a map's mappings, a list's elements; timers apart) give the same number for
    the checkpoint of the last micro-batch."""
    import json

    from typer.testing import CliRunner

    from streamstate.cli import app
    from streamstate.spark import read_state

    batches = make_batches(2, 200, users=30, seed=9)
    write_batches(str(tmp_path / "in"), batches)
    ck = str(tmp_path / "ck")
    query = keyed_process(
        spark.readStream.schema("user string, v long")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(tmp_path / "in")),
        key="user",
        function=Visits(),
        output_schema="user string, n long",
        checkpoint=ck,
        parallelism=2,
    ).write_stream("memory", trigger={"availableNow": True})
    query.await_termination()
    figures = query.last_progress["observedMetrics"][OBSERVATION]
    result = CliRunner().invoke(app, ["checkpoints", "inspect", "--json", f"{ck}/chk-1"])
    assert result.exit_code == 0, result.output
    (inspected,) = json.loads(result.output)["checkpoints"]
    read_back = {
        name: [r.value for r in read_state(spark, ck, state=name).collect()]
        for name in ("n", "recent", "by_rest")
    }
    counted = (
        len(read_back["n"])
        + sum(len(v) for v in read_back["recent"])
        + sum(len(v) for v in read_back["by_rest"])
    )
    users = {u for rows in batches for u, _ in rows}
    rests = {(u, v % 4) for rows in batches for u, v in rows}
    oracle = (
        len(users)
        + sum(min(3, sum(1 for rows in batches for x, _ in rows if x == u)) for u in users)
        + len(rests)
    )
    assert figures["checkpointId"] == 1
    assert figures["numRowsTotal"] == inspected["operators"]["keyed-process"]["entries"]
    listed = spark.read.format("streamstate-metadata").load(ck).collect()
    assert figures["numRowsTotal"] == sum(r.entries for r in listed if r.entries is not None)
    assert figures["numRowsTotal"] == counted == oracle
    assert figures["numTimersPending"] == len(users)
