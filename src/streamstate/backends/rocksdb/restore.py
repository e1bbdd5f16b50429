"""Restoring the RocksDB keyed backend, with rescaling by key-group ranges (SPEC §7, §10).

From **incremental checkpoints** (:func:`restore_incremental`): the new subtask's key-group range
is intersected with every old subtask's range. The old snapshot with the largest overlap becomes
the *base*: its files are downloaded (and verified) straight into the working directory and
opened; the key groups outside the new range are dropped with one ``delete_range`` per column
family (two ranges: below and above; with ``row_cache_size`` > 0 RocksDB refuses range deletions,
so the entries are deleted one by one and any range tombstone the base's files carry is compacted
away first). Every other overlapping snapshot is downloaded into a
temporary directory, opened read-only, and the key groups of the new range are copied in key
order, in WriteBatches of ``restore_batch_bytes``. Without rescaling the base is the whole
answer, and its uploaded files are reused by the next incremental checkpoint.

From **snapshot files** (savepoints and canonical checkpoints of any backend at any parallelism):
``restore_files.py``.

:class:`NativeRestoreFile` hands a manifest of a bare file store (no checkpoint metadata: tools,
benchmarks, tests) to ``RocksDBKeyedStateBackend.restore``, the one restore entry point.

Timers go into the backend's timer queues (``backends/timer_queues.py``), key group by key
group.
"""

from __future__ import annotations

import itertools
import os
import shutil
from abc import abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import google_crc32c

from streamstate.backends.base import check_key_type
from streamstate.backends.rocksdb.incremental import IncrementalManifest, IncrementalStateHandle
from streamstate.backends.rocksdb.instance import ColumnFamily, RocksDBInstance, open_read_only
from streamstate.backends.rocksdb.keys import KeyLayout, key_group_bound
from streamstate.backends.rocksdb.parts import RocksDBParts
from streamstate.backends.rocksdb.storage import SnapshotFileStore, crc32c_of_file
from streamstate.backends.timer_queues import TimerRestore
from streamstate.errors import (
    CheckpointError,
    CorruptCheckpointError,
    MaxParallelismMismatchError,
    StateBackendError,
)
from streamstate.format.meta import StateMetaSnapshot
from streamstate.format.names import create_restored_file, file_name
from streamstate.format.restore import KeyedStateRestore, RestoredBlock
from streamstate.keygroups import KeyGroupRange
from streamstate.serializers.base import TypeSerializer
from streamstate.serializers.migration import MigratingSerializer

#: values converted per call when a state migrates (bench/migration.py)
_MIGRATION_CHUNK = 4_096

__all__ = [
    "NativeRestoreFile",
    "NativeSnapshotFile",
    "copy_column_family",
    "download_snapshot",
    "load_manifest",
    "migrate_column_family",
    "migrate_values",
    "restore_incremental",
]


class NativeSnapshotFile(KeyedStateRestore):
    """A restore file that is a native RocksDB snapshot: a RocksDB backend restores natively
    when every file is one (from :attr:`store` and :attr:`incremental_handle`)."""

    @property
    @abstractmethod
    def store(self) -> SnapshotFileStore:
        """The file store the handle's paths are relative to."""

    @property
    @abstractmethod
    def incremental_handle(self) -> IncrementalStateHandle | str:
        """The manifest's handle (size and CRC32C are checked on load), or its path."""


class NativeRestoreFile(NativeSnapshotFile):
    """One old subtask's native snapshot (a manifest handle or path in ``store``) as a restore
    file: ``RestoreInput([NativeRestoreFile(store, h) for h in handles])``. Native only (it has
    no canonical view): a RocksDB backend restores it natively, any other backend refuses it."""

    kind = "full"

    def __init__(self, store: SnapshotFileStore, handle: IncrementalStateHandle | str) -> None:
        self._store = store
        self._handle = handle
        self.path = handle if isinstance(handle, str) else handle.path
        self.key_serializer = {}
        self.max_parallelism = 0
        self.states = []

    @property
    def store(self) -> SnapshotFileStore:
        return self._store

    @property
    def incremental_handle(self) -> IncrementalStateHandle | str:
        return self._handle

    def blocks(self) -> Iterator[RestoredBlock]:
        raise CheckpointError(
            f"{self.path} is a native RocksDB snapshot without a canonical view; only a RocksDB "
            "backend restores it (from checkpoint storage, every backend reads it)"
        )


def load_manifest(
    store: SnapshotFileStore, handle: IncrementalStateHandle | str
) -> IncrementalManifest:
    """Read and verify one subtask's manifest."""
    path = handle if isinstance(handle, str) else handle.path
    data = store.get_bytes(path)
    if isinstance(handle, IncrementalStateHandle) and (
        len(data) != handle.size or google_crc32c.value(data) != handle.crc32c
    ):
        raise CorruptCheckpointError(
            f"RocksDB manifest {path!r} does not match its checkpoint metadata (size or checksum)"
        )
    return IncrementalManifest.decode(data, path)


