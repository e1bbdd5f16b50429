"""Snapshots of the RocksDB keyed backend (SPEC §6.3, §6.4, §10).

Synchronous phase (:func:`take_snapshot`, on the processing thread): flush the write-back cache
(one atomic WriteBatch), run the bounded TTL sweeps, take a native RocksDB checkpoint into
``checkpoints/chk-<id>`` (memtables flushed, SST files hard-linked: no data is copied), record
the states' meta data and copy the heap timers. Processing continues right after.

Asynchronous phase, two ways to write the same :class:`RocksDBKeyedStateSnapshot`:

* **incremental checkpoint** (:meth:`~RocksDBKeyedStateSnapshot.write_incremental`): upload the
  SST files that no confirmed earlier checkpoint uploaded, then the manifest
  (``incremental.py``);
* **canonical** (the :class:`~streamstate.format.snapshot.KeyedStateSnapshot` interface, for
  savepoints and the common format writer): open the native checkpoint *read-only* and iterate
  it key group by key group, decoding composite keys back into ``(key, namespace, state)``. A
  rocksdict ``Snapshot`` isolates point reads but not iteration, so the immutable checkpoint is
  what makes the scan consistent.

:meth:`~RocksDBKeyedStateSnapshot.release` closes the read-only database and deletes the
checkpoint directory.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import google_crc32c

from streamstate.backends.rocksdb.incremental import (
    IncrementalManifest,
    IncrementalStateHandle,
    PrivateFile,
    SharedFile,
    TimerBlock,
    UploadTracker,
)
from streamstate.backends.rocksdb.instance import ColumnFamily, RocksDBConfig, open_read_only
from streamstate.backends.rocksdb.keys import KeyLayout, key_group_bound, key_group_prefix_bytes
from streamstate.backends.rocksdb.parts import RegisteredState, RocksDBParts
from streamstate.backends.rocksdb.restore_files import materialize_deferred_state
from streamstate.backends.rocksdb.storage import SnapshotFileStore, crc32c_of_file
from streamstate.errors import CheckpointError, CorruptCheckpointError, StateMigrationException
from streamstate.format.codec import UNREADABLE
from streamstate.format.entries import COUNTED_BY_ELEMENT
from streamstate.format.meta import StateMetaInfo, StateMetaSnapshot
from streamstate.format.snapshot import EntryColumns, KeyedStateSnapshot, SnapshotSource
from streamstate.keygroups import KeyGroupRange
from streamstate.namespace import VOID_NAMESPACE
from streamstate.serializers import serializer_from_snapshot
from streamstate.serializers.base import SerializerSnapshot, TypeSerializer

__all__ = [
    "RocksDBKeyedStateSnapshot",
    "decode_columns",
    "decode_entries",
    "sweep_ttl",
    "take_snapshot",
]

#: a manifest's path: ``chk-<id>/<operator>/<subtask>-<attempt>[-<token>].state`` (the Spark
#: runtime adds a random token to the names of a checkpoint's own files)
_SUBTASK_FILE = re.compile(r"^(?:.*/)?chk-\d+/([^/]+)/(\d+)-(\d+)(?:-[0-9a-f]+)?\.state$")


# ---- synchronous phase -----------------------------------------------------------------------


def take_snapshot(backend: RocksDBParts, checkpoint_id: int) -> RocksDBKeyedStateSnapshot:
    """The synchronous phase of a snapshot of ``backend`` (see the module docstring)."""
    for name in backend.restored.deferred_names():  # never registered: kept as stored
        materialize_deferred_state(backend, name)
    unbound = backend.timer_queues.unbound_names()
    if unbound:
        raise CheckpointError(
            f"timer queues {unbound} were restored with namespace serializers that are not built "
            "in and their timer services were not created yet (the namespaces are decoded with "
            "the service's serializer); create the timer services before the next checkpoint"
        )
    backend.cache.flush()
    for reg in backend.registered_states():
        hook = reg.ttl_hook
        if hook is not None and hook.max_entries_per_checkpoint > 0:
            sweep_ttl(backend, reg)
    instance = backend.instance
    target = os.path.join(instance.checkpoints_path, f"chk-{checkpoint_id}")
    if os.path.exists(target):
        target = f"{target}-{uuid.uuid4().hex[:8]}"
    instance.create_checkpoint(target)
    states: list[_SnapshotState] = [
        _SnapshotState(reg.meta.snapshot(), reg.meta, reg.layout, _full_snapshot_transform(reg))
        for reg in backend.registered_states()
    ]
    states.extend(_SnapshotState(m, None, None, None) for m in backend.restored.state_metas())
    timer_sources: list[SnapshotSource] = backend.timer_queues.snapshot_sources()
    return RocksDBKeyedStateSnapshot(
        key_serializer=backend.key_serializer,
        max_parallelism=backend.max_parallelism,
        key_group_range=backend.key_group_range,
        checkpoint_id=checkpoint_id,
        directory=target,
        backend_uid=backend.backend_uid,
        config=backend.config,
        states=states,
        timer_sources=timer_sources,
        previous_uploads=dict(backend.uploads.confirmed),
        previous_location=backend.uploads.location,
        uploads=backend.uploads,
    )


def _full_snapshot_transform(reg: RegisteredState) -> Callable[[Any], Any] | None:
    hook = reg.ttl_hook
    if hook is None or not hook.cleanup_full_snapshot:
        return None
    return hook.transform  # type: ignore[no-any-return]


def sweep_ttl(backend: RocksDBParts, reg: RegisteredState) -> int:
    """One bounded TTL sweep of a state (the stand-in for Flink's compaction filter).

    Visits at most ``hook.max_entries_per_checkpoint`` RocksDB entries from ``hook.cursor`` (a raw
    key; None = from the start), deletes expired ones and rewrites partly expired ones in one
    WriteBatch, and stores where to resume. Map mappings are visited one by one (the transform
    of a one-mapping dict). The state's cache must be clean (it is flushed first) and is dropped
    if anything changed. Returns the number of entries changed.
    """
    hook = reg.ttl_hook
    if hook is None:  # not a TTL state
        return 0
    transform = hook.transform
    left = hook.max_entries_per_checkpoint
    meta = reg.meta
    is_map = meta.kind == "map"
    serializer = meta.state_serializer
    if is_map:
        key_ser, value_ser = serializer.key, serializer.value  # type: ignore[attr-defined]
        entry_end = reg.layout.entry_end
    cf = reg.cf
    batch = backend.instance.new_batch()
    handle = cf.handle
    changed = 0
    #: entries removed (``streamstate.format.entries``: mappings, list elements, values)
    removed = 0
    elements = meta.kind in COUNTED_BY_ELEMENT and not is_map
    cursor: bytes | None = None
    for raw_key, raw_value in cf.scan(hook.cursor or b"", None):
        if left <= 0:
            cursor = raw_key
            break
        left -= 1
        if is_map:
            uk = key_ser.deserialize(raw_key[entry_end(raw_key) :])
            state = {uk: value_ser.deserialize(raw_value)}
            new = transform(state)
            if new is None or uk not in new:
                batch.delete(raw_key, handle)
                changed += 1
                removed += 1
            elif new is not state:
                batch.put(raw_key, value_ser.serialize(new[uk]), handle)
                changed += 1
        else:
            state = serializer.deserialize(raw_value)
            new = transform(state)
            if new is None:
                batch.delete(raw_key, handle)
                changed += 1
                removed += len(state) if elements else 1
            elif new is not state:
                batch.put(raw_key, serializer.serialize(new), handle)
                changed += 1
                removed += len(state) - len(new) if elements else 0
    hook.cursor = cursor
    if changed:
        backend.instance.write(batch)
        reg.cache.clear()
        if reg.cache.stored is not None:
            reg.cache.stored -= removed
    return changed


# ---- the snapshot ----------------------------------------------------------------------------


class _SnapshotState:
    """One column family as the snapshot sees it."""

    __slots__ = ("layout", "meta", "rebuild", "snapshot_meta", "transform")

    def __init__(
        self,
        snapshot_meta: StateMetaSnapshot,
        meta: StateMetaInfo | None,
        layout: KeyLayout | None,
        transform: Callable[[Any], Any] | None,
        rebuild: Callable[[SerializerSnapshot], TypeSerializer[Any]] = serializer_from_snapshot,
    ) -> None:
        self.snapshot_meta = snapshot_meta
        self.meta = meta
        self.layout = layout
        self.transform = transform
        #: how the serializers of an unregistered state are rebuilt from their snapshots
        self.rebuild = rebuild

    @property
    def name(self) -> str:
        return self.snapshot_meta.name

    def resolve(self, key_serializer: TypeSerializer[Any], max_parallelism: int) -> StateMetaInfo:
        """The meta with serializers (rebuilt from the checkpoint for unregistered states)."""
        if self.meta is None:
            d = self.snapshot_meta
            try:
                ns = self.rebuild(d.namespace_serializer)
                st = self.rebuild(d.state_serializer)
            except Exception as exc:
                raise CheckpointError(
                    f"state {d.name!r} was restored but not registered, and its serializers "
                    f"cannot be rebuilt from the checkpoint ({exc}); register the state before "
                    "taking a savepoint"
                ) from exc
            self.meta = StateMetaInfo(d.name, d.kind, ns, st, d.ttl)
        if self.layout is None:
            self.layout = KeyLayout(
                max_parallelism,
                key_serializer,
                self.meta.namespace_serializer,
                has_user_key=self.meta.kind == "map",
            )
        return self.meta


def decode_entries(
    meta: StateMetaInfo,
    layout: KeyLayout,
    raw_entries: Iterable[tuple[bytes, bytes]],
) -> list[tuple[Any, Any, Any]]:
    """``(key, namespace, state)`` from raw RocksDB entries of one state (a key group's, read
    whole), in key order.

    Map mappings of one ``(key, namespace)`` are adjacent (they share the entry prefix) and are
    gathered into one dict. Without a namespace (and not a map) the keys and the values are
    decoded as two columns, each in one call of its serializer where its bytes allow it
    (``deserialize_many``). An entry the state's serializers cannot read (a restored
    checkpoint's description of the state does not fit its data) raises
    :class:`~streamstate.errors.StateMigrationException` naming the state.
    """
    if meta.kind != "map" and layout.ns_void:
        pairs = list(raw_entries)
        columns = decode_columns(meta, layout, [k for k, _ in pairs], [v for _, v in pairs])
        return list(columns)
    try:
        return list(_decode_entries(meta, layout, raw_entries))
    except UNREADABLE as exc:
        raise _unreadable(meta, exc) from None


def decode_columns(
    meta: StateMetaInfo, layout: KeyLayout, raw_keys: list[bytes], raw_values: list[bytes]
) -> EntryColumns:
    """The entries of a state without a namespace that is not a map, from its raw RocksDB keys
    and values (in key order) as columns: the keys and the values each decoded in one call of
    their serializer where their bytes allow it (``deserialize_many``), no tuple per entry.
    Raises :class:`~streamstate.errors.StateMigrationException` as :func:`decode_entries`."""
    try:
        keys = layout.decode_keys(raw_keys)
        values = meta.state_serializer.deserialize_many(raw_values)
    except UNREADABLE as exc:
        raise _unreadable(meta, exc) from None
    return EntryColumns(keys, [VOID_NAMESPACE], values)


def _unreadable(meta: StateMetaInfo, exc: BaseException) -> StateMigrationException:
    return StateMigrationException(
        f"state {meta.name!r}: a stored entry cannot be read with its serializers "
        f"({meta.state_serializer!r}; {type(exc).__name__}: {exc})"
    )


def _decode_entries(
    meta: StateMetaInfo,
    layout: KeyLayout,
    raw_entries: Iterable[tuple[bytes, bytes]],
) -> Iterator[tuple[Any, Any, Any]]:
    decode_key = layout.decode_key
    key_end = layout.key_end
    decode_ns = layout.decode_namespace
    if meta.kind != "map":
        deserialize = meta.state_serializer.deserialize
        for raw_key, raw_value in raw_entries:
            end = key_end(raw_key)
            yield (
                decode_key(raw_key),
                decode_ns(raw_key, end, len(raw_key)),
                deserialize(raw_value),
            )
        return
    dict_serializer: Any = meta.state_serializer
    dk, dv = dict_serializer.key.deserialize, dict_serializer.value.deserialize
    entry_end = layout.entry_end
    prefix: bytes | None = None
    current: dict[Any, Any] = {}
    key = ns = None
    for raw_key, raw_value in raw_entries:
        end = entry_end(raw_key)
        if prefix is None or raw_key[:end] != prefix:
            if prefix is not None:
                yield key, ns, current
            prefix = raw_key[:end]
            key = decode_key(raw_key)
            ns = decode_ns(raw_key, key_end(raw_key), end)
            current = {}
        current[dk(raw_key[end:])] = dv(raw_value)
    if prefix is not None:
        yield key, ns, current


class RocksDBKeyedStateSnapshot(KeyedStateSnapshot):
    """A native RocksDB checkpoint plus meta data, written incrementally or canonically."""

    def __init__(
        self,
        *,
        key_serializer: TypeSerializer[Any],
        max_parallelism: int,
        key_group_range: KeyGroupRange,
        checkpoint_id: int,
        directory: str,
        backend_uid: str,
        config: RocksDBConfig,
        states: list[_SnapshotState],
        timer_sources: list[SnapshotSource],
        previous_uploads: dict[str, SharedFile] | None = None,
        previous_location: str | None = None,
        uploads: UploadTracker | None = None,
    ) -> None:
        self.key_serializer = key_serializer
        self.max_parallelism = max_parallelism
        self.key_group_range = key_group_range
        self.checkpoint_id = checkpoint_id
        self.directory = directory
        self.backend_uid = backend_uid
        self.config = config
        #: local SST name -> SharedFile of the last confirmed checkpoint, at snapshot time
        self.previous_uploads: dict[str, SharedFile] = previous_uploads or {}
        #: where the previous uploads are: a write to another location references none of them
        self.previous_location = previous_location
        #: where write_incremental offers its uploads (the backend's, for a later confirmation)
        self._uploads = uploads if uploads is not None else UploadTracker()
        self._states = states
        self._timer_sources = timer_sources
        self._timer_metas = [s.meta for s in timer_sources]
        self._kg_bytes = key_group_prefix_bytes(max_parallelism)
        self._db: Any = None
        self._cfs: dict[str, Any] = {}
        self._resolved: list[StateMetaInfo] | None = None
        self._released = False

    @classmethod
    def of_manifest(
        cls,
        manifest: IncrementalManifest,
        directory: str,
        config: RocksDBConfig | None = None,
        serializers: Callable[[SerializerSnapshot], TypeSerializer[Any]] | None = None,
    ) -> RocksDBKeyedStateSnapshot:
        """A canonical view of an incremental snapshot whose files were downloaded into
        ``directory`` (released = that directory deleted). Serializers are rebuilt from the
        manifest by ``serializers`` (default: ``serializer_from_snapshot``, the program's)."""
        rebuild = serializers or serializer_from_snapshot
        key_serializer = rebuild(manifest.key_serializer)
        key_groups = KeyGroupRange(*manifest.key_group_range)
        return cls(
            key_serializer=key_serializer,
            max_parallelism=manifest.max_parallelism,
            key_group_range=key_groups,
            checkpoint_id=manifest.checkpoint_id,
            directory=directory,
            backend_uid=manifest.backend_uid,
            config=config or RocksDBConfig(),
            states=[_SnapshotState(d, None, None, None, rebuild) for d in manifest.states],
            timer_sources=[
                _ManifestTimers(block, key_serializer, key_groups, rebuild)
                for block in manifest.timers
            ],
        )

    @property
    def state_names(self) -> list[str]:
        """Names of the states and timer queues in the snapshot (no serializer is rebuilt)."""
        return [s.name for s in self._states] + [m.name for m in self._timer_metas]

    # ---- canonical view (KeyedStateSnapshot) ---------------------------------------------------

    @property
    def states(self) -> list[StateMetaInfo]:  # type: ignore[override]
        if self._resolved is None:
            self._resolved = [
                s.resolve(self.key_serializer, self.max_parallelism) for s in self._states
            ] + self._timer_metas
        return self._resolved

    def _open(self) -> dict[str, Any]:
        if self._released:
            raise CheckpointError(f"snapshot {self.checkpoint_id} was already released")
        if self._db is None:
            self._db, self._cfs = open_read_only(self.directory, self.config)
        return self._cfs

    def raw_entries(self, state_name: str, key_group: int) -> Iterator[tuple[bytes, bytes]]:
        """Raw ``(composite key, value)`` of one state in one key group, from the checkpoint."""
        return zip(*self.raw_columns(state_name, key_group), strict=True)

    def raw_columns(self, state_name: str, key_group: int) -> tuple[list[bytes], list[bytes]]:
        """The raw composite keys and the values of one state in one key group, as columns."""
        cf = self._open().get(state_name)
        if cf is None:
            return [], []
        n = self._kg_bytes
        view = ColumnFamily(state_name, cf, None)
        return view.scan_columns(key_group_bound(key_group, n), key_group_bound(key_group + 1, n))

    def key_group_entries(
        self, key_group: int
    ) -> Iterator[tuple[int, Iterable[tuple[Any, Any, Any]]]]:
        metas = self.states
        for index, st in enumerate(self._states):
            meta = metas[index]
            layout = st.layout
            assert layout is not None
            transform = st.transform
            if transform is None and meta.kind != "map" and layout.ns_void:
                raw_keys, raw_values = self.raw_columns(st.name, key_group)
                if raw_keys:
                    yield index, decode_columns(meta, layout, raw_keys, raw_values)
                continue
            out = decode_entries(meta, layout, self.raw_entries(st.name, key_group))
            if transform is not None:
                out = list(_transformed(out, transform))
            if out:
                yield index, out
        offset = len(self._states)
        kg_index = key_group - self.key_group_range.start
        for j, source in enumerate(self._timer_sources):
            timers = _timer_entries(source, kg_index)
            if timers:
                yield offset + j, timers

    def release_key_group(self, key_group: int) -> None:
        kg_index = key_group - self.key_group_range.start
        for source in self._timer_sources:
            source.release_key_group(kg_index)

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        if self._db is not None:
            db, self._db = self._db, None
            self._cfs = {}
            db.close()
            del db
        for source in self._timer_sources:
            source.release()
        shutil.rmtree(self.directory, ignore_errors=True)

    # ---- incremental checkpoint ----------------------------------------------------------------

    def write_incremental(
        self,
        store: SnapshotFileStore,
        path: str,
        *,
        shared_dir: str = "shared",
        release: bool = True,
    ) -> IncrementalStateHandle:
        """Upload new SST files to ``shared_dir`` and the manifest to ``path`` (asynchronous phase).

        SST files listed in :attr:`previous_uploads` (same name and size) are referenced, not
        uploaded. The manifest is written last, so a failure leaves no manifest behind. Once
        written, the uploads are offered to the backend, which reuses them after
        ``notify_checkpoint_complete(checkpoint_id)``.
        """
        if self._released:
            raise CheckpointError(f"snapshot {self.checkpoint_id} was already released")
        try:
            shared: list[SharedFile] = []
            private: list[PrivateFile] = []
            uploaded = reused = 0
            location = store.location
            previous_uploads = self.previous_uploads if location == self.previous_location else {}
            for name in sorted(os.listdir(self.directory)):
                local = os.path.join(self.directory, name)
                if name.endswith(".sst"):
                    previous = previous_uploads.get(name)
                    if previous is not None and previous.size == os.path.getsize(local):
                        shared.append(previous)
                        reused += previous.size
                        continue
                    size, crc = crc32c_of_file(local)
                    remote = self._shared_path(shared_dir, path)
                    store.put_file(local, remote)
                    shared.append(SharedFile(name, remote, size, crc))
                    uploaded += size
                else:
                    with open(local, "rb") as f:
                        data = f.read()
                    private.append(PrivateFile(name, len(data), google_crc32c.value(data), data))
            manifest = IncrementalManifest(
                checkpoint_id=self.checkpoint_id,
                backend_uid=self.backend_uid,
                key_serializer=self.key_serializer.snapshot(),
                max_parallelism=self.max_parallelism,
                key_group_range=self.key_group_range.to_tuple(),
                states=[s.snapshot_meta for s in self._states],
                shared=shared,
                private=private,
                timers=self._timer_blocks(),
            )
            data = manifest.encode()
            store.put_bytes(data, path)
            uploaded += len(data)
            self._uploads.offer(self.checkpoint_id, shared, location)
            return IncrementalStateHandle(
                path=path,
                size=len(data),
                crc32c=google_crc32c.value(data),
                checkpoint_id=self.checkpoint_id,
                key_group_range=self.key_group_range.to_tuple(),
                shared=shared,
                uploaded_bytes=uploaded,
                reused_bytes=reused,
            )
        finally:
            if release:
                self.release()

    def _shared_path(self, shared_dir: str, manifest_path: str) -> str:
        """A new, unique path for an SST file in the shared area.

        For a manifest at ``chk-<id>/<operator>/<subtask>-<attempt>.state`` this is
        ``<shared_dir>/<operator>/<subtask>-<attempt>-<checkpoint id>-<token>.sst`` (the naming
        of the checkpoint storage's other shared files: the checkpoint id in the name lets
        retention tell files of checkpoints still in progress from orphans).
        """
        token = uuid.uuid4().hex[:16]
        m = _SUBTASK_FILE.match(manifest_path)
        if m is None:
            return f"{shared_dir}/{self.checkpoint_id}-{token}.sst"
        op, subtask, attempt = m.groups()
        return f"{shared_dir}/{op}/{subtask}-{attempt}-{self.checkpoint_id}-{token}.sst"

    def _timer_blocks(self) -> list[TimerBlock]:
        blocks = []
        start = self.key_group_range.start
        ks = self.key_serializer.serialize
        for source in self._timer_sources:
            ns = source.meta.namespace_serializer.serialize
            entries = []
            for i in range(len(self.key_group_range)):
                for key, namespace, timestamp in _timer_entries(source, i):
                    entries.append((start + i, ks(key), ns(namespace), int(timestamp)))
            blocks.append(TimerBlock(source.meta.snapshot(), entries))
        return blocks


def _transformed(
    entries: Iterable[tuple[Any, Any, Any]], transform: Callable[[Any], Any]
) -> Iterator[tuple[Any, Any, Any]]:
    for key, ns, state in entries:
        new = transform(state)
        if new is not None:
            yield key, ns, new


class _ManifestTimers(SnapshotSource):
    """The timers of one timer queue of a manifest, decoded, as a snapshot source."""

    def __init__(
        self,
        block: TimerBlock,
        key_serializer: TypeSerializer[Any],
        key_groups: KeyGroupRange,
        rebuild: Callable[[SerializerSnapshot], TypeSerializer[Any]],
    ) -> None:
        d = block.meta
        ns = rebuild(d.namespace_serializer)
        self.meta = StateMetaInfo(d.name, d.kind, ns, rebuild(d.state_serializer), d.ttl)
        self._by_index: dict[int, list[tuple[Any, Any, int]]] = {}
        key, namespace = key_serializer.deserialize, ns.deserialize
        for kg, raw_key, raw_ns, timestamp in block.entries:
            try:
                timer = (key(raw_key), namespace(raw_ns), timestamp)
            except UNREADABLE as exc:
                raise CorruptCheckpointError(
                    f"timer queue {d.name!r}, key group {kg}: a checkpointed timer cannot be "
                    f"read ({type(exc).__name__}: {exc})"
                ) from None
            self._by_index.setdefault(kg - key_groups.start, []).append(timer)

    def entries(self, key_group_index: int) -> list[tuple[Any, Any, int]] | None:
        return self._by_index.get(key_group_index)


def _timer_entries(source: Any, key_group_index: int) -> list[tuple[Any, Any, Any]]:
    """The timers of one key group: RocksDB's timer sources track no changes, so they give
    plain entries (never encoded or delta sections)."""
    return list(source.entries(key_group_index) or ())
