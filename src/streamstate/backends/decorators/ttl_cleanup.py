"""TTL cleanup of stored states: snapshot filter, incremental cleanup, bounded sweeps (SPEC §8).

All three strategies apply one function, :func:`snapshot_transform`, to stored (TTL-wrapped)
states: it returns the state without its expired parts, the state itself when nothing expired, or
None when nothing is left. See :mod:`streamstate.backends.decorators.ttl` for the whole picture.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from streamstate.api.descriptors import StateKind
from streamstate.api.ttl import StateTtlConfig
from streamstate.format.entries import COUNTED_BY_ELEMENT

__all__ = [
    "LONG_MAX",
    "IncrementalCleanup",
    "TtlCleanupHook",
    "TtlPolicy",
    "snapshot_transform",
    "sweep",
]

LONG_MAX = (1 << 63) - 1


_NO_CUTOFF = float("-inf")


class TtlPolicy:
    """The parts of a :class:`StateTtlConfig` the hot path needs, plus the clock.

    >>> class FixedClock:
    ...     def now(self): return 1_000
    >>> p = TtlPolicy(StateTtlConfig(ttl=100), FixedClock())
    >>> p.expired(900, 1_000), p.expired(901, 1_000)
    (True, False)
    >>> p.cutoff(LONG_MAX) == LONG_MAX     # at the end of time everything is expired
    True
    """

    __slots__ = ("config", "now", "return_expired", "ttl", "update_on_read")

    def __init__(self, config: StateTtlConfig, clock: Any) -> None:
        self.config = config
        self.ttl = config.ttl
        self.now: Callable[[], int] = clock.now
        self.update_on_read = config.update_type is StateTtlConfig.UpdateType.OnReadAndWrite
        self.return_expired = (
            config.state_visibility is StateTtlConfig.StateVisibility.ReturnExpiredIfNotCleanedUp
        )

    def cutoff(self, now: int) -> int:
        """A value is expired at ``now`` iff its timestamp is ``<= cutoff(now)``.

        ``ts + ttl <= now`` with ``ts + ttl`` saturating at ``LONG_MAX`` is the same as
        ``ts <= now - ttl`` except when ``now`` is ``LONG_MAX`` itself (then everything is).
        """
        return now - self.ttl if now < LONG_MAX else LONG_MAX

    def expired(self, ts: int, now: int) -> bool:
        return ts <= self.cutoff(now)

    def unexpired_cutoff(self, now: int) -> float:
        """Flink's ``getUnexpired``: a stored value is built upon (by a reduce, an aggregate's
        ``add``, a merge) iff its timestamp is ``> unexpired_cutoff(now)``; with
        ``ReturnExpiredIfNotCleanedUp`` that is any value still stored, expired or not.

        >>> class FixedClock:
        ...     def now(self): return 1_000
        >>> visible = StateTtlConfig.StateVisibility.ReturnExpiredIfNotCleanedUp
        >>> TtlPolicy(StateTtlConfig(ttl=100), FixedClock()).unexpired_cutoff(1_000)
        900
        >>> TtlPolicy(StateTtlConfig(ttl=100, state_visibility=visible), FixedClock()
        ...           ).unexpired_cutoff(1_000)
        -inf
        """
        return _NO_CUTOFF if self.return_expired else self.cutoff(now)


def snapshot_transform(kind: StateKind, policy: TtlPolicy) -> Callable[[Any], Any]:
    """``stored state -> stored state without expired parts``, or None when nothing is left.

    Returns its argument itself when nothing expired, and never mutates it (it runs on snapshot
    data shared with the working state).
    """
    now_fn = policy.now
    cutoff_fn = policy.cutoff

    if kind is StateKind.LIST:

        def transform_list(lst: Any) -> Any:
            cutoff = cutoff_fn(now_fn())
            live = [e for e in lst if e[0] > cutoff]
            if len(live) == len(lst):
                return lst
            return live or None

        return transform_list

    if kind is StateKind.MAP:

        def transform_map(d: Any) -> Any:
            cutoff = cutoff_fn(now_fn())
            live = {k: v for k, v in d.items() if v[0] > cutoff}
            if len(live) == len(d):
                return d
            return live or None

        return transform_map

    def transform_value(tv: Any) -> Any:
        if tv is None or tv[0] <= cutoff_fn(now_fn()):
            return None
        return tv

    return transform_value


class IncrementalCleanup:
    """Heap incremental cleanup of one state table: a cursor over its key groups.

    Each :meth:`step` does at most ``cleanup_size`` units of work: checking one entry (and
    removing it, or rewriting it without its expired elements), or moving on to the next key
    group. On entering a key group it takes the list of that group's ``(key, namespace)`` pairs
    (iterating the map, as the :class:`StateMap` contract allows), then checks them one by one
    through ``get``/``put``/``remove`` on later steps, so the map may change in between. Each
    entry is thus visited once per full pass; a pass over ``n`` entries in ``g`` key groups takes
    ``(n + g) / cleanup_size`` state accesses.

    Complexity: O(cleanup_size) per step, plus O(entries of a key group) once when entering it.
    """

    __slots__ = (
        "_elements",
        "_kg",
        "_map",
        "_maps",
        "_num_groups",
        "_pending",
        "_pos",
        "_size",
        "_table",
        "_transform",
    )

    def __init__(self, table: Any, transform: Callable[[Any], Any], cleanup_size: int) -> None:
        if cleanup_size < 1:
            raise ValueError(f"cleanup_size must be >= 1, got {cleanup_size}")
        self._table = table
        #: a list or map state: the table counts its elements, which a cleanup removes
        self._elements = table.meta.kind in COUNTED_BY_ELEMENT
        # the table's own list (its last element is the no-current-key guard, never visited)
        self._maps = table.maps
        self._num_groups = len(table.maps) - 1
        self._transform = transform
        self._size = cleanup_size
        self._kg = 0
        self._map: Any = None
        self._pending: list[tuple[Any, Any]] = []
        self._pos = 0

    def step(self) -> int:
        """Run one bounded cleanup step; returns the number of entries checked."""
        budget = self._size
        pending = self._pending
        pos = self._pos
        m = self._map
        transform = self._transform
        checked = 0
        while budget > 0:
            budget -= 1
            if pos >= len(pending):
                kg = self._kg
                m = self._maps[kg]
                self._kg = kg + 1 if kg + 1 < self._num_groups else 0
                pending = [(k, ns) for k, ns, _ in m] if len(m) else []
                pos = 0
                continue
            key, ns = pending[pos]
            pos += 1
            checked += 1
            state = m.get(key, ns)
            if state is None:
                continue
            new = transform(state)
            if new is None:
                m.remove(key, ns)
            elif new is not state:
                m.put(key, ns, new)
            else:
                continue
            if self._elements:
                self._table.elements -= len(state) - (0 if new is None else len(new))
        self._pending = pending
        self._pos = pos
        self._map = m
        return checked

    def __call__(self, *_: Any) -> None:
        """Run a step (usable as a ``key_selected_listeners`` callback)."""
        self.step()


class TtlCleanupHook:
    """The cleanup strategies of one TTL state, handed to its backend's
    ``register_ttl_cleanup``: the heap backend wires ``transform`` into the state table
    (snapshot transformer, :class:`IncrementalCleanup` of ``cleanup_size``); RocksDB runs the
    bounded sweep of the module docstring (:func:`sweep`) at snapshots.
    """

    __slots__ = (
        "cleanup_full_snapshot",
        "cleanup_size",
        "cursor",
        "max_entries_per_checkpoint",
        "run_cleanup_for_every_record",
        "state_name",
        "transform",
    )

    def __init__(
        self,
        state_name: str,
        transform: Callable[[Any], Any],
        cleanup_full_snapshot: bool,
        max_entries_per_checkpoint: int,
        cleanup_size: int = 0,
        run_cleanup_for_every_record: bool = False,
    ) -> None:
        self.state_name = state_name
        self.transform = transform
        self.cleanup_full_snapshot = cleanup_full_snapshot
        self.max_entries_per_checkpoint = max_entries_per_checkpoint
        #: heap incremental cleanup: entries checked per state access (0: off)
        self.cleanup_size = cleanup_size
        #: heap incremental cleanup: also step on every key change
        self.run_cleanup_for_every_record = run_cleanup_for_every_record
        #: the backend's resume position for the next sweep (None: start from the beginning)
        self.cursor: Any = None


def sweep(
    hook: TtlCleanupHook,
    entries: Iterator[tuple[Any, Any]],
    delete: Callable[[Any], None],
    put: Callable[[Any, Any], None],
) -> Any:
    """One bounded TTL sweep: visit at most ``hook.max_entries_per_checkpoint`` entries.

    ``entries`` yields ``(position, stored_state)`` starting at ``hook.cursor``; expired entries
    are deleted with ``delete(position)``, partly expired ones rewritten with ``put``. Returns
    the position to resume from next time (None once the iterator is exhausted, i.e. start over),
    and stores it in ``hook.cursor``.
    """
    transform = hook.transform
    left = hook.max_entries_per_checkpoint
    cursor: Any = None
    for position, state in entries:
        if left <= 0:
            cursor = position
            break
        left -= 1
        new = transform(state)
        if new is None:
            delete(position)
        elif new is not state:
            put(position, new)
    hook.cursor = cursor
    return cursor