def check_compatible(
    backend: RocksDBParts,
    max_parallelism: int,
    key_serializer: dict[str, Any],
    where: str,
) -> None:
    if max_parallelism != backend.max_parallelism:
        raise MaxParallelismMismatchError(
            f"{where} was taken with max_parallelism={max_parallelism}, but the job now runs "
            f"with max_parallelism={backend.max_parallelism}; the number of key groups cannot "
            "change"
        )
    check_key_type(key_serializer, backend.key_serializer, where)


def check_fresh(backend: RocksDBParts) -> None:
    if backend.registered_state_names():
        raise StateBackendError(
            "a RocksDB keyed backend can only be restored before any state is registered "
            f"(registered: {backend.registered_state_names()})"
        )


def remember_states(backend: RocksDBParts, states: Iterable[StateMetaSnapshot]) -> None:
    """Record the meta data of the states of file headers or manifests."""
    metas = list(states)
    backend.restored.remember(metas)
    for meta in metas:
        if backend.restored_state_meta(meta.name) is None:
            backend.add_restored_meta(meta)


# ---- incremental ------------------------------------------------------------------------------


def download_snapshot(
    store: SnapshotFileStore, manifest: IncrementalManifest, directory: str, where: str
) -> None:
    """Download and verify every file of ``manifest`` into ``directory`` (a database opens
    there); ``where`` names the snapshot in errors."""
    os.makedirs(directory, exist_ok=True)
    job = store.location
    for i, f in enumerate(manifest.shared):
        local = os.path.join(
            directory, file_name(f.name, checkpoint=job, file=where, field=f"shared[{i}].name")
        )
        try:
            store.get_file(f.path, local)
        except FileExistsError:
            raise CorruptCheckpointError(
                f"{where}: shared[{i}].name {f.name!r} names a file that exists already in "
                f"{directory} (a name given twice?); refused"
            ) from None
        size, crc = crc32c_of_file(local)
        if size != f.size or crc != f.crc32c:
            raise CorruptCheckpointError(
                f"{where}: shared file {f.path!r} is corrupt or truncated ({size} bytes, crc "
                f"{crc:#x}; expected {f.size} bytes, crc {f.crc32c:#x})"
            )
    for i, p in enumerate(manifest.private):
        if len(p.data) != p.size or google_crc32c.value(p.data) != p.crc32c:
            raise CorruptCheckpointError(f"{where}: private file {p.name!r} fails its checksum")
        field = f"private[{i}].name"
        with create_restored_file(
            directory, p.name, checkpoint=job, file=where, field=field
        ) as out:
            out.write(p.data)


def restore_incremental(
    backend: RocksDBParts,
    store: SnapshotFileStore,
    handles: Sequence[IncrementalStateHandle | str],
    *,
    claim: bool = False,
) -> dict[str, int]:
    """Restore ``backend`` (fresh) from the incremental snapshots of every old subtask. With
    ``claim`` its next checkpoint to the same store references the base snapshot's files.

    Returns counters: ``{"base_files", "copied_entries", "deleted_ranges"}``.
    """
    check_fresh(backend)
    new_range = backend.key_group_range
    manifests = []
    for h in handles:
        m = load_manifest(store, h)
        where = f"RocksDB snapshot {h if isinstance(h, str) else h.path!r}"
        check_compatible(backend, m.max_parallelism, m.key_serializer, where)
        old = KeyGroupRange(*m.key_group_range)
        overlap = old.intersection(new_range)
        if overlap:
            manifests.append((m, old, overlap, where))
    stats = {"base_files": 0, "copied_entries": 0, "deleted_ranges": 0}
    if not manifests:
        return stats
    base_index = max(range(len(manifests)), key=lambda i: len(manifests[i][2]))
    base, base_range, _, base_where = manifests[base_index]
    instance = backend.instance
    instance.close_db()
    download_snapshot(store, base, instance.db_path, base_where)
    stats["base_files"] = len(base.shared)
    try:
        instance.open()
    except StateBackendError as exc:  # the files verified, yet RocksDB refuses them
        raise CorruptCheckpointError(f"{base_where} does not open as a database: {exc}") from None
    instance.drop_range_tombstones()
    n = backend.key_layout.kg_bytes
    if base_range.start < new_range.start:
        instance.delete_range(key_group_bound(0, n), key_group_bound(new_range.start, n))
        stats["deleted_ranges"] += 1
    if base_range.end > new_range.end:
        instance.delete_range(
            key_group_bound(new_range.end + 1, n), key_group_bound(backend.max_parallelism, n)
        )
        stats["deleted_ranges"] += 1
    for i, (m, _, overlap, where) in enumerate(manifests):
        if i == base_index:
            continue
        directory = os.path.join(instance.restore_path, f"{i}")
        try:
            download_snapshot(store, m, directory, where)
            stats["copied_entries"] += _copy_key_groups(instance, directory, overlap, n)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    timers = TimerRestore(backend.timer_queues, backend.key_serializer)
    for m, _, _, _ in manifests:
        remember_states(backend, m.states)
        for block in m.timers:
            timers.add_native(block.meta, block.entries)
    timers.install()
    # the base's files are now files of this database: the next checkpoint references them
    backend.uploads.restored(base.shared, store.location if claim else None)
    return stats


