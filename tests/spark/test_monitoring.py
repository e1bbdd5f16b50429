"""A streaming query's state figures in Spark's own progress (SPEC §13.5): every micro-batch's
``observedMetrics["streamstate"]`` in ``query.last_progress`` / ``recent_progress`` and, on a
classic session, in what a ``StreamingQueryListener`` receives; checked against the input."""

from __future__ import annotations

import time
from typing import Any

import pytest
from data import make_batches, write_batches
from functions import Count

from streamstate.spark import keyed_process
from streamstate.spark.driver.progress import FIGURES, OBSERVATION
from streamstate.spark.driver.session import is_connect

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
