"""Time-to-live as a decorator around any keyed state (SPEC §8).

:func:`create_ttl_state` is what :meth:`KeyedStateBackend.get_or_create_keyed_state` calls for a
descriptor with a :class:`~streamstate.api.ttl.StateTtlConfig`. It asks the backend for a *raw*
state of the same kind and name whose stored values carry their last-access timestamp, and wraps it
in a TTL state that implements the user-facing contract. The raw states know nothing about TTL.

Stored layout (the ``TtlValue``): a 2-tuple ``(last_access_ms, user_value)``, written by
:class:`~streamstate.serializers.ttl.TtlValueSerializer` around the user's serializer.

=================  ===============================================================
state kind          what the raw state stores
=================  ===============================================================
value               ``(ts, value)``
list                ``[(ts, element), ...]`` (every element has its own timestamp)
map                 ``{user_key: (ts, value)}`` (every value has its own timestamp)
reducing            ``(ts, reduced)``; the reduce function is wrapped
aggregating         ``(ts, accumulator)``; the ``AggregateFunction`` is wrapped
=================  ===============================================================

A value is *expired* iff ``ts + ttl <= now`` where ``ts + ttl`` saturates at the largest int64
(so a value written near the end of time never wraps around). ``now`` comes from
``backend.clock`` (injectable). Semantics follow Flink:

* ``update_type``: ``OnCreateAndWrite`` refreshes ``ts`` on every write; ``OnReadAndWrite`` also on
  every read of an unexpired value (``Disabled`` turns TTL off: the descriptor then has no TTL).
* ``state_visibility``: ``NeverReturnExpired`` hides expired values, and adding to an expired
  reducing/aggregating state starts afresh; with ``ReturnExpiredIfNotCleanedUp`` a read returns
  an expired value that is still stored (and then removes it), and adds and merges build on it
  (Flink's ``getUnexpired``). A list read returns every stored element, expired ones included,
  and clears the list only when none is unexpired (Flink's ``IteratorWithCleanup``).
* **cleanup on read**: an expired value met by a read is removed (list elements and map values
  individually).
* **full-snapshot cleanup** (``cleanup_full_snapshot``): on the heap backend the state table's
  ``snapshot_transformer`` drops expired values while a snapshot is written, without touching the
  working state. Lists drop *every* expired element (not only an expired prefix: elements of a
  list need not be in timestamp order once ``OnReadAndWrite`` or merges are involved); maps drop
  expired values; an entry left empty is not written at all.
* **incremental cleanup** (heap, ``cleanup_size > 0``): :class:`IncrementalCleanup` keeps a cursor
  over the state table's key groups and runs at most ``cleanup_size`` units of work per state
  access (a unit is one entry checked, or one step to the next key group), and optionally on every
  record (``run_cleanup_for_every_record``, through ``backend.key_selected_listeners``). It uses
  the :class:`~streamstate.backends.heap.state_map.StateMap` contract only (iteration, ``get``,
  ``put``, ``remove``), so it works on nested maps and on the copy-on-write map alike.
* **other backends** (RocksDB): if the backend has ``register_ttl_cleanup(hook)``, it receives one
  :class:`TtlCleanupHook` per TTL state. The hook carries the same ``transform`` the heap uses for
  snapshots (stored state → stored state to keep, or None to delete) and the bound
  ``max_entries_per_checkpoint`` (``StateTtlConfig.rocksdb_sweep_per_checkpoint``). The backend
  is expected to (1) apply ``hook.transform`` to every entry it writes into a full snapshot when
  ``hook.cleanup_full_snapshot`` is set, and (2) in the synchronous phase of every checkpoint,
  call :func:`sweep` with an iterator over the state's stored entries that starts at
  ``hook.cursor`` (its own resume position, e.g. the last raw key visited) and store the returned
  cursor back. That is the stand-in for Flink's compaction filter, which rocksdict does not expose.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from streamstate.api.descriptors import StateDescriptor, StateKind
from streamstate.api.functions import AggregateFunction, ReduceFunction
from streamstate.api.state import (
    InternalAggregatingState,
    InternalListState,
    InternalMapState,
    InternalReducingState,
    InternalValueState,
)
from streamstate.api.ttl import StateTtlConfig
from streamstate.backends.decorators.ttl_cleanup import (
    LONG_MAX,
    IncrementalCleanup,
    TtlCleanupHook,
    TtlPolicy,
    snapshot_transform,
    sweep,
)
from streamstate.errors import StateAccessError
from streamstate.serializers import DictSerializer, ListSerializer, TypeSerializer
from streamstate.serializers.ttl import TtlValueSerializer

if TYPE_CHECKING:
    from streamstate.backends.base import KeyedStateBackend

__all__ = [
    "LONG_MAX",
    "IncrementalCleanup",
    "TtlAggregateFunction",
    "TtlAggregatingState",
    "TtlCleanupHook",
    "TtlListState",
    "TtlMapState",
    "TtlPolicy",
    "TtlReduceFunction",
    "TtlReducingState",
    "TtlValueState",
    "create_ttl_state",
    "snapshot_transform",
    "sweep",
    "ttl_state_serializer",
]


# ---------------------------------------------------------------------------------------------
# Serializers and wrapped functions of the raw state


def ttl_state_serializer(descriptor: StateDescriptor) -> TypeSerializer[Any]:
    """The serializer of what the raw state of a TTL ``descriptor`` stores."""
    kind = descriptor.kind
    if kind is StateKind.LIST:
        return ListSerializer(TtlValueSerializer(descriptor.element_serializer))  # type: ignore[attr-defined]
    if kind is StateKind.MAP:
        return DictSerializer(
            descriptor.key_serializer,  # type: ignore[attr-defined]
            TtlValueSerializer(descriptor.value_serializer),  # type: ignore[attr-defined]
        )
    return TtlValueSerializer(descriptor.serializer)


class TtlReduceFunction(ReduceFunction[Any]):
    """Reduces ``(ts, value)`` pairs with the user's function; expired sides are ignored
    unless the visibility is ``ReturnExpiredIfNotCleanedUp`` (Flink's ``getUnexpired``)."""

    __slots__ = ("original", "policy")

    def __init__(self, original: ReduceFunction[Any], policy: TtlPolicy) -> None:
        self.original = original
        self.policy = policy

    def reduce(self, value1: Any, value2: Any) -> Any:
        now = self.policy.now()
        cutoff = self.policy.unexpired_cutoff(now)
        live1 = value1 is not None and value1[0] > cutoff
        live2 = value2 is not None and value2[0] > cutoff
        if live1 and live2:
            return (now, self.original.reduce(value1[1], value2[1]))
        if live1:
            return (now, value1[1])
        if live2:
            return (now, value2[1])
        return None


class TtlAggregateFunction(AggregateFunction[Any, Any, Any]):
    """Aggregates into ``(ts, accumulator)``; an expired accumulator is replaced by a new one
    unless the visibility is ``ReturnExpiredIfNotCleanedUp`` (Flink's ``getUnexpired``)."""

    __slots__ = ("original", "policy")

    def __init__(self, original: AggregateFunction[Any, Any, Any], policy: TtlPolicy) -> None:
        self.original = original
        self.policy = policy

    def create_accumulator(self) -> Any:
        return (self.policy.now(), self.original.create_accumulator())

    def add(self, value: Any, accumulator: Any) -> Any:
        now = self.policy.now()
        if accumulator is None or accumulator[0] <= self.policy.unexpired_cutoff(now):
            acc = self.original.create_accumulator()
        else:
            acc = accumulator[1]
        return (now, self.original.add(value, acc))

    def get_result(self, accumulator: Any) -> Any:
        return None if accumulator is None else self.original.get_result(accumulator[1])

    def merge(self, acc_a: Any, acc_b: Any) -> Any:
        now = self.policy.now()
        cutoff = self.policy.unexpired_cutoff(now)
        live_a = acc_a is not None and acc_a[0] > cutoff
        live_b = acc_b is not None and acc_b[0] > cutoff
        if live_a and live_b:
            return (now, self.original.merge(acc_a[1], acc_b[1]))
        if live_a:
            return (now, acc_a[1])
        if live_b:
            return (now, acc_b[1])
        return None


def _raw_descriptor(descriptor: StateDescriptor, policy: TtlPolicy) -> StateDescriptor:
    """A copy of ``descriptor`` describing the raw state: TTL-wrapped serializer and functions."""
    raw = copy.copy(descriptor)
    raw.serializer = ttl_state_serializer(descriptor)
    kind = descriptor.kind
    if kind is StateKind.VALUE:
        raw.default = None  # type: ignore[attr-defined]
    elif kind is StateKind.LIST:
        raw.element_serializer = TtlValueSerializer(descriptor.element_serializer)  # type: ignore[attr-defined]
    elif kind is StateKind.MAP:
        raw.value_serializer = TtlValueSerializer(descriptor.value_serializer)  # type: ignore[attr-defined]
    elif kind is StateKind.REDUCING:
        raw.reduce_function = TtlReduceFunction(descriptor.reduce_function, policy)  # type: ignore[attr-defined]
    elif kind is StateKind.AGGREGATING:
        raw.aggregate_function = TtlAggregateFunction(descriptor.aggregate_function, policy)  # type: ignore[attr-defined]
    return raw


# ---------------------------------------------------------------------------------------------
# The TTL states


class _TtlState:
    """Shared fields: the raw state, the user's descriptor, the policy, the access callback."""

    __slots__ = ("_access", "_descriptor", "_original", "_policy")

    def __init__(
        self,
        original: Any,
        descriptor: StateDescriptor,
        policy: TtlPolicy,
        access: Callable[[], Any] | None,
    ) -> None:
        self._original = original
        self._descriptor = descriptor
        self._policy = policy
        self._access = access

    @property
    def descriptor(self) -> StateDescriptor:
        return self._descriptor

    @property
    def original(self) -> Any:
        """The raw state holding TTL-wrapped values."""
        return self._original

    @property
    def ttl_config(self) -> StateTtlConfig:
        return self._policy.config

    def set_current_namespace(self, namespace: Any) -> None:
        self._original.set_current_namespace(namespace)

    def get_current_namespace(self) -> Any:
        return self._original.get_current_namespace()

    def clear(self) -> None:
        if self._access is not None:
            self._access()
        self._original.clear()

    def _read_single(self, tv: Any) -> Any:
        """Flink's ``getWithTtlCheckAndUpdate`` for single-valued raw states: the user value of
        ``tv`` or None, clearing it when expired and refreshing it on read if configured."""
        policy = self._policy
        now = policy.now()
        if tv[0] <= policy.cutoff(now):
            self._original.clear()
            return tv[1] if policy.return_expired else None
        if policy.update_on_read:
            self._original.update_internal((now, tv[1]))
        return tv[1]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._descriptor.name!r}, ttl={self._policy.ttl}ms)"


