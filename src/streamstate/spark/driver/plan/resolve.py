"""What ``keyed_process`` resolves once, before anything runs: its arguments checked against the
input, against the checkpoint the job restores and against each other, into the operator's
:class:`~streamstate.spark.driver.plan.options.KeyedOptions`.

* the input: key and event-time columns, the output and side-output schemas;
* the execution mode (Flink's ``execution.runtime-mode``, :func:`resolve_execution_mode`);
* the parallelism and the number of key groups (a checkpoint's, unless given; the key groups
  can never change);
* the state backend (the checkpoint's, unless given: :func:`checkpointed_backend`);
* whether a window aggregate is folded before the shuffle (SPEC §13.2).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
from typing import Any

from streamstate.api.functions import KeyedProcessFunction
from streamstate.errors import CheckpointNotFoundError, MaxParallelismMismatchError
from streamstate.keygroups import compute_default_max_parallelism
from streamstate.spark.driver.plan.options import KeyedOptions
from streamstate.spark.driver.plan.pre_aggregation import PreAggregationPlan, plan_pre_aggregation
from streamstate.spark.driver.session import default_parallelism, parse_ddl

__all__ = [
    "BACKEND_SWITCH",
    "EXECUTION_MODES",
    "STREAMSTATE_EVENT",
    "KeyedArguments",
    "absolute_url",
    "checkpointed_backend",
    "resolve_execution_mode",
    "resolve_options",
]

#: ``keyed_process(execution_mode=...)``: Flink's ``execution.runtime-mode`` values
EXECUTION_MODES = ("automatic", "batch", "streaming")
#: the log-record attribute naming what a warning reports, for programs that say it their own
#: way (the demo announces a backend switch itself)
STREAMSTATE_EVENT = "streamstate_event"
#: ``STREAMSTATE_EVENT`` of the warning that a checkpoint is restored into another backend
BACKEND_SWITCH = "backend-switch"

log = logging.getLogger(__name__)


@dataclasses.dataclass
class KeyedArguments:
    """What ``keyed_process`` was given, as given (its parameters say what each means)."""

    df: Any
    key: str | list[str]
    function: KeyedProcessFunction[Any, Any]
    output_schema: Any
    parallelism: int | None
    max_parallelism: int | None
    state_backend: Any
    checkpoint: str | None
    event_time: str | None
    watermark_delay: int | datetime.timedelta | None
    savepoint: str | None
    initial_state: str | None
    operator_name: str
    storage_options: dict[str, Any] | None
    max_deltas: int
    retained_checkpoints: int
    host_idle_timeout: float
    adaptive: bool
    side_outputs: dict[Any, Any] | None
    execution_mode: str
    pre_aggregate: bool | None


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


def absolute_url(url: str) -> str:
    """A path made absolute (a URL as it is)."""
    return url if "://" in url else os.path.abspath(url)


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


def resolve_options(args: KeyedArguments) -> tuple[KeyedOptions, Any]:
    """The operator's options from ``keyed_process``'s arguments, and the checkpoint the job
    restores (None: none); raises the error a mistake in them would cause later, at once."""
    df = args.df
    key_columns = _key_columns(args)
    struct, side_structs = _output_structs(args)
    streaming = df.isStreaming
    mode = resolve_execution_mode(args.execution_mode, streaming, args.initial_state)
    _check_streaming_options(args, streaming, side_structs)
    checkpoint = absolute_url(args.checkpoint) if args.checkpoint else None
    initial_state = absolute_url(args.initial_state) if args.initial_state else None
    storage_options = dict(args.storage_options or {})
    latest = _latest_checkpoint(checkpoint, storage_options)
    # what the job restores: its latest checkpoint, else (streaming) the initial state
    restored = latest
    if restored is None and streaming:
        restored = _initial_checkpoint(initial_state, storage_options)
    parallelism, max_parallelism = _parallelism(args, latest, checkpoint)
    backend, backend_options = _backend_name(
        _follow_backend(args.state_backend, restored, args.operator_name)
    )
    function, pre_aggregation, mode = _pre_aggregation(args, key_columns, streaming, mode)
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
        event_time=args.event_time,
        watermark_delay=_ms(args.watermark_delay, "watermark_delay"),
        operator_name=args.operator_name,
        storage_options=storage_options,
        initial_state=initial_state,
        max_deltas=args.max_deltas,
        retained_checkpoints=args.retained_checkpoints,
        host_idle_timeout=args.host_idle_timeout,
        adaptive=args.adaptive,
        side_output_structs=side_structs,
        execution_mode=mode,
        streaming=streaming,
        pre_aggregation=pre_aggregation,
    )
    return options, restored


def _key_columns(args: KeyedArguments) -> list[str]:
    if not isinstance(args.function, KeyedProcessFunction):
        raise TypeError(
            f"function must be a KeyedProcessFunction instance, got {type(args.function).__name__}"
        )
    key = args.key
    key_columns = [key] if isinstance(key, str) else list(key)
    if not key_columns:
        raise ValueError("key must name at least one column")
    for c in [*key_columns, *([args.event_time] if args.event_time else [])]:
        if c not in args.df.columns:
            raise ValueError(f"column {c!r} is not in the input (columns: {args.df.columns})")
    return key_columns


def _output_structs(args: KeyedArguments) -> tuple[Any, dict[str, Any]]:
    """The output schema and each side output's, as StructTypes."""
    from pyspark.sql.types import StructType

    spark = args.df.sparkSession
    schema = args.output_schema
    struct = parse_ddl(spark, schema) if isinstance(schema, str) else schema
    if not isinstance(struct, StructType):
        raise TypeError(f"output_schema must be a StructType or a DDL string, got {schema!r}")
    side_structs = _side_output_structs(
        args.side_outputs, struct_type=StructType, parse=lambda ddl: parse_ddl(spark, ddl)
    )
    return struct, side_structs


