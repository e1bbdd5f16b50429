"""What a keyed backend hands to checkpoint storage: a snapshot, key group by key group.

The synchronous phase of a snapshot (on the processing thread) produces a
:class:`KeyedStateSnapshot`; the asynchronous phase (a background writer) walks it in ascending
key-group order and releases each key group as soon as it is written, so that copy-on-write
overhead shrinks while the write progresses (SPEC §5.4).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from typing import Any

from streamstate.format.meta import StateMetaInfo
from streamstate.keygroups import KeyGroupRange
from streamstate.serializers.base import TypeSerializer

__all__ = [
    "DELTA_SNAPSHOT",
    "FULL_SNAPSHOT",
    "DeltaEntries",
    "EncodedEntries",
    "EntryColumns",
    "KeyedStateSnapshot",
    "SnapshotSource",
    "SourcesKeyedStateSnapshot",
]

FULL_SNAPSHOT = "full"
"""A snapshot holding every entry of its key groups."""
DELTA_SNAPSHOT = "delta"
"""A snapshot holding only what changed since the previous checkpoint (SPEC §6.3)."""


class EncodedEntries:
    """Entries of one state in one key group, still in the snapshot file's encoding.

    A backend hands these out for state it restored but never decoded (a state the program has
    not registered yet); the writer copies ``data`` into the new file as it is.
    """

    __slots__ = ("count", "data")

    def __init__(self, data: bytes, count: int) -> None:
        #: one entries section (see docs/formats.md)
        self.data = data
        self.count = count


class EntryColumns:
    """Entries as columns: ``keys``, ``namespaces`` (one per key, or a single one shared by all)
    and ``states`` (None for removed entries). Saves building a tuple per entry."""

    __slots__ = ("keys", "namespaces", "states")

    def __init__(self, keys: list[Any], namespaces: list[Any], states: list[Any] | None) -> None:
        self.keys = keys
        self.namespaces = namespaces
        self.states = states

    def __len__(self) -> int:
        return len(self.keys)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        """``(key, namespace, state)`` (``(key, namespace)`` without states), like a list."""
        ns = self.namespaces
        if len(ns) != len(self.keys):
            ns = ns * len(self.keys)
        if self.states is None:
            return zip(self.keys, ns, strict=True)
        return zip(self.keys, ns, self.states, strict=True)


class DeltaEntries:
    """What changed in one state and key group since the previous checkpoint.

    ``upserts`` are ``(key, namespace, state)`` to write; ``removed`` are ``(key, namespace)``
    whose entries are gone. ``removed=None`` means *replace*: ``upserts`` is the complete content
    of the key group for this state (timers use this).
    """

    __slots__ = ("removed", "upserts")

    def __init__(
        self,
        upserts: list[tuple[Any, Any, Any]] | EntryColumns,
        removed: list[tuple[Any, Any]] | EntryColumns | None,
    ) -> None:
        self.upserts = upserts
        self.removed = removed


class KeyedStateSnapshot(ABC):
    """A consistent image of one keyed backend's state, readable key group by key group."""

    key_serializer: TypeSerializer[Any]
    max_parallelism: int
    key_group_range: KeyGroupRange
    states: list[StateMetaInfo]
    #: FULL_SNAPSHOT, or DELTA_SNAPSHOT for the changes since the previous checkpoint
    kind: str = FULL_SNAPSHOT
    #: the checkpoint the snapshot was taken for (0: none, e.g. a savepoint of a test backend)
    checkpoint_id: int = 0

    @abstractmethod
    def key_group_entries(
        self, key_group: int
    ) -> Iterator[tuple[int, Iterable[tuple[Any, Any, Any]] | EncodedEntries | DeltaEntries]]:
        """For one key group: ``(state index, entries)`` per state that has entries there.

        Entries are ``(key, namespace, state)``; snapshot transformers (TTL) are already applied.
        A source may instead give :class:`EncodedEntries` (restored, never decoded) and, in a
        delta snapshot, :class:`DeltaEntries`.
        """

    @abstractmethod
    def release_key_group(self, key_group: int) -> None:
        """The key group was written; its copy-on-write versions may be dropped."""

    @abstractmethod
    def release(self) -> None:
        """The whole snapshot is done (written or abandoned). Idempotent."""

    def __enter__(self) -> KeyedStateSnapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class SnapshotSource(ABC):
    """One state's contribution to a keyed snapshot, key group by key group."""

    meta: StateMetaInfo

    @abstractmethod
    def entries(
        self, key_group_index: int
    ) -> Iterable[tuple[Any, Any, Any]] | EncodedEntries | DeltaEntries | None:
        """``(key, namespace, state)`` of one key group (index from the range start), or None."""

    def release_key_group(self, key_group_index: int) -> None:  # noqa: B027 - optional
        """The key group was written."""

    def release(self) -> None:  # noqa: B027 - optional
        """The snapshot is done."""


class SourcesKeyedStateSnapshot(KeyedStateSnapshot):
    """A keyed snapshot assembled from one :class:`SnapshotSource` per state (and timer queue)."""

    def __init__(
        self,
        key_serializer: TypeSerializer[Any],
        max_parallelism: int,
        key_group_range: KeyGroupRange,
        sources: list[SnapshotSource],
        checkpoint_id: int = 0,
        kind: str = FULL_SNAPSHOT,
    ) -> None:
        self.kind = kind
        self.key_serializer = key_serializer
        self.max_parallelism = max_parallelism
        self.key_group_range = key_group_range
        self.checkpoint_id = checkpoint_id
        self._sources = sources
        self.states = [s.meta for s in sources]
        self._released = False

    def key_group_entries(
        self, key_group: int
    ) -> Iterator[tuple[int, Iterable[tuple[Any, Any, Any]] | EncodedEntries | DeltaEntries]]:
        index = key_group - self.key_group_range.start
        for state_index, source in enumerate(self._sources):
            entries = source.entries(index)
            if entries is not None:
                yield state_index, entries

    def release_key_group(self, key_group: int) -> None:
        index = key_group - self.key_group_range.start
        for source in self._sources:
            source.release_key_group(index)

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        for source in self._sources:
            source.release()
