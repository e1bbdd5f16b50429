"""What ``keyed_process`` checks on the driver before the first Spark job (SPEC §12, §14.1).

Without these checks a mistake is found by an executor, seconds into the job, in a task
that Spark then retries: a key column of a type without a stable hash, an output column Arrow
cannot carry, a state type streamstate cannot serialize, a state declared differently from
the checkpoint it restores. :func:`check_before_first_job` finds each of them on the driver and
raises the error the executor would have raised, naming the column or the state:

* the key columns' types (:class:`~streamstate.errors.UnsupportedKeyTypeError`), and against the
  key type of the checkpoint the job restores (a
  :class:`~streamstate.errors.StateMigrationException` naming both types: keys decide key
  groups, so the key type never migrates);
* a checkpoint whose keys are not where this job looks for them
  (:class:`~streamstate.errors.KeyGroupPlacementError`, :mod:`streamstate.checkpoint.placement`:
  an integer key that a Spark job before key group placement 2 put in one key group);
* every output and side-output column (an ``OutputSchemaError`` for a type Spark cannot pass
  through Arrow, e.g. an interval);
* the function's states: a copy of the function is opened once on the driver, on an empty heap
  backend that knows the state declarations of the checkpoint the job restores (its latest
  checkpoint, else ``initial_state``), then closed. Every descriptor it creates is checked as
  on an executor, under the rules of schema evolution: a type without a serializer raises
  :class:`~streamstate.errors.UnsupportedStateTypeError`, a state declared with another kind,
  or a type its checkpointed values cannot migrate to, raises
  :class:`~streamstate.errors.StateMigrationException` with both declarations and the remedies
  (a state renamed with its ``previous_name`` is checked under its old name). Only
  streamstate's errors are raised here: an ``open()`` that fails on the driver for its own
  reasons (a resource only the executors reach) is logged and left to the executors.
* the checkpointed states the opened function does not declare: one
  :class:`~streamstate.errors.UndeclaredStateWarning` naming each with its entries (counted
  from the checkpoint's files, for those states only).

All of this runs when ``keyed_process`` is called, before the query starts, whether or not
input is waiting. States a function creates later than ``open()`` (in ``process_element``) are
checked when they are created, on the executors, as before (and may be reported as undeclared
here).
"""

from __future__ import annotations

import logging
from typing import Any

from streamstate.checkpoint.placement import check_placement
from streamstate.errors import OutputSchemaError, StreamStateError
from streamstate.runtime.undeclared import merge_counts, warn_undeclared_states

__all__ = ["check_before_first_job", "check_output_schema"]

log = logging.getLogger(__name__)


def check_output_schema(struct: Any, what: str = "output") -> None:
    """Raise :class:`OutputSchemaError` naming the first column of ``struct`` (a Spark
    ``StructType``) that Spark cannot pass through Arrow, or that streamstate cannot build."""
    from pyspark.sql.pandas.types import to_arrow_type

    from streamstate.spark.records import OutputConverter

    for field in struct.fields:
        try:
            arrow_type = to_arrow_type(field.dataType)
            import pyarrow as pa

            OutputConverter(pa.schema([pa.field(field.name, arrow_type)]))
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise OutputSchemaError(
                f"{what} column {field.name!r} has type {field.dataType.simpleString()}, which "
                f"a keyed function cannot produce through Arrow ({first}); declare another "
                "type (a long for an interval, a string, ...)"
            ) from None


def check_before_first_job(options: Any, restored: Any = None) -> None:
    """Check ``options`` (``keyed_process``'s resolved options) as the module docstring says;
    ``restored`` is the completed checkpoint (or savepoint) the job restores, if any."""
    from streamstate.backends.base import check_key_type
    from streamstate.spark.job import key_serializer_for

    check_output_schema(options.output_struct)
    for tag, struct in options.side_output_structs.items():
        check_output_schema(struct, f"side output {tag!r}")
    input_schema, _ = options.arrow_schemas()
    key_serializer = key_serializer_for(input_schema, options.key_columns)
    columns = ", ".join(repr(c) for c in options.key_columns)
    if restored is not None:
        check_placement(restored, options.operator_name, f"this job (key {columns})")
    declared, key_snapshot = _restored_declarations(options, restored)
    if key_snapshot is not None:
        check_key_type(
            key_snapshot,
            key_serializer,
            f"key column{'s' if len(options.key_columns) > 1 else ''} {columns}; "
            f"checkpoint {restored.url}",
        )
    undeclared = _open_function(options, key_serializer, declared)
    if undeclared:
        warn_undeclared_states(
            options.operator_name, _entries_of(restored, options.operator_name, undeclared)
        )


