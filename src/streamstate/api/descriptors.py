"""State descriptors: the name, kind and serializers of a state (SPEC §2.1).

>>> d = ValueStateDescriptor("count", int, default=0)
>>> d.name, d.kind.value, d.default
('count', 'value', 0)
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from typing import Any

from streamstate.api.functions import AggregateFunction, ReduceFunction
from streamstate.api.ttl import StateTtlConfig
from streamstate.errors import InvalidStateNameError, UnsupportedStateTypeError
from streamstate.serializers import (
    DictSerializer,
    ListSerializer,
    TypeSerializer,
    serializer_for,
)

__all__ = [
    "MAX_NAME_LENGTH",
    "RESERVED_STATE_NAMES",
    "AggregatingStateDescriptor",
    "ListStateDescriptor",
    "MapStateDescriptor",
    "ReducingStateDescriptor",
    "StateDescriptor",
    "StateKind",
    "ValueStateDescriptor",
    "validate_name",
]

MAX_NAME_LENGTH = 200
RESERVED_STATE_NAMES = frozenset({"default"})
_UNSAFE = re.compile(r"[/\\\x00-\x1f\x7f]")


def validate_name(name: Any, what: str = "state") -> str:
    """Check a state or operator name; names become file and column-family names (SPEC §12)."""
    if not isinstance(name, str) or not name:
        raise InvalidStateNameError(f"a {what} name must be a non-empty str, got {name!r}")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidStateNameError(
            f"{what} name {name[:40]!r}... is {len(name)} characters long; "
            f"at most {MAX_NAME_LENGTH} are allowed"
        )
    if _UNSAFE.search(name) or name in (".", ".."):
        raise InvalidStateNameError(
            f"{what} name {name!r} contains a path separator or control character"
        )
    return name


def _serializer(name: Any, type_or_serializer: Any, what: str = "values") -> TypeSerializer[Any]:
    """The serializer of a type a descriptor names; a type streamstate cannot serialize raises
    :class:`~streamstate.errors.UnsupportedStateTypeError` naming the state."""
    try:
        return serializer_for(type_or_serializer)
    except TypeError as exc:
        raise UnsupportedStateTypeError(f"state {name!r}: the type of its {what}: {exc}") from None


class StateKind(enum.Enum):
    """The kind of a keyed state; a restored state must keep its kind."""

    VALUE = "value"
    LIST = "list"
    MAP = "map"
    REDUCING = "reducing"
    AGGREGATING = "aggregating"


class StateDescriptor:
    """Name, kind, serializer and optional TTL of one state.

    ``serializer`` serializes the whole stored state of one (key, namespace): the value for value
    and reducing state, the list for list state, the dict for map state, the accumulator for
    aggregating state.

    ``previous_name`` renames a state: a restore that finds no state ``name`` in the checkpoint
    but one named ``previous_name`` gives it to this state (checked and migrated like any other),
    and the next checkpoint holds it under ``name`` only. Keep it while a checkpoint written
    before the rename may still be restored; the old name must not be declared again.
    """

    kind: StateKind

    def __init__(
        self, name: str, serializer: TypeSerializer[Any], previous_name: str | None = None
    ) -> None:
        self.name = validate_name(name)
        if name in RESERVED_STATE_NAMES:
            raise InvalidStateNameError(
                f"state name {name!r} is reserved (it is RocksDB's default column family)"
            )
        if previous_name is not None:
            validate_name(previous_name, "previous state")
            if previous_name == name:
                raise InvalidStateNameError(
                    f"state {name!r}: previous_name must differ from the state's name"
                )
        self.serializer = serializer
        self.previous_name = previous_name
        self.ttl_config: StateTtlConfig | None = None

    def enable_time_to_live(self, ttl_config: StateTtlConfig) -> StateDescriptor:
        """Let values of this state expire (SPEC §8). Returns the descriptor."""
        if not isinstance(ttl_config, StateTtlConfig):
            raise TypeError(f"expected a StateTtlConfig, got {ttl_config!r}")
        self.ttl_config = ttl_config if ttl_config.is_enabled else None
        return self

    def get_name(self) -> str:
        """The state's name."""
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.serializer!r})"


class ValueStateDescriptor(StateDescriptor):
    """A :class:`~streamstate.api.state.ValueState` of ``type_or_serializer`` values."""

    kind = StateKind.VALUE

    def __init__(
        self,
        name: str,
        type_or_serializer: Any,
        default: Any = None,
        *,
        previous_name: str | None = None,
    ) -> None:
        super().__init__(name, _serializer(name, type_or_serializer), previous_name)
        self.default = default


class ListStateDescriptor(StateDescriptor):
    """A :class:`~streamstate.api.state.ListState` of ``element_type`` elements."""

    kind = StateKind.LIST

    def __init__(self, name: str, element_type: Any, *, previous_name: str | None = None) -> None:
        self.element_serializer: TypeSerializer[Any] = _serializer(name, element_type, "elements")
        super().__init__(name, ListSerializer(self.element_serializer), previous_name)


class MapStateDescriptor(StateDescriptor):
    """A :class:`~streamstate.api.state.MapState` from ``key_type`` to ``value_type``."""

    kind = StateKind.MAP

    def __init__(
        self, name: str, key_type: Any, value_type: Any, *, previous_name: str | None = None
    ) -> None:
        self.key_serializer: TypeSerializer[Any] = _serializer(name, key_type, "map keys")
        self.value_serializer: TypeSerializer[Any] = _serializer(name, value_type, "map values")
        super().__init__(
            name, DictSerializer(self.key_serializer, self.value_serializer), previous_name
        )


class ReducingStateDescriptor(StateDescriptor):
    """A :class:`~streamstate.api.state.ReducingState` folding with ``reduce_function``."""

    kind = StateKind.REDUCING

    def __init__(
        self,
        name: str,
        reduce_function: ReduceFunction[Any] | Callable[[Any, Any], Any],
        type_or_serializer: Any,
        *,
        previous_name: str | None = None,
    ) -> None:
        super().__init__(name, _serializer(name, type_or_serializer), previous_name)
        if isinstance(reduce_function, ReduceFunction):
            self.reduce_function: ReduceFunction[Any] = reduce_function
        elif callable(reduce_function):
            self.reduce_function = ReduceFunction.of(reduce_function)
        else:
            raise TypeError(
                f"reduce_function must be a ReduceFunction or callable, got {reduce_function!r}"
            )


class AggregatingStateDescriptor(StateDescriptor):
    """An :class:`~streamstate.api.state.AggregatingState` with ``aggregate_function``.

    ``accumulator_type`` describes the accumulator, which is what is stored.
    """

    kind = StateKind.AGGREGATING

    def __init__(
        self,
        name: str,
        aggregate_function: AggregateFunction[Any, Any, Any],
        accumulator_type: Any,
        *,
        previous_name: str | None = None,
    ) -> None:
        if not isinstance(aggregate_function, AggregateFunction):
            raise TypeError(
                f"aggregate_function must be an AggregateFunction, got {aggregate_function!r}"
            )
        super().__init__(name, _serializer(name, accumulator_type, "accumulators"), previous_name)
        self.aggregate_function = aggregate_function
