"""Built-in aggregate functions over a column: ``count``, ``sum``, ``min``, ``max``, ``avg``.

Each is an ordinary :class:`~streamstate.api.functions.AggregateFunction` (in the LocalRunner,
in aggregating state, in a window's ``aggregate``) with Spark SQL's semantics: ``count()``
counts elements, ``count(column)`` the non-null values; ``sum``, ``min``, ``max`` and ``avg``
ignore nulls and give ``None`` when a window held no non-null value; ``avg`` is a double; ``NaN``
is larger than any other number for ``min`` and ``max``. An element's column is
``element[column]`` (a Spark :class:`~streamstate.spark.records.Row`, a dict) or
``getattr(element, column)`` (a named tuple, a dataclass).

>>> rows = [{"v": 3}, {"v": None}, {"v": 1.5}]
>>> def fold(fn):
...     acc = fn.create_accumulator()
...     for r in rows:
...         acc = fn.add(r, acc)
...     return fn.get_result(acc)
>>> fold(count()), fold(count("v")), fold(sum("v")), fold(min("v")), fold(max("v")), fold(avg("v"))
(3, 2, 4.5, 1.5, 3, 2.25)

On Spark, a window's pre-aggregation (``keyed_process``, SPEC §13.2) folds a built-in aggregate
before the shuffle with Spark SQL's own partial aggregation, in the JVM: what SQL's aggregates
give for a group (:meth:`BuiltinAggregate.partials`) becomes the accumulator through
:meth:`BuiltinAggregate.accumulator_from_partials`, and the accumulators merge with ``merge`` as
they do per record.

Accumulators are immutable (an ``int`` for count, frozen ``msgspec`` structs otherwise), so heap
state never copies them. Values are numbers (``sum``, ``avg``), or numbers, strings and booleans
(``min``, ``max``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec

from streamstate.api.functions import AggregateFunction

__all__ = [
    "Avg",
    "AvgAccumulator",
    "BuiltinAggregate",
    "Count",
    "Max",
    "Min",
    "Sum",
    "ValueAccumulator",
    "avg",
    "count",
    "max",
    "min",
    "sum",
]


class ValueAccumulator(msgspec.Struct, frozen=True, array_like=True):
    """The running value of ``sum``, ``min`` or ``max``; ``None`` until a non-null value came."""

    value: bool | int | float | str | None = None


class AvgAccumulator(msgspec.Struct, frozen=True, array_like=True):
    """The non-null values seen by ``avg`` and their sum as a double (as Spark SQL sums them)."""

    count: int = 0
    total: float = 0.0


_EMPTY = ValueAccumulator()


class BuiltinAggregate(AggregateFunction[Any, Any, Any]):
    """A built-in aggregate of one column (``None``: the element itself, for ``count()``).

    Subclasses declare :attr:`kind` (the name of the Spark SQL aggregate) and how the values of
    SQL's partial aggregates of a group make an accumulator.
    """

    __slots__ = ("column",)

    #: the Spark SQL aggregate it is ("count", "sum", "min", "max", "avg")
    kind: ClassVar[str] = ""

    def __init__(self, column: str | None) -> None:
        if column is not None and (not isinstance(column, str) or not column):
            raise TypeError(f"{self.kind}() takes a column name, got {column!r}")
        self.column = column

    def value_of(self, element: Any) -> Any:
        """The aggregated column of ``element``."""
        column = self.column
        try:
            return element[column]
        except (TypeError, IndexError, KeyError):
            pass
        try:
            return getattr(element, column)  # type: ignore[arg-type]
        except AttributeError:
            raise KeyError(
                f"{self!r}: the element {_short(element)} has no column {column!r}"
            ) from None

    def partials(self) -> list[tuple[str, bool]]:
        """The SQL aggregates whose values of a group make its accumulator, in order: (name of
        the aggregate, whether its argument is the column cast to double). ``count`` with
        no column counts rows."""
        return [(self.kind, False)]

    def accumulator_from_partials(self, values: tuple[Any, ...]) -> Any:
        """The accumulator of a group whose :meth:`partials` gave ``values``."""
        return ValueAccumulator(values[0])

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.column == self.column  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self), self.column))

    def __repr__(self) -> str:
        return f"{self.kind}({'' if self.column is None else repr(self.column)})"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


class Count(BuiltinAggregate):
    """``count()``: the number of elements; ``count(column)``: of non-null values. An ``int``."""

    __slots__ = ()
    kind = "count"

    def __init__(self, column: str | None = None) -> None:
        super().__init__(column)

    def create_accumulator(self) -> int:
        return 0

    def add(self, value: Any, accumulator: int) -> int:
        if self.column is None or self.value_of(value) is not None:
            return accumulator + 1
        return accumulator

    def get_result(self, accumulator: int) -> int:
        return accumulator

    def merge(self, acc_a: int, acc_b: int) -> int:
        return acc_a + acc_b

    def accumulator_from_partials(self, values: tuple[Any, ...]) -> int:
        return int(values[0])


class Sum(BuiltinAggregate):
    """The sum of the non-null values (``None`` if there is none)."""

    __slots__ = ()
    kind = "sum"

    def __init__(self, column: str) -> None:
        super().__init__(column)

    def create_accumulator(self) -> ValueAccumulator:
        return _EMPTY

    def add(self, value: Any, accumulator: ValueAccumulator) -> ValueAccumulator:
        v = self.value_of(value)
        if v is None:
            return accumulator
        if accumulator.value is None:
            return ValueAccumulator(v)
        total: Any = accumulator.value
        return ValueAccumulator(total + v)

    def get_result(self, accumulator: ValueAccumulator) -> Any:
        return accumulator.value

    def merge(self, acc_a: ValueAccumulator, acc_b: ValueAccumulator) -> ValueAccumulator:
        if acc_b.value is None:
            return acc_a
        if acc_a.value is None:
            return acc_b
        total: Any = acc_a.value
        return ValueAccumulator(total + acc_b.value)


def _is_nan(v: Any) -> bool:
    return v != v  # only NaN differs from itself


def _smaller(a: Any, b: Any) -> Any:
    """Spark SQL's ``least``: NaN is larger than every other value."""
    if _is_nan(a):
        return b
    if _is_nan(b):
        return a
    return b if b < a else a


