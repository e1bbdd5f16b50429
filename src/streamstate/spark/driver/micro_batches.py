"""What runs a streaming query's micro-batches: Spark's ``foreachBatch`` function and the idle
ticker (SPEC §13.1; the steps are described in the module ``streamstate.spark.driver.streaming``).

A :class:`MicroBatchRunner` is the ``foreachBatch`` function of a query. In a classic session it
runs in the driver, next to the :class:`~streamstate.spark.driver.streaming.KeyedStreamingQuery`
that made it; a Spark Connect client pickles it to a Python process of the server, which runs
every micro-batch with it and reports to the client through
:class:`~streamstate.spark.driver.connect_reports.ConnectReports`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any

from streamstate.errors import CheckpointMismatchError
from streamstate.spark.driver.commit import (
    BatchPlan,
    CheckpointLog,
    spark_batch_of,
    staged_outputs,
    staged_side_outputs,
)
from streamstate.spark.driver.connect_reports import ConnectReports
from streamstate.spark.driver.no_data import MAX_NO_DATA_BATCHES, MIN_IDLE_INTERVAL, IdleTicker
from streamstate.spark.driver.options import KeyedOptions
from streamstate.spark.driver.progress import ProgressPublisher, micro_batch_figures
from streamstate.spark.driver.sinks import Sink, StagedBatch
from streamstate.spark.driver.step_tasks import StepTasks
from streamstate.spark.failures import (
    failure_report,
    is_function_error,
    original_error,
    quiet_query_failure_log,
)
from streamstate.spark.subtask import OUTPUTS_DIR

__all__ = ["MicroBatchRunner"]

log = logging.getLogger(__name__)

#: the idle ticker looks at least this often (s) whether a no-data micro-batch is due
IDLE_LOOK_S = 1.0


class MicroBatchRunner:
    """Runs the steps of one streaming query run: each Spark micro-batch's (``__call__``, the
    ``foreachBatch`` function) and the no-data ones, commits and delivers them, and records
    their figures and what failed.

    Parameters:
        options: the query's options (their DataFrame is not used).
        log: the checkpoint log of the run (its epoch taken).
        steps: how a step's subtasks run.
        sink, side_sinks: where the outputs and each side output (by tag id) go.
        output_schema, side_schemas: their Arrow schemas.
        run_id: the run's id (names the idle ticker's thread).
        spark: the session that starts the query (None in a Spark Connect server's process).
        no_data_batches: run no-data micro-batches.
        idle_interval: seconds between micro-batches of a running query (None: the run ends by
            itself, ``availableNow`` or ``once``): a running query gets an idle ticker.
        reports: a Spark Connect query's reports to its client (None: a classic session).
        timings: the query's timings (``first_batch_at_ms`` is added).
        created: when the query was created (``time.perf_counter()``).
    """

    def __init__(
        self,
        options: KeyedOptions,
        log: CheckpointLog,
        steps: StepTasks,
        sink: Sink,
        side_sinks: dict[str, Sink],
        output_schema: Any,
        side_schemas: dict[str, Any],
        run_id: str,
        spark: Any,
        *,
        no_data_batches: bool,
        idle_interval: float | None,
        reports: ConnectReports | None,
        timings: dict[str, float],
        created: float,
    ) -> None:
        self.options = dataclasses.replace(options, df=None)
        self.log = log
        self.storage = log.storage
        self.steps = steps
        self.sink = sink
        self.side_sinks = side_sinks
        self.output_schema = output_schema
        self.side_schemas = side_schemas
        self.run_id = run_id
        self.spark = spark
        self.no_data_batches = no_data_batches
        self.idle_interval = idle_interval
        self.reports = reports
        self.timings = timings
        self._t_created = created
        #: one dict of figures per step run by this runner (see KeyedStreamingQuery.batches)
        self.batches: list[dict[str, Any]] = []
        #: guards ``batches``
        self.lock = threading.Lock()
        #: what made a micro-batch fail, as raised (see streamstate.spark.failures)
        self.failure: BaseException | None = None
        #: a no-data micro-batch of the idle ticker failed: the query was stopped with it
        self.idle_failure: BaseException | None = None
        #: restores Spark's query-failure loggers silenced while a function error stops the
        #: query (failures.quiet_query_failure_log)
        self.restore_logs: Any = None
        #: Spark's query, once it exists (None in a Spark Connect server's process)
        self.query: Any = None
        #: set once Spark's query exists (a first micro-batch may end before start() returns)
        self.started = threading.Event()
        #: one step at a time: Spark's foreachBatch calls and the idle ticker
        self._step_lock = threading.Lock()
        self._ticker: IdleTicker | None = None
        #: this run delivered again what a no-data micro-batch of an earlier run may not have
        #: delivered (see _recover)
        self._recovered = False
        self._last_step_end = time.monotonic()
        #: the session a Spark Connect server's idle ticker runs its jobs with
        self._idle_spark: Any = None
        #: the state figures of the steps the current foreachBatch call ran (None outside one)
        self._call_steps: list[dict[str, Any]] | None = None
        #: puts each micro-batch's state figures into Spark's progress (classic session)
        self._publisher = ProgressPublisher()
        #: Spark's id of the query (asked once: each ask is a py4j call)
        self._query_id: str | None = None

    # ---- Spark Connect -------------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        """A Spark Connect client pickles the runner to a Python process on the server, which
        runs every micro-batch (plan, tasks, commit, sinks) with the batch DataFrame's session
        there; the client's session, Spark query, locks and threads stay behind."""
        state = dict(self.__dict__)
        for name in ("spark", "query", "lock", "_step_lock", "restore_logs", "_ticker", "started"):
            state.pop(name, None)
        state["_idle_spark"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.spark = None
        self.query = None
        self.restore_logs = None
        self._ticker = None
        self._idle_spark = None
        self.lock = threading.Lock()
        self._step_lock = threading.Lock()
        self.started = threading.Event()

    # ---- one micro-batch -----------------------------------------------------------------------

    def __call__(self, df: Any, batch_id: int) -> None:
        """Spark's ``foreachBatch`` call of micro-batch ``batch_id`` with its input ``df``."""
        try:
            with self._step_lock:
                if self.idle_failure is not None:  # the query is being stopped with it
                    raise self.idle_failure
                self._call_steps = []
                try:
                    if self.reports is None:  # a classic session: its input is observed
                        df = self._publisher.unobserved(df)
                    self._run_micro_batch(df, batch_id)
                    steps = self._call_steps
                finally:
                    self._call_steps = None
                self._publish(df.sparkSession, steps)
        except BaseException as exc:
            self._record_failure(exc, batch_id, df.sparkSession)
            raise

    def _publish(self, session: Any, steps: list[dict[str, Any]]) -> None:
        """Put the micro-batch's state figures into Spark's progress (a classic session; the
        client of a Spark Connect query adds them to the progress it reads)."""
        figures = micro_batch_figures(steps)
        if figures is None or self.reports is not None:
            return
        self.started.wait(timeout=30.0)
        query = self.query
        if query is not None:
            if self._query_id is None:
                self._query_id = str(query.id)
            # the session that started the query: the micro-batch's own is a clone, whose
            # query manager does not list it
            self._publisher.publish(self.spark or session, self._query_id, figures)

    def _record_failure(self, exc: BaseException, batch_id: int | None, session: Any) -> None:
        """Spark turns what a micro-batch raised into a StreamingQueryException with Java
        traces; keep what was raised, for the query's await_termination() and
        process_all_available() to raise instead."""
        self.failure = original_error(exc)
        if self.restore_logs is None and (
            is_function_error(self.failure) or isinstance(self.failure, CheckpointMismatchError)
        ):
            # raised once, by this driver: Spark need not log it with its Java frames
            self.restore_logs = quiet_query_failure_log(session)
        if self.reports is not None:  # Spark Connect: the client reads it
            self.reports.write_failure(
                failure_report(self.failure, batch_id, self.options.operator_name)  # type: ignore[arg-type]
            )

    def _run_micro_batch(self, df: Any, batch_id: int) -> None:
        t0 = time.perf_counter()
        if not self.batches:
            self.timings.setdefault("first_batch_at_ms", (t0 - self._t_created) * 1e3)
        session = df.sparkSession
        if self.reports is not None:
            self._idle_spark = session
        plan = self.log.plan(batch_id)
        plan_ms = (time.perf_counter() - t0) * 1e3
        if plan.replay:
            # the driver died after committing this micro-batch's step (and perhaps no-data
            # micro-batches after it): Spark hands the micro-batch over again, and so do we
            # with each of its checkpoints (the sinks keep one copy)
            self._recovered = True
            for delivery in self.log.deliveries(batch_id):
                self._deliver_again(session, delivery, t0, plan_ms)
                t0, plan_ms = time.perf_counter(), 0.0
        else:
            self._recover(session)
            if self.no_data_batches and self.log.due(processing_time=False):
                # the state owes an event-time no-data micro-batch from before this input (a
                # rollback to the checkpoint before it, or the bound stopped an earlier call):
                # run it first, so that each checkpoint id holds the step it held before
                self._run_no_data_batches(session, batch_id, processing_time=False)
                t0 = time.perf_counter()
                plan = self.log.plan(batch_id)
                plan_ms = (time.perf_counter() - t0) * 1e3
            self._run_step(session, df, plan, t0, plan_ms)
        if self.no_data_batches:
            # processing time too when no idle ticker fires due timers between micro-batches
            # (availableNow, once): the run ends only when nothing more is due
            self._run_no_data_batches(session, batch_id, processing_time=self.idle_interval is None)
        if self.reports is not None and self.idle_interval is not None and self._ticker is None:
            self.start_idle_ticker()

    def _run_no_data_batches(
        self, session: Any, during_batch: int | None, *, processing_time: bool
    ) -> int:
        """Run no-data micro-batches while one is due (at most ``MAX_NO_DATA_BATCHES``);
        returns how many ran."""
        for n in range(MAX_NO_DATA_BATCHES):
            reason = self.log.due(processing_time=processing_time)
            if reason is None:
                return n
            t0 = time.perf_counter()
            plan = self.log.plan_no_data(during_batch)
            self._run_step(session, None, plan, t0, (time.perf_counter() - t0) * 1e3, reason)
        if self.log.due(processing_time=processing_time):
            log.warning(
                "%d no-data micro-batches in a row and another is due (a timer that fires "
                "again at once?): the next micro-batch goes on",
                MAX_NO_DATA_BATCHES,
            )
        return MAX_NO_DATA_BATCHES

    def _recover(self, session: Any) -> None:
        """Once per query run, before its first step: a no-data micro-batch that ran outside
        the foreachBatch call of the Spark micro-batch it follows (by the idle ticker, or before
        a micro-batch's input) is not covered by Spark's commit of that micro-batch; if it is the
        latest checkpoint, its delivery may not have happened: deliver it again (the
        ``parquet`` and ``memory`` sinks keep one copy)."""
        if self._recovered:
            return
        self._recovered = True
        latest = self.log.latest()
        if latest is None:
            return
        props = latest.metadata.properties
        if props.get("no_data") and props.get("during_batch") != spark_batch_of(latest):
            t0 = time.perf_counter()
            plan = self.log.delivery_of(latest)
            self._deliver_again(session, plan, t0, (time.perf_counter() - t0) * 1e3)

    def _deliver_again(self, session: Any, plan: BatchPlan, t0: float, plan_ms: float) -> None:
        figures = self._figures(plan, plan_ms)
        self._deliver(session, plan, plan.outputs, plan.side_outputs, figures)
        self._finish(figures, t0)

    def _figures(self, plan: BatchPlan, plan_ms: float, due: str | None = None) -> dict[str, Any]:
        figures: dict[str, Any] = {
            "batch": plan.spark_batch,
            "checkpoint": plan.batch,
            "no_data": plan.no_data,
            "replayed": plan.replay,
            "plan_ms": plan_ms,
        }
        if plan.no_data and not plan.replay:
            figures["due"] = due
            figures["idle"] = plan.during_batch is None
        return figures

    def _run_step(
        self,
        session: Any,
        df: Any,
        plan: BatchPlan,
        t0: float,
        plan_ms: float,
        due: str | None = None,
    ) -> None:
        """Run, commit and deliver one step: ``df``'s records, or none (``plan.no_data``)."""
        figures = self._figures(plan, plan_ms, due)
        results = self.steps.run(session, df, plan, figures)
        t_commit = time.perf_counter()
        completed = self.log.commit(plan, results)
        figures["commit_ms"] = (time.perf_counter() - t_commit) * 1e3
        figures["state"]["checkpointDurationMs"] += int(figures["commit_ms"])
        files: list[Any] = [r.outputs for r in results if r.outputs is not None]
        side_files: dict[str, list[Any]] = {}
        for r in sorted(results, key=lambda r: r.subtask):
            for tag, staged in r.side_outputs.items():
                side_files.setdefault(tag, []).append(staged)
        if completed.metadata.properties.get("lineage") != plan.new_lineage:
            # an older run committed this step just before this query took over: its
            # outputs are the step's (commit.CheckpointLog._adopt)
            files = staged_outputs(completed)
            side_files = staged_side_outputs(completed)
        self._deliver(session, plan, files, side_files, figures)
        self._finish(figures, t0)

    def _deliver(
        self,
        session: Any,
        plan: BatchPlan,
        files: list[Any],
        side_files: dict[str, list[Any]],
        figures: dict[str, Any],
    ) -> None:
        """Hand a committed step's staged outputs to the sink and each side sink."""
        t_sink = time.perf_counter()
        checkpoint_id = plan.batch
        self.sink.write(
            StagedBatch(
                checkpoint_id,
                files,
                self.storage,
                self.output_schema,
                self.options.output_struct,
                session,
                plan.spark_batch,
                plan.no_data,
            )
        )
        for tag, side_sink in self.side_sinks.items():
            side_sink.write(
                StagedBatch(
                    checkpoint_id,
                    side_files.get(tag, []),
                    self.storage,
                    self.side_schemas[tag],
                    self.options.side_output_structs[tag],
                    session,
                    plan.spark_batch,
                    plan.no_data,
                )
            )
        figures["side_output_rows"] = {
            tag: sum(f.rows for f in side_files.get(tag, [])) for tag in self.side_sinks
        }
        figures["sink_ms"] = (time.perf_counter() - t_sink) * 1e3
        self._delete_old_outputs(checkpoint_id)

    def _finish(self, figures: dict[str, Any], t0: float) -> None:
        figures["batch_ms"] = (time.perf_counter() - t0) * 1e3
        if self._call_steps is not None and figures.get("state") is not None:
            self._call_steps.append(figures["state"])
        with self.lock:
            self.batches.append(figures)
            count = len(self.batches)
        if self.reports is not None:
            self.reports.write_batch(figures, count)
        self._last_step_end = time.monotonic()
        if self._ticker is not None:
            self._ticker.wake()  # a new checkpoint may bring a nearer processing-time timer

    def _delete_old_outputs(self, batch_id: int) -> None:
        """Staged outputs are needed until their step is delivered and no replay can ask for
        them (a replay delivers the latest checkpoint only: steps are delivered in order, one
        after the other): keep the last few."""
        old = batch_id - max(2, self.options.retained_checkpoints)
        if old >= 0:
            self.storage.delete(f"{OUTPUTS_DIR}/batch-{old}")

    # ---- the idle ticker -----------------------------------------------------------------------

    def start_idle_ticker(self) -> None:
        """A running query (``processingTime`` or the default trigger) gets a ticker that runs
        the no-data micro-batches due while no input comes; ``availableNow`` and ``once`` runs
        end by themselves and run theirs inside their last micro-batch."""
        if self.idle_interval is None or self._ticker is not None:
            return
        self._ticker = IdleTicker(self._idle_tick, f"streamstate-idle-{self.run_id[:8]}")
        self._ticker.start()

    def stop_idle_ticker(self, timeout: float | None = 120.0) -> None:
        """No new no-data micro-batch; wait up to ``timeout`` s for one that runs."""
        if self._ticker is not None:
            self._ticker.stop(timeout)

    def _idle_tick(self) -> float | None:
        """One look of the idle ticker: if a no-data micro-batch is due, the last step ended at
        least one trigger interval ago and Spark is not running a micro-batch with input, run
        one. Returns the seconds until the next look (None: the ticker ends)."""
        interval = max(self.idle_interval or 0.0, MIN_IDLE_INTERVAL)
        failed: BaseException | None = None
        with self._step_lock:
            ticker = self._ticker
            if ticker is None or ticker.stopped or self.failure is not None:
                return None
            session = self.spark if self.spark is not None else self._idle_spark
            if session is None:
                return IDLE_LOOK_S
            now = time.time_ns() // 1_000_000
            reason = self.log.due(now)
            if reason is None and self._recovered:
                timer = self.log.next_processing_timer()
                if timer is None:
                    return IDLE_LOOK_S
                return min(IDLE_LOOK_S, max(0.0, (timer - now) / 1e3))
            if reason is not None:
                wait = self._last_step_end + interval - time.monotonic()
                if wait > 0:
                    return min(wait, IDLE_LOOK_S)
            if not self._still_running():
                return None
            if reason is not None and self._input_batch_starting():
                log.debug("idle ticker: %s due, but Spark runs a micro-batch with input", reason)
                return interval  # its step fires what is due, before its records
            try:
                # the run's first look: the delivery of an earlier run's last no-data
                # micro-batch may not have happened, and no input may come to do it
                self._recover(session)
                if reason is not None:
                    t0 = time.perf_counter()
                    plan = self.log.plan_no_data(None)
                    plan_ms = (time.perf_counter() - t0) * 1e3
                    self._run_step(session, None, plan, t0, plan_ms, reason)
            except BaseException as exc:
                self._record_failure(exc, None, session)
                self.idle_failure = failed = self.failure or exc
        if failed is None:
            return 0.0
        log.error("a no-data micro-batch of the idle ticker failed; stopping the query: %r", failed)
        # outside the step lock: Spark's streaming thread may be waiting for it
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
        return None

    def _still_running(self) -> bool:
        """The query is active (in a Spark Connect server's process: the client did not stop
        it; Spark ends the process with the query)."""
        if self.reports is not None and self.reports.stopped():
            return False
        return self.query is None or bool(self.query.isActive)

    def _input_batch_starting(self) -> bool:
        """Spark is running a trigger that found new input (unknown in a Spark Connect
        server's process: no)."""
        if self.query is None:
            return False
        try:
            status = self.query.status
        except Exception:
            return False
        return bool(status.get("isTriggerActive") and status.get("isDataAvailable"))
