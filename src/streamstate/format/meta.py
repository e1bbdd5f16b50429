"""The meta data of one state: its live form and the form a snapshot holds (SPEC §4, §6.2).

A registered state's :class:`StateMetaInfo` carries its serializers; a snapshot writes its
:class:`StateMetaSnapshot` (the serializers' snapshots) into file headers and manifests, and a
restore reads it back as the same typed structure, from the file header to the backend:

>>> from streamstate.serializers import Int64Serializer, VoidNamespaceSerializer
>>> live = StateMetaInfo("count", "value", VoidNamespaceSerializer(), Int64Serializer())
>>> snap = live.snapshot()
>>> snap.name, snap.kind, snap.state_serializer["type"]
('count', 'value', 'int64')
>>> StateMetaSnapshot.from_header({"id": 0, **snap.to_dict()}) == snap
True
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec

from streamstate.serializers.base import SerializerSnapshot, TypeSerializer

__all__ = ["TIMER_STATE_KIND", "StateMetaInfo", "StateMetaSnapshot"]

TIMER_STATE_KIND = "timer"
"""Kind of the pseudo-states holding timers; entries are ``(key, namespace, timestamp)``."""


class StateMetaSnapshot(msgspec.Struct):
    """Meta data of one state as a checkpoint holds it (the snapshot form): name, kind, the
    serializer snapshots and the TTL configuration.

    It is encoded as the map ``{name, kind, namespace_serializer, state_serializer, ttl}`` in
    keyed snapshot file headers and backends' own manifests (docs/formats.md); decoding one of those
    gives this structure directly.
    """

    name: str
    #: a StateKind value ("value", "list", "map", "reducing", "aggregating") or "timer"
    kind: str
    namespace_serializer: SerializerSnapshot
    state_serializer: SerializerSnapshot
    #: StateTtlConfig.to_dict() when the state has TTL (stored values are then TTL-wrapped)
    ttl: dict[str, Any] | None = None

    @classmethod
    def from_header(cls, description: Any) -> StateMetaSnapshot:
        """The meta data of a file header's state description (extra keys, such as the state's
        ``id`` in a keyed snapshot file, are ignored). Raises ``msgspec.ValidationError``."""
        return msgspec.convert(description, cls)

    def to_dict(self) -> dict[str, Any]:
        """The state description written into file headers."""
        return {
            "name": self.name,
            "kind": self.kind,
            "namespace_serializer": self.namespace_serializer,
            "state_serializer": self.state_serializer,
            "ttl": self.ttl,
        }

    @property
    def is_timer(self) -> bool:
        """Whether this is the pseudo-state of a timer queue."""
        return self.kind == TIMER_STATE_KIND


@dataclasses.dataclass
class StateMetaInfo:
    """Name, kind and serializers of one registered state (the live form of its meta data)."""

    name: str
    #: a StateKind value ("value", "list", "map", "reducing", "aggregating") or "timer"
    kind: str
    namespace_serializer: TypeSerializer[Any]
    #: serializer of the whole stored state of one (key, namespace) (list, dict, value, ...)
    state_serializer: TypeSerializer[Any]
    #: StateTtlConfig.to_dict() when the state has TTL (stored values are then TTL-wrapped)
    ttl: dict[str, Any] | None = None

    def snapshot(self) -> StateMetaSnapshot:
        """The snapshot form written into checkpoints."""
        return StateMetaSnapshot(
            self.name,
            self.kind,
            self.namespace_serializer.snapshot(),
            self.state_serializer.snapshot(),
            self.ttl,
        )

    def to_dict(self) -> dict[str, Any]:
        return self.snapshot().to_dict()
