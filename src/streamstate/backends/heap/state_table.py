"""A heap state table: one :class:`StateMap` per key group of the backend's range (SPEC §5.1).

Operations on the current key go to ``maps[ctx.kg_index]``; the backend sets ``kg_index`` once per
key change, so a state access costs one list index plus the map operation. Before any key is
set, ``kg_index`` points at a guard map (one past the key-group maps) that raises
:class:`~streamstate.errors.NoCurrentKeyError`, so the hot path needs no ``if``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from streamstate.backends.base import KeyContext
from streamstate.backends.heap.state_map import StateMap, StateMapSnapshot, StateSnapshotTransformer
from streamstate.errors import KeyGroupOutOfRangeError, NoCurrentKeyError
from streamstate.format.entries import COUNTED_BY_ELEMENT, count_entries
from streamstate.format.meta import StateMetaInfo
from streamstate.keygroups import KeyGroupRange, assign_to_key_group

__all__ = ["NoCurrentKeyGuard", "StateTable"]


class NoCurrentKeyGuard(StateMap):
    """Stands in for a key group's map while no current key is set: every access raises."""

    __slots__ = ("_name",)

    def __init__(self, state_name: str) -> None:
        self._name = state_name

    def _fail(self, *_: Any) -> Any:
        raise NoCurrentKeyError(
            f"state {self._name!r} was accessed with no current key set; keyed state can only be "
            "used while processing a record or timer of a key (or after set_current_key)"
        )

    get = contains = put = put_and_get_old = remove = remove_and_get_old = transform = _fail  # type: ignore[assignment]
    snapshot = _fail  # type: ignore[assignment]

    def __len__(self) -> int:
        return 0

    def __iter__(self) -> Iterator[tuple[Any, Any, Any]]:
        return iter(())


class StateTable:
    """The storage of one registered heap state, split by key group."""

    __slots__ = ("ctx", "elements", "key_group_range", "maps", "meta", "snapshot_transformer")

    def __init__(
        self,
        ctx: KeyContext,
        key_group_range: KeyGroupRange,
        meta: StateMetaInfo,
        map_factory: Callable[[], StateMap],
    ) -> None:
        self.ctx = ctx
        self.key_group_range = key_group_range
        self.meta = meta
        self.maps: list[StateMap] = [map_factory() for _ in key_group_range]
        self.maps.append(NoCurrentKeyGuard(meta.name))
        #: applied to each state while writing a full snapshot (TTL cleanup); None = identity
        self.snapshot_transformer: StateSnapshotTransformer | None = None
        #: list and map states: their elements (mappings), kept by the state handles as they
        #: change them, so that :meth:`entry_count` costs no walk
        self.elements = 0

    # ---- current key ---------------------------------------------------------------------------

    def get(self, namespace: Any) -> Any:
        ctx = self.ctx
        return self.maps[ctx.kg_index].get(ctx.key, namespace)

    def contains(self, namespace: Any) -> bool:
        ctx = self.ctx
        return self.maps[ctx.kg_index].contains(ctx.key, namespace)

    def put(self, namespace: Any, state: Any) -> None:
        ctx = self.ctx
        self.maps[ctx.kg_index].put(ctx.key, namespace, state)

    def put_and_get_old(self, namespace: Any, state: Any) -> Any:
        ctx = self.ctx
        return self.maps[ctx.kg_index].put_and_get_old(ctx.key, namespace, state)

    def remove(self, namespace: Any) -> None:
        ctx = self.ctx
        self.maps[ctx.kg_index].remove(ctx.key, namespace)

    def remove_and_get_old(self, namespace: Any) -> Any:
        ctx = self.ctx
        return self.maps[ctx.kg_index].remove_and_get_old(ctx.key, namespace)

    def transform(self, namespace: Any, value: Any, fn: Callable[[Any, Any], Any]) -> None:
        ctx = self.ctx
        self.maps[ctx.kg_index].transform(ctx.key, namespace, value, fn)

    # ---- explicit key --------------------------------------------------------------------------

    def map_for_key_group(self, key_group: int) -> StateMap:
        index = key_group - self.key_group_range.start
        if not 0 <= index < len(self.key_group_range):
            raise KeyGroupOutOfRangeError(
                f"state {self.meta.name!r}: key group {key_group} is outside this table's range "
                f"{self.key_group_range}"
            )
        return self.maps[index]

    def map_for_key(self, key: Any, max_parallelism: int) -> StateMap:
        return self.map_for_key_group(assign_to_key_group(key, max_parallelism))

    # ---- whole table ---------------------------------------------------------------------------

    def size(self) -> int:
        """(key, namespace) entries (O(key groups))."""
        return sum(len(m) for m in self.maps)

    def entry_count(self) -> int:
        """The state's entries as ``streamstate.format.entries`` counts them: one per (key,
        namespace) of a value, reducing or aggregating state, one per element or mapping of a
        list or map state (O(key groups))."""
        return self.elements if self.meta.kind in COUNTED_BY_ELEMENT else self.size()

    def recount(self) -> None:
        """Count a list or map state's elements again by walking it (O(entries)): after
        entries were put into the maps directly (a restore)."""
        if self.meta.kind in COUNTED_BY_ELEMENT:
            self.elements = count_entries(self.meta.kind, (state for _, _, state in self))

    def __len__(self) -> int:
        return self.size()

    def keys(self, namespace: Any) -> Iterator[Any]:
        for m in self.maps[:-1]:
            yield from m.keys(namespace)

    def __iter__(self) -> Iterator[tuple[Any, Any, Any]]:
        """``(key, namespace, state)`` of every entry, in key-group order."""
        for m in self.maps[:-1]:
            yield from m

    def key_group_maps(self) -> list[StateMap]:
        """The maps of the key groups, in key-group order (without the guard)."""
        return self.maps[:-1]

    def replace_states(self, convert: Callable[[list[Any]], list[Any]]) -> None:
        """Replace every entry's state by its image under ``convert`` (applied to a column of
        states at a time): a restored state migrating to a new type. O(entries); all or
        nothing (every key group is converted before any changes)."""
        commits = [m.replace_states(convert) for m in self.maps[:-1]]
        for commit in commits:
            commit()

    def snapshot_maps(self) -> list[StateMapSnapshot]:
        """One snapshot per key group, in key-group order (the synchronous phase)."""
        return [m.snapshot() for m in self.maps[:-1]]
