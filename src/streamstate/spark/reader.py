"""Reading state out of a checkpoint or savepoint as a Spark DataFrame.

Like Flink's State Processor API (and Spark's ``statestore`` data source):
``read_state(spark, path, operator=..., state=...)`` returns one row per ``(key, namespace)``
entry of one state, with columns ``key``, ``namespace`` and ``value``. One Spark task reads the
key-group range of one checkpointed subtask (its full snapshot and deltas), so the read is
distributed like the job that wrote it.

Types: keys and values of built-in serializers become Spark types (``long``, ``double``,
``boolean``, ``string``, ``binary``, arrays of them, maps of them, structs ``_1, _2, ...`` for
tuples); anything else (records, pickled values, TTL-wrapped values) becomes a JSON string.
``namespace`` is null for the default namespace and a JSON string otherwise (a window is
``{"start": ..., "end": ...}``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec

__all__ = ["read_state", "spark_type_of"]

_SCALARS = {
    "int64": "long",
    "float64": "double",
    "bool": "boolean",
    "str": "string",
    "bytes": "binary",
}


def spark_type_of(snap: Any) -> str | None:
    """The Spark DDL type for values of a serializer snapshot, or None (JSON instead).

    >>> spark_type_of({"type": "list", "element": {"type": "str"}})
    'array<string>'
    >>> spark_type_of({"type": "struct", "class": "app:Order"}) is None
    True
    """
    if not isinstance(snap, dict):
        return None
    t = snap.get("type")
    if t in _SCALARS:
        return _SCALARS[t]
    if t == "optional":
        return spark_type_of(snap.get("inner"))
    if t == "list":
        inner = spark_type_of(snap.get("element"))
        return None if inner is None else f"array<{inner}>"
    if t == "dict":
        k, v = spark_type_of(snap.get("key")), spark_type_of(snap.get("value"))
        return None if k is None or v is None else f"map<{k},{v}>"
    if t == "tuple":
        fields = [spark_type_of(f) for f in snap.get("fields", ())]
        if not fields or any(f is None for f in fields):
            return None
        return "struct<" + ",".join(f"_{i + 1}:{f}" for i, f in enumerate(fields)) + ">"
    return None


def _json(value: Any) -> str:
    try:
        return msgspec.json.encode(value, enc_hook=_enc_hook).decode()
    except (TypeError, msgspec.EncodeError):
        return repr(value)


def _enc_hook(value: Any) -> Any:
    for attrs in (("start", "end"),):
        if all(hasattr(value, a) for a in attrs):
            return {a: getattr(value, a) for a in attrs}
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    raise TypeError(f"cannot encode {type(value).__name__}")


def _to_spark(value: Any, ddl: str | None) -> Any:
    if ddl is None:
        return _json(value)
    if ddl.startswith("struct<") and isinstance(value, tuple):
        return {f"_{i + 1}": v for i, v in enumerate(value)}
    return value


def _read_subtask(
    checkpoint_url: str,
    directory: str,
    operator: str,
    subtask: int,
    state: str,
    key_ddl: str | None,
    value_ddl: str | None,
    storage_options: dict[str, Any],
) -> Iterator[dict[str, Any]]:
    """Rows of ``state`` in the key groups of old subtask ``subtask``: its files restored into a
    heap backend through the public restore path, read back from the backend's snapshot."""
    from streamstate.backends.heap.backend import HeapKeyedStateBackend
    from streamstate.checkpoint.restore import keyed_restore_files, operator_metadata
    from streamstate.checkpoint.storage import FileSystemCheckpointStorage
    from streamstate.format.snapshot import EncodedEntries
    from streamstate.keygroups import KeyGroupRange
    from streamstate.namespace import VoidNamespace
    from streamstate.serializers import serializer_from_snapshot

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
    snapshot = backend.snapshot(0)
    try:
        index = next((i for i, m in enumerate(snapshot.states) if m.name == state), None)
        if index is None:
            return
        for kg in kg_range:
            for i, entries in snapshot.key_group_entries(kg):
                if i != index:
                    continue
                if isinstance(entries, EncodedEntries):  # a serializer that is not built in
                    rows: Any = _raw_entries(entries, key_serializer)
                    ddl = None
                else:
                    rows, ddl = entries, value_ddl
                for key, namespace, value in rows:
                    yield {
                        "key": _to_spark(key, key_ddl),
                        "namespace": None
                        if isinstance(namespace, VoidNamespace)
                        else _json(namespace),
                        "value": _to_spark(value, ddl),
                    }
    finally:
        snapshot.release()
        backend.dispose()


