"""The functions Spark runs in ``mapInArrow``, one per subtask (= partition).

* :func:`micro_batch_task`: streams the partition to the subtask's state host and yields one
  acknowledgement row (the subtask's :class:`~streamstate.spark.wire.acks.TaskAck`); the outputs
  are staged by the host. A no-data micro-batch runs the same task over one row per subtask
  (``range(p)`` in ``p`` partitions: no shuffle) and streams nothing.
* :func:`bounded_task`: a static DataFrame; runs the subtask inside the task (in batch or
  streaming execution) and yields its outputs (or, when a savepoint is written, stages them and
  yields the acknowledgement).
* :func:`fold_task`: the pre-shuffle stage of a window aggregate pre-aggregated in Python
  (SPEC §13.2): folds its map partition per (key, window) and yields the partial rows.

Everything a task needs travels in its closure: the :class:`~streamstate.spark.job.JobSpec`
(for a micro-batch inside its :class:`~streamstate.spark.wire.step.StepTask`), and in batch
mode the pickled function (a streaming task ships only the function's digest; the host loads
the function file once per query run).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from streamstate.spark.job import KEY_GROUP_COLUMN
from streamstate.spark.wire.acks import ACK_COLUMN, TaskAck, encode_ack
from streamstate.spark.wire.hosts import HostSettings
from streamstate.spark.wire.messages import HostLocation
from streamstate.spark.wire.step import StepTask

__all__ = ["bounded_task", "fold_task", "micro_batch_task", "subtask_of_partition"]


def _ack(ack: TaskAck) -> Any:
    """The task's one row of :data:`~streamstate.spark.wire.acks.ACK_SCHEMA`: its ack, or
    instead of a result the function's error (a function error is data, not a failed task:
    spark/failures.py)."""
    import pyarrow as pa

    return pa.RecordBatch.from_arrays(
        [pa.array([encode_ack(ack)], pa.binary())], names=[ACK_COLUMN]
    )


def _check_batch_id(ctx: Any, batch_id: int | None) -> None:
    prop = ctx.getLocalProperty("streaming.sql.batchId")
    if batch_id is not None and prop is not None and int(prop) != batch_id:
        raise RuntimeError(
            f"the task was planned for micro-batch {batch_id} but Spark runs it in micro-batch "
            f"{prop}"
        )


def micro_batch_task(
    step: StepTask,
    hosts: HostSettings,
    locations: dict[int, HostLocation],
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The task of one step: ``step`` as the driver planned it (sent on to the host
    unchanged), ``hosts`` how to reach the query run's hosts, ``locations`` subtask -> where
    its host was after the previous step. A no-data step's partition is one placeholder row,
    and no record is streamed."""

    def task(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        from streamstate.spark.task.host_client import FunctionFailed, run_batch
        from streamstate.spark.task.spawn import find_jvm_pid

        ctx = _task_context(TaskContext.get())
        index = ctx.partitionId()
        _check_batch_id(ctx, step.spark_batch)
        if step.no_data:
            for _ in batches:  # the placeholder row that makes Spark run this task
                pass
            batches = iter(())
        try:
            ack = run_batch(
                hosts.spec(index, watch_pid=find_jvm_pid()),
                step,
                ctx.taskAttemptId(),
                batches,
                pythonpath=hosts.pythonpath,
                secret=hosts.secret,
                location=locations.get(index),
                connect_timeout=hosts.connect_timeout,
            )
        except FunctionFailed as failed:
            # the host dropped the batch; the driver raises the error once, no retry
            yield _ack(TaskAck(subtask=index, error=failed.report))
            return
        ack.timings.worker_pid = os.getpid()
        ack.timings.attempt_number = ctx.attemptNumber()
        yield _ack(ack)

    return task


def bounded_task(
    job_bytes: bytes,
    function_blob: bytes,
    savepoint: dict[str, Any] | None,
    execution_mode: str = "streaming",
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A static DataFrame: run the subtask over the whole partition, fire all timers at the end
    of input, and yield the outputs; with ``savepoint`` ({url, directory, id}) stage the outputs
    and write the subtask's savepoint files, yielding one acknowledgement instead.

    ``execution_mode``: ``"batch"`` for a partition sorted by key (one key's state at a time,
    ``spark/task/batch_subtask.py``), ``"streaming"`` for the streaming operator over the partition
    as it comes."""

    def task(batches: Iterator[Any]) -> Iterator[Any]:
        import time

        import cloudpickle
        from pyspark import TaskContext

        from streamstate.spark.failures import is_function_error, task_error_report
        from streamstate.spark.job import JobSpec

        ctx = _task_context(TaskContext.get())
        job = msgspec.msgpack.decode(job_bytes, type=JobSpec)
        found, batches = subtask_of_partition(job, batches)
        if found is None:
            if savepoint is None:
                return  # no record: no key, no state, no timer, no output
            # every subtask writes its savepoint file, with or without records: this plan is
            # streamstate's own, collected at once (never part of a user's plan), so Spark's
            # partition is the placement's
            found = ctx.partitionId()
        index = found
        runtime: Any
        if execution_mode == "batch":
            from streamstate.spark.task.batch_subtask import BatchSubtaskRuntime

            runtime = BatchSubtaskRuntime(
                job,
                index,
                lambda: cloudpickle.loads(function_blob),
                savepoint=savepoint is not None,
            )
        else:
            from streamstate.spark.subtask import SubtaskRuntime

            runtime = SubtaskRuntime(
                job, index, lambda: cloudpickle.loads(function_blob), incremental=False
            )
        try:
            runtime.prepare(-1, "empty")
            runtime.begin(None, time.time_ns() // 1_000_000)
            for batch in batches:
                runtime.process(batch)
                if savepoint is None:
                    yield from runtime.output_batches()
            runtime.end_of_input()
            if savepoint is None:
                yield from runtime.output_batches()
                return
            result = runtime.finish(
                savepoint["id"],
                ctx.taskAttemptId(),
                "savepoint",
                savepoint=savepoint["directory"],
            )
        except Exception as exc:
            if savepoint is None or not is_function_error(exc):
                raise  # a lazy DataFrame's rows carry no error: Spark reports it
            where = f"in {job.operator!r} subtask {index} (batch mode)"
            yield _ack(TaskAck(subtask=index, error=task_error_report(exc, where)))
            return
        finally:
            runtime.close()
        yield _ack(TaskAck(subtask=index, result=result))

    return task


#: sha256 -> the unpickled function, per Python worker (workers are reused across tasks and
#: micro-batches: the fold unpickles a function once per process, not per batch)
_FUNCTIONS: dict[str, Any] = {}


def fold_task(
    job_bytes: bytes, function_blob: bytes, sha: str, watermark: int | None
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The Python fold before the shuffle of one micro-batch (or of a batch-mode job, with
    ``watermark`` None): the rows of :mod:`streamstate.spark.partials` of its map partition,
    with the schema the job's subtasks receive (``JobSpec.input_schema``)."""

    def task(batches: Iterator[Any]) -> Iterator[Any]:
        from streamstate.spark.job import JobSpec, arrow_schema_from_bytes, load_function
        from streamstate.spark.partial_fold import PartialFold
        from streamstate.windows.pre_aggregation import pre_aggregation_of

        job = msgspec.msgpack.decode(job_bytes, type=JobSpec)
        function = _FUNCTIONS.get(sha)
        if function is None:
            function = _FUNCTIONS[sha] = load_function(function_blob, sha, "the task closure")
        fold = PartialFold(
            function,
            pre_aggregation_of(function),
            key_columns=job.key_columns,
            value_columns=job.value_columns,
            event_time=job.event_time,
            watermark=watermark,
            output_schema=arrow_schema_from_bytes(job.input_schema),
            max_parallelism=job.max_parallelism,
        )
        for batch in batches:
            fold.add(batch)
        yield from fold.batches()

    return task


def subtask_of_partition(job: Any, batches: Iterator[Any]) -> tuple[int | None, Iterator[Any]]:
    """The subtask whose records a partition of placed input holds, read from the records'
    key groups (``_kg``), and the partition's batches (the first ones looked at included); None
    for a partition without records.

    A task of a batch-mode result must not take its subtask from Spark's partition id: in a
    larger plan (a union with the result on either side, ``exceptAll``, ``intersect``, a
    coalesce) Spark numbers the task's partition in the whole plan, not in the placement
    shuffle. Every batch is checked to hold only the subtask's key groups, so a partition that
    mixes subtasks fails with an error that says so."""
    import itertools

    from streamstate.errors import KeyGroupOutOfRangeError

    first = None
    for batch in batches:
        if batch.num_rows:
            first = batch
            break
    if first is None:
        return None, iter(())
    from streamstate.keygroups import (
        compute_key_group_range_for_operator_index,
        compute_operator_index_for_key_group,
    )

    p, max_p = job.parallelism, job.max_parallelism
    index = compute_operator_index_for_key_group(
        max_p, p, first.column(KEY_GROUP_COLUMN)[0].as_py()
    )
    owned = compute_key_group_range_for_operator_index(max_p, p, index)
    kg_range = (owned.start, owned.end)

    def checked(stream: Iterator[Any]) -> Iterator[Any]:
        import pyarrow.compute as pc

        for batch in stream:
            if batch.num_rows:
                bounds = pc.min_max(batch.column(KEY_GROUP_COLUMN))
                low, high = bounds["min"].as_py(), bounds["max"].as_py()
                if low < kg_range[0] or high > kg_range[1]:
                    outside = low if low < kg_range[0] else high
                    raise KeyGroupOutOfRangeError(
                        f"a task of keyed_process {job.operator!r} got records of key groups "
                        f"{kg_range[0]}..{kg_range[1]} (subtask {index} of {p}) and of key group "
                        f"{outside} (subtask "
                        f"{compute_operator_index_for_key_group(max_p, p, outside)}): Spark merged "
                        "partitions "
                        "of the placement shuffle (repartitionById) before the keyed function "
                        "ran, e.g. an adaptive coalesce"
                    )
            yield batch

    return index, checked(itertools.chain([first], batches))


def _task_context(ctx: Any) -> Any:
    if ctx is None:
        raise RuntimeError("streamstate's Spark tasks run only inside a Spark task")
    return ctx
