"""The driver's side of exactly-once micro-batches: which state version a batch starts from,
and the commit of the version it ends with.

Micro-batch ``b`` runs every subtask on state version ``b - 1`` (checkpoint ``chk-(b-1)``, or
the empty/initial state for the first batch) and ends with checkpoint ``chk-b``, whose
``_metadata`` the driver writes (:class:`~streamstate.checkpoint.coordinator.
CheckpointCoordinator`) only after every subtask acknowledged. The metadata's properties carry
what the next batch needs:

``lineage``
    a uuid drawn for this commit; a host holds "version b" only if it also holds its lineage,
    so state from an uncommitted or foreign run of batch ``b`` is never mistaken for it.
``watermark`` / ``max_timestamp``
    the event-time watermark applied in the batch and the largest event time seen so far; the
    next batch's watermark is ``max(watermark, max_timestamp - delay - 1)``.
``outputs``
    the Parquet files the subtasks staged: the sink reads them after the commit, and reads
    them again if Spark replays the batch after a crash between our commit and Spark's.
``side_outputs``
    the same for each side output the query delivers (tag id -> files), when there are any.

Fencing: a query takes an epoch in the checkpoint directory when it starts; a query that a
newer one took over (same directory) stops at its next plan or commit with
:class:`~streamstate.errors.CheckpointFencedError`, and ``_metadata`` is created only if absent,
so a committed checkpoint is never replaced.

Cases at the start of batch ``b`` (:meth:`CheckpointLog.plan`): the latest complete checkpoint
is ``b - 1`` (normal), ``b`` (the driver died after our commit and Spark replays: only the sink
runs again) or anything else (a gap: the state does not belong to this query's progress, an
error naming both).
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from typing import Any

import msgspec

from streamstate.errors import CheckpointError, CheckpointFencedError, CheckpointNotFoundError
from streamstate.spark.subtask import MIN_WATERMARK, BatchResult, StagedOutput

__all__ = ["BatchPlan", "CheckpointLog"]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class BatchPlan:
    """What every subtask of batch ``batch`` is told at BEGIN."""

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
    ) -> None:
        from streamstate.checkpoint.coordinator import CheckpointCoordinator

        self.storage = storage
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
        if self.epoch is not None:
            # a fenced query must not even run its tasks: they would move the state hosts,
            # which the newer query shares, to this query's lineage
            self.storage.check_epoch(self.epoch, f"run micro-batch {batch}")
        latest = self.latest()
        now = time.time_ns() // 1_000_000
        if latest is None:
            if batch != 0 and self.storage.checkpoint_ids():
                raise CheckpointError(
                    f"Spark runs micro-batch {batch} but {self.storage.url} has no complete "
                    "checkpoint to start from (its checkpoints are incomplete or were deleted)"
                )
            return BatchPlan(batch, -1, "empty", _lineage(), {}, MIN_WATERMARK, now, MIN_WATERMARK)
        cid = latest.checkpoint_id
        props = latest.metadata.properties
        if cid == batch:
            outputs = [msgspec.convert(o, StagedOutput) for o in props.get("outputs", [])]
            side = {
                tag: [msgspec.convert(o, StagedOutput) for o in files]
                for tag, files in props.get("side_outputs", {}).items()
            }
            return BatchPlan(
                batch, cid, props["lineage"], props["lineage"], {}, 0, now, 0, True, outputs, side
            )
        if cid != batch - 1:
            raise CheckpointError(
                f"Spark runs micro-batch {batch} but the latest complete state checkpoint in "
                f"{self.storage.url} is chk-{cid}: the state does not match the query's progress "
                "(was the Spark checkpoint or the state directory replaced? if later checkpoints "
                f"were lost or corrupt: streamstate checkpoints rollback {self.storage.url} "
                f"--to {cid})"
            )
        op = latest.metadata.operators.get(self.operator)
        attempts = {} if op is None else {s.subtask_index: s.attempt for s in op.subtasks}
        if op is not None and op.parallelism != self.parallelism:
            attempts = {}  # rescale: every subtask restores its key groups anyway
        watermark = int(props.get("watermark", MIN_WATERMARK))
        max_ts = int(props.get("max_timestamp", MIN_WATERMARK))
        return BatchPlan(
            batch,
            cid,
            props["lineage"],
            _lineage(),
            attempts,
            self._next_watermark(watermark, max_ts),
            now,
            max_ts,
        )

    def _next_watermark(self, watermark: int, max_timestamp: int) -> int:
        if self.watermark_delay is None or max_timestamp == MIN_WATERMARK:
            return watermark
        return max(watermark, max_timestamp - self.watermark_delay - 1)

    def commit(self, plan: BatchPlan, results: list[BatchResult]) -> Any:
        """Commit ``chk-<plan.batch>`` from every subtask's result; raises CheckpointError
        (nothing written) unless all ``parallelism`` subtasks reported version ``batch``."""
        from streamstate.checkpoint.metadata import SubtaskStateHandle

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
        handles = [msgspec.msgpack.decode(r.handle, type=SubtaskStateHandle) for r in results]
        max_ts = plan.max_timestamp
        for r in results:
            if r.max_event_time is not None and r.max_event_time > max_ts:
                max_ts = r.max_event_time
        outputs = [msgspec.to_builtins(r.outputs) for r in results if r.outputs is not None]
        properties = {
            "lineage": plan.new_lineage,
            "batch_id": plan.batch,
            "watermark": plan.watermark,
            "max_timestamp": max_ts,
            "processing_time": plan.processing_time,
            "outputs": outputs,
        }
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


def _lineage() -> str:
    return uuid.uuid4().hex
