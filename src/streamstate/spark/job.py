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
    "KEY_GROUP_COLUMN",
    "JobSpec",
    "arrow_schema_from_bytes",
    "arrow_schema_to_bytes",
    "key_serializer_for",
    "load_function",
    "pickle_function",
]

FUNCTIONS_DIR = "functions"
#: the column the driver adds to every record: the key group of its key (Spark partitions by it)
KEY_GROUP_COLUMN = "_kg"


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
    #: Arrow IPC bytes of the task input schema (value columns + ``_kg``; pre-aggregated:
    #: the rows of :mod:`streamstate.spark.partials`)
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
    #: the records arrive folded per (key, window) before the shuffle (SPEC §13.2): "sql"
    #: (a built-in aggregate, Spark's partial aggregation) or "python"; "" per record
    pre_aggregation: str = ""

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


def _referenced_modules(root: Any, limit: int = 10_000) -> list[str]:
    """The modules of the classes and functions reachable from ``root`` through attributes,
    slots, containers and closures: a window operator holds the user's window, reduce and
    aggregate functions, whose modules are not the operator's."""
    modules: list[str] = []
    seen: set[int] = set()
    stack = [root]
    while stack and len(seen) < limit:
        obj = stack.pop()
        if id(obj) in seen or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
            continue
        seen.add(id(obj))
        if isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
            continue
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
            continue
        if isinstance(obj, types.FunctionType):
            modules.append(obj.__module__)
            stack.extend(c.cell_contents for c in obj.__closure__ or () if _cell_filled(c))
            stack.extend(obj.__defaults__ or ())
            continue
        if isinstance(obj, types.MethodType):
            stack.append(obj.__func__)
            stack.append(obj.__self__)
            continue
        if isinstance(obj, (types.ModuleType, types.BuiltinFunctionType)):
            continue
        cls = obj if isinstance(obj, type) else type(obj)
        modules.extend(c.__module__ for c in cls.__mro__)
        if isinstance(obj, type):
            continue
        stack.extend(getattr(obj, "__dict__", {}).values())
        for c in cls.__mro__:
            slots = getattr(c, "__slots__", ())
            stack.extend(
                getattr(obj, slot, None)
                for slot in ((slots,) if isinstance(slots, str) else slots)
                if slot not in ("__dict__", "__weakref__")
            )
    return modules


def _cell_filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def pickle_function(function: Any, *, detached: bool = False) -> bytes:
    """cloudpickle ``function``; classes and functions of modules that are not installed
    packages (a notebook's helper module, a test module) travel by value, so that executors and
    state hosts need not import them — also those the function only refers to, such as a
    window operator's window function. Record classes carried by value arrive whole, and
    ``detached`` makes them new classes even when loaded in this process
    (:mod:`streamstate.serializers.class_pickling`)."""
    import cloudpickle

    from streamstate.serializers.class_pickling import dumps

    registered: list[str] = []
    for name in _referenced_modules(function):
        if name and _by_value(name) and name in sys.modules and name not in registered:
            try:
                cloudpickle.register_pickle_by_value(sys.modules[name])
            except ValueError:
                continue
            registered.append(name)
    try:
        return dumps(function, detached=detached)
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
    # this file is <src>/streamstate/spark/job.py
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
