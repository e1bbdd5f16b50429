"""The heap keyed state backend (SPEC §5): state as Python objects, one state table per state."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import msgspec

from streamstate.api.descriptors import StateDescriptor
from streamstate.api.state import InternalKvState
from streamstate.backends.base import Clock, KeyedStateBackend, RestoreInput
from streamstate.backends.decorators.ttl_cleanup import IncrementalCleanup, TtlCleanupHook
from streamstate.backends.figures import StateFigures
from streamstate.backends.heap.incremental import (
    MISSING,
    DeltaSnapshotSource,
    TrackingStateMap,
    capture_table_changes,
    tracking_map_class,
)
from streamstate.backends.heap.nested_maps import NestedStateMap
from streamstate.backends.heap.restore import HeapRestoreOperation, RestoredRawStates
from streamstate.backends.heap.snapshot import HeapKeyedStateSnapshot, StateTableSnapshotSource
from streamstate.backends.heap.state_map import StateMap
from streamstate.backends.heap.state_table import StateTable
from streamstate.backends.heap.states import STATE_FACTORIES
from streamstate.backends.snapshot_strategy import SnapshotOptions, SnapshotStrategy
from streamstate.errors import StateBackendError, StateMigrationException
from streamstate.format.meta import StateMetaInfo
from streamstate.format.restore import KeyedStateRestore
from streamstate.format.snapshot import DELTA_SNAPSHOT, SnapshotSource
from streamstate.keygroups import KeyGroupRange
from streamstate.serializers.base import TypeSerializer, describe_snapshot
from streamstate.serializers.migration import MigratingSerializer

__all__ = ["HeapKeyedStateBackend", "TableKind"]

TableKind = Literal["copy_on_write", "nested_maps"]


def _map_class(kind: str) -> type[StateMap]:
    if kind == "nested_maps":
        return NestedStateMap
    if kind == "copy_on_write":
        try:
            from streamstate.backends.heap.copy_on_write import CopyOnWriteStateMap
        except ImportError:  # pragma: no cover - the copy-on-write map ships with the package
            return NestedStateMap
        return CopyOnWriteStateMap  # type: ignore[no-any-return]
    raise ValueError(f"unknown heap table kind {kind!r}; use 'copy_on_write' or 'nested_maps'")


def _map_factory(
    kind: str, serializer: TypeSerializer[Any], incremental: bool = False
) -> Callable[[], StateMap]:
    cls: Any = _map_class(kind)
    if incremental:
        cls = tracking_map_class(cls, track_reads=not serializer.immutable)
    return lambda: cls(serializer)


class HeapKeyedStateBackend(KeyedStateBackend):
    """Keyed state of one subtask held in memory.

    ``table_kind="copy_on_write"`` (default) gives asynchronous snapshots; ``"nested_maps"`` is the
    simple dict-of-dicts table whose snapshots copy everything synchronously. ``incremental=True``
    tracks changed entries so that :meth:`snapshot_delta` costs O(changes) (SPEC §6.3).
    """

    backend_name = "heap"

    def __init__(
        self,
        key_serializer: TypeSerializer[Any],
        max_parallelism: int,
        key_group_range: KeyGroupRange,
        *,
        table_kind: TableKind = "copy_on_write",
        incremental: bool = False,
        clock: Clock | None = None,
        latency_tracking: bool = False,
        size_tracking: bool = False,
        metric_group: Any = None,
    ) -> None:
        super().__init__(
            key_serializer,
            max_parallelism,
            key_group_range,
            clock=clock,
            latency_tracking=latency_tracking,
            size_tracking=size_tracking,
            metric_group=metric_group,
        )
        _map_factory(table_kind, key_serializer)  # validate early
        self.table_kind = table_kind
        self.incremental = incremental
        self._tables: dict[str, StateTable] = {}
        #: restored state still encoded until registered (see heap/restore.py)
        self._pending_restore: RestoredRawStates | None = None
        #: entries written and removed that checkpoints captured since the last state_figures()
        self._rows_updated = 0
        self._rows_removed = 0
        #: a restored state was migrated or renamed: an incremental chain starts over
        self._full_snapshot_needed = False

    # ---- states --------------------------------------------------------------------------------

    def register_state_table(
        self,
        name: str,
        kind: str,
        namespace_serializer: TypeSerializer[Any],
        state_serializer: TypeSerializer[Any],
        ttl: dict[str, Any] | None = None,
        *,
        reader: TypeSerializer[Any] | None = None,
    ) -> StateTable:
        """The table of state ``name``, created if new (restored tables are reused).

        ``reader`` reads the restored values of the state (``restored_value_reader``): a
        :class:`~streamstate.serializers.migration.MigratingSerializer` converts them, once,
        here (a table decoded at the restore, or the still-encoded entries)."""
        table = self._tables.get(name)
        meta = StateMetaInfo(name, kind, namespace_serializer, state_serializer, ttl)
        migrating = isinstance(reader, MigratingSerializer)
        if table is None:
            factory = _map_factory(self.table_kind, state_serializer, self.incremental)
            table = StateTable(self.ctx, self.key_group_range, meta, factory)
            self._tables[name] = table
            if self._pending_restore is not None and self._pending_restore.fill(
                table, self.key_serializer, reader
            ):
                _take_changes(table)  # restored entries are already in the checkpoint chain
        else:
            if migrating:
                assert isinstance(reader, MigratingSerializer)
                try:
                    table.replace_states(reader.convert_values)
                except (msgspec.ValidationError, msgspec.DecodeError, ValueError) as exc:
                    raise StateMigrationException(
                        f"state {name!r}: the checkpointed values cannot be migrated to "
                        f"{describe_snapshot(state_serializer.snapshot())} ({exc})"
                    ) from None
            table.meta = meta
        if migrating:
            # the chain's base holds the old values: the next checkpoint is a full snapshot
            self._full_snapshot_needed = True
        return table

    def _create_internal_state(
        self, namespace_serializer: TypeSerializer[Any], descriptor: StateDescriptor
    ) -> InternalKvState:
        ttl = descriptor.ttl_config.to_dict() if descriptor.ttl_config is not None else None
        table = self.register_state_table(
            descriptor.name,
            descriptor.kind.value,
            namespace_serializer,
            descriptor.serializer,
            ttl,
            reader=self.restored_value_reader(descriptor.name, descriptor.serializer),
        )
        factory = STATE_FACTORIES[descriptor.kind]
        return factory(table, descriptor, namespace_serializer)  # type: ignore[no-any-return]

    def rename_restored_state(self, old: str, new: str) -> None:
        """Restored state ``old`` becomes ``new``: its table or its still-encoded entries too
        (the next checkpoint, a full one, holds it under ``new`` only)."""
        super().rename_restored_state(old, new)
        table = self._tables.pop(old, None)
        if table is not None:
            table.meta = dataclasses.replace(table.meta, name=new)
            self._tables[new] = table
        if self._pending_restore is not None:
            self._pending_restore.rename(old, new)
        self._full_snapshot_needed = True

    def state_table(self, name: str) -> StateTable:
        table = self._tables.get(name)
        if table is None:
            raise StateBackendError(f"no state named {name!r} is registered on this heap backend")
        return table

    def state_tables(self) -> dict[str, StateTable]:
        return dict(self._tables)

    def get_keys(self, state_name: str, namespace: Any) -> Iterator[Any]:
        table = self._tables.get(state_name)
        if table is None:
            return iter(())
        return table.keys(namespace)

    def state_figures(self) -> StateFigures:
        """Entries of every table (``streamstate.format.entries``; O(states x key groups)); with
        change tracking, the (key, namespace) entries written and removed that checkpoints
        captured since the previous call."""
        updated = removed = None
        if self.incremental:
            updated, removed = self._rows_updated, self._rows_removed
            self._rows_updated = self._rows_removed = 0
        return StateFigures(rows=self.num_entries(), rows_updated=updated, rows_removed=removed)

    def num_entries(self, state_name: str | None = None) -> int:
        pending = self._pending_restore
        if state_name is not None:
            table = self._tables.get(state_name)
            if table is not None:
                return table.entry_count()
            return 0 if pending is None else pending.num_entries(state_name)
        total = sum(t.entry_count() for t in self._tables.values())
        return total + (0 if pending is None else pending.num_entries())

    # ---- snapshots -----------------------------------------------------------------------------

    def snapshot(self, checkpoint_id: int = 0) -> HeapKeyedStateSnapshot:
        """The synchronous phase: per-key-group map snapshots of every table, plus timers."""
        self._check_open()
        sources: list[SnapshotSource] = [
            StateTableSnapshotSource(t.meta, t.snapshot_maps(), t.snapshot_transformer)
            for t in self._tables.values()
        ]
        if self._pending_restore is not None:
            sources.extend(self._pending_restore.snapshot_sources())
        sources.extend(self.timer_queues.snapshot_sources())
        return HeapKeyedStateSnapshot(
            self.key_serializer,
            self.max_parallelism,
            self.key_group_range,
            sources,
            checkpoint_id,
        )

    def snapshot_delta(self, checkpoint_id: int = 0) -> HeapKeyedStateSnapshot:
        """The synchronous phase of an incremental checkpoint: the entries changed since the
        previous :meth:`snapshot_delta` (or :meth:`reset_change_tracking`), values copied.

        O(changed entries + key groups). Needs ``incremental=True``.
        """
        self._check_open()
        if not self.incremental:
            raise StateBackendError(
                "snapshot_delta needs a heap backend created with incremental=True"
            )
        sources: list[SnapshotSource] = []
        for t in self._tables.values():
            serializer = t.meta.state_serializer
            copy = None if serializer.immutable else serializer.copy
            per_kg = capture_table_changes(t.key_group_maps(), copy, t.snapshot_transformer)
            for delta in per_kg:
                if delta is not None:
                    self._rows_updated += len(delta.upserts)
                    self._rows_removed += len(delta.removed or ())
            sources.append(DeltaSnapshotSource(t.meta, per_kg))
        # restored state still encoded never changes: it is in the delta's base already
        sources.extend(self.timer_queues.delta_snapshot_sources())
        return HeapKeyedStateSnapshot(
            self.key_serializer,
            self.max_parallelism,
            self.key_group_range,
            sources,
            checkpoint_id,
            kind=DELTA_SNAPSHOT,
        )

    def snapshot_strategy(self, options: SnapshotOptions) -> SnapshotStrategy:
        """A full file per checkpoint, or an incremental chain of deltas with change tracking
        (``heap/snapshot_strategy.py``)."""
        from streamstate.backends.heap.snapshot_strategy import heap_snapshot_strategy

        return heap_snapshot_strategy(self, options)

    def take_full_snapshot_request(self) -> bool:
        """Whether the next checkpoint of an incremental chain must be a full snapshot (a
        restored state was migrated or renamed since the chain's base was written); asking
        clears the request."""
        needed, self._full_snapshot_needed = self._full_snapshot_needed, False
        return needed

    def reset_change_tracking(self, count: bool = False) -> None:
        """Forget recorded changes: the current state is the base of the next delta.
        ``count``: they were changes of the state (a full checkpoint), not a restore: count
        them in the next :meth:`state_figures`."""
        for t in self._tables.values():
            updated, removed = _take_changes(t)
            if count:
                self._rows_updated += updated
                self._rows_removed += removed
        self.timer_queues.reset_changes()

    # ---- restore -------------------------------------------------------------------------------

    def restore(self, source: RestoreInput | Sequence[KeyedStateRestore]) -> None:
        """Restore from snapshot files (full then deltas, per old subtask); all or nothing.

        Must run before any state is registered; timers go into this backend's timer queues
        (created now if the program has not created them yet). Native snapshots are read through
        their canonical view.
        """
        self._check_open()
        HeapRestoreOperation(self, self.timer_queues).run(RestoreInput.of(source).files)

    def install_pending_restore(self, pending: RestoredRawStates) -> None:
        """Restored state still encoded (heap/restore.py): written into every snapshot
        unchanged, decoded into its table when the program registers the state."""
        self._pending_restore = pending

    def has_state_table(self, name: str) -> bool:
        return name in self._tables

    def drop_state_table(self, name: str) -> None:
        """Forget the table of ``name`` (a restore that failed midway undoes its tables)."""
        self._tables.pop(name, None)

    # ---- checkpoints and TTL -------------------------------------------------------------------

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Nothing to do: a heap snapshot references no earlier upload."""

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Nothing to do: a heap snapshot keeps nothing after it was written."""

    def register_ttl_cleanup(self, hook: TtlCleanupHook) -> Callable[[], object] | None:
        """Wire the TTL cleanup strategies into the state's table: the snapshot transformer
        (full-snapshot cleanup) and the incremental cleanup cursor."""
        table = self.state_table(hook.state_name)
        table.snapshot_transformer = hook.transform if hook.cleanup_full_snapshot else None
        if hook.cleanup_size <= 0:
            return None
        cleanup = IncrementalCleanup(table, hook.transform, hook.cleanup_size)
        if hook.run_cleanup_for_every_record:
            self.key_selected_listeners.append(cleanup)
        return cleanup.step

    def dispose(self) -> None:
        self._tables.clear()
        self._pending_restore = None
        super().dispose()


def _take_changes(table: StateTable) -> tuple[int, int]:
    """Forget the table's recorded changes; returns how many entries they wrote and removed."""
    updated = removed = 0
    for m in table.key_group_maps():
        if isinstance(m, TrackingStateMap) and m.has_changes():
            void, other = m.take_changes_split()
            gone = sum(1 for v in void.values() if v is MISSING)
            gone += sum(1 for v in other.values() if v is MISSING)
            removed += gone
            updated += len(void) + len(other) - gone
    return updated, removed