class TtlValueState(_TtlState, InternalValueState[Any]):
    """A value state whose value expires."""

    __slots__ = ("_copy_default", "_default")

    def __init__(
        self,
        original: Any,
        descriptor: Any,
        policy: TtlPolicy,
        access: Callable[[], Any] | None,
    ) -> None:
        super().__init__(original, descriptor, policy, access)
        self._default = descriptor.default
        self._copy_default = descriptor.default is not None and not descriptor.serializer.immutable

    def _default_value(self) -> Any:
        if self._copy_default:
            return self._descriptor.serializer.copy(self._default)
        return self._default

    def value(self) -> Any:
        if self._access is not None:
            self._access()
        original = self._original
        tv = original.value()
        if tv is None:
            return self._default_value()
        policy = self._policy
        now = policy.now()
        if tv[0] <= policy.cutoff(now):
            original.clear()
            return tv[1] if policy.return_expired else self._default_value()
        if policy.update_on_read:
            original.update((now, tv[1]))
        return tv[1]

    def update(self, value: Any) -> None:
        if self._access is not None:
            self._access()
        if value is None:
            self._original.clear()
        else:
            self._original.update((self._policy.now(), value))


def _no_none(name: str, values: list[Any]) -> None:
    for v in values:
        if v is None:
            raise StateAccessError(f"list state {name!r}: None cannot be added to a list state")


