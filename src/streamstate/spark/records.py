"""Records in and out of a keyed function on Spark.

In: every input row reaches ``process_element`` as a :class:`Row`, a tuple with the input's
column names (``row.user``, ``row["user"]``, ``row[0]``, ``row.asDict()``), like PySpark's
``Row`` but built from whole Arrow columns at C speed.

Out: a function yields tuples (by position), dicts or rows (by name); :class:`OutputConverter`
turns a subtask's outputs into one Arrow batch of the declared output schema, matching by name
and casting, and raises :class:`~streamstate.errors.OutputSchemaError` naming the column and the
value that does not fit (Spark's ``mapInArrow`` matches by position and fails with JVM errors).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterator, Sequence
from typing import Any

from streamstate.errors import OutputSchemaError

__all__ = ["OutputConverter", "Row", "row_class", "rows_from_batch"]


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


@functools.lru_cache(maxsize=256)
def _row_class(fields: tuple[str, ...]) -> type[Row]:
    ns: dict[str, Any] = {
        "__slots__": (),
        "_fields": fields,
        "_index": {name: i for i, name in enumerate(fields)},
    }
    for i, name in enumerate(fields):
        if name.isidentifier() and not hasattr(Row, name):
            ns[name] = property(operator.itemgetter(i), doc=f"column {name!r}")
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


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} ({type(value).__name__})"


class OutputConverter:
    """Turns a list of function outputs into an Arrow batch of ``schema``.

    >>> import pyarrow as pa
    >>> conv = OutputConverter(pa.schema([("user", pa.string()), ("n", pa.int64())]))
    >>> conv.to_batch([("ann", 1), {"n": 2, "user": "bob"}]).to_pylist()
    [{'user': 'ann', 'n': 1}, {'user': 'bob', 'n': 2}]
    >>> try:
    ...     conv.to_batch([("ann", "x")])
    ... except OutputSchemaError as e:
    ...     print(e)
    output column 'n' is declared int64 but the function produced 'x' (str) in output #0 (...)
    """

    def __init__(self, schema: Any) -> None:
        self.schema = schema
        self.names: list[str] = list(schema.names)
        self._index = {n: i for i, n in enumerate(self.names)}

    def empty(self) -> Any:
        return _empty_batch(self.schema)

    def to_batch(self, outputs: list[Any]) -> Any:
        import pyarrow as pa

        if not outputs:
            return _empty_batch(self.schema)
        columns = self._columns(outputs)
        arrays = []
        for field, values in zip(self.schema, columns, strict=True):
            try:
                arr = pa.array(values, type=field.type, from_pandas=False)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
                raise self._value_error(field, values) from None
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
        first = outputs[0]
        if type(first) is tuple and all(
            type(o) is tuple and len(o) == n for o in outputs
        ):  # fast path: plain tuples of the right width
            return list(zip(*outputs, strict=True)) if n else []
        columns: list[Any] = [[] for _ in range(n)]
        for i, out in enumerate(outputs):
            values = self._normalize(out, i)
            for col, v in zip(columns, values, strict=True):
                col.append(v)
        return columns

    def _normalize(self, out: Any, i: int) -> Sequence[Any]:
        names = self.names
        if isinstance(out, dict):
            extra = [k for k in out if k not in self._index]
            if extra:
                raise OutputSchemaError(
                    f"output #{i} has fields {extra} that the output schema does not declare "
                    f"(declared: {names}): {_describe(out)}"
                )
            return [out.get(name) for name in names]
        fields = getattr(out, "_fields", None) or getattr(out, "__fields__", None)
        if isinstance(out, tuple) and fields:
            return self._normalize(dict(zip(fields, out, strict=True)), i)
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
            f"output #{i} is a {type(out).__name__}; outputs must be tuples, dicts or Rows "
            f"matching the output schema {names}: {_describe(out)}"
        )

    def _value_error(self, field: Any, values: Sequence[Any]) -> OutputSchemaError:
        import pyarrow as pa

        for i, v in enumerate(values):
            try:
                pa.array([v], type=field.type, from_pandas=False)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError) as e:
                return OutputSchemaError(
                    f"output column {field.name!r} is declared {field.type} but the function "
                    f"produced {_describe(v)} in output #{i} ({e})"
                )
        return OutputSchemaError(f"output column {field.name!r} cannot be built as {field.type}")


def _empty_batch(schema: Any) -> Any:
    import pyarrow as pa

    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)
