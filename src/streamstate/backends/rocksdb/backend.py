"""The RocksDB keyed state backend (SPEC §10): state larger than memory, on local disk.

One RocksDB instance per subtask (``instance.py``), one column family per state, composite keys
``[key group][key][namespace][user key]`` (``keys.py``), a write-back cache flushed atomically
(``cache.py``), incremental checkpoints of native RocksDB checkpoints (``snapshot.py``) and
restore with rescaling by key-group ranges (``restore.py``).
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from streamstate.api.descriptors import StateDescriptor, StateKind
from streamstate.api.state import InternalKvState
from streamstate.backends.base import Clock, KeyedStateBackend, RestoreInput, RestoreMode
from streamstate.backends.figures import StateFigures
from streamstate.backends.rocksdb.cache import (
    MapCache,
    ValueCache,
    WriteBackCache,
    msgpack_array_length,
)
from streamstate.backends.rocksdb.incremental import UploadTracker
from streamstate.backends.rocksdb.instance import (
    DEFAULT_COLUMN_FAMILY,
    ColumnFamily,
    RocksDBConfig,
    RocksDBInstance,
)
from streamstate.backends.rocksdb.keys import KeyLayout
from streamstate.backends.rocksdb.parts import RegisteredState
from streamstate.backends.rocksdb.restore import (
    NativeSnapshotFile,
    copy_column_family,
    migrate_column_family,
    migrate_values,
    restore_incremental,
)
from streamstate.backends.rocksdb.restore_files import (
    materialize_deferred_state,
    restore_deferred_state,
    restore_files,
)
from streamstate.backends.rocksdb.restored import RestoredStates
from streamstate.backends.rocksdb.snapshot import RocksDBKeyedStateSnapshot, take_snapshot
from streamstate.backends.rocksdb.states import STATE_FACTORIES, CurrentKeyBytes
from streamstate.backends.snapshot_strategy import SnapshotOptions, SnapshotStrategy
from streamstate.errors import InvalidStateNameError, StateBackendError, StateMigrationException
from streamstate.format.meta import StateMetaInfo, StateMetaSnapshot
from streamstate.format.restore import KeyedStateRestore
from streamstate.keygroups import KeyGroupRange
from streamstate.serializers import describe_snapshot, serializer_from_snapshot
from streamstate.serializers.base import TypeSerializer
from streamstate.serializers.migration import MigratingSerializer, migrating_serializer

if TYPE_CHECKING:
    from streamstate.backends.decorators.ttl_cleanup import TtlCleanupHook

__all__ = ["RegisteredState", "RocksDBKeyedStateBackend"]


class RocksDBKeyedStateBackend(KeyedStateBackend):
    """Keyed state of one subtask in one RocksDB instance.

    Parameters (besides the common ones): ``options`` — a
    :class:`~streamstate.backends.factory.RocksDBStateBackend` or :class:`RocksDBConfig`;
    ``path`` — the instance directory (locked while the backend is open; a temporary directory
    if None).
    """

    backend_name = "rocksdb"

    def __init__(
        self,
        key_serializer: TypeSerializer[Any],
        max_parallelism: int,
        key_group_range: KeyGroupRange,
        *,
        options: Any = None,
        path: str | None = None,
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
        self.config = RocksDBConfig.from_options(options)
        self.instance = RocksDBInstance(
            path or tempfile.mkdtemp(prefix="streamstate-rocksdb-"), self.config
        )
        self.instance.open()
        self.cache = WriteBackCache(self.instance, self.config.cache_entries)
        #: (entries written, deleted) by the cache when state_figures() last looked
        self._figures_base = (0, 0)
        #: layout of the key part, shared by every state
        self._key_layout = self._layout_for(_VOID, has_user_key=False)
        self.current = CurrentKeyBytes(self.ctx, self._key_layout, self._range_start)
        # every key change is a record boundary: the cache may flush and evict there
        self.key_selected_listeners.append(self.cache.at_record_boundary)
        self._registered: dict[str, RegisteredState] = {}
        #: restored data waiting for its state (rocksdb/restored.py)
        self.restored = RestoredStates()
        #: identifies this backend's lineage of incremental checkpoints
        self.backend_uid = uuid.uuid4().hex
        #: shared files the next incremental checkpoint may reference instead of uploading
        self.uploads = UploadTracker()
        #: counters of the last native restore: base_files, copied_entries, deleted_ranges
        self.restore_statistics: dict[str, int] = {}

    # ---- states ------------------------------------------------------------------------------

    def _layout_for(
        self, namespace_serializer: TypeSerializer[Any], *, has_user_key: bool
    ) -> KeyLayout:
        return KeyLayout(
            self.max_parallelism,
            self.key_serializer,
            namespace_serializer,
            has_user_key=has_user_key,
        )

    def _create_internal_state(
        self, namespace_serializer: TypeSerializer[Any], descriptor: StateDescriptor
    ) -> InternalKvState:
        self._check_open()
        name = descriptor.name
        if name == DEFAULT_COLUMN_FAMILY:
            raise InvalidStateNameError(
                f"state name {name!r} collides with RocksDB's default column family"
            )
        kind = descriptor.kind
        ttl = descriptor.ttl_config.to_dict() if descriptor.ttl_config is not None else None
        meta = StateMetaInfo(name, kind.value, namespace_serializer, descriptor.serializer, ttl)
        is_map = kind is StateKind.MAP
        layout = self._layout_for(namespace_serializer, has_user_key=is_map)
        cf = self.instance.column_family(name)
        restored = self.restored.take_state(name)
        reader = self.restored_value_reader(name, descriptor.serializer)
        if self.restored.is_deferred(name):
            restore_deferred_state(
                self, name, kind.value, namespace_serializer, meta.state_serializer, reader
            )
        elif restored is not None:
            self._migrate_if_needed(name, restored, meta, cf, layout)
        cache: ValueCache | MapCache
        start, n = self._range_start, self._num_key_groups
        if is_map:
            ks = descriptor.key_serializer  # type: ignore[attr-defined]
            vs = descriptor.value_serializer  # type: ignore[attr-defined]
            cache = MapCache(
                cf, layout, start, n, ks.serialize, ks.deserialize, vs.serialize, vs.deserialize
            )
        else:
            s = descriptor.serializer
            cache = ValueCache(
                cf, layout, start, n, s.serialize, s.deserialize, elements=kind is StateKind.LIST
            )
        self.cache.register(cache)
        self._registered[name] = RegisteredState(meta, cf, layout, cache)
        factory = STATE_FACTORIES[kind]
        return factory(  # type: ignore[no-any-return]
            descriptor, namespace_serializer, layout, self.current, self.ctx, cache
        )

    def _migrate_if_needed(
        self,
        name: str,
        restored: StateMetaSnapshot,
        meta: StateMetaInfo,
        cf: ColumnFamily,
        layout: KeyLayout,
    ) -> None:
        """Rewrite a restored state whose declaration changed compatibly (Flink's migration):
        every stored value read as the checkpoint wrote it and written as the program declares
        it now, once, before the state is used. A map's keys keep their type (the rules of
        schema evolution refuse a changed key type), so only its values are rewritten."""
        new = meta.state_serializer
        if restored.state_serializer == new.snapshot():
            return
        old_snap = restored.state_serializer
        values_old, values_new = old_snap, new
        if meta.kind == "map":
            values_old = old_snap.get("value", {})
            values_new = new.value  # type: ignore[attr-defined]
        reader = migrating_serializer(values_old, values_new, now=self.clock.now())
        if reader is values_new:
            return  # read as it is
        if isinstance(reader, MigratingSerializer) and reader.reads_stored_bytes:
            return  # the new serializer reads every old value from its bytes, as it is read
        if not isinstance(reader, MigratingSerializer):  # no schema: the serializer's own rules
            compat = new.resolve_compatibility(old_snap)
            if compat.is_compatible_as_is:
                return
            if compat.is_incompatible:  # _check_restored already refused; keep the guard
                raise StateMigrationException(f"state {name!r}: incompatible serializer")
            try:
                old = serializer_from_snapshot(old_snap)
            except Exception as exc:
                raise StateMigrationException(
                    f"state {name!r} needs migration but its checkpointed serializer cannot be "
                    f"rebuilt: {exc}"
                ) from exc
            migrate_column_family(self.instance, cf, meta.kind, old, new, layout)
            return
        try:
            migrate_values(self.instance, cf, reader)
        except (msgspec.ValidationError, msgspec.DecodeError, ValueError, TypeError) as exc:
            raise StateMigrationException(
                f"state {name!r}: the checkpointed values cannot be migrated to "
                f"{describe_snapshot(new.snapshot())} ({exc})"
            ) from None

    def rename_restored_state(self, old: str, new: str) -> None:
        """Restored state ``old`` becomes ``new``: its column family's entries are copied into
        the column family of ``new`` and the old one is dropped (still-encoded state deferred
        to snapshot files just changes its name)."""
        super().rename_restored_state(old, new)
        native = old in self.instance.column_family_names() and not self.restored.is_deferred(old)
        self.restored.rename(old, new)
        if native:
            copy_column_family(
                self.instance, self.instance.column_family(old), self.instance.column_family(new)
            )
            self.instance.drop_column_family(old)

    def register_ttl_cleanup(self, hook: TtlCleanupHook) -> Callable[[], object] | None:
        """Called by the TTL decorator (``create_ttl_state``) for every TTL state: the hook's
        bounded sweep runs at snapshots (rocksdb/snapshot.py); nothing runs per access."""
        self._registered[hook.state_name].ttl_hook = hook
        return None

    def registered_states(self) -> list[RegisteredState]:
        """Every registered state's column family, layout, cache and TTL hook."""
        return list(self._registered.values())

    @property
    def key_layout(self) -> KeyLayout:
        """The layout of the key part of composite keys, shared by every state."""
        return self._key_layout

    # ---- whole-state queries -----------------------------------------------------------------

    def flush(self) -> int:
        """Write every cached change to RocksDB (one atomic WriteBatch); returns how many."""
        self._check_open()
        return self.cache.flush()

    def _column_family_and_layout(self, name: str) -> tuple[ColumnFamily, KeyLayout] | None:
        """The column family and key layout of a registered or restored state, or None."""
        reg = self._registered.get(name)
        if reg is not None:
            return reg.cf, reg.layout
        restored = self.restored.state(name)
        if restored is None:
            return None
        if self.restored.is_deferred(name):  # still in its files: written as they stored it
            materialize_deferred_state(self, name)
        try:
            ns_serializer = serializer_from_snapshot(restored.namespace_serializer)
        except Exception as exc:
            raise StateBackendError(
                f"state {name!r} was restored but is not registered yet, and its namespace "
                f"serializer cannot be rebuilt from the checkpoint: {exc}"
            ) from exc
        layout = self._layout_for(ns_serializer, has_user_key=restored.kind == "map")
        return self.instance.column_family(name), layout

    def get_keys(self, state_name: str, namespace: Any) -> Iterator[Any]:
        found = self._column_family_and_layout(state_name)
        if found is None:
            return iter(())
        self.flush()
        return self._keys_in(*found, namespace)

    def _keys_in(self, cf: ColumnFamily, layout: KeyLayout, namespace: Any) -> Iterator[Any]:
        ns_part = layout.namespace_bytes(namespace)
        key_end, entry_end = layout.key_end, layout.entry_end
        decode_key = layout.decode_key
        previous = None
        for raw in cf.scan_keys(b""):
            end = entry_end(raw)
            if raw[key_end(raw) : end] != ns_part:
                continue
            entry = raw[:end]
            if entry == previous:  # more mappings of the same map
                continue
            previous = entry
            yield decode_key(raw)

    def state_figures(self) -> StateFigures:
        """The entries of every state (``streamstate.format.entries``: counted by one scan of a
        column family the first time, then kept by the flushes, which read the stored versions
        of what they write), RocksDB's estimates of live data plus memtables and of memtables
        plus caches (property reads), and the entries the write-back cache wrote and deleted
        since the previous call (after a flush of what it holds)."""
        self.flush()
        _, live, memtables = self.instance.estimates()
        cache = self.cache
        written, deleted = cache.written, cache.deleted()
        updated = written - deleted - self._figures_base[0]
        removed = deleted - self._figures_base[1]
        self._figures_base = (written - deleted, deleted)
        return StateFigures(
            rows=self._entries(),
            rows_updated=updated,
            rows_removed=removed,
            state_bytes=live + memtables,
            memory_bytes=memtables + self.instance.cache_usage(),
        )

    def num_entries(self, state_name: str | None = None) -> int:
        self.flush()
        return self._entries(state_name)

    def _entries(self, state_name: str | None = None) -> int:
        """Entries of one state or of all (registered, and restored but not registered yet),
        the cache flushed."""
        names = [state_name] if state_name is not None else [*self._registered]
        total = sum(r.cache.stored_entries() for n in names if (r := self._registered.get(n)))
        restored = self.restored.state_names() if state_name is None else [state_name]
        for name in restored:
            if name in self._registered:
                continue
            found = self._column_family_and_layout(name)
            meta = self.restored.state(name)
            if found is None or meta is None:
                continue
            cf, _ = found
            if meta.kind == "list":
                total += sum(msgpack_array_length(raw) for _, raw in cf.scan(b""))
            else:  # a value per key (map: per mapping)
                total += sum(1 for _ in cf.scan_keys(b""))
        return total

    # ---- restore -----------------------------------------------------------------------------

    def restore(self, source: RestoreInput | Sequence[KeyedStateRestore]) -> None:
        """Restore (before any state is registered): natively if every file is a native RocksDB
        snapshot (download, rescale by key-group ranges), else from the keyed snapshot files
        (full then deltas per old subtask) like the heap backend. In ``RestoreMode.CLAIM`` the
        next incremental checkpoint references the restored SST files (same storage)."""
        self._check_open()
        restore_input = RestoreInput.of(source)
        files = restore_input.files
        native = [f for f in files if isinstance(f, NativeSnapshotFile)]
        if native and len(native) == len(files):
            self.restore_statistics = restore_incremental(
                self,
                native[0].store,
                [f.incremental_handle for f in native],
                claim=restore_input.mode is RestoreMode.CLAIM,
            )
            return
        restore_files(self, files)

    def snapshot_strategy(self, options: SnapshotOptions) -> SnapshotStrategy:
        """Native incremental checkpoints, or a canonical file per checkpoint
        (``rocksdb/snapshot_strategy.py``)."""
        from streamstate.backends.rocksdb.snapshot_strategy import rocksdb_snapshot_strategy

        return rocksdb_snapshot_strategy(self, options)

    # ---- snapshots ---------------------------------------------------------------------------

    def snapshot(self, checkpoint_id: int = 0) -> RocksDBKeyedStateSnapshot:
        """The synchronous phase: flush, bounded TTL sweep, native checkpoint, meta, timers.

        Returns a :class:`~streamstate.backends.rocksdb.snapshot.RocksDBKeyedStateSnapshot`,
        which is a canonical :class:`~streamstate.format.snapshot.KeyedStateSnapshot` (for
        savepoints) and can also be uploaded incrementally (``write_incremental``).
        """
        self._check_open()
        return take_snapshot(self, checkpoint_id)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` is complete: later checkpoints may reuse its files."""
        self.uploads.complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` will never complete: its files are never reused."""
        self.uploads.abort(checkpoint_id)

    # ---- lifecycle ---------------------------------------------------------------------------

    def dispose(self) -> None:
        if self._disposed:
            return
        self.cache.dispose()
        self._registered.clear()
        self.instance.close()
        super().dispose()

    def __repr__(self) -> str:
        return (
            f"RocksDBKeyedStateBackend({self.instance.path!r}, key groups "
            f"{self.key_group_range}, states {sorted(self._registered)})"
        )


def _void_serializer() -> TypeSerializer[Any]:
    from streamstate.serializers import VoidNamespaceSerializer

    return VoidNamespaceSerializer()


_VOID = _void_serializer()
