"""``keyed_process``: run a keyed function over a Spark DataFrame, batch or streaming.

Records are routed by key group (Flink's assignment) to ``parallelism`` subtasks; each reaches
``function.process_element(row, ctx)`` as a :class:`~streamstate.spark.records.Row`. Outputs
(tuples, dicts or Rows) form a DataFrame of ``output_schema``.

* A static ``df`` (batch mode) gives a DataFrame. Event-time timers and windows fire at the end
  of the input (in batch execution: at the end of each key's records). With ``savepoint=`` (a
  path or URL) the job runs at once, writes the final state there as a savepoint (a streaming
  query can start from it with ``initial_state=``) and returns its outputs.
* A streaming ``df`` gives a :class:`~streamstate.spark.driver.query.streaming.KeyedStream`;
  start it with ``.write_stream(sink, ...)``. ``checkpoint`` (a path or URL) is required: the
  state's checkpoints, staged outputs and Spark's own streaming checkpoint live there.

**Execution modes** (``execution_mode``, Flink's ``execution.runtime-mode``): ``"automatic"``
(the default) is batch for a static DataFrame and streaming for a streaming one or with
``initial_state=``; ``"batch"`` sorts each subtask's records by key and keeps one key's state in
memory at a time, firing a key's timers when its records end (Flink's BATCH runtime);
``"streaming"`` keeps every key's state in ``state_backend`` until the input ends. With
``"automatic"``, a window aggregate folded before the shuffle runs its folded rows through the
streaming operator; ``"batch"`` never folds. See docs/spark/batch.md.

**Pre-aggregation** (``pre_aggregate``, SPEC §13.2): a window aggregate
(``window(...).aggregate(...)``/``.reduce(...)``) is folded per key and window before the
shuffle (a built-in aggregate such as ``count()`` in Spark SQL's own partial aggregation).
None (the default) folds wherever the outputs are those of the per-record path; True also where
only intermediate firings can differ (allowed lateness: one late firing per window per
micro-batch; ``ContinuousEventTimeTrigger``), and raises ``PreAggregationError`` where it cannot
run (evictors, count or delta triggers, ``process``/``apply``, session windows); False never
folds.
"""

from __future__ import annotations

import contextlib
import datetime
from typing import Any

from streamstate.api.functions import KeyedProcessFunction
from streamstate.spark.driver.environment import ensure_worker_path
from streamstate.spark.driver.plan.checks import check_before_first_job
from streamstate.spark.driver.plan.resolve import KeyedArguments, absolute_url, resolve_options
from streamstate.spark.driver.query.batch import run_bounded
from streamstate.spark.driver.query.streaming import KeyedStream
from streamstate.spark.offline.reader import register

__all__ = ["keyed_process"]


def keyed_process(
    df: Any,
    *,
    key: str | list[str],
    function: KeyedProcessFunction[Any, Any],
    output_schema: Any,
    parallelism: int | None = None,
    max_parallelism: int | None = None,
    state_backend: Any = None,
    checkpoint: str | None = None,
    event_time: str | None = None,
    watermark_delay: int | datetime.timedelta | None = None,
    savepoint: str | None = None,
    initial_state: str | None = None,
    operator_name: str = "keyed-process",
    storage_options: dict[str, Any] | None = None,
    max_deltas: int = 16,
    retained_checkpoints: int = 3,
    host_idle_timeout: float = 600.0,
    adaptive: bool = False,
    side_outputs: dict[Any, Any] | None = None,
    execution_mode: str = "automatic",
    pre_aggregate: bool | None = None,
) -> Any:
    """Run ``function`` keyed by ``key`` over ``df``, with its state kept by streamstate: a
    DataFrame for a static ``df``, a
    :class:`~streamstate.spark.driver.query.streaming.KeyedStream` for a streaming one (the
    module docstring says more).

    Parameters:
        key: the key column, or several (a tuple key).
        function: a ``KeyedProcessFunction`` (windows from ``streamstate.windows`` included);
            it is pickled with cloudpickle.
        output_schema: a ``StructType`` or DDL string (``"user string, n long"``).
        parallelism: subtasks (default: the checkpoint's, else Spark's default parallelism).
            A restart with another value rescales the state by key group.
        max_parallelism: key groups (default: the checkpoint's, else Flink's default).
        state_backend: ``"heap"``, ``"rocksdb"`` or a configured ``StateBackend`` (default:
            the backend that wrote the checkpoint the job restores, else ``"heap"``). Another
            backend than the checkpoint's converts the state on restore (logged once).
        checkpoint: the job directory of a streaming query (a path or URL).
        event_time: a timestamp (or long milliseconds) column giving each record's event time.
        watermark_delay: bounded out-of-orderness (ms or timedelta); the watermark of a batch is
            the largest event time of the earlier batches minus the delay (minus 1 ms).
        savepoint: batch mode: run at once and write the final state there.
        initial_state: a savepoint (or checkpoint) the first micro-batch starts from.
        operator_name: names the operator in checkpoints.
        storage_options: fsspec options of the checkpoint storage (credentials, endpoints).
        max_deltas: incremental checkpoints between two full snapshots of a subtask.
        retained_checkpoints: complete checkpoints kept.
        host_idle_timeout: seconds after which an unused state host exits.
        adaptive: leave Spark's adaptive query execution on for the keyed job (off by default:
            the placed shuffle gains nothing from it and pays its planning cost every batch).
        side_outputs: ``{OutputTag: schema}`` (streaming only): the side outputs to deliver,
            each to its own sink (``write_stream(side_sinks={tag: sink})``), exactly-once like
            the main output; e.g. a window's ``side_output_late_data(tag)``. Values emitted to
            other tags are dropped and counted (``query.batches``: ``side_outputs_dropped``).
        execution_mode: ``"automatic"`` (default), ``"batch"`` or ``"streaming"`` (the module
            docstring, "Execution modes").
        pre_aggregate: fold a window aggregate before the shuffle: None (default) wherever the
            outputs are the same, True also where intermediate firings differ, False never
            (the module docstring, "Pre-aggregation").
    """
    options, restored = resolve_options(KeyedArguments(**locals()))
    ensure_worker_path(options.spark)
    register(options.spark)  # the state formats, to read what the job checkpoints
    check_before_first_job(options, restored)
    if options.streaming:
        return KeyedStream(options)
    result = run_bounded(options, savepoint=absolute_url(savepoint) if savepoint else None)
    # the streaming API on a batch result: say why, instead of PySpark's ATTRIBUTE_NOT_SUPPORTED
    # (a DataFrame kind that takes no attribute keeps PySpark's error)
    with contextlib.suppress(Exception):
        result.write_stream = _batch_write_stream
    return result


def _batch_write_stream(*args: Any, **kwargs: Any) -> Any:
    raise TypeError(
        "keyed_process was given a static DataFrame, so it ran in batch mode and returned a "
        "DataFrame, which has no write_stream: write it with .write (e.g. "
        "result.write.parquet(path)), or read the input with spark.readStream for a streaming "
        "query"
    )