def _copy_key_groups(
    instance: RocksDBInstance, directory: str, key_groups: KeyGroupRange, kg_bytes: int
) -> int:
    """Copy the entries of ``key_groups`` of every column family of the database at
    ``directory`` into ``instance``; returns how many entries were copied."""
    db, cfs = open_read_only(directory, instance.config)
    limit = instance.config.restore_batch_bytes
    begin = key_group_bound(key_groups.start, kg_bytes)
    end = key_group_bound(key_groups.end + 1, kg_bytes)
    copied = 0
    try:
        for name, cf in cfs.items():
            target = instance.column_family(name)
            handle = target.handle
            batch = instance.new_batch()
            size = 0
            for key, value in ColumnFamily(name, cf, None).scan(begin, end):
                batch.put(key, value, handle)
                size += len(key) + len(value)  # type: ignore[arg-type]
                copied += 1
                if size >= limit:
                    instance.write(batch)
                    batch = instance.new_batch()
                    size = 0
            instance.write(batch)
    finally:
        cfs.clear()
        db.close()
        del db
    return copied


# ---- migration --------------------------------------------------------------------------------


def migrate_column_family(
    instance: RocksDBInstance,
    cf: ColumnFamily,
    kind: str,
    old: TypeSerializer[Any],
    new: TypeSerializer[Any],
    layout: KeyLayout,
) -> int:
    """Rewrite every entry of ``cf`` from the ``old`` serializer's bytes to the ``new`` one's.

    Map states rewrite user keys too (their bytes may change). Returns the entries rewritten.
    """
    batch = instance.new_batch()
    handle = cf.handle
    n = 0
    if kind == "map":
        old_k, old_v = old.key, old.value  # type: ignore[attr-defined]
        new_k, new_v = new.key, new.value  # type: ignore[attr-defined]
        for raw_key, raw_value in cf.scan(b"", None):
            end = layout.entry_end(raw_key)
            uk = old_k.deserialize(raw_key[end:])
            new_key = raw_key[:end] + new_k.serialize(uk)
            if new_key != raw_key:
                batch.delete(raw_key, handle)
            batch.put(new_key, new_v.serialize(old_v.deserialize(raw_value)), handle)
            n += 1
    else:
        for raw_key, raw_value in cf.scan(b"", None):
            batch.put(raw_key, new.serialize(old.deserialize(raw_value)), handle)
            n += 1
    instance.write(batch)
    return n


def migrate_values(instance: RocksDBInstance, cf: ColumnFamily, reader: MigratingSerializer) -> int:
    """Rewrite every value of ``cf`` (a map state's: one entry per mapping, its key kept as it
    is) from the old serializer's bytes to the new one's, ``reader`` converting a chunk of
    values at a time; written in batches of ``restore_batch_bytes``. Returns the entries
    rewritten."""
    limit = instance.config.restore_batch_bytes
    handle = cf.handle
    convert = reader.convert_stored
    batch = instance.new_batch()
    n = size = 0
    items = cf.items()
    while chunk := list(itertools.islice(items, _MIGRATION_CHUNK)):
        keys = [k for k, _ in chunk]
        size += _put_all(batch, handle, keys, convert([v for _, v in chunk]))
        n += len(keys)
        if size >= limit:
            instance.write(batch)
            batch, size = instance.new_batch(), 0
    instance.write(batch)
    return n


def _put_all(batch: Any, handle: Any, keys: list[bytes], values: list[bytes]) -> int:
    """Put every pair into ``batch``; returns their bytes."""
    put = batch.put
    for key, value in zip(keys, values, strict=True):
        put(key, value, handle)
    return sum(map(len, keys)) + sum(map(len, values))


def copy_column_family(
    instance: RocksDBInstance, source: ColumnFamily, target: ColumnFamily
) -> int:
    """Copy every entry of ``source`` into ``target`` (a renamed state), in batches of
    ``restore_batch_bytes``; returns the entries copied."""
    limit = instance.config.restore_batch_bytes
    handle = target.handle
    batch = instance.new_batch()
    n = size = 0
    for key, value in source.scan(b"", None):
        batch.put(key, value, handle)
        n += 1
        size += len(key) + len(value)  # type: ignore[arg-type]
        if size >= limit:
            instance.write(batch)
            batch = instance.new_batch()
            size = 0
    instance.write(batch)
    return n
