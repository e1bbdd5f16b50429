"""Operator state: non-keyed state of one subtask (SPEC §1, §2.2, §7).

Three kinds, which differ only in how they are redistributed on restore: split-distribute list
state (elements dealt out round-robin), union list state (every subtask gets every element) and
broadcast state (a map of which every subtask holds a full copy). Operator state always lives on
the heap and is snapshotted synchronously (it is small by design: offsets, rules, buffers).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from typing import Any

from streamstate.api.descriptors import ListStateDescriptor, MapStateDescriptor, validate_name
from streamstate.api.functions import OperatorStateStore
from streamstate.api.state import BroadcastState, ListState
from streamstate.errors import StateAccessError, StateMigrationException
from streamstate.serializers.base import TypeSerializer, describe_snapshot
from streamstate.serializers.migration import MigratingSerializer, migrating_serializer

__all__ = [
    "BroadcastStateSnapshot",
    "HeapBroadcastState",
    "ListStateSnapshot",
    "OperatorStateBackend",
    "OperatorStateMode",
    "OperatorStateSnapshot",
    "PartitionableListState",
]


class OperatorStateMode(enum.Enum):
    """How a list state is redistributed on restore."""

    SPLIT_DISTRIBUTE = "split_distribute"
    UNION = "union"
    BROADCAST = "broadcast"


class PartitionableListState(ListState[Any]):
    """An operator list state (split-distribute or union)."""

    def __init__(
        self, name: str, mode: OperatorStateMode, element_serializer: TypeSerializer[Any]
    ) -> None:
        self.name = name
        self.mode = mode
        self.element_serializer = element_serializer
        self._list: list[Any] = []

    def get(self) -> list[Any]:
        return self._list

    def add(self, value: Any) -> None:
        if value is None:
            raise StateAccessError(f"operator list state {self.name!r}: None cannot be added")
        self._list.append(value)

    def add_all(self, values: Iterable[Any]) -> None:
        new = list(values)
        if any(v is None for v in new):
            raise StateAccessError(f"operator list state {self.name!r}: None cannot be added")
        self._list.extend(new)

    def update(self, values: Iterable[Any] | None) -> None:
        self._list = []
        if values is not None:
            self.add_all(values)

    def clear(self) -> None:
        self._list = []

    def __repr__(self) -> str:
        return (
            f"PartitionableListState({self.name!r}, {self.mode.value}, {len(self._list)} elements)"
        )


class HeapBroadcastState(BroadcastState[Any, Any]):
    """An operator map state that every subtask holds in full."""

    def __init__(
        self, name: str, key_serializer: TypeSerializer[Any], value_serializer: TypeSerializer[Any]
    ) -> None:
        self.name = name
        self.key_serializer = key_serializer
        self.value_serializer = value_serializer
        self._map: dict[Any, Any] = {}

    def get(self, key: Any) -> Any:
        return self._map.get(key)

    def contains(self, key: Any) -> bool:
        return key in self._map

    def items(self) -> Iterator[tuple[Any, Any]]:
        return iter(list(self._map.items()))

    def keys(self) -> Iterator[Any]:
        return iter(list(self._map))

    def put(self, key: Any, value: Any) -> None:
        self._map[key] = value

    def put_all(self, mapping: dict[Any, Any]) -> None:
        self._map.update(mapping)

    def remove(self, key: Any) -> None:
        self._map.pop(key, None)

    def clear(self) -> None:
        self._map.clear()

    def __len__(self) -> int:
        return len(self._map)


class ListStateSnapshot:
    """A copy of one operator list state at snapshot time."""

    __slots__ = ("element_serializer", "elements", "mode", "name")

    def __init__(
        self,
        name: str,
        mode: OperatorStateMode,
        element_serializer: TypeSerializer[Any],
        elements: list[Any],
    ) -> None:
        self.name = name
        self.mode = mode
        self.element_serializer = element_serializer
        self.elements = elements


class BroadcastStateSnapshot:
    """A copy of one broadcast state at snapshot time."""

    __slots__ = ("entries", "key_serializer", "name", "value_serializer")

    def __init__(
        self,
        name: str,
        key_serializer: TypeSerializer[Any],
        value_serializer: TypeSerializer[Any],
        entries: dict[Any, Any],
    ) -> None:
        self.name = name
        self.key_serializer = key_serializer
        self.value_serializer = value_serializer
        self.entries = entries


class OperatorStateSnapshot:
    """All operator state of one subtask at one checkpoint."""

    __slots__ = ("broadcast_states", "list_states")

    def __init__(
        self,
        list_states: dict[str, ListStateSnapshot] | None = None,
        broadcast_states: dict[str, BroadcastStateSnapshot] | None = None,
    ) -> None:
        self.list_states = list_states or {}
        self.broadcast_states = broadcast_states or {}

    def is_empty(self) -> bool:
        return not self.list_states and not self.broadcast_states


class OperatorStateBackend(OperatorStateStore):
    """Registry and storage of one subtask's operator state."""

    def __init__(self) -> None:
        self._lists: dict[str, PartitionableListState] = {}
        self._broadcasts: dict[str, HeapBroadcastState] = {}
        self._restored: OperatorStateSnapshot | None = None

    # ---- registration --------------------------------------------------------------------------

    def get_list_state(self, descriptor: ListStateDescriptor) -> PartitionableListState:
        return self._get_list(descriptor, OperatorStateMode.SPLIT_DISTRIBUTE)

    def get_union_list_state(self, descriptor: ListStateDescriptor) -> PartitionableListState:
        return self._get_list(descriptor, OperatorStateMode.UNION)

    def _get_list(
        self, descriptor: ListStateDescriptor, mode: OperatorStateMode
    ) -> PartitionableListState:
        if not isinstance(descriptor, ListStateDescriptor):
            raise TypeError(f"operator list state needs a ListStateDescriptor, got {descriptor!r}")
        name = validate_name(descriptor.name)
        if name in self._broadcasts:
            raise StateMigrationException(
                f"operator state {name!r} is registered as broadcast state, not list state"
            )
        state = self._lists.get(name)
        if state is not None:
            if state.mode is not mode:
                raise StateMigrationException(
                    f"operator state {name!r} is registered with mode {state.mode.value}; it "
                    f"cannot be requested with mode {mode.value}"
                )
            return state
        state = PartitionableListState(name, mode, descriptor.element_serializer)
        restored = self._restored.list_states.get(name) if self._restored else None
        if restored is not None:
            if restored.mode is not mode:
                raise StateMigrationException(
                    f"operator state {name!r} was checkpointed with mode {restored.mode.value} "
                    f"and is now requested with mode {mode.value}"
                )
            compat = descriptor.element_serializer.resolve_compatibility(
                restored.element_serializer.snapshot()
            )
            if compat.is_incompatible:
                raise StateMigrationException(
                    f"operator state {name!r}: the new element serializer "
                    f"{descriptor.element_serializer!r} cannot read the checkpointed elements "
                    f"written by {restored.element_serializer!r}"
                )
            state._list = _decoded(
                restored.element_serializer, list(restored.elements), descriptor.element_serializer
            )
        self._lists[name] = state
        return state

    def get_broadcast_state(self, descriptor: MapStateDescriptor) -> HeapBroadcastState:
        if not isinstance(descriptor, MapStateDescriptor):
            raise TypeError(f"broadcast state needs a MapStateDescriptor, got {descriptor!r}")
        name = validate_name(descriptor.name)
        if name in self._lists:
            raise StateMigrationException(
                f"operator state {name!r} is registered as list state, not broadcast state"
            )
        state = self._broadcasts.get(name)
        if state is not None:
            return state
        state = HeapBroadcastState(name, descriptor.key_serializer, descriptor.value_serializer)
        restored = self._restored.broadcast_states.get(name) if self._restored else None
        if restored is not None:
            for new, old, what in (
                (descriptor.key_serializer, restored.key_serializer, "key"),
                (descriptor.value_serializer, restored.value_serializer, "value"),
            ):
                if new.resolve_compatibility(old.snapshot()).is_incompatible:
                    raise StateMigrationException(
                        f"broadcast state {name!r}: the new {what} serializer {new!r} cannot read "
                        f"the checkpointed state written by {old!r}"
                    )
            keys = _decoded(
                restored.key_serializer, list(restored.entries), descriptor.key_serializer
            )
            values = _decoded(
                restored.value_serializer,
                list(restored.entries.values()),
                descriptor.value_serializer,
            )
            state._map = dict(zip(keys, values, strict=True))
        self._broadcasts[name] = state
        return state

    def registered_state_names(self) -> list[str]:
        return [*self._lists, *self._broadcasts]

    # ---- snapshot / restore --------------------------------------------------------------------

    def snapshot(self) -> OperatorStateSnapshot:
        """A synchronous deep copy of every operator state (restored but unused ones included)."""
        lists: dict[str, ListStateSnapshot] = {}
        broadcasts: dict[str, BroadcastStateSnapshot] = {}
        if self._restored is not None:
            # Restored state that this run never touched must survive the next checkpoint.
            lists.update(self._restored.list_states)
            broadcasts.update(self._restored.broadcast_states)
        for name, s in self._lists.items():
            cp = s.element_serializer.copy
            lists[name] = ListStateSnapshot(
                name, s.mode, s.element_serializer, [cp(v) for v in s.get()]
            )
        for name, b in self._broadcasts.items():
            kc, vc = b.key_serializer.copy, b.value_serializer.copy
            broadcasts[name] = BroadcastStateSnapshot(
                name, b.key_serializer, b.value_serializer, {kc(k): vc(v) for k, v in b.items()}
            )
        return OperatorStateSnapshot(lists, broadcasts)

    def restore(self, snapshot: OperatorStateSnapshot) -> None:
        """Install the (already redistributed) operator state of this subtask."""
        if self._lists or self._broadcasts:
            raise StateAccessError("operator state must be restored before any state is registered")
        self._restored = snapshot

    @property
    def is_restored(self) -> bool:
        return self._restored is not None


def _decoded(
    restored: TypeSerializer[Any], values: list[Any], declared: TypeSerializer[Any]
) -> list[Any]:
    """Values of a restored operator state as values of the declared serializer: decoded with
    it when the checkpoint left them encoded (types not rebuilt from the checkpoint: records,
    pickle), and migrated when the declaration changed compatibly (``int`` → ``float``, a
    record gaining a field, ...: ``serializers/evolution.py``)."""
    from streamstate.format.restore import RestoredSerializer

    try:
        reader = migrating_serializer(restored.snapshot(), declared, now=0)
        if isinstance(restored, RestoredSerializer):
            return restored.decode_with(values, declared if reader is None else reader)
        if isinstance(reader, MigratingSerializer):
            return reader.convert_values([restored.to_wire(v) for v in values])
        return values
    except Exception as exc:
        raise StateMigrationException(
            f"operator state values written by {describe_snapshot(restored.snapshot())} cannot "
            f"be read as {describe_snapshot(declared.snapshot())}: {exc}"
        ) from None
