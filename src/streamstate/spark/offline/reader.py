"""Reading state out of a checkpoint or savepoint as a Spark DataFrame.

Like Flink's State Processor API (and Spark's ``statestore`` data source):
``read_state(spark, path, operator=..., state=...)`` returns one row per ``(key, namespace)``
entry of one state (or one row per timer of a timer pseudo-state). One Spark task reads the
key-group range of one checkpointed subtask (its full snapshot and deltas), so the read is
distributed like the job that wrote it. The columns and types of each kind of state, TTL and
timers included, are described in :mod:`streamstate.spark.offline.state_rows`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import msgspec

from streamstate.spark.offline.state_rows import TIMER_KIND, StateLayout, spark_type_of

__all__ = ["ReadPlan", "read_state", "spark_type_of"]


def _read_subtask(
    checkpoint_url: str,
    directory: str,
    operator: str,
    subtask: int,
    layout: StateLayout,
    storage_options: dict[str, Any],
) -> Iterator[dict[str, Any]]:
    """Rows of the state ``layout`` describes, in the key groups of old subtask ``subtask``:
    its files restored into a heap backend through the public restore path, read back from the
    backend's snapshot (timers: from the backend's timer queues)."""
    from streamstate.backends.heap.backend import HeapKeyedStateBackend
    from streamstate.checkpoint.restore import keyed_restore_files, operator_metadata
    from streamstate.checkpoint.storage import FileSystemCheckpointStorage
    from streamstate.format.snapshot import EncodedEntries
    from streamstate.keygroups import KeyGroupRange
    from streamstate.serializers import serializer_from_snapshot

    state = layout.name
    storage = FileSystemCheckpointStorage(
        checkpoint_url, "", durable=False, storage_options=storage_options
    )
    cp = storage.load(directory)
    op = operator_metadata(cp, operator)
    handle = op.subtasks[subtask]
    kg_range = KeyGroupRange(*handle.key_group_range)
    key_snapshot = op.key_serializer or handle.key_serializer
    assert key_snapshot is not None, f"{checkpoint_url}: no key serializer for {operator!r}"
    key_serializer = serializer_from_snapshot(key_snapshot)
    # copy-on-write tables: the snapshot read below shares the restored entries, copying none
    backend = HeapKeyedStateBackend(key_serializer, op.max_parallelism, kg_range)
    files = keyed_restore_files(cp, operator, kg_range, op.max_parallelism)
    for f in files:
        f.only_states = {state}  # the other states' serializers do not matter here
    try:
        backend.restore(files)
    finally:
        for f in files:
            f.close()
    if layout.kind == TIMER_KIND:
        try:
            yield from layout.timer_rows(list(_timers(backend, state)))
        finally:
            backend.dispose()
        return
    snapshot = backend.snapshot(0)
    try:
        index = next((i for i, m in enumerate(snapshot.states) if m.name == state), None)
        if index is None:
            return
        stored = _stored_serializer(layout)
        for kg in kg_range:
            for i, entries in snapshot.key_group_entries(kg):
                if i != index:
                    continue
                if isinstance(entries, EncodedEntries):  # kept encoded by the heap backend
                    rows: Any = _raw_entries(entries, key_serializer, stored)
                else:
                    rows = entries
                yield from layout.rows(rows)
    finally:
        snapshot.release()
        backend.dispose()


def _timers(backend: Any, name: str) -> Iterator[tuple[int, Any, Any]]:
    """``(timestamp, key, namespace)`` of the restored timer queue ``name``."""
    queue = backend.timer_queues.get(name)
    if queue is None:
        return
    decode = None
    if not queue.bound:  # a namespace serializer not built in: namespaces decoded generically
        generic = msgspec.msgpack.Decoder()
        decode = generic.decode if queue.encoded_form == "wire" else bytes.hex
    for ts, key, namespace, _ in queue.queue:
        yield ts, key, namespace if decode is None else decode(namespace)


def _stored_serializer(layout: StateLayout) -> Any:
    """The serializer of what a TTL state stores, when every type in it is built in apart from
    TTL's ``(last access, value)`` wrapper (which the heap keeps encoded); else None."""
    from streamstate.format.restore import is_builtin_snapshot
    from streamstate.serializers import serializer_from_snapshot
    from streamstate.spark.offline.state_rows import user_value_snapshot

    snap = layout.stored_snapshot
    if layout.ttl is None or snap is None or not is_builtin_snapshot(user_value_snapshot(snap)):
        return None
    return serializer_from_snapshot(snap)


def _raw_entries(
    block: Any, key_serializer: Any, value_serializer: Any = None
) -> Iterator[tuple[Any, Any, Any]]:
    """Entries of a state the heap backend keeps encoded: values decoded with
    ``value_serializer``, or generically (msgpack) without one."""
    from streamstate.namespace import VOID_NAMESPACE

    section = msgspec.msgpack.Decoder(
        tuple[list[msgspec.Raw], list[msgspec.Raw], list[msgspec.Raw]]
    )
    generic = msgspec.msgpack.Decoder()
    key_decoder = msgspec.msgpack.Decoder(key_serializer.wire_type)
    keys, namespaces, states = section.decode(block.data)
    if len(namespaces) == 1 and len(keys) != 1:
        namespaces = namespaces * len(keys)
    if value_serializer is None:
        values = [generic.decode(s) for s in states]
    else:
        typed = msgspec.msgpack.Decoder(value_serializer.wire_type)
        values = [value_serializer.from_wire(typed.decode(s)) for s in states]
    for k, ns, value in zip(keys, namespaces, values, strict=True):
        namespace = generic.decode(ns)
        yield (
            key_serializer.from_wire(key_decoder.decode(k)),
            VOID_NAMESPACE if namespace in (None, [], {}) else namespace,
            value,
        )


