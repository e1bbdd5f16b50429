"""Records in and out of a keyed function on Spark.

In: every input row reaches ``process_element`` as a :class:`Row`, a tuple with the input's
column names (``row.user``, ``row["user"]``, ``row[0]``, ``row.asDict()``), like PySpark's
``Row`` but built from whole Arrow columns at C speed (their values:
:mod:`streamstate.spark.columns`).

Out: a function yields tuples (by position), dicts or rows (by name); :class:`OutputConverter`
turns a subtask's outputs into one Arrow batch of the declared output schema, matching by name
and casting, and raises :class:`~streamstate.errors.OutputSchemaError` naming the column and the
value that does not fit (Spark's ``mapInArrow`` matches by position and fails with JVM errors).

A cast never loses information silently: a dict or Row must give every declared field (``None``
for a null), an integer column takes integral values only (``1.7`` or ``True`` into ``long``
raise, ``2.0`` is taken), every integer must fit its column, an integer into a double column
must be exact (below 2**53), a finite float must not overflow a ``float`` column, a date
column takes dates but no datetimes (whose time of day would be dropped), and a timestamp
column takes ``datetime`` values (naive ones are UTC) but no numbers, whose unit would be a
guess (streamstate's event times are milliseconds, Spark's timestamps microseconds). An array
column takes lists or tuples, a map column dicts or lists of ``(key, value)`` pairs, a struct
column dicts with exactly its fields or tuples by position; their elements are checked like
top-level columns (no fraction into an integer, no string parsed into a number).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import operator
from collections.abc import Iterator, Sequence
from typing import Any

from streamstate.errors import OutputSchemaError
from streamstate.spark.output_columns import column_builder

__all__ = [
    "OutputConverter",
    "Row",
    "record_fields",
    "row_class",
    "row_serializer",
    "rows_from_batch",
]


class Row(tuple):  # type: ignore[type-arg]
    """An input record: a tuple whose fields are also reachable by column name.

    >>> R = row_class(["user", "n"])
    >>> r = R(("ann", 3))
    >>> r.user, r["n"], r[0], r.asDict()
    ('ann', 3, 'ann', {'user': 'ann', 'n': 3})
    >>> r
    Row(user='ann', n=3)
    """

    __slots__ = ()
    _fields: tuple[str, ...] = ()
    _index: dict[str, int] = {}

    def __getitem__(self, item: Any) -> Any:
        if item.__class__ is str:
            try:
                return tuple.__getitem__(self, self._index[item])
            except KeyError:
                raise KeyError(
                    f"the record has no column {item!r} (columns: {list(self._fields)})"
                ) from None
        return tuple.__getitem__(self, item)

    def asDict(self) -> dict[str, Any]:  # noqa: N802 - PySpark's name
        """The record as ``{column: value}``."""
        return dict(zip(self._fields, self, strict=True))

    as_dict = asDict

    def __repr__(self) -> str:
        return (
            "Row(" + ", ".join(f"{n}={v!r}" for n, v in zip(self._fields, self, strict=True)) + ")"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_row, (self._fields, tuple(self)))


def _rebuild_row(fields: tuple[str, ...], values: tuple[Any, ...]) -> Row:
    return row_class(fields)(values)


try:  # the C descriptor behind namedtuple's fields: reads the tuple slot directly
    from collections import _tuplegetter  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - other Pythons
    _tuplegetter = None


def _field(index: int, doc: str) -> Any:
    """The accessor of field ``index``: ``row.user`` is the hot path of every function. An
    ``itemgetter`` property would go through :meth:`Row.__getitem__` (Python, for names) on
    every access; namedtuple's C getter does not (about 6x faster per access here)."""
    if _tuplegetter is not None:
        return _tuplegetter(index, doc)
    return property(operator.itemgetter(index), doc=doc)


@functools.lru_cache(maxsize=256)
def _row_class(fields: tuple[str, ...]) -> type[Row]:
    ns: dict[str, Any] = {
        "__slots__": (),
        "_fields": fields,
        "_index": {name: i for i, name in enumerate(fields)},
    }
    for i, name in enumerate(fields):
        if name.isidentifier() and not hasattr(Row, name):
            ns[name] = _field(i, f"column {name!r}")
    return type("Row", (Row,), ns)


