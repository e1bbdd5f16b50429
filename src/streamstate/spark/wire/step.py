"""A step's task, as one typed message from the driver to the state host of every subtask.

The driver plans a step once (:meth:`~streamstate.spark.driver.step.commit.BatchPlan.task`): a
:class:`StepTask` travels unchanged in the closure of the step's Spark tasks (or in the driver's
own delivery, :mod:`streamstate.spark.driver.step.delivery`) and, inside a :class:`Begin`, to each
subtask's host, which validates it as plain data before anything in it is used. Its fields keep
their names all the way; what differs by subtask (the subtask, its task attempt, the schema of
its records) is the :class:`Begin`'s.
"""

from __future__ import annotations

import msgspec

__all__ = ["Begin", "StepTask"]


class StepTask(msgspec.Struct, frozen=True, kw_only=True):
    """One step of a keyed operator, as every one of its subtasks runs it."""

    #: the operator's :class:`~streamstate.spark.job.JobSpec` (msgpack; a host checks it
    #: against the job it was started for)
    job: bytes
    #: the checkpoint id the step commits (the state version it ends with)
    batch: int
    #: the state version to start from (-1: empty or the initial state)
    base: int
    #: the lineage of ``base`` and the one the step's checkpoint starts
    lineage: str
    new_lineage: str
    #: subtask -> the task attempt whose files ``chk-base`` lists
    base_attempts: dict[int, int] = {}
    #: the watermark and processing time the step runs at (ms)
    watermark: int | None = None
    processing_time: int | None = None
    #: the Spark micro-batch whose ``foreachBatch`` call runs the step (None: the idle ticker)
    spark_batch: int | None = None
    #: a micro-batch without input (:mod:`streamstate.spark.driver.step.no_data`): a task streams
    #: no records
    no_data: bool = False


class Begin(msgspec.Struct, frozen=True, kw_only=True, tag="BEGIN", tag_field="t"):
    """The BEGIN message: the step's task for one subtask (the frame's header, ``t`` =
    ``"BEGIN"``)."""

    task: StepTask
    #: the subtask the client means (checked against the host's)
    subtask: int
    #: the Spark task attempt (or the driver's delivery attempt) that runs it
    attempt: int
    #: the Arrow schema of the records that follow (None: no records)
    schema: bytes | None = None

    @property
    def base_attempt(self) -> int | None:
        """The task attempt whose files ``chk-base`` lists for this subtask."""
        return self.task.base_attempts.get(self.subtask)