def _larger(a: Any, b: Any) -> Any:
    """Spark SQL's ``greatest``: NaN is larger than every other value."""
    if _is_nan(a):
        return a
    if _is_nan(b):
        return b
    return b if b > a else a


class _Extreme(BuiltinAggregate):
    __slots__ = ()
    pick: ClassVar[Any] = None

    def __init__(self, column: str) -> None:
        super().__init__(column)

    def create_accumulator(self) -> ValueAccumulator:
        return _EMPTY

    def add(self, value: Any, accumulator: ValueAccumulator) -> ValueAccumulator:
        v = self.value_of(value)
        if v is None:
            return accumulator
        current = accumulator.value
        if current is None:
            return ValueAccumulator(v)
        best = type(self).pick(current, v)
        return accumulator if best is current else ValueAccumulator(best)

    def get_result(self, accumulator: ValueAccumulator) -> Any:
        return accumulator.value

    def merge(self, acc_a: ValueAccumulator, acc_b: ValueAccumulator) -> ValueAccumulator:
        if acc_b.value is None:
            return acc_a
        if acc_a.value is None:
            return acc_b
        return acc_a if type(self).pick(acc_a.value, acc_b.value) is acc_a.value else acc_b


class Min(_Extreme):
    """The smallest non-null value (``None`` if there is none)."""

    __slots__ = ()
    kind = "min"
    pick = staticmethod(_smaller)


class Max(_Extreme):
    """The largest non-null value (``None`` if there is none)."""

    __slots__ = ()
    kind = "max"
    pick = staticmethod(_larger)


class Avg(BuiltinAggregate):
    """The mean of the non-null values as a double (``None`` if there is none); the values are
    summed as doubles, as Spark SQL does."""

    __slots__ = ()
    kind = "avg"

    def __init__(self, column: str) -> None:
        super().__init__(column)

    def create_accumulator(self) -> AvgAccumulator:
        return AvgAccumulator()

    def add(self, value: Any, accumulator: AvgAccumulator) -> AvgAccumulator:
        v = self.value_of(value)
        if v is None:
            return accumulator
        return AvgAccumulator(accumulator.count + 1, accumulator.total + float(v))

    def get_result(self, accumulator: AvgAccumulator) -> float | None:
        if not accumulator.count:
            return None
        return accumulator.total / accumulator.count

    def merge(self, acc_a: AvgAccumulator, acc_b: AvgAccumulator) -> AvgAccumulator:
        if not acc_b.count:
            return acc_a
        if not acc_a.count:
            return acc_b
        return AvgAccumulator(acc_a.count + acc_b.count, acc_a.total + acc_b.total)

    def partials(self) -> list[tuple[str, bool]]:
        return [("count", False), ("sum", True)]

    def accumulator_from_partials(self, values: tuple[Any, ...]) -> AvgAccumulator:
        n = int(values[0])
        return AvgAccumulator(n, float(values[1]) if n else 0.0)


def count(column: str | None = None) -> Count:
    """Count elements (``count()``) or the non-null values of ``column``."""
    return Count(column)


def sum(column: str) -> Sum:  # Spark SQL's name
    """Sum the non-null values of ``column``."""
    return Sum(column)


def min(column: str) -> Min:  # Spark SQL's name
    """The smallest non-null value of ``column``."""
    return Min(column)


def max(column: str) -> Max:  # Spark SQL's name
    """The largest non-null value of ``column``."""
    return Max(column)


def avg(column: str) -> Avg:
    """The mean of the non-null values of ``column``, a double."""
    return Avg(column)
