"""What a keyed backend hands to checkpoint storage: a snapshot, key group by key group.

The synchronous phase of a snapshot (on the processing thread) produces a
:class:`KeyedStateSnapshot`; the asynchronous phase (a background writer) walks it in ascending
key-group order and releases each key group as soon as it is written, so that copy-on-write
overhead shrinks while the write progresses (SPEC §5.4).
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from typing import Any

from streamstate.keygroups import KeyGroupRange
from streamstate.serializers.base import TypeSerializer

__all__ = [
    "TIMER_STATE_KIND",
    "KeyedStateSnapshot",
    "SnapshotSource",
    "SourcesKeyedStateSnapshot",
    "StateMetaInfo",
]

TIMER_STATE_KIND = "timer"
"""Kind of the pseudo-states holding timers; entries are ``(key, namespace, timestamp)``."""


@dataclasses.dataclass
class StateMetaInfo:
    """Name, kind and serializers of one state as written into a snapshot."""

    name: str
    #: a StateKind value ("value", "list", "map", "reducing", "aggregating") or "timer"
    kind: str
    namespace_serializer: TypeSerializer[Any]
    #: serializer of the whole stored state of one (key, namespace) (list, dict, value, ...)
    state_serializer: TypeSerializer[Any]
    #: StateTtlConfig.to_dict() when the state has TTL (stored values are then TTL-wrapped)
    ttl: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "namespace_serializer": self.namespace_serializer.snapshot(),
            "state_serializer": self.state_serializer.snapshot(),
            "ttl": self.ttl,
        }


class KeyedStateSnapshot(ABC):
    """A consistent image of one keyed backend's state, readable key group by key group."""

    key_serializer: TypeSerializer[Any]
    max_parallelism: int
    key_group_range: KeyGroupRange
    states: list[StateMetaInfo]

    @abstractmethod
    def key_group_entries(
        self, key_group: int
    ) -> Iterator[tuple[int, Iterable[tuple[Any, Any, Any]]]]:
        """For one key group: ``(state index, entries)`` per state that has entries there.

        Entries are ``(key, namespace, state)``; snapshot transformers (TTL) are already applied.
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
    def entries(self, key_group_index: int) -> Iterable[tuple[Any, Any, Any]] | None:
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
    ) -> None:
        self.key_serializer = key_serializer
        self.max_parallelism = max_parallelism
        self.key_group_range = key_group_range
        self.checkpoint_id = checkpoint_id
        self._sources = sources
        self.states = [s.meta for s in sources]
        self._released = False

    def key_group_entries(
        self, key_group: int
    ) -> Iterator[tuple[int, Iterable[tuple[Any, Any, Any]]]]:
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
