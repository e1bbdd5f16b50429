"""What a subtask receives for a window pre-aggregated before the shuffle (SPEC §13.2): a
:class:`Partial` per folded group, handed to
:meth:`~streamstate.windows.operator.WindowOperator.process_partial` (how and when windows are
pre-aggregated: :mod:`streamstate.windows.pre_aggregation`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["LATE", "PARTIAL", "WINDOWLESS", "Partial"]

#: a partial: the accumulator of one (key, window) group
PARTIAL = 0
#: late elements: every window of theirs was late (dropped and counted, or the side output)
LATE = 1
#: elements that belong to no window (a sliding window's gaps when slide > size): counted only
WINDOWLESS = 2


class Partial:
    """What a subtask merges into a window operator for one row it received (see
    :meth:`~streamstate.windows.operator.WindowOperator.process_partial`)."""

    __slots__ = ("accumulator", "count", "element", "kind", "records", "timestamp", "window")

    def __init__(
        self,
        kind: int,
        window: Any = None,
        accumulator: Any = None,
        timestamp: int | None = None,
        count: int = 1,
        element: Any = None,
        records: int | None = None,
    ) -> None:
        #: PARTIAL, LATE or WINDOWLESS
        self.kind = kind
        #: the window (event-time windows), or None: the operator assigns it
        self.window = window
        #: the group's accumulator (aggregate) or reduced value (reduce)
        self.accumulator = accumulator
        #: the group's earliest timestamp (what a trigger sees as the element's timestamp);
        #: WINDOWLESS: the elements' timestamp when the fold left their lateness to the subtask
        self.timestamp = timestamp
        #: elements in the group
        self.count = count
        #: a late element itself (for the late side output), else None
        self.element = element
        #: elements whose latest window is this group's (a PARTIAL): late elements if the
        #: window is late (the fold left lateness to the subtask)
        self.records = count if records is None else records

    def __repr__(self) -> str:
        return (
            f"Partial(kind={self.kind}, window={self.window!r}, accumulator={self.accumulator!r}, "
            f"timestamp={self.timestamp}, count={self.count})"
        )
