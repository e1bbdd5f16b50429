"""The part of a keyed state backend that every backend shares (SPEC §4).

A :class:`KeyedStateBackend` belongs to one subtask. It knows the subtask's key-group range and
the current key, keeps the registry ``name -> state``, creates states through the backend's
factory and wraps them in decorators (raw → TTL → metrics), and checks restored states against
what the program declares now.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from streamstate.api.descriptors import StateDescriptor
from streamstate.api.state import InternalKvState
from streamstate.backends.timer_queues import KeyGroupedTimerQueue, TimerQueues
from streamstate.errors import (
    KeyGroupOutOfRangeError,
    NoCurrentKeyError,
    StateAccessError,
    StateBackendError,
    StateMigrationException,
    StreamStateError,
    UnsupportedKeyTypeError,
)
from streamstate.format.meta import StateMetaSnapshot
from streamstate.keygroups import KeyGroupRange, assign_to_key_group
from streamstate.namespace import VOID_NAMESPACE
from streamstate.serializers import (
    TypeSerializer,
    VoidNamespaceSerializer,
    describe_snapshot,
    serializer_for,
)
from streamstate.serializers.evolution import resolve_schema_change
from streamstate.serializers.migration import migrating_serializer

if TYPE_CHECKING:
    from streamstate.backends.decorators.ttl_cleanup import TtlCleanupHook
    from streamstate.backends.figures import StateFigures
    from streamstate.backends.snapshot_strategy import SnapshotOptions, SnapshotStrategy
    from streamstate.format.restore import KeyedStateRestore
    from streamstate.format.snapshot import KeyedStateSnapshot

__all__ = [
    "KEY_TYPE_REMEDY",
    "MIGRATION_REMEDY",
    "Clock",
    "KeyContext",
    "KeyedStateBackend",
    "RestoreInput",
    "RestoreMode",
    "SystemClock",
    "check_key_type",
    "check_written_value",
    "migration_error",
    "stored_serializer",
]

_KEY_GROUP_CACHE_LIMIT = 1 << 16


def check_written_value(
    serializer: Any, value: Any, state: str, key: Any, what: str = "value"
) -> None:
    """Check a value a state is about to store (its class is not exactly the serializer's
    ``value_class``): a value the serializer cannot write raises here, naming the state, the
    key and the value, instead of at the next checkpoint (or never, in a batch run without a
    savepoint). Both backends' states call it; cost: bench/state_type_check.py."""
    try:
        serializer.check(value)
    except TypeError as exc:
        raise StateAccessError(f"state {state!r} of key {key!r}: the {what} {exc}") from None


def checked_list_elements(
    values: Iterable[Any] | None, serializer: Any, state: str, key: Any
) -> list[Any]:
    """The elements a list state's ``add_all``/``update`` are about to store, as a new list:
    None is refused, and every element whose class is not exactly the serializer's
    ``value_class`` is checked (:func:`check_written_value`). Every backend's list states use it."""
    if values is None:
        return []
    out = list(values)
    if any(v is None for v in out):
        raise StateAccessError(f"list state {state!r}: None cannot be added to a list state")
    cls = serializer.value_class
    for v in out:
        if v.__class__ is not cls:
            check_written_value(serializer, v, state, key, "element")
    return out


class Clock:
    """Processing-time source in milliseconds; tests inject their own."""

    def now(self) -> int:
        import time

        return time.time_ns() // 1_000_000


SystemClock = Clock


class KeyContext:
    """The current key of a backend, shared by all its states (read on every state access).

    ``kg_index`` is the current key group minus the range start; before any key is set it points
    one past the end, at a guard that raises :class:`NoCurrentKeyError`.
    """

    __slots__ = ("_start", "key", "kg_index")

    def __init__(self, no_key_index: int, range_start: int = 0) -> None:
        self.key: Any = None
        self.kg_index: int = no_key_index
        self._start = range_start

    @property
    def key_group(self) -> int:
        """The current key group (meaningless while no key is set)."""
        return self.kg_index + self._start


class RestoreMode(enum.Enum):
    """Whether a restored snapshot belongs to the job from now on (Flink's restore modes)."""

    #: the snapshot is in the storage the backend checkpoints to next: later checkpoints may
    #: reference its files instead of writing them again (a backend's own incremental files)
    CLAIM = "claim"
    #: the snapshot stays someone else's: later checkpoints reference none of its files
    NO_CLAIM = "no_claim"


