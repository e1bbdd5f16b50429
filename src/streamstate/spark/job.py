"""What the driver, the Spark tasks and the state hosts agree on about one keyed operator.

A :class:`JobSpec` is plain data (a ``msgspec.Struct``): it travels in the ``mapInArrow``
closure of every micro-batch (a few hundred bytes) and in the BEGIN message to a state host.
Large things travel by reference: the user function is pickled once per query run into
``<checkpoint>/functions/<sha256>.pkl`` and loaded by a host only when its digest changes.
"""

from __future__ import annotations

import hashlib
import os
import sys
import types
from typing import Any

import msgspec

from streamstate.errors import UnsupportedKeyTypeError

__all__ = [
    "FUNCTIONS_DIR",
    "JobSpec",
    "arrow_schema_from_bytes",
    "arrow_schema_to_bytes",
    "key_serializer_for",
    "load_function",
    "pickle_function",
]

FUNCTIONS_DIR = "functions"


class JobSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One keyed operator of one query: placement, schemas, state backend, checkpoint location."""

    #: operator name (names its files in checkpoints)
    operator: str
    parallelism: int
    max_parallelism: int
    #: key column(s); several columns make a tuple key
    key_columns: list[str]
    #: columns of the records the function sees (the input minus the key-group column)
    value_columns: list[str]
    #: Arrow IPC bytes of the task input schema (value columns + ``_kg``)
    input_schema: bytes
    #: Arrow IPC bytes of the output schema
    output_schema: bytes
    #: event-time column (timestamp, or long milliseconds) or None
    event_time: str | None = None
    #: "heap" or "rocksdb"
    state_backend: str = "heap"
    #: backend options (dataclass fields of the backend)
    state_backend_options: dict[str, Any] = {}
    #: checkpoint job directory (path or URL; "" in batch mode without savepoint)
    checkpoint_url: str = ""
    storage_options: dict[str, Any] = {}
    #: incremental checkpoints: deltas after a full snapshot; a new full one after this many
    max_deltas: int = 16
    compression: str = "lz4"
    #: the pickled function, relative to ``checkpoint_url`` (or absolute), and its sha256
    function_path: str = ""
    function_sha: str = ""
    #: savepoint or checkpoint the first batch starts from when no checkpoint exists yet
    initial_state: str | None = None
    #: side-output tag id -> Arrow IPC bytes of its schema (the side outputs delivered)
    side_outputs: dict[str, bytes] = {}

    @property
    def identity(self) -> str:
        """What a state host must match to keep its state: everything but the function."""
        return hashlib.sha1(
            msgspec.msgpack.encode(msgspec.structs.replace(self, function_path=""))
        ).hexdigest()


def arrow_schema_to_bytes(schema: Any) -> bytes:
    return bytes(schema.serialize())


def arrow_schema_from_bytes(data: bytes) -> Any:
    import pyarrow as pa

    return pa.ipc.read_schema(pa.py_buffer(data))


def key_serializer_for(schema: Any, key_columns: list[str]) -> Any:
    """The key serializer for key columns of an Arrow schema (a tuple serializer for several)."""
    import pyarrow as pa

    from streamstate.serializers import (
        BoolSerializer,
        BytesSerializer,
        Float64Serializer,
        Int64Serializer,
        StrSerializer,
        TupleSerializer,
    )

    def one(name: str) -> Any:
        t = schema.field(name).type
        if pa.types.is_integer(t):
            return Int64Serializer()
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            return StrSerializer()
        if pa.types.is_boolean(t):
            return BoolSerializer()
        if pa.types.is_floating(t):
            return Float64Serializer()
        if pa.types.is_binary(t) or pa.types.is_large_binary(t):
            return BytesSerializer()
        raise UnsupportedKeyTypeError(
            f"key column {name!r} has type {t}; keys must be integers, strings, booleans, "
            "floats or binary (cast the column, e.g. a timestamp to long)"
        )

    if len(key_columns) == 1:
        return one(key_columns[0])
    return TupleSerializer(*(one(c) for c in key_columns))


def _by_value(module_name: str) -> bool:
    """Whether functions of this module must travel by value (hosts cannot import it)."""
    if module_name in ("__main__", "__mp_main__"):
        return False  # cloudpickle pickles __main__ by value anyway
    top = module_name.partition(".")[0]
    if top in ("streamstate", "pyspark") or top in sys.stdlib_module_names:
        return False
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None) or ""
    return not any(marker in path for marker in ("site-packages", "dist-packages"))


_SCALARS = (str, bytes, int, float, bool, type(None))


def _modules_of(function: Any, limit: int = 10_000) -> list[str]:
    """The modules of the classes and functions reachable from ``function`` through attributes
    and containers: a window operator holds the user's window, reduce or aggregate function,
    trigger and evictor, whose modules must travel by value too."""
    names: list[str] = []
    seen: set[int] = set()
    todo = [function]
    while todo and len(seen) < limit:
        obj = todo.pop()
        if isinstance(obj, _SCALARS) or id(obj) in seen or isinstance(obj, types.ModuleType):
            continue
        seen.add(id(obj))
        if isinstance(obj, type):
            names.extend(c.__module__ for c in obj.__mro__)
            continue
        if isinstance(obj, (types.FunctionType, types.MethodType)):
            names.append(getattr(obj, "__module__", None) or "")
            todo.append(getattr(obj, "__self__", None))
            continue
        names.extend(c.__module__ for c in type(obj).__mro__)
        if isinstance(obj, dict):
            todo.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            todo.extend(obj)
        else:
            todo.extend(getattr(obj, "__dict__", {}).values())
            slots = [s for c in type(obj).__mro__ for s in getattr(c, "__slots__", ())]
            todo.extend(getattr(obj, s) for s in slots if isinstance(s, str) and hasattr(obj, s))
    return list(dict.fromkeys(n for n in names if n))


def pickle_function(function: Any) -> bytes:
    """cloudpickle ``function``; classes of modules that are not installed packages (a
    notebook's helper module, a test module) travel by value, so that executors and state
    hosts need not import them."""
    import cloudpickle

    registered: list[str] = []
    for name in _modules_of(function):
        if _by_value(name) and name in sys.modules and name not in registered:
            try:
                cloudpickle.register_pickle_by_value(sys.modules[name])
            except ValueError:
                continue
            registered.append(name)
    try:
        return cloudpickle.dumps(function)  # type: ignore[no-any-return]
    finally:
        for name in registered:
            cloudpickle.unregister_pickle_by_value(sys.modules[name])


def load_function(blob: bytes, sha: str, where: str) -> Any:
    import cloudpickle

    if hashlib.sha256(blob).hexdigest() != sha:
        raise ValueError(f"function file {where} does not match its sha256 {sha}")
    return cloudpickle.loads(blob)


def src_path() -> str:
    """The directory that holds the ``streamstate`` package (for workers' PYTHONPATH)."""
    import streamstate

    return os.path.dirname(os.path.dirname(os.path.abspath(streamstate.__file__)))
