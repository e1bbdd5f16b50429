"""``rewrite_savepoint``: a new savepoint from a checkpoint or savepoint, with keyed states
replaced from DataFrames, renamed or dropped, and optionally every state re-keyed (SPEC §14.3).

The remedy of every refused migration (docs: "Upgrading a job"): read the old state
(``read_state``), convert it with DataFrame operations, and write the savepoint in which that
state holds the converted values; every other state, timer and operator state is carried over
unchanged (:mod:`streamstate.checkpoint.rewrite` does the writing). The new job starts from it
with ``keyed_process(..., initial_state=<savepoint>)``, at any parallelism, on either backend.

.. code-block:: python

    from streamstate.spark import read_state, rewrite_savepoint

    old = read_state(spark, "/ck/job", state="last")              # key, namespace, value
    new = old.select("key", "namespace", F.struct(...).alias("value"))
    rewrite_savepoint("/ck/job", "/savepoints/v2",
                      replace={"last": (ValueStateDescriptor("last", LastV2), new)})

The replacing DataFrame has ``read_state``'s columns: ``key``, ``value`` (a list state's value
is its list, a map state's its map; a record is a struct, a dict, or its JSON text), and
optionally ``namespace`` (null for the default one) and ``last_access`` (ms, a state with
time-to-live; without it the entries count as accessed at the rewrite). Its rows are read on
the driver (``toLocalIterator``: a partition at a time) and written by the driver.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import msgspec

__all__ = ["rewrite_savepoint"]


def rewrite_savepoint(
    source: str,
    target: str,
    *,
    operator: str = "keyed-process",
    replace: Mapping[str, tuple[Any, ...]] | None = None,
    rename: Mapping[str, str] | None = None,
    drop: Iterable[str] = (),
    rekey: Callable[[Any], Any] | None = None,
    key_type: Any = None,
    storage_options: dict[str, Any] | None = None,
) -> str:
    """Write a new savepoint at ``target`` from the checkpoint or savepoint ``source``; returns
    its URL.

    Parameters:
        source: a job's checkpoint directory (its latest complete checkpoint), a ``chk-<id>``
            directory or a savepoint directory.
        target: the new savepoint's directory (must not hold a savepoint yet).
        operator: the operator whose keyed state changes (``keyed_process(operator_name=)``).
        replace: checkpointed state name → ``(descriptor, DataFrame)`` or ``(descriptor,
            DataFrame, namespace_type)``: the state as the new code declares it (its name may
            differ: the state is renamed) and its entries (see the module docstring). A name
            the checkpoint does not hold adds a state.
        rename: checkpointed state name → new name (the entries are carried byte for byte).
        drop: checkpointed state names to leave out.
        rekey: a function mapping every old key to its new key; every keyed state and timer of
            the operator moves to its new key's key group. The replacing DataFrames give keys
            of the new type.
        key_type: the new key type (``int``, ``str``, ``tuple[str, int]``, ...; default: the
            checkpoint's), which the new job's key columns must have.
        storage_options: fsspec options of both locations.

    Raises :class:`~streamstate.errors.CheckpointError` naming a state that is not there, a
    name used twice, two keys ``rekey`` sends to one, or a value the new type cannot hold.
    """
    from streamstate.backends.base import stored_serializer
    from streamstate.checkpoint.rewrite import Rekey, ReplacedState
    from streamstate.checkpoint.rewrite import rewrite_savepoint as rewrite
    from streamstate.format.meta import StateMetaInfo
    from streamstate.serializers import serializer_for

    new_keys = None if key_type is None else serializer_for(key_type)
    cp = _source(source, storage_options)
    op = cp.metadata.operators.get(operator)
    if new_keys is None:
        from streamstate.serializers import serializer_from_snapshot

        snap = op.key_serializer if op is not None else None
        new_keys = serializer_from_snapshot(snap) if snap else None
    replaced: dict[str, Any] = {}
    now = time.time_ns() // 1_000_000
    for name, spec in (replace or {}).items():
        descriptor, frame, *rest = spec
        namespace_serializer = _namespace_serializer(rest[0] if rest else None)
        meta = StateMetaInfo(
            descriptor.name,
            descriptor.kind.value,
            namespace_serializer,
            stored_serializer(descriptor),
            descriptor.ttl_config.to_dict() if descriptor.ttl_config is not None else None,
        )
        assert new_keys is not None, f"{source}: no key type for operator {operator!r}"
        entries = _entries(frame, descriptor, new_keys, namespace_serializer, now)
        replaced[name] = ReplacedState(meta, entries)
    rekeyed = None
    if rekey is not None:
        assert new_keys is not None
        rekeyed = Rekey(new_keys, rekey)
    done = rewrite(
        cp,
        target,
        operator=operator,
        replace=replaced,
        rename=rename,
        drop=drop,
        rekey=rekeyed,
        storage_options=storage_options,
    )
    return str(done.url)


def _source(source: str, options: dict[str, Any] | None) -> Any:
    import os

    from streamstate.checkpoint.storage import open_location

    path = source if "://" in source else os.path.abspath(source)
    storage, directory = open_location(path, options)
    return storage.load(directory)


def _namespace_serializer(namespace_type: Any) -> Any:
    from streamstate.serializers import VoidNamespaceSerializer, serializer_for

    return VoidNamespaceSerializer() if namespace_type is None else serializer_for(namespace_type)


def _entries(
    frame: Any, descriptor: Any, key_serializer: Any, namespace_serializer: Any, now: int
) -> Iterator[tuple[Any, Any, Any]]:
    """``(key, namespace, stored value)`` of the DataFrame's rows, read a partition at a time."""
    from streamstate.namespace import VOID_NAMESPACE

    columns = set(frame.columns)
    has_namespace = "namespace" in columns
    has_access = "last_access" in columns
    ttl = descriptor.ttl_config is not None
    kind = descriptor.kind.value
    for row in frame.toLocalIterator():
        key = _typed(row["key"], key_serializer)
        namespace = row["namespace"] if has_namespace else None
        ns = VOID_NAMESPACE if namespace is None else _typed(namespace, namespace_serializer)
        value = _typed(row["value"], descriptor.serializer)
        if ttl:
            access = row["last_access"] if has_access else None
            value = _with_access(kind, value, now if access is None else access)
        yield key, ns, value


def _with_access(kind: str, value: Any, access: Any) -> Any:
    """A TTL state's stored value: every value with its last access (one per element of a
    list, per mapping of a map, when ``access`` gives one each)."""
    if kind == "list":
        stamps = access if isinstance(access, list) else [access] * len(value)
        return [(int(t), v) for t, v in zip(stamps, value, strict=True)]
    if kind == "map":
        return {
            k: (int(access[k] if isinstance(access, dict) else access), v) for k, v in value.items()
        }
    return (int(access), value)


def _typed(value: Any, serializer: Any) -> Any:
    """A Spark value (a Row, list, dict, scalar, or a record's JSON text) as a value of
    ``serializer``."""
    if value is None:
        return None
    wire = serializer.wire_type
    if isinstance(value, str) and not _takes_text(wire):
        built = msgspec.json.decode(value)
    else:
        built = _builtins(value)
    return serializer.from_wire(msgspec.convert(_shaped(built, wire), wire, strict=False))


def _takes_text(wire: Any) -> bool:
    try:
        msgspec.convert("", wire)
    except (msgspec.ValidationError, TypeError):
        return False
    return True


def _builtins(value: Any) -> Any:
    """Rows as dicts, recursively (a tuple's struct ``_1, _2, ...`` as a list)."""
    if hasattr(value, "asDict"):
        value = value.asDict(recursive=True)
    if isinstance(value, dict):
        keys = list(value)
        if keys and keys == [f"_{i + 1}" for i in range(len(keys))]:
            return [_builtins(v) for v in value.values()]
        return {k: _builtins(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_builtins(v) for v in value]
    return value


def _shaped(value: Any, wire: Any) -> Any:
    """A dict for an array-like record (a window's ``{"start": .., "end": ..}``) as its array."""
    if (
        isinstance(value, dict)
        and isinstance(wire, type)
        and issubclass(wire, msgspec.Struct)
        and wire.__struct_config__.array_like
    ):
        return [value.get(f) for f in wire.__struct_fields__]
    return value
