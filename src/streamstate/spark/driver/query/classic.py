"""A streaming query of a classic session: its micro-batches run in this driver.

Spark calls the query's :class:`~streamstate.spark.driver.step.micro_batches.MicroBatchRunner`
here, so the query and its runner share one object: :class:`ClassicReports` is both ends of the
query's reports (:mod:`streamstate.spark.driver.reports`). The steps' figures and failures are
the runner's own; each micro-batch's state figures go into Spark's progress through the
query's observation (:mod:`streamstate.spark.driver.monitor.progress`), and the runner's jobs
read their input past it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from streamstate.spark.driver.monitor.figures import micro_batch_figures
from streamstate.spark.driver.monitor.progress import ProgressPublisher, observe_state
from streamstate.spark.driver.reports import QueryReports, StepReports
from streamstate.spark.driver.step.micro_batches import MicroBatchRunner

__all__ = ["ClassicReports"]

log = logging.getLogger(__name__)


class ClassicReports(StepReports, QueryReports):
    """Both ends of a classic session's query (see the module docstring); ``spark``: the
    session that starts the query."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self.runner: MicroBatchRunner | None = None
        #: Spark's query, once it exists
        self.query: Any = None
        #: set once Spark's query exists (a first micro-batch may end before start() returns)
        self.started = threading.Event()
        #: puts each micro-batch's state figures into Spark's progress
        self._publisher = ProgressPublisher()
        #: Spark's id of the query (asked once: each ask is a py4j call)
        self._query_id: str | None = None

    # ---- the query's end -----------------------------------------------------------------------

    def foreach_batch(self, parts: Any, timings: Any, df: Any) -> tuple[Any, Any]:
        self.runner = MicroBatchRunner(parts, self, timings)
        # each micro-batch's state figures go into Spark's progress (monitor/progress.py)
        return self.runner, observe_state(df)

    def start(self, writer: Any, where: str) -> Any:
        query = writer.start()
        self.query = query
        self.started.set()
        self._runner().start_idle_ticker()
        return query

    def sync(self, sinks: bool = True) -> None:
        pass  # the runner's figures and the sinks are this process's

    def batches(self) -> list[dict[str, Any]]:
        return self._runner().batches

    def failure(self, spark_error: BaseException | None) -> BaseException | None:
        return self._runner().failure

    def idle_failure(self) -> BaseException | None:
        return self._runner().idle_failure

    def progress(self, progress: list[Any]) -> list[Any]:
        return progress  # Spark's progress carries the figures itself

    def stop(self, timeout: float | None) -> None:
        self._runner().stop_idle_ticker(timeout)

    def log_again(self) -> None:
        runner = self._runner()
        restore, runner.restore_logs = runner.restore_logs, None
        if restore is not None and not self.query.isActive:
            restore()
        elif restore is not None:
            runner.restore_logs = restore

    def _runner(self) -> MicroBatchRunner:
        assert self.runner is not None, "foreach_batch() makes the runner"
        return self.runner

    # ---- the runner's end ----------------------------------------------------------------------

    def input(self, df: Any) -> Any:
        return self._publisher.unobserved(df)

    def step(self, figures: dict[str, Any], count: int) -> None:
        pass  # query.batches is the runner's list

    def micro_batch(self, runner: Any, session: Any, steps: list[dict[str, Any]]) -> None:
        figures = micro_batch_figures(steps)
        if figures is None:
            return
        self.started.wait(timeout=30.0)
        query = self.query
        if query is not None:
            if self._query_id is None:
                self._query_id = str(query.id)
            # the session that started the query: the micro-batch's own is a clone, whose
            # query manager does not list it
            self._publisher.publish(self.spark or session, self._query_id, figures)

    def failed(self, failure: BaseException, batch_id: int | None, operator: str) -> None:
        pass  # the query reads the runner's failure

    def running(self) -> bool:
        return self.query is None or bool(self.query.isActive)

    def input_batch_starting(self) -> bool:
        if self.query is None:
            return False
        try:
            status = self.query.status
        except Exception:
            return False
        return bool(status.get("isTriggerActive") and status.get("isDataAvailable"))

    def stop_query(self) -> None:
        query = self.query
        for attempt in (1, 2):
            if query is None:
                break
            try:
                query.stop()
                break
            except Exception as stop_error:
                log.warning(
                    "could not stop the query after the failure (attempt %d): %s",
                    attempt,
                    str(stop_error)[:2000],
                )
                time.sleep(1.0)

    def idle_session(self, last: Any) -> Any:
        return self.spark
