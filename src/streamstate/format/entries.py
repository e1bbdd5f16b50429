"""How many entries a keyed state holds: the one count behind every figure that says so (the
``numRowsTotal`` of Spark's progress, ``streamstate checkpoints inspect``, the
``streamstate-metadata`` data source).

=================================  ====================================================
state kind                         entries
=================================  ====================================================
value, reducing, aggregating       one per (key, namespace) holding a value
map                                one per mapping (a key, a namespace and a user key)
list                               one per element
timers (kind ``timer``)            none: timers are counted apart, one per
                                   (timestamp, key, namespace)
=================================  ====================================================

A state with a time-to-live counts what it stores: an expired entry (or element, or mapping)
that cleanup has not removed yet counts until it is removed. The counts apply to the stored
form of a state, the same in every backend and in the canonical snapshot format: a list is
stored as the list of its elements, a map as the dict of its mappings (with a time-to-live,
of their ``(timestamp, value)`` pairs).

>>> entries_of("map", {"a": 1, "b": 2}), entries_of("list", [1, 2, 3]), entries_of("value", 7)
(2, 3, 1)
>>> count_entries("list", [[1], [2, 3]])
3
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from streamstate.format.meta import TIMER_STATE_KIND

__all__ = ["COUNTED_BY_ELEMENT", "count_entries", "entries_of"]

#: the kinds of state whose stored value is a collection that counts one entry per element
COUNTED_BY_ELEMENT = frozenset({"list", "map"})


def entries_of(kind: str, stored: Any) -> int:
    """The entries one stored (key, namespace) value of a state of ``kind`` counts for (the
    module's table); a timer queue's raises ValueError (timers are counted apart)."""
    if kind in COUNTED_BY_ELEMENT:
        return len(stored)
    if kind == TIMER_STATE_KIND:
        raise ValueError("timers are not state entries; count them apart")
    return 1


def count_entries(kind: str, stored_values: Iterable[Any]) -> int:
    """The entries of a state of ``kind`` whose stored (key, namespace) values are
    ``stored_values`` (:func:`entries_of` summed)."""
    if kind in COUNTED_BY_ELEMENT:
        return sum(map(len, stored_values))
    if kind == TIMER_STATE_KIND:
        raise ValueError("timers are not state entries; count them apart")
    return sum(1 for _ in stored_values)