def _state_declarations(options: Any, restored: Any) -> list[Any]:
    """What ``restored`` says about each keyed state of the operator (timers aside)."""
    return _restored_declarations(options, restored)[0]


def _restored_declarations(options: Any, restored: Any) -> tuple[list[Any], Any]:
    """What ``restored`` says about each keyed state of the operator (timers aside): the state
    meta data of every subtask's first keyed file (a snapshot's header, a RocksDB manifest);
    and the snapshot of its key serializer (None without a checkpoint)."""
    if restored is None:
        return [], None
    from streamstate.checkpoint.restore import keyed_file_restore
    from streamstate.keygroups import KeyGroupRange

    op = restored.metadata.operators.get(options.operator_name)
    if op is None:
        return [], None
    found: dict[str, Any] = {}
    key_snapshot = op.key_serializer
    for sub in op.subtasks:
        if not sub.keyed:
            continue
        kg_range = KeyGroupRange(*sub.key_group_range)
        reader = keyed_file_restore(restored, list(sub.keyed), kg_range)[0]
        try:
            if key_snapshot is None:
                key_snapshot = reader.key_serializer or None
            for meta in reader.states:
                if meta.kind != "timer":
                    found.setdefault(meta.name, meta)
        finally:
            reader.close()
    return list(found.values()), key_snapshot


def _open_function(options: Any, key_serializer: Any, declared: list[Any]) -> list[str]:
    """Open and close a copy of the function, as subtask 0 on an empty heap backend that
    knows the checkpoint's ``declared`` states; returns those it does not declare."""
    import cloudpickle

    from streamstate.backends.heap.factory import HeapStateBackend
    from streamstate.runtime.operator import KeyedProcessOperator
    from streamstate.spark.job import pickle_function

    # as an executor gets it, its classes carried by value copies of the user's, which the
    # check leaves as it found them (msgspec caches what it learns in a class it inspects)
    function = cloudpickle.loads(pickle_function(options.function, detached=True))
    op = KeyedProcessOperator(
        function,
        key_serializer,
        operator_name=options.operator_name,
        subtask_index=0,
        parallelism=options.parallelism,
        max_parallelism=options.max_parallelism,
        state_backend=HeapStateBackend(),
    )
    undeclared: list[str] = []
    try:
        for meta in declared:
            op.keyed_backend.add_restored_meta(meta)
        op.open()
        undeclared = list(op.keyed_backend.undeclared_states())
    except StreamStateError:
        raise
    except Exception as exc:  # the function's own open() on the driver: the executors decide
        log.info(
            "keyed_process could not open %s on the driver to check its states (%r); the "
            "executors check them when they open it",
            type(options.function).__name__,
            exc,
        )
    finally:
        op.dispose()
    return undeclared


def _entries_of(restored: Any, operator: str, names: list[str]) -> dict[str, int | None]:
    """The entries of the keyed states ``names`` in ``restored`` (one per key and namespace),
    read from the checkpoint's files for those states only (a restore of them, still encoded,
    into a heap backend per old subtask: no user class is needed)."""
    from streamstate.backends.base import RestoreInput
    from streamstate.backends.heap.backend import HeapKeyedStateBackend
    from streamstate.checkpoint.restore import keyed_file_restore
    from streamstate.keygroups import KeyGroupRange
    from streamstate.serializers import serializer_from_snapshot

    op = restored.metadata.operators[operator]
    counts: list[dict[str, int | None]] = []
    for sub in op.subtasks:
        if not sub.keyed:
            continue
        kg_range = KeyGroupRange(*sub.key_group_range)
        files = keyed_file_restore(restored, list(sub.keyed), kg_range)
        try:
            for f in files:
                f.only_states = set(names)
            key_snapshot = op.key_serializer or files[0].key_serializer
            backend = HeapKeyedStateBackend(
                serializer_from_snapshot(key_snapshot), op.max_parallelism, kg_range
            )
            try:
                backend.restore(RestoreInput(files))
                counts.append(backend.undeclared_states())
            except StreamStateError as exc:  # counting must not stop the job: say so instead
                log.info("the entries of %s were not counted: %s", names, exc)
                counts.append(dict.fromkeys(names))
            finally:
                backend.dispose()
        finally:
            for f in files:
                f.close()
    return merge_counts(counts)
