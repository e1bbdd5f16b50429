"""A committed step's outputs, handed to the sinks (SPEC §13.1, step 4).

The subtasks stage a step's outputs (and each side output's) as Parquet files beside the
checkpoint; once the driver committed the step, :class:`OutputDelivery` hands them to the sink
and to each side sink as a :class:`~streamstate.spark.driver.sinks.StagedBatch` (idempotent per
checkpoint id: a replay hands the same files again), then deletes the staged outputs no replay
can ask for any more.
"""

from __future__ import annotations

from typing import Any

from streamstate.spark.driver.plan.options import KeyedOptions
from streamstate.spark.driver.sinks import Sink, StagedBatch
from streamstate.spark.driver.step.commit import BatchPlan
from streamstate.spark.driver.step.staged import staged_outputs, staged_side_outputs
from streamstate.spark.subtask import OUTPUTS_DIR
from streamstate.spark.wire.results import BatchResult, StagedOutput

__all__ = ["OutputDelivery", "StepOutputs", "committed_outputs"]

#: a step's staged outputs and, per side-output tag id, its side outputs'
StepOutputs = tuple[list[StagedOutput], dict[str, list[StagedOutput]]]


def committed_outputs(plan: BatchPlan, results: list[BatchResult], completed: Any) -> StepOutputs:
    """The staged outputs of a step just committed as checkpoint ``completed``: the subtasks'
    (by subtask), or, if an older run committed the step just before this query took over
    (``commit.CheckpointLog._adopt``), the ones that run committed (checked as any checkpoint's
    are, :mod:`~streamstate.spark.driver.step.staged`)."""
    if completed.metadata.properties.get("lineage") != plan.new_lineage:
        return staged_outputs(completed), staged_side_outputs(completed)
    files = [r.outputs for r in results if r.outputs is not None]
    side_files: dict[str, list[StagedOutput]] = {}
    for r in sorted(results, key=lambda r: r.subtask):
        for tag, staged in r.side_outputs.items():
            side_files.setdefault(tag, []).append(staged)
    return files, side_files


class OutputDelivery:
    """Hands committed steps' outputs to a query's sink and side sinks.

    Parameters:
        options: the query's options.
        storage: its checkpoint storage (the staged files' root).
        sink, side_sinks: where the outputs and each side output (by tag id) go.
        output_schema, side_schemas: their Arrow schemas.
    """

    def __init__(
        self,
        options: KeyedOptions,
        storage: Any,
        sink: Sink,
        side_sinks: dict[str, Sink],
        output_schema: Any,
        side_schemas: dict[str, Any],
    ) -> None:
        self.options = options
        self.storage = storage
        self.sink = sink
        self.side_sinks = side_sinks
        self.output_schema = output_schema
        self.side_schemas = side_schemas

    def deliver(self, session: Any, plan: BatchPlan, outputs: StepOutputs) -> dict[str, Any]:
        """Hand step ``plan``'s staged ``outputs`` to the sink and each side sink; returns the
        side outputs delivered (tag id -> files: every declared tag)."""
        files, side_files = outputs
        self.sink.write(self._batch(session, plan, files, self.output_schema, None))
        delivered: dict[str, list[StagedOutput]] = {}
        for tag, side_sink in self.side_sinks.items():
            delivered[tag] = side_files.get(tag, [])
            side_sink.write(self._batch(session, plan, delivered[tag], self.side_schemas[tag], tag))
        self._delete_old_outputs(plan.batch)
        return delivered

    def _batch(
        self, session: Any, plan: BatchPlan, files: list[Any], schema: Any, tag: str | None
    ) -> StagedBatch:
        options = self.options
        return StagedBatch(
            plan.batch,
            files,
            self.storage,
            schema,
            options.output_struct if tag is None else options.side_output_structs[tag],
            session,
            plan.spark_batch,
            plan.no_data,
        )

    def _delete_old_outputs(self, batch_id: int) -> None:
        """Staged outputs are needed until their step is delivered and no replay can ask for
        them (a replay delivers the latest checkpoint only: steps are delivered in order, one
        after the other): keep the last few."""
        old = batch_id - max(2, self.options.retained_checkpoints)
        if old >= 0:
            self.storage.delete(f"{OUTPUTS_DIR}/batch-{old}")
