"""How the subtasks of one streaming step run (SPEC §13.1, §13.2), on the driver.

A step's :class:`~streamstate.spark.wire.step.StepTask` goes to every subtask's state host
either through a Spark job (the micro-batch placed by subtask, or pre-aggregated per (key,
window) before the shuffle, then one ``mapInArrow`` task per subtask,
:func:`~streamstate.spark.task.tasks.micro_batch_task`) or, for a pre-aggregated micro-batch
with a ``local`` master, from the driver itself (:mod:`streamstate.spark.driver.delivery`).
Either way the subtasks' acknowledgements come back as the step's ``BatchResult``s, and the
step's figures (rows, routes, restores, per-subtask timings) are filled in.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import msgspec

from streamstate.spark.driver.commit import BatchPlan
from streamstate.spark.driver.host_fleet import HostFleet
from streamstate.spark.driver.options import KeyedOptions
from streamstate.spark.driver.placement import place
from streamstate.spark.driver.progress import step_figures
from streamstate.spark.failures import raise_function_error
from streamstate.spark.job import JobSpec
from streamstate.spark.subtask import MIN_WATERMARK, BatchResult
from streamstate.spark.task.tasks import ACK_SCHEMA, micro_batch_task
from streamstate.spark.wire.step import StepTask

__all__ = ["StepTasks"]


class StepTasks:
    """Runs the subtasks of one query's steps.

    Parameters:
        options: the operator's options.
        job: its ``JobSpec`` (``job_bytes``: encoded, as every step carries it).
        function: the pickled function and its sha256 (for a Python fold before the shuffle).
        hosts: the query run's state hosts.
        delivery_jvm: with a ``local`` master and pre-aggregation, the driver JVM's pid: the
            driver delivers pre-aggregated rows to the hosts itself (None: the tasks do).
    """

    def __init__(
        self,
        options: KeyedOptions,
        job: JobSpec,
        job_bytes: bytes,
        function: tuple[bytes, str],
        hosts: HostFleet,
        delivery_jvm: int | None,
    ) -> None:
        self.options = options
        self.job = job
        self._job_bytes = job_bytes
        self._function = function
        self.hosts = hosts
        self._delivery_jvm = delivery_jvm
        self._delivery: Any = None

    def __getstate__(self) -> dict[str, Any]:
        """Pickled with its query to a Spark Connect server: without the input DataFrame (the
        client's session stays behind; each step gets the micro-batch's DataFrame)."""
        state = dict(self.__dict__)
        state["options"] = dataclasses.replace(self.options, df=None)
        return state

    def run(
        self, session: Any, df: Any, plan: BatchPlan, figures: dict[str, Any]
    ) -> list[BatchResult]:
        """Run the step ``plan`` over ``df`` (None: a step without input) in every subtask;
        ``figures`` gets its timings and counts. Raises the function's error if a subtask's
        function raised."""
        options = self.options
        t_place = time.perf_counter()
        step = plan.task(self._job_bytes)
        locations = dict(self.hosts.locations)
        if not plan.no_data and not options.adaptive:
            session.conf.set("spark.sql.adaptive.enabled", "false")
        if options.pre_aggregation is not None and self._delivery_jvm is not None:
            rows = self._deliver_from_driver(df, plan, step, locations, figures, t_place)
        else:
            if plan.no_data:
                # one placeholder row in each of p partitions: Spark runs the task of every
                # subtask (partition i is subtask i), without a shuffle
                p = options.parallelism
                placed = session.range(0, p, 1, p)
            else:
                placed = self._placed(df, plan)
            task = micro_batch_task(step, self.hosts.settings(), locations)
            t_job = time.perf_counter()
            figures["place_ms"] = (t_job - t_place) * 1e3
            rows = placed.mapInArrow(task, ACK_SCHEMA).collect()
            figures["job_ms"] = (time.perf_counter() - t_job) * 1e3
        raise_function_error(rows)
        results = [msgspec.msgpack.decode(r["result"], type=BatchResult) for r in rows]
        routes = self.hosts.update_locations(rows)
        figures["rows"] = sum(r.rows for r in results)
        figures["output_rows"] = sum(r.output_rows for r in results)
        figures["late_records_dropped"] = sum(r.late_records_dropped for r in results)
        if self.job.pre_aggregation:
            figures["partials"] = sum(r.partials for r in results)
        figures["side_outputs_dropped"] = sum(r.side_outputs_dropped for r in results)
        figures["restore"] = sorted({r.restore for r in results})
        # the task's side: connecting (spawn_ms: starting the host, None if it was running),
        # streaming the partition to it, and why it fell back to a host on its own node
        task_timings = {
            int(row["subtask"]): {
                k: v
                for k, v in json.loads(row["timings"] or "{}").items()
                if k in ("connect_ms", "spawn_ms", "stream_ms", "fallback")
            }
            for row in rows
        }
        figures["subtasks"] = [
            {
                "subtask": r.subtask,
                "restore": r.restore,
                "route": routes.get(r.subtask),
                "rows": r.rows,
                **task_timings.get(r.subtask, {}),
                **r.stats,
                **({"state_metrics": r.state_metrics} if r.state_metrics else {}),
            }
            for r in sorted(results, key=lambda r: r.subtask)
        ]
        figures["routes"] = sorted(set(routes.values()))
        figures["watermark"] = plan.watermark
        figures["state"] = step_figures(results, plan.batch, plan.watermark, figures["output_rows"])
        return results

    def _deliver_from_driver(
        self,
        df: Any,
        plan: BatchPlan,
        step: StepTask,
        locations: dict[int, dict[str, Any]],
        figures: dict[str, Any],
        t_place: float,
    ) -> list[dict[str, Any]]:
        """The pre-aggregated micro-batch collected to the driver (one Spark job) and streamed
        from here to the state hosts (:mod:`streamstate.spark.driver.delivery`); the
        acknowledgements as tasks would yield them. A no-data micro-batch runs no Spark job:
        each host gets its BEGIN and END."""
        import pyarrow as pa

        from streamstate.keygroups import assign_key_groups_for_columns
        from streamstate.spark.driver.delivery import DriverDelivery
        from streamstate.spark.driver.pre_aggregation import collected_fold
        from streamstate.spark.job import KEY_GROUP_COLUMN

        options = self.options
        pre = options.pre_aggregation
        assert pre is not None and self._delivery_jvm is not None
        t_job = time.perf_counter()
        figures["place_ms"] = (t_job - t_place) * 1e3
        if plan.no_data:
            table = pa.table({KEY_GROUP_COLUMN: pa.array([], pa.int32())})
        else:
            fold = collected_fold(
                df, pre, watermark=self._fold_watermark(plan), fold_task=self._fold(plan)
            )
            t_job = time.perf_counter()
            figures["place_ms"] = (t_job - t_place) * 1e3
            table = fold.toArrow()
        figures["job_ms"] = (time.perf_counter() - t_job) * 1e3
        if KEY_GROUP_COLUMN not in table.column_names:
            columns = [table.column(c).combine_chunks() for c in options.key_columns]
            groups = assign_key_groups_for_columns(columns, options.max_parallelism)
            table = table.append_column(KEY_GROUP_COLUMN, pa.array(groups, pa.int32()))
        if self._delivery is None:
            self._delivery = DriverDelivery(self.job, self.hosts.settings(), self._delivery_jvm)
        t_deliver = time.perf_counter()
        acks = self._delivery.deliver(table, step, locations)
        figures["deliver_ms"] = (time.perf_counter() - t_deliver) * 1e3
        return [{**a, "timings": json.dumps(a["timings"]), "error": None} for a in acks]

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
        from streamstate.spark.driver.pre_aggregation import pre_aggregated

        return pre_aggregated(
            df,
            pre,
            parallelism=options.parallelism,
            max_parallelism=options.max_parallelism,
            watermark=self._fold_watermark(plan),
            fold_task=self._fold(plan),
        )
