"""``keyed_process``: run a keyed function over a Spark DataFrame, batch or streaming."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import os
from typing import Any

from streamstate.api.functions import KeyedProcessFunction
from streamstate.errors import CheckpointNotFoundError, MaxParallelismMismatchError
from streamstate.keygroups import compute_default_max_parallelism
from streamstate.spark.driver.batch import run_bounded
from streamstate.spark.driver.checks import check_before_first_job
from streamstate.spark.driver.environment import ensure_worker_path
from streamstate.spark.driver.options import KeyedOptions
from streamstate.spark.driver.pre_aggregation import plan_pre_aggregation
from streamstate.spark.driver.reader import register
from streamstate.spark.driver.session import default_parallelism, parse_ddl
from streamstate.spark.driver.streaming import KeyedStream

__all__ = [
    "BACKEND_SWITCH",
    "EXECUTION_MODES",
    "STREAMSTATE_EVENT",
    "checkpointed_backend",
    "keyed_process",
    "resolve_execution_mode",
]

#: ``keyed_process(execution_mode=...)``: Flink's ``execution.runtime-mode`` values
EXECUTION_MODES = ("automatic", "batch", "streaming")
#: the log-record attribute naming what a warning reports, for programs that say it their own
#: way (the demo announces a backend switch itself)
STREAMSTATE_EVENT = "streamstate_event"
#: ``STREAMSTATE_EVENT`` of the warning that a checkpoint is restored into another backend
BACKEND_SWITCH = "backend-switch"

log = logging.getLogger(__name__)


def _ms(value: int | datetime.timedelta | None, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    if isinstance(value, int) and value >= 0:
        return value
    raise ValueError(f"{what} must be milliseconds (int >= 0) or a timedelta, got {value!r}")


def _backend_name(state_backend: Any) -> tuple[str, dict[str, Any]]:
    from streamstate.backends.factory import StateBackend

    if state_backend is None:
        return "heap", {}
    if isinstance(state_backend, str):
        if state_backend not in ("heap", "heap-nested", "rocksdb"):
            raise ValueError(f"unknown state backend {state_backend!r}; use 'heap' or 'rocksdb'")
        return state_backend, {}
    if isinstance(state_backend, StateBackend):
        fields = {
            f.name: getattr(state_backend, f.name)
            for f in dataclasses.fields(state_backend)
            if f.init and f.name not in ("working_dir", "incremental")
        }
        return state_backend.name, fields
    raise TypeError(
        f"state_backend must be 'heap', 'rocksdb' or a StateBackend, got {state_backend!r}"
    )


def _latest_checkpoint(checkpoint: str | None, options: dict[str, Any]) -> Any:
    """The latest complete checkpoint of the job directory ``checkpoint``, or None."""
    from streamstate.checkpoint.storage import FileSystemCheckpointStorage

    if checkpoint is None:
        return None
    storage = FileSystemCheckpointStorage(checkpoint, "", storage_options=options)
    try:
        return storage.latest_checkpoint()
    except CheckpointNotFoundError:
        return None


def _initial_checkpoint(initial_state: str | None, options: dict[str, Any]) -> Any:
    """The savepoint (or checkpoint) ``initial_state`` names, or None."""
    from streamstate.checkpoint.storage import open_location

    if initial_state is None:
        return None
    storage, directory = open_location(initial_state, options)
    # the directory is relative to that storage (None: a job directory, its latest checkpoint);
    # resolve_checkpoint would take a name such as "sp" for a path of the working directory
    return storage.load(directory)


def checkpointed_backend(restored: Any, operator: str) -> str | None:
    """The backend kind that wrote ``operator``'s keyed state in ``restored``: ``"rocksdb"``
    for native RocksDB snapshots, ``"heap"`` for canonical files (a heap checkpoint, or any
    savepoint); None without keyed state."""
    op = None if restored is None else restored.metadata.operators.get(operator)
    written = [] if op is None else [sub for sub in op.subtasks if sub.keyed]
    if not written:
        return None
    return "rocksdb" if any(not sub.is_canonical for sub in written) else "heap"


def _follow_backend(state_backend: Any, restored: Any, operator: str) -> Any:
    """``state_backend``, or (None) the backend the restored checkpoint was written by; a
    switch from one to the other is logged."""
    found = checkpointed_backend(restored, operator)
    if state_backend is None:
        return found or "heap"
    name = state_backend if isinstance(state_backend, str) else state_backend.name
    family = "rocksdb" if name == "rocksdb" else "heap"
    if found is not None and found != family and restored.metadata.kind != "savepoint":
        log.warning(
            "%s: operator %r was checkpointed by the %s backend (%s); it is restored into the %s "
            "backend, converted key group by key group",
            restored.url,
            operator,
            found,
            restored.directory,
            family,
            extra={STREAMSTATE_EVENT: BACKEND_SWITCH},
        )
    return state_backend


def resolve_execution_mode(mode: str, streaming: bool, initial_state: str | None) -> str:
    """``"batch"`` or ``"streaming"`` for ``execution_mode=mode`` (Flink's runtime mode):
    ``automatic`` is batch for a static DataFrame (a bounded input) that does not start from
    ``initial_state``, streaming otherwise.

    >>> [resolve_execution_mode("automatic", streaming, None) for streaming in (False, True)]
    ['batch', 'streaming']
    """
    if mode not in EXECUTION_MODES:
        raise ValueError(
            f"execution_mode must be one of {', '.join(map(repr, EXECUTION_MODES))}, got {mode!r}"
        )
    if streaming:
        if mode == "batch":
            raise ValueError(
                "execution_mode='batch' needs a bounded input (a static DataFrame): a streaming "
                "DataFrame never ends, so its keys never finish (Flink refuses BATCH for "
                "unbounded sources too)"
            )
        return "streaming"
    if mode == "automatic":
        return "streaming" if initial_state else "batch"
    if mode == "batch" and initial_state:
        raise ValueError(
            "execution_mode='batch' starts from no state (one key's state at a time, built from "
            "the input); initial_state= needs execution_mode='streaming'"
        )
    return mode


def _absolute(url: str) -> str:
    return url if "://" in url else os.path.abspath(url)


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
    """Run ``function`` keyed by ``key`` over ``df``, with its state kept by streamstate.

    Records are routed by key group (Flink's assignment) to ``parallelism`` subtasks; each
    reaches ``function.process_element(row, ctx)`` as a :class:`~streamstate.spark.records.Row`.
    Outputs (tuples, dicts or Rows) form a DataFrame of ``output_schema``.

    * static ``df`` (batch mode): returns a DataFrame. Event-time timers and windows fire at the
      end of the input (in batch execution: at the end of each key's records). With
      ``savepoint=`` (a path or URL) the job runs at once, writes the final state there as a
      savepoint (a streaming query can start from it with
      ``initial_state=``) and returns its outputs.
    * streaming ``df``: returns a :class:`~streamstate.spark.driver.streaming.KeyedStream`; start it
      with ``.write_stream(sink, ...)``. ``checkpoint`` (a path or URL) is required: the state's
      checkpoints, staged outputs and Spark's own streaming checkpoint live there.

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
        event_time: a timestamp (or long milliseconds) column giving each record's event time.
        watermark_delay: bounded out-of-orderness (ms or timedelta); the watermark of a batch is
            the largest event time of the earlier batches minus the delay (minus 1 ms).
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
        execution_mode: ``"automatic"`` (default: batch for a static DataFrame, streaming for
            a streaming one or with ``initial_state=``), ``"batch"`` (each subtask's records
            sorted by key, one key's state in memory at a time, a key's timers fired when its
            records end: Flink's BATCH runtime) or ``"streaming"`` (every key's state in
            ``state_backend`` until the input ends). With ``"automatic"``, a window aggregate
            that is folded before the shuffle (``pre_aggregate``) runs its folded rows through
            the streaming operator; ``"batch"`` never folds. See docs/spark/batch.md.
        pre_aggregate: fold a window aggregate (``window(...).aggregate(...)``/``.reduce(...)``)
            per key and window before the shuffle (SPEC §13.2; a built-in aggregate such as
            ``count()`` in Spark SQL's own partial aggregation). None (default): wherever the
            outputs are those of the per-record path; True: also where only intermediate
            firings can differ (allowed lateness: one late firing per window per micro-batch;
            ``ContinuousEventTimeTrigger``), and ``PreAggregationError`` where it cannot run
            (evictors, count or delta triggers, ``process``/``apply``, session windows);
            False: never.
    """
    from pyspark.sql.types import StructType

    if not isinstance(function, KeyedProcessFunction):
        raise TypeError(
            f"function must be a KeyedProcessFunction instance, got {type(function).__name__}"
        )
    key_columns = [key] if isinstance(key, str) else list(key)
    if not key_columns:
        raise ValueError("key must name at least one column")
    for c in [*key_columns, *([event_time] if event_time else [])]:
        if c not in df.columns:
            raise ValueError(f"column {c!r} is not in the input (columns: {df.columns})")
    spark = df.sparkSession
    struct = parse_ddl(spark, output_schema) if isinstance(output_schema, str) else output_schema
    if not isinstance(struct, StructType):
        raise TypeError(
            f"output_schema must be a StructType or a DDL string, got {output_schema!r}"
        )
    streaming = df.isStreaming
    mode = resolve_execution_mode(execution_mode, streaming, initial_state)
    side_structs = _side_output_structs(
        side_outputs, struct_type=StructType, parse=lambda ddl: parse_ddl(spark, ddl)
    )
    if side_structs and not streaming:
        raise ValueError(
            "side_outputs= is for streaming queries (delivered to write_stream's side_sinks=); "
            "in batch mode nothing is late, and other side outputs are not exposed"
        )
    if streaming and checkpoint is None:
        raise ValueError("a streaming keyed_process needs checkpoint= (a directory path or URL)")
    if streaming and savepoint is not None:
        raise ValueError("savepoint= is for batch mode; a streaming query checkpoints instead")
    checkpoint = _absolute(checkpoint) if checkpoint else None
    initial_state = _absolute(initial_state) if initial_state else None
    latest = _latest_checkpoint(checkpoint, storage_options or {})
    # what the job restores: its latest checkpoint, else (streaming) the initial state
    restored = latest
    if restored is None and streaming:
        restored = _initial_checkpoint(initial_state, storage_options or {})
    op = None if latest is None else latest.metadata.operators.get(operator_name)
    found = None if op is None else (op.parallelism, op.max_parallelism)
    if found is not None:
        if max_parallelism is not None and max_parallelism != found[1]:
            raise MaxParallelismMismatchError(
                f"{checkpoint} holds operator {operator_name!r} with max_parallelism={found[1]}; "
                f"it cannot restart with max_parallelism={max_parallelism} (the number of key "
                "groups is fixed for the life of a job)"
            )
        max_parallelism = found[1]
        parallelism = parallelism or found[0]
    parallelism = parallelism or default_parallelism(df.sparkSession)
    max_parallelism = max_parallelism or compute_default_max_parallelism(parallelism)
    if not 1 <= parallelism <= max_parallelism:
        raise ValueError(
            f"parallelism must be between 1 and max_parallelism={max_parallelism}, got "
            f"{parallelism}"
        )
    backend, backend_options = _backend_name(
        _follow_backend(state_backend, restored, operator_name)
    )
    if mode == "batch" and execution_mode == "batch":
        if pre_aggregate:
            raise ValueError(
                "pre_aggregate=True folds records before the shuffle, and "
                "execution_mode='batch' runs each key's sorted records through one key's state: "
                "choose one (execution_mode='automatic' folds a window aggregate wherever it can)"
            )
        pre_aggregation = None
    else:
        function, pre_aggregation = plan_pre_aggregation(
            df,
            function,
            pre_aggregate,
            key_columns=key_columns,
            event_time=event_time,
            streaming=streaming,
        )
        if pre_aggregation is not None and mode == "batch":
            # automatic: the folded rows (one per key and window of a partition) are few; they
            # go through the operator as in streaming execution, as Flink's combiner's would
            mode = "streaming"
    options = KeyedOptions(
        df=df,
        key_columns=key_columns,
        function=function,
        output_struct=struct,
        parallelism=parallelism,
        max_parallelism=max_parallelism,
        state_backend=backend,
        state_backend_options=backend_options,
        checkpoint=checkpoint,
        event_time=event_time,
        watermark_delay=_ms(watermark_delay, "watermark_delay"),
        operator_name=operator_name,
        storage_options=dict(storage_options or {}),
        initial_state=initial_state,
        max_deltas=max_deltas,
        retained_checkpoints=retained_checkpoints,
        host_idle_timeout=host_idle_timeout,
        adaptive=adaptive,
        side_output_structs=side_structs,
        execution_mode=mode,
        pre_aggregation=pre_aggregation,
    )
    ensure_worker_path(df.sparkSession)
    register(df.sparkSession)  # the state formats, to read what the job checkpoints
    check_before_first_job(options, restored)
    if streaming:
        return KeyedStream(options)
    result = run_bounded(options, savepoint=_absolute(savepoint) if savepoint else None)
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


def _side_output_structs(
    side_outputs: dict[Any, Any] | None, struct_type: Any, parse: Any = None
) -> dict[str, Any]:
    """``{OutputTag or tag id: StructType or DDL}`` -> ``{tag id: StructType}``."""
    from streamstate.api.functions import OutputTag

    out: dict[str, Any] = {}
    for tag, schema in (side_outputs or {}).items():
        if isinstance(tag, OutputTag):
            tag_id = tag.tag_id
        elif isinstance(tag, str) and tag:
            tag_id = tag
        else:
            raise TypeError(f"side_outputs keys must be OutputTags, got {tag!r}")
        if isinstance(schema, str):
            struct = parse(schema) if parse is not None else struct_type.fromDDL(schema)
        else:
            struct = schema
        if not isinstance(struct, struct_type):
            raise TypeError(
                f"the schema of side output {tag_id!r} must be a StructType or a DDL string, "
                f"got {schema!r}"
            )
        out[tag_id] = struct
    return out
