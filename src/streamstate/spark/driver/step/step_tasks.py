"""How the subtasks of one streaming step run (SPEC §13.1, §13.2), on the driver.

A step's :class:`~streamstate.spark.wire.step.StepTask` goes to every subtask's state host
either through a Spark job (the micro-batch placed by subtask, or pre-aggregated per (key,
window) before the shuffle, then one ``mapInArrow`` task per subtask,
:func:`~streamstate.spark.task.tasks.micro_batch_task`) or, for a pre-aggregated micro-batch
with a ``local`` master, from the driver itself (:mod:`streamstate.spark.driver.step.delivery`).
Either way each subtask's acknowledgement comes back as one typed
:class:`~streamstate.spark.wire.acks.TaskAck` (its result, timings and host location, or the
function's error), and the phases are timed in the run's :class:`~streamstate.spark.driver.
monitor.figures.Spans`.
"""

from __future__ import annotations

from typing import Any

from streamstate.spark.driver.monitor.figures import Spans
from streamstate.spark.driver.plan.options import KeyedOptions
from streamstate.spark.driver.plan.placement import place
from streamstate.spark.driver.step.commit import BatchPlan
from streamstate.spark.driver.step.host_fleet import HostFleet
from streamstate.spark.failures import raise_function_error
from streamstate.spark.job import JobSpec
from streamstate.spark.subtask import MIN_WATERMARK
from streamstate.spark.task.tasks import micro_batch_task
from streamstate.spark.wire.acks import ACK_SCHEMA, TaskAck, decode_acks
from streamstate.spark.wire.messages import HostLocation
from streamstate.spark.wire.step import StepTask

__all__ = ["StepTasks"]


class StepTasks:
    """Runs the subtasks of one query's steps.

    Parameters:
        options: the operator's options (without their DataFrame: each step gets the
            micro-batch's).
        job: its ``JobSpec`` (``job_bytes``: encoded, as every step carries it).
        function: the pickled function and its sha256 (for a Python fold before the shuffle).
        hosts: the query run's state hosts.
        delivery_jvm: with a ``local`` master and pre-aggregation, the driver JVM's pid: the
            driver delivers pre-aggregated rows to the hosts itself (None: the tasks do).
        spans: where the step's phases are timed (``place``, ``job``, ``deliver``).
    """

    def __init__(
        self,
        options: KeyedOptions,
        job: JobSpec,
        job_bytes: bytes,
        function: tuple[bytes, str],
        hosts: HostFleet,
        delivery_jvm: int | None,
        spans: Spans,
    ) -> None:
        self.options = options
        self.job = job
        self._job_bytes = job_bytes
        self._function = function
        self.hosts = hosts
        self._delivery_jvm = delivery_jvm
        self._delivery: Any = None
        self.spans = spans

    def run(self, session: Any, df: Any, plan: BatchPlan) -> list[TaskAck]:
        """Run the step ``plan`` over ``df`` (None: a step without input) in every subtask;
        returns their acknowledgements, each subtask's host location remembered. Raises the
        function's error if a subtask's function raised."""
        options = self.options
        step = plan.task(self._job_bytes)
        locations = dict(self.hosts.locations)
        if not plan.no_data and not options.adaptive:
            session.conf.set("spark.sql.adaptive.enabled", "false")
        if options.pre_aggregation is not None and self._delivery_jvm is not None:
            acks = self._deliver_from_driver(df, plan, step, locations)
        else:
            with self.spans.span("place"):
                if plan.no_data:
                    # one placeholder row in each of p partitions: Spark runs the task of every
                    # subtask (partition i is subtask i), without a shuffle
                    p = options.parallelism
                    placed = session.range(0, p, 1, p)
                else:
                    placed = self._placed(df, plan)
                task = micro_batch_task(step, self.hosts.settings(), locations)
            with self.spans.span("job"):
                acks = decode_acks(placed.mapInArrow(task, ACK_SCHEMA).collect())
        raise_function_error(acks)
        self.hosts.update_locations(acks)
        return acks

    def _deliver_from_driver(
        self, df: Any, plan: BatchPlan, step: StepTask, locations: dict[int, HostLocation]
    ) -> list[TaskAck]:
        """The pre-aggregated micro-batch collected to the driver (one Spark job) and streamed
        from here to the state hosts (:mod:`streamstate.spark.driver.step.delivery`); the
        acknowledgements as tasks would make them. A no-data micro-batch runs no Spark job:
        each host gets its BEGIN and END."""
        import pyarrow as pa

        from streamstate.keygroups import assign_key_groups_for_columns
        from streamstate.spark.driver.plan.pre_aggregation import collected_fold
        from streamstate.spark.driver.step.delivery import DriverDelivery
        from streamstate.spark.job import KEY_GROUP_COLUMN

        options = self.options
        pre = options.pre_aggregation
        assert pre is not None and self._delivery_jvm is not None
        if plan.no_data:
            with self.spans.span("place"), self.spans.span("job"):
                table = pa.table({KEY_GROUP_COLUMN: pa.array([], pa.int32())})
        else:
            with self.spans.span("place"):
                fold = collected_fold(
                    df, pre, watermark=self._fold_watermark(plan), fold_task=self._fold(plan)
                )
            with self.spans.span("job"):
                table = fold.toArrow()
        if KEY_GROUP_COLUMN not in table.column_names:
            columns = [table.column(c).combine_chunks() for c in options.key_columns]
            groups = assign_key_groups_for_columns(columns, options.max_parallelism)
            table = table.append_column(KEY_GROUP_COLUMN, pa.array(groups, pa.int32()))
        if self._delivery is None:
            self._delivery = DriverDelivery(self.job, self.hosts.settings(), self._delivery_jvm)
        with self.spans.span("deliver"):
            return self._delivery.deliver(table, step, locations)  # type: ignore[no-any-return]

    def _fold_watermark(self, plan: BatchPlan) -> int | None:
        return None if plan.watermark <= MIN_WATERMARK else plan.watermark

    def _fold(self, plan: BatchPlan) -> Any:
        """The Python fold's ``mapInArrow`` function for this batch."""
        from streamstate.spark.task.tasks import fold_task

        blob, sha = self._function
        return fold_task(self._job_bytes, blob, sha, self._fold_watermark(plan))

    def _placed(self, df: Any, plan: BatchPlan) -> Any:
        """The micro-batch placed by subtask: its records, or pre-aggregated per (key, window)
        under the batch's watermark (SPEC §13.2)."""
        options = self.options
        pre = options.pre_aggregation
        if pre is None:
            return place(df, options.key_columns, options.parallelism, options.max_parallelism)
        from streamstate.spark.driver.plan.pre_aggregation import pre_aggregated

        return pre_aggregated(
            df,
            pre,
            parallelism=options.parallelism,
            max_parallelism=options.max_parallelism,
            watermark=self._fold_watermark(plan),
            fold_task=self._fold(plan),
        )
