"""The driver's side of exactly-once micro-batches: which state version a step starts from,
and the commit of the version it ends with.

A *step* is one run of every subtask that ends with a checkpoint: the step of a Spark
micro-batch's input, or a no-data micro-batch (:mod:`streamstate.spark.driver.step.no_data`).
Checkpoint ids are consecutive: step ``c`` runs every subtask on state version ``c - 1`` (checkpoint
``chk-(c-1)``, or the empty/initial state for the first one) and ends with checkpoint ``chk-c``,
whose ``_metadata`` the driver writes (:class:`~streamstate.checkpoint.coordinator.
CheckpointCoordinator`) only after every subtask acknowledged. Until a query's first no-data
micro-batch, checkpoint ``c`` is the step of Spark micro-batch ``c``. The metadata's properties
carry what the next step needs:

``lineage``
    a uuid drawn for this commit; a host holds "version c" only if it also holds its lineage,
    so state from an uncommitted or foreign run of step ``c`` is never mistaken for it.
``batch_id``
    the Spark micro-batch whose input the state has consumed: the step of micro-batch ``b``
    and the no-data micro-batches after it record ``b``.
``no_data`` / ``during_batch``
    ``no_data`` is true for a no-data micro-batch; ``during_batch`` names the Spark micro-batch
    whose ``foreachBatch`` call ran the step (absent: the idle ticker ran it).
``watermark`` / ``max_timestamp``
    the event-time watermark applied in the step and the largest event time seen so far; the
    next step's watermark is ``max(watermark, max_timestamp - delay - 1)``.
``event_timer`` / ``processing_timer``
    the earliest pending timer of each time domain over every subtask after the step (null:
    none): whether a no-data micro-batch is due follows from these and the watermarks.
``outputs``
    the Parquet files the subtasks staged: the sink reads them after the commit, and reads
    them again if the delivery may not have happened (a replay after a crash).
``side_outputs``
    the same for each side output the query delivers (tag id -> files), when there are any.

Fencing: a query takes an epoch in the checkpoint directory when it starts; a query that a
newer one took over (same directory) stops at its next plan or commit with
:class:`~streamstate.errors.CheckpointFencedError`, and ``_metadata`` is created only if absent,
so a committed checkpoint is never replaced.

Cases when Spark runs micro-batch ``b`` (:meth:`CheckpointLog.plan`): the latest complete
checkpoint records micro-batch ``b - 1`` (normal: a new step), ``b`` (the driver died after
committing ``b``'s step, and perhaps no-data micro-batches after it, before Spark's commit:
Spark replays ``b``, and only the deliveries of ``b``'s checkpoints run again,
:meth:`CheckpointLog.deliveries`) or anything else (a gap:
the state does not belong to this query's progress, an error naming both). Checkpoints written
before no-data micro-batches existed record ``batch_id`` equal to their id and read the same.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from typing import Any

import msgspec

from streamstate.errors import (
    CheckpointError,
    CheckpointFencedError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
)
from streamstate.spark.driver.spark_checkpoint import rollback_command
from streamstate.spark.driver.step.no_data import TimeProgress, due, next_watermark
from streamstate.spark.driver.step.staged import staged_outputs, staged_side_outputs
from streamstate.spark.subtask import MIN_WATERMARK
from streamstate.spark.wire.results import BatchResult, StagedOutput
from streamstate.spark.wire.step import StepTask

__all__ = ["BatchPlan", "CheckpointLog", "spark_batch_of"]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class BatchPlan:
    """What every subtask of one step is told at BEGIN."""

    #: the checkpoint id the step commits (the state version it ends with)
    batch: int
    #: the state version to start from (-1: empty or the initial state)
    base: int
    lineage: str
    new_lineage: str
    #: subtask -> the task attempt whose files chk-base lists
    base_attempts: dict[int, int]
    watermark: int
    processing_time: int
    max_timestamp: int
    #: chk-<batch> is already committed (replay after a driver crash): only the sink runs
    replay: bool = False
    #: the staged outputs of a replayed batch
    outputs: list[StagedOutput] = dataclasses.field(default_factory=list)
    #: the staged side outputs of a replayed batch, per tag id
    side_outputs: dict[str, list[StagedOutput]] = dataclasses.field(default_factory=dict)
    #: the Spark micro-batch whose input the state has consumed after the step
    spark_batch: int = 0
    #: a micro-batch without input (streamstate.spark.driver.step.no_data)
    no_data: bool = False
    #: the Spark micro-batch whose foreachBatch call runs the step (None: the idle ticker)
    during_batch: int | None = None

    def task(self, job: bytes) -> StepTask:
        """The step as every subtask runs it (sent to each subtask's host unchanged); ``job``
        the operator's encoded :class:`~streamstate.spark.job.JobSpec`."""
        return StepTask(
            job=job,
            batch=self.batch,
            base=self.base,
            lineage=self.lineage,
            new_lineage=self.new_lineage,
            base_attempts=self.base_attempts,
            watermark=self.watermark,
            processing_time=self.processing_time,
            spark_batch=self.during_batch,
            no_data=self.no_data,
        )


class CheckpointLog:
    """The committed state versions of one keyed operator in its checkpoint storage."""

    def __init__(
        self,
        storage: Any,
        operator: str,
        parallelism: int,
        *,
        watermark_delay: int | None = None,
        retained: int | None = None,
        epoch: Any = None,
        spark_checkpoint: str | None = None,
    ) -> None:
        from streamstate.checkpoint.coordinator import CheckpointCoordinator

        self.storage = storage
        #: where Spark keeps the query's checkpoint (for the rollback command in errors)
        self.spark_checkpoint = spark_checkpoint
        self.operator = operator
        self.parallelism = parallelism
        self.watermark_delay = watermark_delay
        #: the epoch this query holds (None: no fencing)
        self.epoch = epoch
        self.coordinator = CheckpointCoordinator(storage, retained=retained, epoch=epoch)
        self._latest: Any = None
        self._scanned = False

    def latest(self) -> Any:
        """The latest complete checkpoint (read from storage once, then tracked), or None."""
        if not self._scanned:
            try:
                self._latest = self.storage.latest_checkpoint()
            except CheckpointNotFoundError:
                self._latest = None
            self._scanned = True
        return self._latest

    def plan(self, batch: int) -> BatchPlan:
        """The step of Spark micro-batch ``batch``'s input (or its replay, see the module doc)."""
        self._check_epoch(f"run micro-batch {batch}")
        latest = self.latest()
        now = time.time_ns() // 1_000_000
        problem = self.mismatch(batch)
        if problem is not None:
            raise CheckpointMismatchError(problem)
        if latest is None:
            return BatchPlan(
                batch,
                -1,
                "empty",
                _lineage(),
                {},
                MIN_WATERMARK,
                now,
                MIN_WATERMARK,
                spark_batch=batch,
                during_batch=batch,
            )
        if spark_batch_of(latest) == batch:
            return self.delivery_of(latest)
        return self._next_step(latest, now, spark_batch=batch, during_batch=batch)

    def mismatch(self, batch: int) -> str | None:
        """Why the state cannot be the one Spark micro-batch ``batch`` runs on (the message of a
        :class:`CheckpointError`), or None: the latest complete checkpoint must have consumed
        micro-batch ``batch - 1`` (a new step) or ``batch`` (a replay)."""
        latest = self.latest()
        url = self.storage.url
        if latest is None:
            if batch != 0 and self.storage.checkpoint_ids():
                return (
                    f"Spark runs micro-batch {batch} next but {url} has no complete checkpoint "
                    "to start from (its checkpoints are incomplete or were deleted)"
                )
            return None
        cid = latest.checkpoint_id
        consumed = spark_batch_of(latest)
        if consumed in (batch - 1, batch):
            return None
        where = "" if consumed == cid else f" (after Spark micro-batch {consumed})"
        rollback = rollback_command(url, cid, self.spark_checkpoint)
        return (
            f"Spark runs micro-batch {batch} next but the latest complete state checkpoint in "
            f"{url} is chk-{cid}{where}: the state does not match the query's progress (was "
            "the Spark checkpoint or the state directory replaced? if later checkpoints were "
            f"lost or corrupt: {rollback})"
        )

    def check_start(self, spark_log: Any, batch: int) -> None:
        """Before the query starts: raise :class:`CheckpointError` (:meth:`mismatch`) unless the
        state fits micro-batch ``batch``, the one Spark runs first (``spark_log``: a
        :class:`~streamstate.spark.driver.spark_checkpoint.SparkLog` of the query's Spark
        checkpoint), so that a state behind Spark's commit log is found whether or not input is
        waiting."""
        problem = self.mismatch(batch)
        if problem is None:
            return
        committed = spark_log.last("commits")
        done = (
            f"Spark's checkpoint {spark_log.location} has committed micro-batch {committed}"
            if committed >= 0
            else f"Spark's checkpoint {spark_log.location} has no committed micro-batch"
        )
        raise CheckpointMismatchError(f"the query cannot start: {done}. {problem}")

    def delivery_of(self, checkpoint: Any) -> BatchPlan:
        """A plan that only delivers a committed checkpoint's staged outputs again (``replay``)."""
        props = checkpoint.metadata.properties
        cid = checkpoint.checkpoint_id
        return BatchPlan(
            cid,
            cid,
            props["lineage"],
            props["lineage"],
            {},
            0,
            time.time_ns() // 1_000_000,
            0,
            replay=True,
            outputs=staged_outputs(checkpoint),
            side_outputs=staged_side_outputs(checkpoint),
            spark_batch=spark_batch_of(checkpoint),
            no_data=bool(props.get("no_data")),
            during_batch=props.get("during_batch"),
        )

    def deliveries(self, batch: int) -> list[BatchPlan]:
        """The complete checkpoints of Spark micro-batch ``batch`` (its step and the no-data
        micro-batches after it), oldest first, as plans that only deliver them again: what a
        replay of ``batch`` hands to the sinks. Those that retention deleted were delivered
        before a later one was committed (steps are delivered in order)."""
        out = []
        checkpoint = self.latest()
        while checkpoint is not None and spark_batch_of(checkpoint) == batch:
            out.append(self.delivery_of(checkpoint))
            if checkpoint.checkpoint_id == 0:
                break
            try:
                checkpoint = self.storage.load(checkpoint.checkpoint_id - 1)
            except CheckpointError:
                break
        return out[::-1]

    def plan_no_data(self, during_batch: int | None) -> BatchPlan:
        """A no-data micro-batch after the latest checkpoint, run in the ``foreachBatch`` call
        of Spark micro-batch ``during_batch`` (None: by the idle ticker)."""
        self._check_epoch("run a no-data micro-batch")
        latest = self.latest()
        if latest is None:
            raise CheckpointError(
                f"no complete checkpoint in {self.storage.url} to run a no-data micro-batch on"
            )
        return self._next_step(
            latest,
            time.time_ns() // 1_000_000,
            spark_batch=spark_batch_of(latest),
            no_data=True,
            during_batch=during_batch,
        )

    def _check_epoch(self, action: str) -> None:
        if self.epoch is not None:
            # a fenced query must not even run its tasks: they would move the state hosts,
            # which the newer query shares, to this query's lineage
            self.storage.check_epoch(self.epoch, action)

    def _next_step(
        self,
        latest: Any,
        now: int,
        *,
        spark_batch: int,
        no_data: bool = False,
        during_batch: int | None = None,
    ) -> BatchPlan:
        props = latest.metadata.properties
        op = latest.metadata.operators.get(self.operator)
        attempts = {} if op is None else {s.subtask_index: s.attempt for s in op.subtasks}
        if op is not None and op.parallelism != self.parallelism:
            attempts = {}  # rescale: every subtask restores its key groups anyway
        progress = TimeProgress.of(props)
        return BatchPlan(
            latest.checkpoint_id + 1,
            latest.checkpoint_id,
            props["lineage"],
            _lineage(),
            attempts,
            next_watermark(progress.watermark, progress.max_timestamp, self.watermark_delay),
            now,
            progress.max_timestamp,
            spark_batch=spark_batch,
            no_data=no_data,
            during_batch=during_batch,
        )

    def due(self, now: int | None = None, *, processing_time: bool = True) -> str | None:
        """Why a no-data micro-batch after the latest checkpoint is due (``no_data.due``), or
        None."""
        latest = self.latest()
        if latest is None:
            return None
        if now is None:
            now = time.time_ns() // 1_000_000
        progress = TimeProgress.of(latest.metadata.properties)
        return due(progress, self.watermark_delay, now, processing_time=processing_time)

    def next_processing_timer(self) -> int | None:
        """The earliest pending processing-time timer after the latest checkpoint (ms)."""
        latest = self.latest()
        if latest is None:
            return None
        return TimeProgress.of(latest.metadata.properties).processing_timer

    def commit(self, plan: BatchPlan, results: list[BatchResult]) -> Any:
        """Commit ``chk-<plan.batch>`` from every subtask's result; raises CheckpointError
        (nothing written) unless all ``parallelism`` subtasks reported version ``batch``."""
        got = sorted(r.subtask for r in results)
        if got != list(range(self.parallelism)):
            raise CheckpointError(
                f"batch {plan.batch} is not committed: subtasks {got} acknowledged, expected "
                f"0..{self.parallelism - 1}"
            )
        for r in results:
            if r.version != plan.batch:
                raise CheckpointError(
                    f"batch {plan.batch} is not committed: subtask {r.subtask} reports state "
                    f"version {r.version}"
                )
        handles = [r.handle for r in results]
        max_ts = plan.max_timestamp
        for r in results:
            if r.max_event_time is not None and r.max_event_time > max_ts:
                max_ts = r.max_event_time
        outputs = [msgspec.to_builtins(r.outputs) for r in results if r.outputs is not None]
        event_timers = [r.event_timer for r in results if r.event_timer is not None]
        processing_timers = [r.processing_timer for r in results if r.processing_timer is not None]
        properties: dict[str, Any] = {
            "lineage": plan.new_lineage,
            "batch_id": plan.spark_batch,
            "watermark": plan.watermark,
            "max_timestamp": max_ts,
            "processing_time": plan.processing_time,
            "event_timer": min(event_timers, default=None),
            "processing_timer": min(processing_timers, default=None),
            "outputs": outputs,
        }
        if plan.no_data:
            properties["no_data"] = True
        if plan.during_batch is not None:
            properties["during_batch"] = plan.during_batch
        side: dict[str, list[Any]] = {}
        for r in sorted(results, key=lambda r: r.subtask):
            for tag, staged in r.side_outputs.items():
                side.setdefault(tag, []).append(msgspec.to_builtins(staged))
        if side:  # the staged side outputs, delivered again if Spark replays the batch
            properties["side_outputs"] = side
        try:
            completed = self.coordinator.commit(
                plan.batch,
                handles,
                expected={self.operator: self.parallelism},
                properties=properties,
            )
        except CheckpointFencedError:
            completed = self._adopt(plan.batch)
            if completed is None:
                raise
        self._latest, self._scanned = completed, True
        return completed

    def _adopt(self, batch: int) -> Any:
        """``chk-<batch>`` exists already: if an older run committed it (it passed its last
        epoch check just before this query took over) and this query still holds the newest
        epoch, it is as good as this query's own result (same input, same base): continue from
        it. Returns it, or None (fenced)."""
        if self.epoch is None:
            return None
        current = self.storage.current_epoch()
        if current is None or current.number != self.epoch.number:
            return None
        try:
            existing = self.storage.load(batch)
        except CheckpointError:
            return None
        op = existing.metadata.operators.get(self.operator)
        their_epoch = int(existing.metadata.properties.get("epoch", 0))
        if op is None or op.parallelism != self.parallelism or their_epoch >= self.epoch.number:
            return None
        log.warning(
            "%s was committed by an older run (epoch %s) before this query (epoch %s) took "
            "over; continuing from it",
            existing.url,
            their_epoch,
            self.epoch.number,
        )
        return existing

    def close(self) -> None:
        self.coordinator.close()


def spark_batch_of(checkpoint: Any) -> int:
    """The Spark micro-batch whose input a committed checkpoint's state has consumed (its
    ``batch_id``; checkpoints without one are from before no-data micro-batches: their id)."""
    return int(checkpoint.metadata.properties.get("batch_id", checkpoint.checkpoint_id))


def _lineage() -> str:
    return uuid.uuid4().hex