def row_class(fields: Sequence[str]) -> type[Row]:
    """The :class:`Row` subclass for records with these column names (cached)."""
    return _row_class(tuple(fields))


def rows_from_batch(batch: Any, columns: Sequence[str] | None = None) -> Iterator[Row]:
    """The rows of an Arrow record batch (``columns``: which ones, default all)."""
    names = list(columns) if columns is not None else list(batch.schema.names)
    cls = row_class(names)
    new = functools.partial(tuple.__new__, cls)
    data = [batch.column(n).to_pylist() for n in names]
    return map(new, zip(*data, strict=True)) if data else iter(())


def row_serializer(struct: Any, columns: Sequence[str]) -> Any:
    """The serializer a window infers for a :class:`Row` of ``columns`` of the Spark schema
    ``struct`` (``TupleSerializer`` of the fields, as ``infer_serializer`` types a non-null
    Row's values), or None if a column's type has no such serializer.

    >>> from pyspark.sql.types import StructType, StructField, LongType, StringType
    >>> row_serializer(StructType([StructField("k", StringType()), StructField("v", LongType())]),
    ...                ["k", "v"])
    TupleSerializer(fields=[{'type': 'str', 'version': 1}, {'type': 'int64', 'version': 1}])
    """
    from streamstate.serializers import (
        BoolSerializer,
        BytesSerializer,
        Float64Serializer,
        Int64Serializer,
        StrSerializer,
        TupleSerializer,
        serializer_for,
    )

    by_type: dict[str, Any] = {
        "ByteType": Int64Serializer,
        "ShortType": Int64Serializer,
        "IntegerType": Int64Serializer,
        "LongType": Int64Serializer,
        "FloatType": Float64Serializer,
        "DoubleType": Float64Serializer,
        "StringType": StrSerializer,
        "BinaryType": BytesSerializer,
        "BooleanType": BoolSerializer,
        "TimestampType": lambda: serializer_for(datetime.datetime),
        "DateType": lambda: serializer_for(datetime.date),
    }
    fields: list[Any] = []
    for name in columns:
        make = by_type.get(type(struct[name].dataType).__name__)
        if make is None:
            return None
        fields.append(make())
    return TupleSerializer(*fields)


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} ({type(value).__name__})"


