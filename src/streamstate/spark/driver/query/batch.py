"""Batch mode: ``keyed_process`` over a static DataFrame.

Without a savepoint the result is a lazy DataFrame: placement, then one ``mapInArrow`` task per
subtask that runs the operator over its partition and fires the timers when the input ends,
streaming its outputs back to Spark. Two execution modes (SPEC §13.3), chosen by
``execution_mode`` (Flink's ``execution.runtime-mode``; ``automatic`` picks batch for a static
DataFrame, as Flink does for bounded sources):

* ``batch``: after the placement shuffle, Spark sorts each partition by key and event time
  (``sortWithinPartitions``: its external sort, so no partition needs to fit in memory; see
  :func:`sort_columns`), and the task keeps one key's state at a time
  (``spark/task/batch_subtask.py``), firing a key's timers when its records end;
* ``streaming``: the streaming operator over the partition as it comes, every key's state in
  the job's state backend until the input ends, when the watermark jumps to the end of time.

With ``savepoint=`` the job runs at once: each task also writes its subtask's state as a
savepoint file and stages its outputs as Parquet under ``<savepoint>/outputs/``; the driver
commits the savepoint's ``_metadata`` once every subtask succeeded and returns a DataFrame that
reads the staged outputs. A streaming query started with ``initial_state=<savepoint>`` begins
from that state (bootstrapping), at any parallelism.
"""

from __future__ import annotations

import posixpath
import time
import weakref
from typing import Any

import msgspec

from streamstate.spark.driver.plan.options import KeyedOptions
from streamstate.spark.driver.plan.placement import place
from streamstate.spark.failures import original_error, raise_function_error
from streamstate.spark.job import KEY_GROUP_COLUMN, pickle_function
from streamstate.spark.task.tasks import bounded_task
from streamstate.spark.wire.acks import ACK_SCHEMA, decode_acks

__all__ = ["run_bounded", "sort_columns"]


def sort_columns(key_columns: list[str], event_time: str | None, exact: bool) -> list[str]:
    """The order of a subtask's records in batch execution: by key, then by event time within
    a key.

    ``exact``: Spark's sort orders equal keys together exactly when they are equal keys (integer,
    string, binary and boolean columns). Floating-point keys are sorted by key group first,
    because Spark sorts ``-0.0`` with ``0.0``, which are different keys (their key groups
    differ, as in Flink). The key alone is much cheaper to sort: one integer column is radix
    sorted, where a key group first leaves most comparisons to the second column.

    >>> sort_columns(["k"], "ts", True), sort_columns(["k"], None, False)
    (['k', 'ts'], ['_kg', 'k'])
    """
    first = [] if exact else [KEY_GROUP_COLUMN]
    return [*first, *key_columns, *([event_time] if event_time else [])]


def _exact_keys(df: Any, key_columns: list[str]) -> bool:
    """Whether every key column has a type whose sort order groups exactly the equal keys."""
    from pyspark.sql.types import BinaryType, BooleanType, IntegralType, StringType

    types = (IntegralType, StringType, BinaryType, BooleanType)
    return all(isinstance(df.schema[c].dataType, types) for c in key_columns)


def run_bounded(options: KeyedOptions, *, savepoint: str | None = None) -> Any:
    blob = pickle_function(options.function)
    mode = options.execution_mode
    if options.pre_aggregation is None:
        placed = _placed_records(options)
    else:
        placed = _pre_aggregated(options, blob)
        sort = _sort(options)
        if sort is not None:
            placed = _sorted_within_partitions(placed, list(sort))
    if savepoint is None:
        job = options.job_spec("")
        task = bounded_task(msgspec.msgpack.encode(job), blob, None, mode)
        return placed.mapInArrow(task, options.output_struct)
    return _with_savepoint(options, placed, blob, savepoint)


def _sorted_within_partitions(placed: Any, columns: list[str]) -> Any:
    """``placed.sortWithinPartitions(*columns)``; in a classic session in one call into the JVM,
    with the Columns built once per JVM (PySpark's Column API takes ~19 round trips)."""
    from streamstate.spark.driver.jvm_columns import jvm_column
    from streamstate.spark.driver.session import is_connect

    if is_connect(placed):
        return placed.sortWithinPartitions(*columns)
    from pyspark.sql.dataframe import DataFrame

    def build(jvm: Any) -> Any:
        functions = getattr(jvm, "org.apache.spark.sql.functions")
        python_utils = getattr(jvm, "org.apache.spark.api.python.PythonUtils")
        # functions.col, as PySpark's sortWithinPartitions does with a column's name
        return python_utils.toSeq([functions.col(c) for c in columns])

    spark = placed.sparkSession
    order = jvm_column(spark, ("sortWithinPartitions", *columns), build)
    return DataFrame(placed._jdf.sortWithinPartitions(order), spark)