@dataclass(frozen=True)
class RestoreInput:
    """What :meth:`KeyedStateBackend.restore` restores from (SPEC §7).

    ``files``: one :class:`~streamstate.format.restore.KeyedStateRestore` per snapshot file,
    for each old subtask its full snapshot then its deltas, or its snapshot in the own format
    of the backend that wrote it (a subclass of that backend's, which it may restore directly;
    every other backend reads its canonical view). ``mode``: see :class:`RestoreMode`.
    """

    files: Sequence[KeyedStateRestore] = field(default_factory=tuple)
    mode: RestoreMode = RestoreMode.NO_CLAIM

    @classmethod
    def of(cls, source: RestoreInput | Sequence[KeyedStateRestore]) -> RestoreInput:
        """``source`` itself, or a plain file list as a :class:`RestoreInput`."""
        if isinstance(source, RestoreInput):
            return source
        return cls(tuple(source))


class KeyedStateBackend(ABC):
    """Keyed state of one subtask: registry, current key, decorators, restore checks.

    The contract every backend implements (docs/architecture.md, "adding a backend"):

    * states: :meth:`_create_internal_state` (the raw state of its storage), :meth:`get_keys`,
      :meth:`num_entries`;
    * snapshots: :meth:`snapshot` (the canonical synchronous phase), :meth:`snapshot_strategy`
      (how checkpoints are written: a canonical file each unless the backend has its own),
      :meth:`notify_checkpoint_complete`, :meth:`notify_checkpoint_aborted`;
    * restore: :meth:`restore` (one entry point, a :class:`RestoreInput`);
    * timers: :meth:`create_timer_queue` (the backend owns its timer queues, snapshots them
      with its states and restores them itself);
    * TTL: :meth:`register_ttl_cleanup`;
    * lifecycle: :meth:`dispose`.
    """

    #: short name of the backend (its package's name, ``streamstate.backends.<name>``)
    backend_name: str = ""
    #: whether the backend tracks changes, so that its snapshot strategy can write deltas
    incremental: bool = False

    def __init__(
        self,
        key_serializer: TypeSerializer[Any],
        max_parallelism: int,
        key_group_range: KeyGroupRange,
        *,
        clock: Clock | None = None,
        latency_tracking: bool = False,
        size_tracking: bool = False,
        metric_group: Any = None,
    ) -> None:
        if not key_group_range:
            raise ValueError("a keyed state backend needs a non-empty key group range")
        if key_group_range.end >= max_parallelism:
            raise ValueError(
                f"key group range {key_group_range} exceeds max_parallelism={max_parallelism}"
            )
        self.key_serializer = key_serializer
        self.max_parallelism = max_parallelism
        self.key_group_range = key_group_range
        self.clock = clock or Clock()
        self.latency_tracking = latency_tracking
        self.size_tracking = size_tracking
        self.metric_group = metric_group
        self.ctx = KeyContext(len(key_group_range), key_group_range.start)
        self._range_start = key_group_range.start
        self._num_key_groups = len(key_group_range)
        self._states: dict[str, InternalKvState] = {}
        self._descriptors: dict[str, StateDescriptor] = {}
        self._restored_meta: dict[str, StateMetaSnapshot] = {}
        self._last_descriptor: StateDescriptor | None = None
        self._last_state: InternalKvState | None = None
        self._kg_cache: dict[Any, int] = {}
        self._disposed = False
        #: listeners called with the key group before every key change (incremental cleanup, ...)
        self.key_selected_listeners: list[Callable[[Any], None]] = []
        #: the timer queues this backend created (snapshotted and restored with its states)
        self.timer_queues = TimerQueues(key_group_range)

    # ---- current key -------------------------------------------------------------------------

    def set_current_key(self, key: Any, key_group: int | None = None) -> None:
        """Make ``key`` the current key. ``key_group`` may be given if already computed.

        Fails with :class:`KeyGroupOutOfRangeError` if the key's group is not in this backend's
        range: the key was routed to the wrong subtask, which happens when a key's hash is not
        deterministic.
        """
        if key_group is None:
            cache = self._kg_cache
            key_group = cache.get(key)
            if key_group is None:
                if key is None:
                    raise UnsupportedKeyTypeError("the current key must not be None")
                key_group = assign_to_key_group(key, self.max_parallelism)
                if len(cache) >= _KEY_GROUP_CACHE_LIMIT:
                    cache.clear()
                cache[key] = key_group
        index = key_group - self._range_start
        if index < 0 or index >= self._num_key_groups:
            raise KeyGroupOutOfRangeError(
                f"key {key!r} belongs to key group {key_group}, which is outside this backend's "
                f"range {self.key_group_range} (max_parallelism={self.max_parallelism}); the key "
                "was routed to the wrong subtask — is its hash non-deterministic?"
            )
        if self.key_selected_listeners:
            for listener in self.key_selected_listeners:
                listener(key)
        ctx = self.ctx
        ctx.key = key
        ctx.kg_index = index

    def get_current_key(self) -> Any:
        if self.ctx.key is None:
            raise NoCurrentKeyError("no current key is set on this keyed state backend")
        return self.ctx.key

    def get_current_key_group_index(self) -> int:
        if self.ctx.key is None:
            raise NoCurrentKeyError("no current key is set on this keyed state backend")
        return self.ctx.key_group

    def clear_current_key(self) -> None:
        """Forget the current key (state access fails until a key is set again)."""
        self.ctx.key = None
        self.ctx.kg_index = len(self.key_group_range)

    # ---- registry ----------------------------------------------------------------------------

    def get_partitioned_state(
        self,
        namespace: Any,
        namespace_serializer: TypeSerializer[Any] | None,
        descriptor: StateDescriptor,
    ) -> Any:
        """The state of ``descriptor`` scoped to ``namespace``.

        The hot path: the last descriptor asked for is cached, so repeated calls cost one
        identity check. Without a ``namespace_serializer`` the first call infers one from
        ``namespace`` (the void serializer for ``VOID_NAMESPACE``): a state registered with the
        void serializer refuses every other namespace, since a checkpoint could not tell them
        apart.
        """
        if descriptor is self._last_descriptor:
            state = self._last_state
            assert state is not None
            state.set_current_namespace(namespace)
            return state
        name = descriptor.name
        state = self._states.get(name)
        if state is None:
            if namespace_serializer is None:
                namespace_serializer = self._infer_namespace_serializer(name, namespace)
            state = self.get_or_create_keyed_state(namespace_serializer, descriptor)
        elif self._descriptors[name].kind is not descriptor.kind:
            raise self._kind_mismatch(name, self._descriptors[name].kind.value, descriptor)
        self._last_descriptor = descriptor
        self._last_state = state
        state.set_current_namespace(namespace)
        return state

    @staticmethod
    def _infer_namespace_serializer(name: str, namespace: Any) -> TypeSerializer[Any]:
        if namespace == VOID_NAMESPACE:
            return VoidNamespaceSerializer()
        try:
            return serializer_for(type(namespace))
        except TypeError as e:
            raise StateAccessError(
                f"state {name!r}: no namespace serializer was given and none can be inferred "
                f"for namespace {namespace!r}: {e}"
            ) from e

    def get_or_create_keyed_state(
        self, namespace_serializer: TypeSerializer[Any], descriptor: StateDescriptor
    ) -> Any:
        """The state registered as ``descriptor.name``, created (and checked) on first use."""
        self._check_open()
        name = descriptor.name
        state = self._states.get(name)
        if state is not None:
            registered = self._descriptors[name]
            if registered.kind is not descriptor.kind:
                raise self._kind_mismatch(name, registered.kind.value, descriptor)
            return state
        self._check_restored(name, namespace_serializer, descriptor)
        if descriptor.ttl_config is not None:
            from streamstate.backends.decorators.ttl import create_ttl_state

            state = create_ttl_state(self, namespace_serializer, descriptor)
        else:
            state = self._create_internal_state(namespace_serializer, descriptor)
        state = self._decorate(state, namespace_serializer, descriptor)
        self._states[name] = state
        self._descriptors[name] = descriptor
        state.set_current_namespace(VOID_NAMESPACE)
        return state

    def _decorate(
        self,
        state: InternalKvState,
        namespace_serializer: TypeSerializer[Any],
        descriptor: StateDescriptor,
    ) -> InternalKvState:
        if self.latency_tracking or self.size_tracking:
            from streamstate.backends.decorators.metrics import wrap_with_metrics

            state = wrap_with_metrics(
                state,
                descriptor,
                self.metric_group,
                latency=self.latency_tracking,
                size=self.size_tracking,
            )
        return state

    def _kind_mismatch(
        self, name: str, old_kind: str, descriptor: StateDescriptor
    ) -> StateMigrationException:
        return StateMigrationException(
            f"state {name!r} is registered as {old_kind} state but is now requested as "
            f"{descriptor.kind.value} state; a state's kind cannot change"
        )

    def _check_restored(
        self, name: str, namespace_serializer: TypeSerializer[Any], descriptor: StateDescriptor
    ) -> None:
        """Check a state against what the restored checkpoint says about it (SPEC §4, §14.1),
        before anything of it is read: the same kind, the same namespaces, and values the rules
        of schema evolution can migrate. A state first registered under its ``previous_name``
        is renamed here (after the checks)."""
        meta = self._restored_meta.get(name)
        previous = descriptor.previous_name
        renamed_from = None
        if meta is None and previous is not None and previous not in self._states:
            meta = self._restored_meta.get(previous)
            renamed_from = previous if meta is not None else None
        if meta is None:
            return
        what = f"state {name!r}" + (f" (checkpointed as {previous!r})" if renamed_from else "")
        if meta.kind != descriptor.kind.value:
            raise migration_error(
                f"{what} was checkpointed as {meta.kind} state but is now declared as "
                f"{descriptor.kind.value} state; a state's kind cannot change",
            )
        ns_compat = namespace_serializer.resolve_compatibility(meta.namespace_serializer)
        if not ns_compat.is_compatible_as_is:
            raise migration_error(
                f"{what}: its namespaces were checkpointed as "
                f"{describe_snapshot(meta.namespace_serializer)} but are now "
                f"{describe_snapshot(namespace_serializer.snapshot())}",
            )
        serializer = stored_serializer(descriptor)
        change = resolve_schema_change(meta.state_serializer, serializer.snapshot())
        refused = change.compatibility.is_incompatible
        if not change.known:  # no schema on one side: the serializer's own rules decide
            refused = serializer.resolve_compatibility(meta.state_serializer).is_incompatible
        if refused:
            hint = ""
            if _mentions_pickle(meta.state_serializer) and not _uses_pickle(descriptor.serializer):
                hint = (
                    " (the checkpoint was written with PickleSerializer; reading it runs code "
                    "from the checkpoint, so pass PickleSerializer() to enable it)"
                )
            old, new = (
                describe_snapshot(meta.state_serializer),
                describe_snapshot(serializer.snapshot()),
            )
            differs = f": {change.describe()}" if change.known and change.refused else ""
            raise migration_error(
                f"{what}: its values were checkpointed as {old} but are now declared as "
                f"{new}{differs}{hint}",
            )
        if renamed_from is not None:
            self.rename_restored_state(renamed_from, name)

    def rename_restored_state(self, old: str, new: str) -> None:
        """Restored state ``old`` belongs to state ``new`` from now on (a descriptor named it
        as its ``previous_name``). Backends move its data too; the next checkpoint holds it
        under its new name only."""
        meta = self._restored_meta.pop(old)
        self._restored_meta[new] = msgspec.structs.replace(meta, name=new)

    def restored_value_reader(
        self, name: str, serializer: TypeSerializer[Any]
    ) -> TypeSerializer[Any] | None:
        """What reads the restored values of state ``name`` as values of ``serializer`` (what
        the state stores now): ``serializer`` itself when they are read as they are, a
        :class:`~streamstate.serializers.migration.MigratingSerializer` when they migrate (the
        backend converts them once, now), None when nothing of ``name`` was restored."""
        meta = self._restored_meta.get(name)
        if meta is None:
            return None
        reader = migrating_serializer(meta.state_serializer, serializer, now=self.clock.now())
        return serializer if reader is None else reader

    def undeclared_states(self) -> dict[str, int | None]:
        """The restored keyed states the program has not registered, each with its entries
        (one per key and namespace; None when they cannot be counted without the program's
        serializers): carried into every checkpoint, unread. Timers aside."""
        out: dict[str, int | None] = {}
        for name in sorted(self._restored_meta):
            if name in self._states:
                continue
            try:
                out[name] = self.num_entries(name)
            except StreamStateError:
                out[name] = None
        return out

    def restored_state_meta(self, name: str) -> StateMetaSnapshot | None:
        """What the restored checkpoint says about state ``name`` (the snapshot form of its meta
        data; None if it had no such state): lets a program rebuild a serializer it would
        otherwise infer from data not seen yet."""
        return self._restored_meta.get(name)

    def add_restored_meta(self, meta: StateMetaSnapshot) -> bool:
        """Record what the checkpoint being restored says about a state (checked when the
        program registers it); returns whether the state was new."""
        new = meta.name not in self._restored_meta
        self._restored_meta[meta.name] = meta
        return new

    def discard_restored_meta(self, name: str) -> None:
        """Forget a restored state's meta data (a restore that failed midway undoes it)."""
        self._restored_meta.pop(name, None)

    def registered_state_names(self) -> list[str]:
        return list(self._states)

    def get_state_descriptor(self, name: str) -> StateDescriptor | None:
        return self._descriptors.get(name)

    def apply_to_all_keys(
        self,
        namespace: Any,
        namespace_serializer: TypeSerializer[Any] | None,
        descriptor: StateDescriptor,
        fn: Callable[[Any, Any], None],
    ) -> None:
        """Call ``fn(key, state)`` for every key with state under ``namespace``.

        The key list is copied first, so ``fn`` may clear the state it is given.
        """
        state = self.get_partitioned_state(namespace, namespace_serializer, descriptor)
        keys = list(self.get_keys(descriptor.name, namespace))
        saved_key, saved_kg = self.ctx.key, self.ctx.key_group
        try:
            for key in keys:
                self.set_current_key(key)
                state.set_current_namespace(namespace)
                fn(key, state)
        finally:
            if saved_key is not None:
                self.set_current_key(saved_key, saved_kg)
            else:
                self.clear_current_key()

    # ---- backend specifics -------------------------------------------------------------------

    @abstractmethod
    def _create_internal_state(
        self, namespace_serializer: TypeSerializer[Any], descriptor: StateDescriptor
    ) -> InternalKvState:
        """Create the raw (undecorated) state of ``descriptor`` in this backend's storage."""

    @abstractmethod
    def get_keys(self, state_name: str, namespace: Any) -> Iterator[Any]:
        """Keys that have state ``state_name`` under ``namespace``."""

    @abstractmethod
    def num_entries(self, state_name: str | None = None) -> int:
        """Entries of one state, or of all states, as :mod:`streamstate.format.entries` counts
        them: one per (key, namespace) of a value, reducing or aggregating state, one per
        mapping of a map state, one per element of a list state; timers are not entries."""

    def state_entries(self) -> dict[str, int]:
        """The entries of every registered state (:meth:`num_entries`), by name: what a
        checkpoint records next to its files. Cheap on every backend (the heap's table sizes and
        element counts, RocksDB's counts kept by its flushes)."""
        return {name: self.num_entries(name) for name in self.registered_state_names()}

    def state_figures(self) -> StateFigures:
        """What the backend holds now and what changed since the previous call
        (:class:`~streamstate.backends.figures.StateFigures`). This default counts entries and
        tracks no changes; backends override it with what they can take cheaply."""
        from streamstate.backends.figures import StateFigures

        return StateFigures(rows=self.num_entries())

    @abstractmethod
    def snapshot(self, checkpoint_id: int) -> KeyedStateSnapshot:
        """The synchronous phase of a canonical snapshot; returns what the asynchronous phase
        writes (savepoints, full checkpoints)."""

    def snapshot_strategy(self, options: SnapshotOptions) -> SnapshotStrategy:
        """How this backend's checkpoints are written (Flink's ``SnapshotStrategy``): by default a
        canonical full file per checkpoint; a backend writing deltas or its own format returns its
        own. Raises :class:`~streamstate.errors.CheckpointError` for options it cannot honour."""
        from streamstate.backends.snapshot_strategy import FullSnapshotStrategy
        from streamstate.errors import CheckpointError

        if options.incremental is not None:
            raise CheckpointError(
                f"incremental checkpoints need a keyed backend with change tracking "
                f"(HeapStateBackend(incremental=True)); the {self.backend_name} backend has none"
            )
        return FullSnapshotStrategy(self.snapshot, options)

    @abstractmethod
    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` was committed: later checkpoints may build on it."""

    @abstractmethod
    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` will never commit: forget what it uploaded."""

    @abstractmethod
    def restore(self, source: RestoreInput | Sequence[KeyedStateRestore]) -> None:
        """Restore from ``source`` (a :class:`RestoreInput`, or its file list) before any state
        is registered; all or nothing."""

    # ---- timers ------------------------------------------------------------------------------

    def create_timer_queue(
        self, name: str, namespace_serializer: TypeSerializer[Any]
    ) -> KeyGroupedTimerQueue:
        """The timer queue ``name`` (Flink's ``PriorityQueueSetFactory.create``), created on
        first use: a state of this backend, snapshotted with the others and restored by
        :meth:`restore` (a queue created after the restore holds its restored timers already).
        The namespace serializer is checked against the checkpoint's.

        The queues are in memory (like Flink's heap timers); a backend with
        timers in its own storage overrides this and snapshots them itself.
        """
        self._check_open()
        return self.timer_queues.create(name, namespace_serializer)

    # ---- TTL -----------------------------------------------------------------------------------

    @abstractmethod
    def register_ttl_cleanup(self, hook: TtlCleanupHook) -> Callable[[], object] | None:
        """Install the TTL cleanup of the state ``hook.state_name`` (just created): returns the
        step the TTL state runs on every access (incremental cleanup), or None."""

    def dispose(self) -> None:
        """Release every resource; the backend cannot be used afterwards."""
        self.timer_queues.clear()
        self._states.clear()
        self._descriptors.clear()
        self._last_descriptor = None
        self._last_state = None
        self._disposed = True

    def _check_open(self) -> None:
        if self._disposed:
            raise StateBackendError(f"this {self.backend_name} keyed state backend was disposed")

    @property
    def number_of_key_groups(self) -> int:
        return self.max_parallelism


MIGRATION_REMEDY = (
    "The checkpoint is left as it was: the previous code still restores it. To make this "
    "change, rewrite the checkpoint into a savepoint whose state is converted (a DataFrame of "
    'new values: streamstate.spark.rewrite_savepoint; see the docs, "Upgrading a job") and '
    "start the job from that savepoint with initial_state=; or give the state a new name (the "
    "old one is kept, unread); or start from a new checkpoint directory"
)
"""The ways out of a refused migration, named by every :class:`StateMigrationException` of a
restore."""

KEY_TYPE_REMEDY = (
    "The checkpoint is left as it was: the previous code still restores it. Keys decide key "
    "groups, so a new key type means new key groups for every state: rewrite the checkpoint "
    "into a savepoint with every state re-keyed (streamstate.spark.rewrite_savepoint(..., "
    'rekey=...); see the docs, "Upgrading a job") and start the job from it with '
    "initial_state=, or start from a new checkpoint directory"
)
"""The ways out of a changed key type."""


def migration_error(problem: str) -> StateMigrationException:
    """A restored state the program now declares differently: what differs (``problem``
    names the state and both types in the user's words) and the ways out (SPEC §12, §14.1)."""
    return StateMigrationException(f"{problem}. {MIGRATION_REMEDY}")


def check_key_type(checkpointed: Any, key_serializer: TypeSerializer[Any], where: str) -> None:
    """Refuse to restore keys checkpointed under the serializer snapshot ``checkpointed`` with
    ``key_serializer`` unless it reads them as they are (a key's bytes decide its key group,
    so no key type migrates): a :class:`StateMigrationException` naming both key types in the
    user's words, ``where`` (the file), and the remedy."""
    if key_serializer.resolve_compatibility(checkpointed).is_compatible_as_is:
        return
    raise StateMigrationException(
        f"the key type was checkpointed as {describe_snapshot(checkpointed)} but is now "
        f"{describe_snapshot(key_serializer.snapshot())} ({where}). {KEY_TYPE_REMEDY}"
    )


def stored_serializer(descriptor: StateDescriptor) -> TypeSerializer[Any]:
    """The serializer of what the raw state of ``descriptor`` stores (its values wrapped with
    their last access when it has time-to-live)."""
    if descriptor.ttl_config is None:
        return descriptor.serializer
    from streamstate.backends.decorators.ttl import ttl_state_serializer

    return ttl_state_serializer(descriptor)


def _mentions_pickle(snap: Any) -> bool:
    if isinstance(snap, dict):
        return snap.get("type") == "pickle" or any(_mentions_pickle(v) for v in snap.values())
    if isinstance(snap, list):
        return any(_mentions_pickle(v) for v in snap)
    return False


def _uses_pickle(serializer: TypeSerializer[Any]) -> bool:
    return _mentions_pickle(serializer.snapshot())