class OutputConverter:
    """Turns a list of function outputs into an Arrow batch of ``schema``.

    >>> import pyarrow as pa
    >>> conv = OutputConverter(pa.schema([("user", pa.string()), ("n", pa.int64())]))
    >>> conv.to_batch([("ann", 1), {"n": 2, "user": "bob"}, ("cy", 3.0)]).to_pylist()
    [{'user': 'ann', 'n': 1}, {'user': 'bob', 'n': 2}, {'user': 'cy', 'n': 3}]
    >>> for bad in [("ann", "x")], [("ann", 1), ("bob", 1.7)], [{"user": "ann"}]:
    ...     try:
    ...         conv.to_batch(bad)
    ...     except OutputSchemaError as e:
    ...         print(e)
    output column 'n' is declared int64 but the function produced 'x' (str) in output #0 (...)
    output column 'n' is declared int64 but the function produced 1.7 (float) in output #1 (...)
    output #0 has no value for the declared fields ['n'] ...
    """

    def __init__(self, schema: Any) -> None:
        self.schema = schema
        self.names: list[str] = list(schema.names)
        self._index = {n: i for i, n in enumerate(self.names)}
        self._builders = [column_builder(f.type) for f in schema]

    def empty(self) -> Any:
        return _empty_batch(self.schema)

    def to_batch(self, outputs: list[Any]) -> Any:
        import pyarrow as pa

        if not outputs:
            return _empty_batch(self.schema)
        columns = self._columns(outputs)
        arrays = []
        for field, build, values in zip(self.schema, self._builders, columns, strict=True):
            try:
                arr = build(values, field.type)
            except (pa.ArrowException, OverflowError, TypeError, ValueError):
                raise self._value_error(field, build, values) from None
            if arr.null_count and not field.nullable:
                i = arr.is_null().to_pylist().index(True)
                raise OutputSchemaError(
                    f"output column {field.name!r} is declared NOT NULL but output #{i} has no "
                    f"value for it: {_describe(outputs[i])}"
                )
            arrays.append(arr)
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _columns(self, outputs: list[Any]) -> list[Sequence[Any]]:
        n = len(self.names)
        # fast path: plain tuples of the right width (both tests loop in C)
        if set(map(type, outputs)) == {tuple} and set(map(len, outputs)) == {n}:
            # column by column: a transposition with zip(*outputs) makes an iterator per
            # output (5-8x slower for 100k outputs)
            return [list(map(operator.itemgetter(i), outputs)) for i in range(n)]
        columns: list[Any] = [[] for _ in range(n)]
        for i, out in enumerate(outputs):
            values = self._normalize(out, i)
            for col, v in zip(columns, values, strict=True):
                col.append(v)
        return columns

    def _normalize(self, out: Any, i: int) -> Sequence[Any]:
        names = self.names
        if isinstance(out, dict):
            try:
                values = [out[name] for name in names]
            except KeyError:
                # a missing field is an error, not a null: a typo in a field name would
                # otherwise write nulls silently; an explicit None is a null
                missing = [name for name in names if name not in out]
                raise OutputSchemaError(
                    f"output #{i} has no value for the declared fields {missing} (declared: "
                    f"{names}; give None for a null): {_describe(out)}"
                ) from None
            if len(out) != len(names):
                extra = [k for k in out if k not in self._index]
                raise OutputSchemaError(
                    f"output #{i} has fields {extra} that the output schema does not declare "
                    f"(declared: {names}): {_describe(out)}"
                )
            return values
        fields = getattr(out, "_fields", None) or getattr(out, "__fields__", None)
        if isinstance(out, tuple) and fields:
            return self._normalize(dict(zip(fields, out, strict=True)), i)
        record = record_fields(out)
        if record is not None:
            return self._normalize(record, i)
        if isinstance(out, tuple | list):
            if len(out) != len(names):
                raise OutputSchemaError(
                    f"output #{i} has {len(out)} values but the output schema declares "
                    f"{len(names)} columns {names}: {_describe(out)}"
                )
            return out
        if len(names) == 1:
            return [out]
        raise OutputSchemaError(
            f"output #{i} is a {type(out).__name__}; outputs must be tuples, dicts, Rows or "
            f"records (dataclasses, msgspec Structs, attrs classes) matching the output schema "
            f"{names}: {_describe(out)}"
        )

    def _value_error(self, field: Any, build: Any, values: Sequence[Any]) -> OutputSchemaError:
        import pyarrow as pa

        for i, v in enumerate(values):
            try:
                build([v], field.type)
            except (pa.ArrowException, OverflowError, TypeError, ValueError) as e:
                return OutputSchemaError(
                    f"output column {field.name!r} is declared {field.type} but the function "
                    f"produced {_describe(v)} in output #{i} ({e})"
                )
        return OutputSchemaError(f"output column {field.name!r} cannot be built as {field.type}")


def record_fields(value: Any) -> dict[str, Any] | None:
    """The fields of a record instance (a dataclass, a ``msgspec.Struct``, an attrs class) by
    name, or None for any other value.

    >>> import dataclasses
    >>> @dataclasses.dataclass
    ... class Alert:
    ...     user: str
    ...     n: int
    >>> record_fields(Alert("ann", 3)), record_fields(("ann", 3))
    ({'user': 'ann', 'n': 3}, None)
    """
    if isinstance(value, type):
        return None
    cls = type(value)
    names: Any = getattr(cls, "__struct_fields__", None)  # msgspec.Struct
    if names is None and dataclasses.is_dataclass(value):
        names = [f.name for f in dataclasses.fields(value)]
    if names is None:
        attributes = getattr(cls, "__attrs_attrs__", None)  # an attrs class
        if attributes is None:
            return None
        names = [a.name for a in attributes]
    return {name: getattr(value, name) for name in names}


def _empty_batch(schema: Any) -> Any:
    import pyarrow as pa

    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)