class TtlListState(_TtlState, InternalListState[Any]):
    """A list state whose elements expire one by one."""

    __slots__ = ()

    def get(self) -> list[Any]:
        if self._access is not None:
            self._access()
        original = self._original
        stored = original.get_internal()
        if not stored:
            return []
        policy = self._policy
        now = policy.now()
        cutoff = policy.cutoff(now)
        live = [e for e in stored if e[0] > cutoff]
        if len(live) == len(stored):
            if policy.update_on_read:
                original.update_internal([(now, e[1]) for e in stored])
            return [e[1] for e in stored]
        if policy.return_expired:
            # Flink's IteratorWithCleanup: every element stored is returned, expired ones too,
            # and the list is cleared only once nothing unexpired is left; reading with
            # OnReadAndWrite rewrites the unexpired elements (updateTs), dropping the others.
            if not live:
                original.clear()
            elif policy.update_on_read:
                original.update_internal([(now, e[1]) for e in live])
            return [e[1] for e in stored]
        # cleanup on read: the expired elements are removed (see docs/concepts/ttl.md, deviations)
        original.update_internal([(now, e[1]) for e in live] if policy.update_on_read else live)
        return [e[1] for e in live]

    def add(self, value: Any) -> None:
        if value is None:
            raise StateAccessError(
                f"list state {self._descriptor.name!r}: None cannot be added to a list state"
            )
        if self._access is not None:
            self._access()
        self._original.add((self._policy.now(), value))

    def add_all(self, values: Iterable[Any]) -> None:
        vs = list(values) if values is not None else []
        _no_none(self._descriptor.name, vs)
        if not vs:
            return
        if self._access is not None:
            self._access()
        now = self._policy.now()
        self._original.add_all([(now, v) for v in vs])

    def update(self, values: Iterable[Any] | None) -> None:
        vs = list(values) if values is not None else []
        _no_none(self._descriptor.name, vs)
        if self._access is not None:
            self._access()
        now = self._policy.now()
        self._original.update_internal([(now, v) for v in vs])

    def get_internal(self) -> list[Any] | None:
        return self.get() or None

    def update_internal(self, value: Any) -> None:
        self.update(value)

    def merge_namespaces(self, target: Any, sources: Iterable[Any]) -> None:
        if self._access is not None:
            self._access()
        # elements keep their own timestamps; expired ones are dropped when read
        self._original.merge_namespaces(target, sources)