@dataclasses.dataclass(frozen=True)
class ReadPlan:
    """What the tasks of one ``read_state`` read: the checkpoint directory ``directory`` of the
    job at ``url``, the ``subtasks`` checkpointed subtasks of the operator, and how the
    state's entries become rows."""

    url: str
    directory: str
    subtasks: int
    layout: StateLayout


def _plan(
    path: str,
    state: str,
    operator: str,
    storage_options: dict[str, Any] | None,
    include_expired: bool,
    now: int | None,
) -> ReadPlan:
    """Find ``state`` in the checkpoint at ``path`` (its meta data in the first snapshot file
    that holds it); raises :class:`~streamstate.errors.CheckpointError` listing every readable
    name when it is not there."""
    from streamstate.checkpoint.restore import keyed_file_restore, operator_metadata
    from streamstate.checkpoint.storage import open_location
    from streamstate.errors import CheckpointError

    storage, directory = open_location(path if "://" in path else _abspath(path), storage_options)
    cp = storage.load(directory)
    op = operator_metadata(cp, operator)
    meta = None
    for sub in op.subtasks:
        if any(state in handle.states for handle in sub.keyed):
            reader = keyed_file_restore(cp, list(sub.keyed), sub_range(sub))[0]
            try:
                meta = next((s for s in reader.states if s.name == state), None)
            finally:
                reader.close()
        if meta is not None:
            break
    if meta is None:
        names = sorted({n for s in op.subtasks for h in s.keyed for n in h.states})
        raise CheckpointError(
            f"{cp.url} has no keyed state {state!r} in operator {operator!r}; the states it "
            f"holds: {[n for n in names if not n.startswith('_timers.')]}, its timers: "
            f"{[n for n in names if n.startswith('_timers.')]}"
        )
    layout = StateLayout.of(
        {
            "name": meta.name,
            "kind": meta.kind,
            "state_serializer": meta.state_serializer,
            "ttl": meta.ttl,
        },
        op.key_serializer,
        now=time.time_ns() // 1_000_000 if now is None else now,
        include_expired=include_expired,
    )
    return ReadPlan(storage.url_of(""), cp.directory, len(op.subtasks), layout)


def read_state(
    spark: Any,
    path: str,
    *,
    state: str,
    operator: str = "keyed-process",
    storage_options: dict[str, Any] | None = None,
    include_expired: bool = False,
    now: int | None = None,
) -> Any:
    """The entries of keyed state ``state`` of ``operator`` as a DataFrame ``(key, namespace,
    value)``, or the timers of a timer pseudo-state as ``(key, namespace, timestamp,
    time_domain)``.

    Parameters:
        path: a job's checkpoint directory (its latest complete checkpoint is read), a
            ``chk-<id>`` directory, or a savepoint directory.
        state: a state name, or a timer pseudo-state ``_timers.<service>.<event|processing>``
            (a function's own timers are ``_timers.user.event`` and
            ``_timers.user.processing``; ``streamstate checkpoints inspect`` lists them).
        operator: the operator's name (``keyed_process(operator_name=...)``).
        storage_options: fsspec options of the checkpoint storage.
        include_expired: a state with time-to-live: keep the entries expired at ``now`` and add
            a ``last_access`` column (ms; per element for a list, per mapping for a map).
            Without it expired entries are left out, as the function would not read them.
        now: the processing time (ms) against which TTL expiry is judged (default: this
            driver's clock when ``read_state`` is called).

    Column types are described in :mod:`streamstate.spark.offline.state_rows`. An unknown ``state``
    raises :class:`~streamstate.errors.CheckpointError` listing every readable name.
    """
    from streamstate.spark.driver.environment import ensure_worker_path

    ensure_worker_path(spark)
    plan = _plan(path, state, operator, storage_options, include_expired, now)
    url, target, layout, n = plan.url, plan.directory, plan.layout, plan.subtasks
    options = dict(storage_options or {})  # the executors open the storage themselves

    # one row per old subtask, one partition each: DataFrame APIs only (no sparkContext, no
    # RDD), so that a Spark Connect session reads state the same way as a classic one
    from pyspark.sql.pandas.types import to_arrow_schema

    struct = spark.createDataFrame([], layout.schema()).schema
    arrow_schema = to_arrow_schema(struct)

    def read(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for batch in batches:
            for i in batch.column(0).to_pylist():
                rows = list(_read_subtask(url, target, operator, i, layout, options))
                yield pa.RecordBatch.from_pylist(rows, schema=arrow_schema)

    return spark.range(0, n, 1, n).mapInArrow(read, struct)


def sub_range(sub: Any) -> Any:
    from streamstate.keygroups import KeyGroupRange

    return KeyGroupRange(*sub.key_group_range)


def _abspath(path: str) -> str:
    import os

    return os.path.abspath(path)
