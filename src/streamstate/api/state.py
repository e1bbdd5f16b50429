"""State interfaces (SPEC §2.2).

The public contracts (``ValueState``, ``ListState``, ...) are what user functions see. The
internal contracts (``InternalKvState`` and friends) add what the runtime needs: switching the
namespace, merging namespaces (windows), and access by explicit key.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from streamstate.api.descriptors import StateDescriptor

__all__ = [
    "AggregatingState",
    "AppendingState",
    "BroadcastState",
    "InternalAggregatingState",
    "InternalKvState",
    "InternalListState",
    "InternalMapState",
    "InternalMergingState",
    "InternalReducingState",
    "InternalValueState",
    "ListState",
    "MapState",
    "MergingState",
    "ReadOnlyBroadcastState",
    "ReducingState",
    "State",
    "ValueState",
]

T = TypeVar("T")
IN = TypeVar("IN")
OUT = TypeVar("OUT")
K = TypeVar("K")
V = TypeVar("V")


class State(ABC):
    """A handle to state scoped to the current key and namespace."""

    __slots__ = ()

    @abstractmethod
    def clear(self) -> None:
        """Remove the value of the current key and namespace."""


class ValueState(State, Generic[T]):
    """A single value."""

    __slots__ = ()

    @abstractmethod
    def value(self) -> T | None:
        """The value, or the descriptor's default (None unless given) when there is none."""

    @abstractmethod
    def update(self, value: T | None) -> None:
        """Set the value; ``None`` clears it."""


class AppendingState(State, Generic[IN, OUT]):
    """State to which values are added."""

    __slots__ = ()

    @abstractmethod
    def get(self) -> OUT | None:
        """The current result."""

    @abstractmethod
    def add(self, value: IN) -> None:
        """Add ``value``."""


class MergingState(AppendingState[IN, OUT]):
    """Appending state whose namespaces can be merged (session windows)."""

    __slots__ = ()


class ListState(MergingState[T, Iterable[T]]):
    """A list of values. ``get()`` returns an empty list when absent; None elements are refused."""

    __slots__ = ()

    @abstractmethod
    def get(self) -> list[T]:  # type: ignore[override]
        """The elements in the order they were added (an empty list when absent). The heap
        backend may hand out the stored list: copy it before keeping it."""

    @abstractmethod
    def add_all(self, values: Iterable[T]) -> None:
        """Append every element of ``values``."""

    @abstractmethod
    def update(self, values: Iterable[T] | None) -> None:
        """Replace the list; an empty list (or None) clears it."""


class ReducingState(MergingState[T, T]):
    """A value folded with a reduce function on every ``add``."""

    __slots__ = ()


class AggregatingState(MergingState[IN, OUT]):
    """An accumulator folded with an ``AggregateFunction``; ``get`` returns its result.

    ``add(None)`` clears the state (as Flink's heap backend; the function never sees None).
    """

    __slots__ = ()


class MapState(State, Generic[K, V]):
    """A map of user keys to values. Iteration order is unspecified."""

    __slots__ = ()

    @abstractmethod
    def get(self, key: K) -> V | None:
        """The value mapped to ``key``, or None."""

    @abstractmethod
    def put(self, key: K, value: V) -> None:
        """Map ``key`` to ``value``."""

    @abstractmethod
    def put_all(self, mapping: dict[K, V]) -> None:
        """Put every mapping of ``mapping``."""

    @abstractmethod
    def remove(self, key: K) -> None:
        """Remove ``key``; removing the last mapping removes the whole entry."""

    @abstractmethod
    def contains(self, key: K) -> bool:
        """Whether ``key`` is mapped (also to None, where the value type admits None)."""

    @abstractmethod
    def keys(self) -> Iterator[K]:
        """The user keys."""

    @abstractmethod
    def values(self) -> Iterator[V]:
        """The values."""

    @abstractmethod
    def items(self) -> Iterator[tuple[K, V]]:
        """The ``(user key, value)`` mappings."""

    @abstractmethod
    def is_empty(self) -> bool:
        """Whether the map of the current key and namespace has no mapping."""

    def __iter__(self) -> Iterator[K]:
        return self.keys()

    def __contains__(self, key: object) -> bool:
        return self.contains(key)  # type: ignore[arg-type]


class ReadOnlyBroadcastState(ABC, Generic[K, V]):
    """The read-only view of a broadcast state."""

    @abstractmethod
    def get(self, key: K) -> V | None:
        """The value mapped to ``key``, or None."""

    @abstractmethod
    def contains(self, key: K) -> bool:
        """Whether ``key`` is mapped."""

    @abstractmethod
    def items(self) -> Iterator[tuple[K, V]]:
        """The mappings."""


class BroadcastState(ReadOnlyBroadcastState[K, V]):
    """Operator state held in full by every subtask."""

    @abstractmethod
    def put(self, key: K, value: V) -> None:
        """Map ``key`` to ``value``."""

    @abstractmethod
    def put_all(self, mapping: dict[K, V]) -> None:
        """Put every mapping of ``mapping``."""

    @abstractmethod
    def remove(self, key: K) -> None:
        """Remove ``key``."""

    @abstractmethod
    def clear(self) -> None:
        """Remove every mapping."""


# --------------------------------------------------------------------------------------------
# Internal (backend-facing) contracts


class InternalKvState(State):
    """Backend-facing keyed state: adds the namespace and access by explicit key."""

    __slots__ = ()

    @property
    @abstractmethod
    def descriptor(self) -> StateDescriptor:
        """The descriptor the state was registered with."""

    @abstractmethod
    def set_current_namespace(self, namespace: Any) -> None:
        """Scope subsequent operations to ``namespace``."""

    @abstractmethod
    def get_current_namespace(self) -> Any: ...


class InternalValueState(InternalKvState, ValueState[T]):
    __slots__ = ()


class InternalMergingState(InternalKvState):
    __slots__ = ()

    @abstractmethod
    def merge_namespaces(self, target: Any, sources: Iterable[Any]) -> None:
        """Merge the states of ``sources`` into ``target`` (for the current key) and remove them."""

    @abstractmethod
    def get_internal(self) -> Any:
        """The stored state of the current key and namespace as it is (the list, the reduced
        value, the accumulator), or None. Decorators (TTL) read through this."""

    @abstractmethod
    def update_internal(self, value: Any) -> None:
        """Replace the stored state of the current key and namespace; None (or an empty list for
        list state) removes it."""


class InternalListState(InternalMergingState, ListState[T]):
    __slots__ = ()


class InternalReducingState(InternalMergingState, ReducingState[T]):
    __slots__ = ()


class InternalAggregatingState(InternalMergingState, AggregatingState[IN, OUT]):
    __slots__ = ()


class InternalMapState(InternalKvState, MapState[K, V]):
    __slots__ = ()