def _check_streaming_options(
    args: KeyedArguments, streaming: bool, side_structs: dict[str, Any]
) -> None:
    if side_structs and not streaming:
        raise ValueError(
            "side_outputs= is for streaming queries (delivered to write_stream's side_sinks=); "
            "in batch mode nothing is late, and other side outputs are not exposed"
        )
    if streaming and args.checkpoint is None:
        raise ValueError("a streaming keyed_process needs checkpoint= (a directory path or URL)")
    if streaming and args.savepoint is not None:
        raise ValueError("savepoint= is for batch mode; a streaming query checkpoints instead")


def _parallelism(args: KeyedArguments, latest: Any, checkpoint: str | None) -> tuple[int, int]:
    """(parallelism, max_parallelism): as given, else the latest checkpoint's, else Spark's
    default parallelism and Flink's default number of key groups for it."""
    parallelism, max_parallelism = args.parallelism, args.max_parallelism
    op = None if latest is None else latest.metadata.operators.get(args.operator_name)
    if op is not None:
        if max_parallelism is not None and max_parallelism != op.max_parallelism:
            raise MaxParallelismMismatchError(
                f"{checkpoint} holds operator {args.operator_name!r} with "
                f"max_parallelism={op.max_parallelism}; it cannot restart with "
                f"max_parallelism={max_parallelism} (the number of key groups is fixed for the "
                "life of a job)"
            )
        max_parallelism = op.max_parallelism
        parallelism = parallelism or op.parallelism
    parallelism = parallelism or default_parallelism(args.df.sparkSession)
    max_parallelism = max_parallelism or compute_default_max_parallelism(parallelism)
    if not 1 <= parallelism <= max_parallelism:
        raise ValueError(
            f"parallelism must be between 1 and max_parallelism={max_parallelism}, got "
            f"{parallelism}"
        )
    return parallelism, max_parallelism


def _pre_aggregation(
    args: KeyedArguments, key_columns: list[str], streaming: bool, mode: str
) -> tuple[KeyedProcessFunction[Any, Any], PreAggregationPlan | None, str]:
    """(function, how it is folded before the shuffle or None, execution mode)."""
    if mode == "batch" and args.execution_mode == "batch":
        if args.pre_aggregate:
            raise ValueError(
                "pre_aggregate=True folds records before the shuffle, and "
                "execution_mode='batch' runs each key's sorted records through one key's state: "
                "choose one (execution_mode='automatic' folds a window aggregate wherever it can)"
            )
        return args.function, None, mode
    function, pre_aggregation = plan_pre_aggregation(
        args.df,
        args.function,
        args.pre_aggregate,
        key_columns=key_columns,
        event_time=args.event_time,
        streaming=streaming,
    )
    if pre_aggregation is not None and mode == "batch":
        # automatic: the folded rows (one per key and window of a partition) are few; they
        # go through the operator as in streaming execution, as Flink's combiner's would
        mode = "streaming"
    return function, pre_aggregation, mode