#: no live mapping (a mapping to None is one)
_ABSENT = object()


class TtlMapState(_TtlState, InternalMapState[Any, Any]):
    """A map state whose values expire one by one."""

    __slots__ = ()

    def _read(self, key: Any) -> Any:
        """The value of ``key`` under the TTL rules, or ``_ABSENT``: an expired mapping is
        removed, and its value still returned with ``ReturnExpiredIfNotCleanedUp``."""
        if self._access is not None:
            self._access()
        original = self._original
        tv = original.get(key)
        if tv is None:
            return _ABSENT
        policy = self._policy
        now = policy.now()
        if tv[0] <= policy.cutoff(now):
            original.remove(key)
            return tv[1] if policy.return_expired else _ABSENT
        if policy.update_on_read:
            original.put(key, (now, tv[1]))
        return tv[1]

    def get(self, key: Any) -> Any:
        value = self._read(key)
        return None if value is _ABSENT else value

    def _check_none(self, key: Any) -> None:
        """A None value is stored as ``(ts, None)``, which only the value type can tell is
        valid; check it now rather than when a checkpoint reads it back."""
        ser = self._descriptor.value_serializer  # type: ignore[attr-defined]
        try:
            ser.deserialize(ser.serialize(None))
        except Exception as exc:
            raise StateAccessError(
                f"map state {self._descriptor.name!r}: cannot put {key!r} -> None, the value "
                f"type does not admit None (declare it as `T | None`): {exc}"
            ) from exc

    def put(self, key: Any, value: Any) -> None:
        if value is None:
            self._check_none(key)
        if self._access is not None:
            self._access()
        self._original.put(key, (self._policy.now(), value))

    def put_all(self, mapping: dict[Any, Any]) -> None:
        if not mapping:
            return
        for k, v in mapping.items():
            if v is None:
                self._check_none(k)
        if self._access is not None:
            self._access()
        now = self._policy.now()
        self._original.put_all({k: (now, v) for k, v in mapping.items()})

    def remove(self, key: Any) -> None:
        if self._access is not None:
            self._access()
        self._original.remove(key)

    def contains(self, key: Any) -> bool:
        # as Flink's TtlMapState: a mapping whose value is None is still contained
        return self._read(key) is not _ABSENT

    def _items(self) -> list[tuple[Any, Any]]:
        if self._access is not None:
            self._access()
        original = self._original
        policy = self._policy
        now = policy.now()
        cutoff = policy.cutoff(now)
        out: list[tuple[Any, Any]] = []
        refreshed: dict[Any, Any] = {}
        return_expired = policy.return_expired
        update_on_read = policy.update_on_read
        for k, tv in original.items():
            if tv[0] <= cutoff:
                original.remove(k)
                if return_expired:
                    out.append((k, tv[1]))
            else:
                out.append((k, tv[1]))
                if update_on_read:
                    refreshed[k] = (now, tv[1])
        if refreshed:
            original.put_all(refreshed)
        return out

    def items(self) -> Iterator[tuple[Any, Any]]:
        return iter(self._items())

    def keys(self) -> Iterator[Any]:
        return iter([k for k, _ in self._items()])

    def values(self) -> Iterator[Any]:
        return iter([v for _, v in self._items()])

    def is_empty(self) -> bool:
        if self._access is not None:
            self._access()
        original = self._original
        policy = self._policy
        cutoff = policy.cutoff(policy.now())
        found = False
        for k, tv in original.items():
            if tv[0] <= cutoff:
                original.remove(k)
                found = found or policy.return_expired
            else:
                found = True
        return not found


