"""What runs a streaming query's micro-batches: Spark's ``foreachBatch`` function and the idle
ticker (SPEC §13.1; the steps are described in the module
``streamstate.spark.driver.query.streaming``).

A :class:`MicroBatchRunner` is made from a query run's ``RunParts`` (what runs a step:
the checkpoint log, the subtasks, the outputs' delivery) and the runner's end of the query's
reports (:class:`~streamstate.spark.driver.reports.StepReports`). In a classic session it runs
in the driver, next to the
:class:`~streamstate.spark.driver.query.streaming.KeyedStreamingQuery` that made it; a Spark
Connect client pickles the parts (plain data, its sinks and function included) to a Python
process of the server, which makes the runner there
(:class:`~streamstate.spark.driver.query.connect.ServerBatches`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any

from streamstate.errors import CheckpointMismatchError
from streamstate.spark.driver.monitor.figures import Spans, step_entry
from streamstate.spark.driver.plan.options import KeyedOptions
from streamstate.spark.driver.reports import StepReports
from streamstate.spark.driver.step.commit import BatchPlan, CheckpointLog, spark_batch_of
from streamstate.spark.driver.step.no_data import (
    MAX_NO_DATA_BATCHES,
    MIN_IDLE_INTERVAL,
    IdleTicker,
)
from streamstate.spark.driver.step.outputs import OutputDelivery, committed_outputs
from streamstate.spark.driver.step.step_tasks import StepTasks
from streamstate.spark.failures import is_function_error, original_error, quiet_query_failure_log

__all__ = ["MicroBatchRunner", "RunParts"]

log = logging.getLogger(__name__)

#: the idle ticker looks at least this often (s) whether a no-data micro-batch is due
IDLE_LOOK_S = 1.0


@dataclasses.dataclass(frozen=True)
class RunParts:
    """What runs the steps of one query run, as plain data that pickles to a Spark Connect
    server (no session, no Spark query, no thread).

    Parameters:
        options: the query's options, without their DataFrame.
        log: the checkpoint log of the run (its epoch taken).
        steps: how a step's subtasks run.
        outputs: how a committed step's outputs reach the sinks.
        run_id: the run's id (names the idle ticker's thread).
        no_data_batches: run no-data micro-batches.
        idle_interval: seconds between micro-batches of a running query (None: the run ends by
            itself, ``availableNow`` or ``once``): a running query gets an idle ticker.
        spans: where each step's phases are timed (the steps' own too).
    """

    options: KeyedOptions
    log: CheckpointLog
    steps: StepTasks
    outputs: OutputDelivery
    run_id: str
    no_data_batches: bool
    idle_interval: float | None
    spans: Spans

    def with_no_data(self, no_data_batches: bool, idle_interval: float | None) -> RunParts:
        """These parts running no-data micro-batches or not, a running query's at most every
        ``idle_interval`` seconds."""
        return dataclasses.replace(
            self, no_data_batches=no_data_batches, idle_interval=idle_interval
        )


class MicroBatchRunner:
    """Runs the steps of one streaming query run: each Spark micro-batch's (``__call__``, the
    ``foreachBatch`` function) and the no-data ones, commits and delivers them, and records
    their figures and what failed.

    Parameters:
        parts: what runs the steps.
        reports: the runner's end of the query's reports.
        timings: the query's timings (``first_batch_at_ms`` is marked).
    """

    def __init__(self, parts: RunParts, reports: StepReports, timings: Spans) -> None:
        self.parts = parts
        self.log = parts.log
        self.steps = parts.steps
        self.reports = reports
        self.timings = timings
        self.spans = parts.spans
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
        #: one step at a time: Spark's foreachBatch calls and the idle ticker
        self._step_lock = threading.Lock()
        self._ticker: IdleTicker | None = None
        #: this run delivered again what a no-data micro-batch of an earlier run may not have
        #: delivered (see _recover)
        self._recovered = False
        self._last_step_end = time.monotonic()
        #: the session of the last micro-batch
        self._session: Any = None
        #: the state figures of the steps the current foreachBatch call ran (None outside one)
        self._call_steps: list[dict[str, Any]] | None = None

    # ---- one micro-batch -----------------------------------------------------------------------

    def __call__(self, df: Any, batch_id: int) -> None:
        """Spark's ``foreachBatch`` call of micro-batch ``batch_id`` with its input ``df``."""
        try:
            with self._step_lock:
                if self.idle_failure is not None:  # the query is being stopped with it
                    raise self.idle_failure
                self._call_steps = []
                try:
                    df = self.reports.input(df)
                    self._run_micro_batch(df, batch_id)
                    steps = self._call_steps
                finally:
                    self._call_steps = None
                self.reports.micro_batch(self, df.sparkSession, steps)
        except BaseException as exc:
            self._record_failure(exc, batch_id, df.sparkSession)
            raise

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
        self.reports.failed(self.failure, batch_id, self.parts.options.operator_name)

    def _run_micro_batch(self, df: Any, batch_id: int) -> None:
        self.spans.restart()
        self.timings.mark("first_batch_at")
        session = self._session = df.sparkSession
        with self.spans.span("plan"):
            plan = self.log.plan(batch_id)
        if plan.replay:
            # the driver died after committing this micro-batch's step (and perhaps no-data
            # micro-batches after it): Spark hands the micro-batch over again, and so do we
            # with each of its checkpoints (the sinks keep one copy)
            self._recovered = True
            for i, delivery in enumerate(self.log.deliveries(batch_id)):
                if i:
                    self.spans.restart()
                self._deliver_again(session, delivery)
        else:
            self._run_input(session, df, batch_id, plan)
        if self.parts.no_data_batches:
            # processing time too when no idle ticker fires due timers between micro-batches
            # (availableNow, once): the run ends only when nothing more is due
            idle = self.parts.idle_interval is None
            self._run_no_data_batches(session, batch_id, processing_time=idle)

    def _run_input(self, session: Any, df: Any, batch_id: int, plan: BatchPlan) -> None:
        """The step of a micro-batch's input (``plan``), after what this run owes before it."""
        self._recover(session)
        if self.parts.no_data_batches and self.log.due(processing_time=False):
            # the state owes an event-time no-data micro-batch from before this input (a
            # rollback to the checkpoint before it, or the bound stopped an earlier call):
            # run it first, so that each checkpoint id holds the step it held before
            self._run_no_data_batches(session, batch_id, processing_time=False)
            self.spans.restart()
            with self.spans.span("plan"):
                plan = self.log.plan(batch_id)
        self._run_step(session, df, plan)

    def _run_no_data_batches(
        self, session: Any, during_batch: int | None, *, processing_time: bool
    ) -> int:
        """Run no-data micro-batches while one is due (at most ``MAX_NO_DATA_BATCHES``);
        returns how many ran."""
        for n in range(MAX_NO_DATA_BATCHES):
            reason = self.log.due(processing_time=processing_time)
            if reason is None:
                return n
            self._run_no_data_step(session, during_batch, reason)
        if self.log.due(processing_time=processing_time):
            log.warning(
                "%d no-data micro-batches in a row and another is due (a timer that fires "
                "again at once?): the next micro-batch goes on",
                MAX_NO_DATA_BATCHES,
            )
        return MAX_NO_DATA_BATCHES

    def _run_no_data_step(self, session: Any, during_batch: int | None, reason: str) -> None:
        self.spans.restart()
        with self.spans.span("plan"):
            plan = self.log.plan_no_data(during_batch)
        self._run_step(session, None, plan, reason)

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
            # timed apart: the step that follows keeps its own plan and start
            outer, self.spans = self.spans, Spans()
            try:
                with self.spans.span("plan"):
                    plan = self.log.delivery_of(latest)
                self._deliver_again(session, plan)
            finally:
                self.spans = outer

    def _deliver_again(self, session: Any, plan: BatchPlan) -> None:
        """Hand a committed step's outputs to the sinks again (a replay)."""
        with self.spans.span("sink"):
            side = self.parts.outputs.deliver(session, plan, (plan.outputs, plan.side_outputs))
        self._finish(plan, side_outputs=side)

    def _run_step(self, session: Any, df: Any, plan: BatchPlan, due: str | None = None) -> None:
        """Run, commit and deliver one step: ``df``'s records, or none (``plan.no_data``)."""
        acks = self.steps.run(session, df, plan)
        results = [a.result for a in acks if a.result is not None]
        with self.spans.span("commit"):
            completed = self.log.commit(plan, results)
        outputs = committed_outputs(plan, results, completed)
        with self.spans.span("sink"):
            side = self.parts.outputs.deliver(session, plan, outputs)
        self._finish(plan, due=due, acks=acks, side_outputs=side)

    def _finish(self, plan: BatchPlan, **what: Any) -> None:
        """Record a step's figures (:func:`~streamstate.spark.driver.monitor.figures.
        step_entry` of ``what``) and report them."""
        self.spans.mark("batch")
        pre_aggregated = bool(self.steps.job.pre_aggregation)
        figures = step_entry(plan, self.spans.ms, pre_aggregated=pre_aggregated, **what)
        if self._call_steps is not None and figures.get("state") is not None:
            self._call_steps.append(figures["state"])
        with self.lock:
            self.batches.append(figures)
            count = len(self.batches)
        self.reports.step(figures, count)
        self._last_step_end = time.monotonic()
        if self._ticker is not None:
            self._ticker.wake()  # a new checkpoint may bring a nearer processing-time timer

    # ---- the idle ticker -----------------------------------------------------------------------

    def start_idle_ticker(self) -> None:
        """A running query (``processingTime`` or the default trigger) gets a ticker that runs
        the no-data micro-batches due while no input comes; ``availableNow`` and ``once`` runs
        end by themselves and run theirs inside their last micro-batch."""
        if self.parts.idle_interval is None or self._ticker is not None:
            return
        self._ticker = IdleTicker(self._idle_tick, f"streamstate-idle-{self.parts.run_id[:8]}")
        self._ticker.start()

    def stop_idle_ticker(self, timeout: float | None = 120.0) -> None:
        """No new no-data micro-batch; wait up to ``timeout`` s for one that runs."""
        if self._ticker is not None:
            self._ticker.stop(timeout)

    def _idle_tick(self) -> float | None:
        """One look of the idle ticker: if a no-data micro-batch is due, the last step ended at
        least one trigger interval ago and Spark is not running a micro-batch with input, run
        one. Returns the seconds until the next look (None: the ticker ends)."""
        interval = max(self.parts.idle_interval or 0.0, MIN_IDLE_INTERVAL)
        failed: BaseException | None = None
        with self._step_lock:
            ticker = self._ticker
            if ticker is None or ticker.stopped or self.failure is not None:
                return None
            session = self.reports.idle_session(self._session)
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
            if not self.reports.running():
                return None
            if reason is not None and self.reports.input_batch_starting():
                log.debug("idle ticker: %s due, but Spark runs a micro-batch with input", reason)
                return interval  # its step fires what is due, before its records
            try:
                # the run's first look: the delivery of an earlier run's last no-data
                # micro-batch may not have happened, and no input may come to do it
                self._recover(session)
                if reason is not None:
                    self._run_no_data_step(session, None, reason)
            except BaseException as exc:
                self._record_failure(exc, None, session)
                self.idle_failure = failed = self.failure or exc
        if failed is None:
            return 0.0
        log.error("a no-data micro-batch of the idle ticker failed; stopping the query: %r", failed)
        # outside the step lock: Spark's streaming thread may be waiting for it
        self.reports.stop_query()
        return None
