"""One output column built to its declared Arrow type, never losing information silently.

``pa.array(values, type=int64)`` truncates floats (1.7 -> 1, -2.9 -> -2) and takes numbers
for timestamps in the column's unit. Columns of those types are built by inference and a
*safe* cast instead, which rejects truncation, overflow and lost precision in one vectorized
pass; for values that are already ints (the common case) the cast is free. What this costs
per output: bench/output_conversion.py.

:func:`column_builder` picks the builder of a type;
:class:`~streamstate.spark.records.OutputConverter` builds each column of a function's outputs
with it (the rules a cast follows are in :mod:`streamstate.spark.records`).
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Sequence
from typing import Any

import msgspec

__all__ = ["column_builder"]


#: values that Arrow builds as they are when records inside a column become dicts
_ARROW_BUILTINS = (
    bytes,
    bytearray,
    memoryview,
    datetime.datetime,
    datetime.date,
    datetime.time,
    datetime.timedelta,
    decimal.Decimal,
)


def _direct(values: Sequence[Any], type_: Any) -> Any:
    import pyarrow as pa

    return pa.array(values, type=type_, from_pandas=False)


def _nested(values: Sequence[Any], type_: Any) -> Any:
    """An array, map or struct column: inferred and safely cast where Arrow can infer the
    values (lists, dicts for structs), so that a fraction in an integer list or struct field
    raises as in a top-level column, and a struct dict must give exactly the declared fields;
    built directly otherwise (maps from dicts or pairs, structs from tuples)."""
    import pyarrow as pa

    try:
        inferred = pa.array(values, from_pandas=False)
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        try:
            return _direct(values, type_)
        except (pa.ArrowException, TypeError):
            # records (dataclasses, msgspec Structs) inside the column: as dicts of their fields
            plain = msgspec.to_builtins(values, builtin_types=_ARROW_BUILTINS)
            if plain == values:
                raise
            return _nested(plain, type_)
    if pa.types.is_struct(type_) and pa.types.is_struct(inferred.type):
        declared = {type_.field(i).name for i in range(type_.num_fields)}
        given = {inferred.type.field(i).name for i in range(inferred.type.num_fields)}
        if given != declared:
            extra, missing = sorted(given - declared), sorted(declared - given)
            raise ValueError(
                "a struct value must give exactly the declared fields"
                + (f"; not declared: {extra}" if extra else "")
                + (f"; missing: {missing} (give None for a null)" if missing else "")
            )
    if _strings_in(inferred.type) and not _strings_in(type_):
        raise ValueError("strings where the declared type has none (a cast would parse them)")
    try:
        return inferred.cast(type_)
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return _direct(values, type_)  # Arrow inferred another shape (dicts for a map)


def _strings_in(type_: Any) -> bool:
    """Whether a (nested) Arrow type has string leaves."""
    import pyarrow as pa

    if pa.types.is_string(type_) or pa.types.is_large_string(type_):
        return True
    return any(_strings_in(type_.field(i).type) for i in range(type_.num_fields))


def _integer(values: Sequence[Any], type_: Any) -> Any:
    import pyarrow as pa

    try:
        arr = pa.array(values, from_pandas=False)
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        # no common type (ints, floats and decimals mixed): check value by value (rare)
        return pa.array([_integral(v) for v in values], type=type_, from_pandas=False)
    got = arr.type
    if got == type_:
        return arr
    if pa.types.is_boolean(got):
        raise pa.ArrowTypeError("expected an integer, got a bool (declare the column boolean)")
    if not (
        pa.types.is_integer(got)
        or pa.types.is_floating(got)
        or pa.types.is_decimal(got)
        or pa.types.is_null(got)
    ):
        raise pa.ArrowTypeError(f"expected an integer, got {got}")
    # safe: a float or decimal with a fraction, NaN, inf or a value out of range raises
    return arr.cast(type_, safe=True)


def _integral(value: Any) -> Any:
    if value is None or type(value) is int:
        return value
    if isinstance(value, bool):
        raise _pa_type_error("expected an integer, got a bool (declare the column boolean)")
    if isinstance(value, str | bytes):
        raise _pa_type_error(f"expected an integer, got {type(value).__name__}")
    as_int = int(value)  # floats, decimals, numpy numbers; NaN and inf raise here
    if as_int != value:
        raise ValueError(f"{value!r} is not integral")
    return as_int


def _pa_type_error(message: str) -> Exception:
    import pyarrow as pa

    return pa.ArrowTypeError(message)


_NUMBERS = frozenset({int, float, bool, decimal.Decimal})


def _timestamp(values: Sequence[Any], type_: Any) -> Any:
    import pyarrow as pa

    arr = pa.array(values, from_pandas=False)
    got = arr.type
    # inference turns numbers mixed with datetimes into timestamps too: look at the types
    numbers = not _NUMBERS.isdisjoint(map(type, values))
    if got == type_ and not numbers:
        return arr
    if not numbers and not (pa.types.is_timestamp(got) or pa.types.is_null(got)):
        raise pa.ArrowTypeError(f"a timestamp column takes datetime values, not {got}")
    if numbers:
        raise pa.ArrowTypeError(
            "a timestamp column takes datetime values, not numbers: a number's unit would be a "
            "guess (event times in streamstate are milliseconds: "
            "datetime.fromtimestamp(ms / 1000, timezone.utc)), or declare the column long"
        )
    # safe: nanoseconds that do not fit microseconds raise; naive datetimes are taken as UTC
    return arr.cast(type_, safe=True)


def _date(values: Sequence[Any], type_: Any) -> Any:
    import pyarrow as pa

    # Arrow drops a datetime's time of day into a date column (and infers date for dates
    # mixed with datetimes): a datetime must be made a date explicitly
    if any(isinstance(v, datetime.datetime) for v in values):
        raise pa.ArrowTypeError(
            "a date column takes datetime.date values; a datetime would lose its time of day "
            "(use .date(), or declare the column timestamp)"
        )
    return pa.array(values, type=type_, from_pandas=False)


def _float32(values: Sequence[Any], type_: Any) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = pa.array(values, type=type_, from_pandas=False)
    if pc.any(pc.is_inf(arr)).as_py():  # a finite double beyond float32's range became inf
        wide = pa.array(values, type=pa.float64(), from_pandas=False)
        if pc.sum(pc.is_inf(wide)).as_py() != pc.sum(pc.is_inf(arr)).as_py():
            raise pa.ArrowInvalid("the value overflows a 32-bit float")
    return arr


def column_builder(type_: Any) -> Any:
    import pyarrow as pa

    if pa.types.is_integer(type_):
        return _integer
    if pa.types.is_timestamp(type_):
        return _timestamp
    if pa.types.is_float32(type_):
        return _float32
    if pa.types.is_date(type_):
        return _date
    if pa.types.is_list(type_) or pa.types.is_struct(type_) or pa.types.is_map(type_):
        return _nested
    return _direct
