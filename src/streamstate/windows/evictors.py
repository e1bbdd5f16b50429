"""Evictors: remove elements from a window before and/or after its function runs (SPEC §9).

Names and semantics follow Flink's ``CountEvictor``, ``TimeEvictor`` and ``DeltaEvictor``. An
evictor sees the window's elements as a Python list of :class:`TimestampedValue` in arrival
order and changes that list in place (the built-in ones remove elements; yours may also
replace or reorder them); after every firing the list as the evictor left it is written back
to the window's state. Each evictor evicts either before the window function
(``evict_before``, the default) or after it (``do_evict_after=True``).

>>> from streamstate.windows import TimeWindow
>>> elements = [TimestampedValue(v, ts) for v, ts in [("a", 1), ("b", 5), ("c", 9)]]
>>> CountEvictor.of(2).evict_before(elements, 3, TimeWindow(0, 10), None)
>>> [e.value for e in elements]
['b', 'c']
>>> TimeEvictor.of(4).evict_before(elements, 2, TimeWindow(0, 10), None)
>>> [e.value for e in elements]  # keeps timestamps > max_timestamp - 4
['c']
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from datetime import timedelta
from typing import Any

__all__ = [
    "CountEvictor",
    "DeltaEvictor",
    "Evictor",
    "EvictorContext",
    "TimeEvictor",
    "TimestampedValue",
    "delta_function",
]


class TimestampedValue:
    """An element of an evicting window with its timestamp (``None``: the record had none)."""

    __slots__ = ("timestamp", "value")

    def __init__(self, value: Any, timestamp: int | None = None) -> None:
        self.value = value
        self.timestamp = timestamp

    def get_value(self) -> Any:
        """The element."""
        return self.value

    def get_timestamp(self) -> int | None:
        """Its event time (ms), or None."""
        return self.timestamp

    def has_timestamp(self) -> bool:
        """Whether it has an event time."""
        return self.timestamp is not None

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, TimestampedValue)
            and self.value == other.value
            and self.timestamp == other.timestamp
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"TimestampedValue({self.value!r}, {self.timestamp!r})"


class EvictorContext(ABC):
    """What an evictor may ask: the clocks and the operator's metric group."""

    @abstractmethod
    def get_current_processing_time(self) -> int: ...

    @abstractmethod
    def get_metric_group(self) -> Any: ...

    @abstractmethod
    def get_current_watermark(self) -> int: ...


class Evictor(ABC):
    """Removes elements of a firing window: :meth:`evict_before` runs before the window
    function, :meth:`evict_after` after it; ``elements`` is changed in place and ``size`` is
    its length."""

    @abstractmethod
    def evict_before(
        self, elements: list[TimestampedValue], size: int, window: Any, ctx: EvictorContext
    ) -> None:
        """Remove elements of ``window`` from ``elements`` before the window function runs."""

    @abstractmethod
    def evict_after(
        self, elements: list[TimestampedValue], size: int, window: Any, ctx: EvictorContext
    ) -> None:
        """Remove elements of ``window`` from ``elements`` after the window function ran."""

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({params})"


class _BeforeOrAfter(Evictor):
    """An evictor with one eviction rule applied either before or after the function."""

    do_evict_after: bool

    @abstractmethod
    def _evict(self, elements: list[TimestampedValue], size: int) -> None: ...

    def evict_before(
        self, elements: list[TimestampedValue], size: int, window: Any, ctx: EvictorContext
    ) -> None:
        if not self.do_evict_after:
            self._evict(elements, size)

    def evict_after(
        self, elements: list[TimestampedValue], size: int, window: Any, ctx: EvictorContext
    ) -> None:
        if self.do_evict_after:
            self._evict(elements, size)


def _millis(value: int | timedelta, what: str) -> int:
    if isinstance(value, timedelta):
        return int(value.total_seconds() * 1000)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be milliseconds (int) or a timedelta, got {value!r}")
    return value


class CountEvictor(_BeforeOrAfter):
    """Keeps the last ``max_count`` elements (in arrival order) of the window."""

    def __init__(self, max_count: int, do_evict_after: bool = False) -> None:
        if isinstance(max_count, bool) or not isinstance(max_count, int) or max_count < 0:
            raise ValueError(f"CountEvictor needs a count >= 0, got {max_count!r}")
        self.max_count = max_count
        self.do_evict_after = do_evict_after

    @classmethod
    def of(cls, max_count: int, do_evict_after: bool = False) -> CountEvictor:
        """Keep the last ``max_count`` elements (before the function, or after it)."""
        return cls(max_count, do_evict_after)

    def _evict(self, elements: list[TimestampedValue], size: int) -> None:
        if size > self.max_count:
            del elements[: size - self.max_count]


class TimeEvictor(_BeforeOrAfter):
    """Keeps the elements whose timestamp is within ``window_size`` ms of the largest timestamp
    in the window: an element with ``timestamp <= max_timestamp - window_size`` is evicted.
    Nothing is evicted when the elements have no timestamps (as Flink, judged by the first)."""

    def __init__(self, window_size: int, do_evict_after: bool = False) -> None:
        self.window_size = window_size
        self.do_evict_after = do_evict_after

    @classmethod
    def of(cls, window_size: int | timedelta, do_evict_after: bool = False) -> TimeEvictor:
        """Keep the elements within ``window_size`` of the window's latest timestamp."""
        return cls(_millis(window_size, "TimeEvictor window_size"), do_evict_after)

    def _evict(self, elements: list[TimestampedValue], size: int) -> None:
        if not elements or elements[0].timestamp is None:
            return
        stamps = [e.timestamp for e in elements if e.timestamp is not None]
        cutoff = max(stamps) - self.window_size
        elements[:] = [e for e in elements if e.timestamp is None or e.timestamp > cutoff]


def delta_function(fn: Any) -> Callable[[Any, Any], float]:
    """``fn`` as a two-argument callable: a callable, or an object with Flink's
    ``get_delta(old_data_point, new_data_point)``."""
    call = getattr(fn, "get_delta", fn)
    if not callable(call):
        raise TypeError(
            f"a delta function must be callable or have get_delta(old, new), got {fn!r}"
        )
    return call  # type: ignore[no-any-return]


class DeltaEvictor(_BeforeOrAfter):
    """Evicts every element whose delta to the window's last element is ``>= threshold``
    (``delta_function(element, last_element)``); the last element itself stays unless its
    delta to itself reaches the threshold."""

    def __init__(self, threshold: float, delta_fn: Any, do_evict_after: bool = False) -> None:
        self.threshold = threshold
        self.delta_function = delta_function(delta_fn)
        self.do_evict_after = do_evict_after

    @classmethod
    def of(cls, threshold: float, delta_fn: Any, do_evict_after: bool = False) -> DeltaEvictor:
        """Evict every element with ``delta_fn(element, last element) >= threshold``."""
        return cls(threshold, delta_fn, do_evict_after)

    def _evict(self, elements: list[TimestampedValue], size: int) -> None:
        if not elements:
            return
        last = elements[-1].value
        delta, threshold = self.delta_function, self.threshold
        elements[:] = [e for e in elements if not delta(e.value, last) >= threshold]