class TtlReducingState(_TtlState, InternalReducingState[Any]):
    """A reducing state whose reduced value expires (the reduce function is TTL-aware)."""

    __slots__ = ()

    def get(self) -> Any:
        if self._access is not None:
            self._access()
        tv = self._original.get_internal()
        return None if tv is None else self._read_single(tv)

    def add(self, value: Any) -> None:
        if self._access is not None:
            self._access()
        if value is None:
            self._original.clear()
        else:
            self._original.add((self._policy.now(), value))

    def get_internal(self) -> Any:
        return self.get()

    def update_internal(self, value: Any) -> None:
        if self._access is not None:
            self._access()
        self._original.update_internal(None if value is None else (self._policy.now(), value))

    def merge_namespaces(self, target: Any, sources: Iterable[Any]) -> None:
        if self._access is not None:
            self._access()
        _merge_dropping_empty(self._original, target, sources)


class TtlAggregatingState(_TtlState, InternalAggregatingState[Any, Any]):
    """An aggregating state whose accumulator expires (the AggregateFunction is TTL-aware)."""

    __slots__ = ("_user_function",)

    def __init__(
        self,
        original: Any,
        descriptor: Any,
        policy: TtlPolicy,
        access: Callable[[], Any] | None,
    ) -> None:
        super().__init__(original, descriptor, policy, access)
        self._user_function = descriptor.aggregate_function

    def get(self) -> Any:
        if self._access is not None:
            self._access()
        tv = self._original.get_internal()
        if tv is None:
            return None
        acc = self._read_single(tv)
        return None if acc is None else self._user_function.get_result(acc)

    def add(self, value: Any) -> None:
        if self._access is not None:
            self._access()
        self._original.add(value)

    def get_internal(self) -> Any:
        """The (unexpired) accumulator, or None."""
        if self._access is not None:
            self._access()
        tv = self._original.get_internal()
        return None if tv is None else self._read_single(tv)

    def update_internal(self, value: Any) -> None:
        if self._access is not None:
            self._access()
        self._original.update_internal(None if value is None else (self._policy.now(), value))

    def merge_namespaces(self, target: Any, sources: Iterable[Any]) -> None:
        if self._access is not None:
            self._access()
        _merge_dropping_empty(self._original, target, sources)


def _merge_dropping_empty(original: Any, target: Any, sources: Iterable[Any]) -> None:
    """Merge through the raw state; if every part had expired the TTL merge yields None, which
    must not stay behind as an entry."""
    original.merge_namespaces(target, sources)
    saved = original.get_current_namespace()
    original.set_current_namespace(target)
    try:
        if original.get_internal() is None:
            original.clear()
    finally:
        original.set_current_namespace(saved)


_TTL_STATES: dict[StateKind, type[_TtlState]] = {
    StateKind.VALUE: TtlValueState,
    StateKind.LIST: TtlListState,
    StateKind.MAP: TtlMapState,
    StateKind.REDUCING: TtlReducingState,
    StateKind.AGGREGATING: TtlAggregatingState,
}


def create_ttl_state(
    backend: KeyedStateBackend,
    namespace_serializer: TypeSerializer[Any],
    descriptor: StateDescriptor,
) -> Any:
    """Create the raw state of ``descriptor`` in ``backend`` and wrap it with TTL.

    Also hands the cleanup strategies of the descriptor's :class:`StateTtlConfig` to the backend
    as a :class:`TtlCleanupHook` (``register_ttl_cleanup``: the heap backend wires its state
    table's snapshot transformer and incremental cleanup cursor, RocksDB its bounded sweep).
    """
    config = descriptor.ttl_config
    if config is None:
        raise ValueError(f"state {descriptor.name!r} has no TTL configuration")
    policy = TtlPolicy(config, backend.clock)
    raw = backend._create_internal_state(namespace_serializer, _raw_descriptor(descriptor, policy))
    transform = snapshot_transform(descriptor.kind, policy)
    access = backend.register_ttl_cleanup(
        TtlCleanupHook(
            descriptor.name,
            transform,
            config.cleanup_full_snapshot,
            config.rocksdb_sweep_per_checkpoint,
            config.cleanup_size,
            config.run_cleanup_for_every_record,
        )
    )
    return _TTL_STATES[descriptor.kind](raw, descriptor, policy, access)