#: input DataFrame -> {its layout: its records placed (and sorted)}, see :func:`_placed_records`
_PLACED: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], Any]] = weakref.WeakKeyDictionary()


def _placed_records(options: KeyedOptions) -> Any:
    """The input placed by subtask and, in batch execution, sorted within each partition (SPEC
    §13.3), made once per input DataFrame and layout.

    A DataFrame never changes, and its placed (and sorted) DataFrame is a function of it and of
    the layout alone: the key columns, the parallelism, the number of key groups and the sort
    columns, which are the key here. Nothing else goes into it: it is bound to the input's own
    session, and no setting changes its rows (its casts and arithmetic neither overflow nor
    divide by zero, with or without ANSI mode; it involves no time zone). So a second job over
    the same input (another function, or the same one again) reuses it, and skips three
    analyses in the JVM (a few ms each on a warm driver, tens on a cold one) and their round
    trips. An entry goes with its input DataFrame."""
    df = options.df
    sort = _sort(options)
    layout = (tuple(options.key_columns), options.parallelism, options.max_parallelism, sort)
    layouts = _PLACED.get(df)
    found = None if layouts is None else layouts.get(layout)
    if found is not None:
        return found
    placed = place(df, options.key_columns, options.parallelism, options.max_parallelism)
    if sort is not None:
        placed = _sorted_within_partitions(placed, list(sort))
    _PLACED.setdefault(df, {})[layout] = placed
    return placed


def _sort(options: KeyedOptions) -> tuple[str, ...] | None:
    """The sort within each partition of batch execution (:func:`sort_columns`), None in
    streaming execution."""
    if options.execution_mode != "batch":
        return None
    exact = _exact_keys(options.df, options.key_columns)
    return tuple(sort_columns(options.key_columns, options.event_time, exact))


def _pre_aggregated(options: KeyedOptions, blob: bytes) -> Any:
    """The input pre-aggregated per (key, window) and placed by subtask (SPEC §13.2; nothing is
    late in batch mode)."""
    import hashlib

    from streamstate.spark.driver.plan.pre_aggregation import pre_aggregated
    from streamstate.spark.task.tasks import fold_task

    assert options.pre_aggregation is not None
    job = msgspec.msgpack.encode(options.job_spec(""))
    return pre_aggregated(
        options.df,
        options.pre_aggregation,
        parallelism=options.parallelism,
        max_parallelism=options.max_parallelism,
        watermark=None,
        fold_task=fold_task(job, blob, hashlib.sha256(blob).hexdigest(), None),
    )


def _with_savepoint(options: KeyedOptions, placed: Any, blob: bytes, savepoint: str) -> Any:
    from streamstate.checkpoint.coordinator import CheckpointCoordinator
    from streamstate.checkpoint.storage import FileSystemCheckpointStorage
    from streamstate.errors import CheckpointError
    from streamstate.spark.subtask import OUTPUTS_DIR

    parent, name = posixpath.split(savepoint.rstrip("/"))
    if not name:
        raise ValueError(f"savepoint must name a directory, got {savepoint!r}")
    storage = FileSystemCheckpointStorage(parent, "", storage_options=options.storage_options)
    if storage.size(f"{name}/_metadata") is not None:
        raise CheckpointError(f"{savepoint} already holds a savepoint; choose a new directory")
    storage.delete(name)  # leftovers of a failed attempt
    job = options.job_spec(parent)
    savepoint_id = 1
    task = bounded_task(
        msgspec.msgpack.encode(job),
        blob,
        {"directory": name, "id": savepoint_id},
        options.execution_mode,
    )
    try:
        acks = decode_acks(placed.mapInArrow(task, ACK_SCHEMA).collect())
    except Exception as exc:
        # a task's error reaches here as text (classic and Spark Connect alike): raise it as
        # the function raised it, with Spark's exception chained (spark/failures.py)
        error = original_error(exc)
        if error is exc:
            raise
        raise error from exc
    raise_function_error(acks)
    results = [a.result for a in acks if a.result is not None]
    handles = [r.handle for r in results]
    outputs = [r.outputs for r in results if r.outputs is not None]
    coordinator = CheckpointCoordinator(storage)
    try:
        coordinator.commit(
            savepoint_id,
            handles,
            expected={options.operator_name: options.parallelism},
            properties={
                "batch_mode": True,
                "execution_mode": options.execution_mode,
                "created": time.time_ns() // 1_000_000,
                "outputs": [msgspec.to_builtins(o) for o in outputs],
            },
            savepoint_directory=name,
        )
    finally:
        coordinator.close()
    spark = options.spark
    if not outputs:
        return spark.createDataFrame([], options.output_struct)
    from streamstate.spark.driver.sinks import spark_readable

    return spark.read.schema(options.output_struct).parquet(
        spark_readable(storage.url_of(f"{name}/{OUTPUTS_DIR}"))
    )
