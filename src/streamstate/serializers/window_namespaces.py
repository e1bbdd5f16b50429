"""The namespaces of window state: :class:`TimeWindow` ``[start, end)`` and
:class:`GlobalWindow` (SPEC §9), with their serializers (here, below the windows package, so
that a restore rebuilds them from a checkpoint without importing the windows; the public names
are ``streamstate.windows.TimeWindow`` and ``GlobalWindow``).

Every window has ``max_timestamp()``, the last millisecond that belongs to it. A window is the
namespace of its state: the window operator sets it on the window's states and
timers, so it must be hashable, immutable and serializable. Both are frozen ``msgspec`` structs
encoded as msgpack arrays, with serializers whose snapshots say ``time_window`` /
``global_window``.

>>> w = TimeWindow(0, 10)
>>> w.max_timestamp(), w.intersects(TimeWindow(10, 20)), w.cover(TimeWindow(5, 30))
(9, True, TimeWindow(start=0, end=30))
>>> TimeWindow.get_window_start_with_offset(-3, 0, 10)
-10
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from streamstate.serializers.structs import StructSerializer

__all__ = [
    "MAX_TIMESTAMP",
    "GlobalWindow",
    "GlobalWindowSerializer",
    "TimeWindow",
    "TimeWindowSerializer",
    "merge_time_windows",
]

MAX_TIMESTAMP = (1 << 63) - 1
"""The end of time (Java's ``Long.MAX_VALUE``)."""


class TimeWindow(msgspec.Struct, frozen=True, array_like=True, order=True):
    """The time interval ``[start, end)`` in milliseconds; ordered by (start, end)."""

    start: int
    end: int

    def max_timestamp(self) -> int:
        """``end - 1``, the last millisecond of the window."""
        return self.end - 1

    def intersects(self, other: TimeWindow) -> bool:
        """Whether the windows overlap or touch (Flink: ``start <= other.end and end >=
        other.start``); touching session windows merge."""
        return self.start <= other.end and self.end >= other.start

    def cover(self, other: TimeWindow) -> TimeWindow:
        """The smallest window containing both."""
        return TimeWindow(min(self.start, other.start), max(self.end, other.end))

    @staticmethod
    def get_window_start_with_offset(timestamp: int, offset: int, window_size: int) -> int:
        """The start of the window of length ``window_size`` (aligned to ``offset``) that
        contains ``timestamp``; correct for negative timestamps too."""
        return timestamp - (timestamp - offset) % window_size

    def __repr__(self) -> str:
        return f"TimeWindow(start={self.start}, end={self.end})"


class GlobalWindow(msgspec.Struct, frozen=True, array_like=True):
    """The one window holding every element of a key (``GlobalWindows``)."""

    def max_timestamp(self) -> int:
        return MAX_TIMESTAMP

    def __repr__(self) -> str:
        return "GlobalWindow()"


class TimeWindowSerializer(StructSerializer):
    """:class:`TimeWindow` as a msgpack array ``[start, end]``.

    >>> s = TimeWindowSerializer()
    >>> s.deserialize(s.serialize(TimeWindow(-5, 5))), s.snapshot()["type"]
    (TimeWindow(start=-5, end=5), 'time_window')
    """

    type_name = "time_window"
    #: built in: the snapshot keeps its first form (version 1)
    version = 1

    def __init__(self) -> None:
        super().__init__(TimeWindow)

    def params(self) -> dict[str, Any]:
        return self.v1_params()


class GlobalWindowSerializer(StructSerializer):
    """:class:`GlobalWindow` (an empty msgpack array)."""

    type_name = "global_window"
    #: built in: the snapshot keeps its first form (version 1)
    version = 1

    def __init__(self) -> None:
        super().__init__(GlobalWindow)

    def params(self) -> dict[str, Any]:
        return self.v1_params()


def merge_time_windows(
    windows: Iterable[TimeWindow], merge: Callable[[list[TimeWindow], TimeWindow], Any]
) -> None:
    """Merge overlapping (or touching) windows: ``merge(to_be_merged, result)`` for every group of
    two or more windows that merge (Flink's ``TimeWindow.mergeWindows``).

    >>> calls = []
    >>> merge_time_windows([TimeWindow(0, 5), TimeWindow(9, 12), TimeWindow(4, 8)],
    ...                    lambda ws, r: calls.append((len(ws), r)))
    >>> calls
    [(2, TimeWindow(start=0, end=8))]
    """
    current: TimeWindow | None = None
    members: list[TimeWindow] = []
    for candidate in sorted(windows, key=lambda w: (w.start, w.end)):
        if current is None:
            current, members = candidate, [candidate]
        elif current.intersects(candidate):
            current = current.cover(candidate)
            members.append(candidate)
        else:
            if len(members) > 1:
                merge(members, current)
            current, members = candidate, [candidate]
    if current is not None and len(members) > 1:
        merge(members, current)