def _raw_entries(block: Any, key_serializer: Any) -> Iterator[tuple[Any, Any, Any]]:
    """Entries of a state whose serializer is not built in: values decoded generically."""
    from streamstate.namespace import VOID_NAMESPACE

    section = msgspec.msgpack.Decoder(
        tuple[list[msgspec.Raw], list[msgspec.Raw], list[msgspec.Raw]]
    )
    generic = msgspec.msgpack.Decoder()
    key_decoder = msgspec.msgpack.Decoder(key_serializer.wire_type)
    keys, namespaces, states = section.decode(block.data)
    if len(namespaces) == 1 and len(keys) != 1:
        namespaces = namespaces * len(keys)
    for k, ns, s in zip(keys, namespaces, states, strict=True):
        namespace = generic.decode(ns)
        yield (
            key_serializer.from_wire(key_decoder.decode(k)),
            VOID_NAMESPACE if namespace in (None, [], {}) else namespace,
            generic.decode(s),
        )


def read_state(
    spark: Any,
    path: str,
    *,
    state: str,
    operator: str = "keyed-process",
    storage_options: dict[str, Any] | None = None,
) -> Any:
    """The entries of keyed state ``state`` of ``operator`` as a DataFrame ``(key, namespace,
    value)``.

    ``path`` names a job's checkpoint directory (its latest complete checkpoint is read), a
    ``chk-<id>`` directory, or a savepoint directory.
    """
    from streamstate.checkpoint.restore import keyed_file_restore, operator_metadata
    from streamstate.checkpoint.storage import open_location
    from streamstate.errors import CheckpointError
    from streamstate.spark.keyed import ensure_worker_path

    ensure_worker_path(spark)

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
            f"{cp.url} has no keyed state {state!r} in operator {operator!r} "
            f"(its states: {[n for n in names if not n.startswith('_timers.')]})"
        )
    key_ddl = spark_type_of(op.key_serializer)
    value_ddl = None if meta.ttl else spark_type_of(meta.state_serializer)
    schema = f"key {key_ddl or 'string'}, namespace string, value {value_ddl or 'string'}"
    url = storage.url_of("")
    target = cp.directory
    options = dict(storage_options or {})  # the executors open the storage themselves
    n = len(op.subtasks)

    # one row per old subtask, one partition each: DataFrame APIs only (no sparkContext, no
    # RDD), so that a Spark Connect session reads state the same way as a classic one
    from pyspark.sql.pandas.types import to_arrow_schema

    struct = spark.createDataFrame([], schema).schema
    arrow_schema = to_arrow_schema(struct)

    def read(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for batch in batches:
            for i in batch.column(0).to_pylist():
                rows = list(
                    _read_subtask(url, target, operator, i, state, key_ddl, value_ddl, options)
                )
                yield pa.RecordBatch.from_pylist(rows, schema=arrow_schema)

    return spark.range(0, n, 1, n).mapInArrow(read, struct)


def sub_range(sub: Any) -> Any:
    from streamstate.keygroups import KeyGroupRange

    return KeyGroupRange(*sub.key_group_range)


def _abspath(path: str) -> str:
    import os

    return os.path.abspath(path)
