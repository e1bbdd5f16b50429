"""Snapshots of the heap keyed backend (SPEC §5.4).

The synchronous phase takes one state-map snapshot per key group of every state table (O(total
buckets) pointer copies with the copy-on-write map; a deep copy with nested maps) and asks every
other participant (timer queues) for its snapshot sources. The asynchronous phase walks key groups
in ascending order and releases each one once written.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from streamstate.backends.heap.state_map import StateMapSnapshot, StateSnapshotTransformer
from streamstate.format.meta import StateMetaInfo
from streamstate.format.snapshot import EntryColumns, SnapshotSource, SourcesKeyedStateSnapshot

__all__ = ["HeapKeyedStateSnapshot", "StateTableSnapshotSource"]


class StateTableSnapshotSource(SnapshotSource):
    """The per-key-group map snapshots of one state table."""

    __slots__ = ("_snapshots", "_transformer", "meta")

    def __init__(
        self,
        meta: StateMetaInfo,
        snapshots: list[StateMapSnapshot],
        transformer: StateSnapshotTransformer | None,
    ) -> None:
        self.meta = meta
        self._snapshots: list[StateMapSnapshot | None] = list(snapshots)
        self._transformer = transformer

    def entries(self, key_group_index: int) -> Iterable[tuple[Any, Any, Any]] | None:
        snap = self._snapshots[key_group_index]
        if snap is None or len(snap) == 0:
            return None
        if self._transformer is None:
            columns = getattr(snap, "columns", None)
            if columns is not None:
                return EntryColumns(*columns())  # no tuple per entry
            heads = getattr(snap, "bucket_heads", None)
            if heads is not None:
                return _chain_columns(heads())
        return snap.iter_transformed(self._transformer)

    def release_key_group(self, key_group_index: int) -> None:
        snap = self._snapshots[key_group_index]
        if snap is not None:
            snap.release()
            self._snapshots[key_group_index] = None

    def release(self) -> None:
        for i in range(len(self._snapshots)):
            self.release_key_group(i)


class HeapKeyedStateSnapshot(SourcesKeyedStateSnapshot):
    """The result of the heap backend's synchronous snapshot phase."""


def _chain_columns(heads: list[Any]) -> EntryColumns:
    """Columns of a copy-on-write snapshot, walking its bucket chains (no tuple per entry)."""
    keys: list[Any] = []
    namespaces: list[Any] = []
    states: list[Any] = []
    add_key, add_ns, add_state = keys.append, namespaces.append, states.append
    for e in heads:
        while e is not None:
            add_key(e.key)
            add_ns(e.namespace)
            add_state(e.state)
            e = e.next
    return EntryColumns(keys, namespaces, states)
