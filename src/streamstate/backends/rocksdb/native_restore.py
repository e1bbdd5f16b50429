"""A native RocksDB snapshot of a checkpoint as a restore file (SPEC §7, §10).

A RocksDB backend restores it natively (download the base snapshot, ``delete_range`` outside its
range, copy in the other snapshots' key groups: ``restore.py``). Every other reader (the heap
backend, ``read_state``, the CLI) reads its canonical view: the snapshot's files are downloaded
into a temporary directory, opened read-only and written as a local canonical snapshot file,
which is then read like any checkpoint file.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import tempfile
from collections.abc import Callable
from typing import IO, Any

import msgspec

from streamstate.backends.rocksdb.incremental import IncrementalManifest, IncrementalStateHandle
from streamstate.backends.rocksdb.restore import (
    NativeSnapshotFile,
    download_snapshot,
    load_manifest,
)
from streamstate.backends.rocksdb.snapshot import RocksDBKeyedStateSnapshot
from streamstate.backends.rocksdb.snapshot_strategy import job_file_store
from streamstate.backends.rocksdb.storage import CheckpointStorageFileStore
from streamstate.errors import CheckpointError, StateMigrationException
from streamstate.format.handles import StateFileHandle
from streamstate.format.keyed_file import KeyedSnapshotReader, write_keyed_snapshot
from streamstate.format.meta import StateMetaSnapshot
from streamstate.format.restore import FileKeyedStateRestore, SnapshotLocation
from streamstate.keygroups import KeyGroupRange
from streamstate.serializers.base import SerializerSnapshot, TypeSerializer

__all__ = ["NativeKeyedStateRestore", "open_native_snapshot"]


def open_native_snapshot(
    manifest: IncrementalManifest,
    directory: str,
    only_states: set[str] | None = None,
    serializers: Callable[[SerializerSnapshot], TypeSerializer[Any]] | None = None,
) -> RocksDBKeyedStateSnapshot:
    """The files of ``manifest``, downloaded into ``directory`` (:func:`download_snapshot`),
    opened as a canonical snapshot (``release()`` it when done). ``only_states``: keep only
    these states and timer queues (None: everything); ``serializers``: how serializers are
    rebuilt from the manifest's snapshots (None: the program's)."""
    if only_states is not None:
        manifest = msgspec.structs.replace(
            manifest,
            states=[m for m in manifest.states if m.name in only_states],
            timers=[t for t in manifest.timers if t.meta.name in only_states],
        )
    return RocksDBKeyedStateSnapshot.of_manifest(manifest, directory, serializers=serializers)


class NativeKeyedStateRestore(FileKeyedStateRestore, NativeSnapshotFile):
    """A native RocksDB snapshot of a checkpoint, limited to a key-group range.

    A RocksDB backend takes :attr:`incremental_handle` and restores natively; any other backend
    reads it like a canonical snapshot file (converted locally on first use, see the module
    docstring). The temporary files go away on :meth:`close`.
    """

    def __init__(
        self, location: SnapshotLocation, handle: StateFileHandle, key_groups: KeyGroupRange
    ) -> None:
        super().__init__(location, handle, key_groups)
        self._store = job_file_store(location.storage, location.directory)
        self._manifest: IncrementalManifest | None = None
        self._tmp: str | None = None

    @property
    def store(self) -> CheckpointStorageFileStore:
        """The job directory's file store (where the manifest's ``shared/...`` paths point)."""
        return self._store

    @property
    def incremental_handle(self) -> IncrementalStateHandle:
        """The manifest's handle for a RocksDB backend's native restore
        (paths relative to :attr:`store`); size and CRC32C are checked on load."""
        h = self.handle
        return IncrementalStateHandle(
            path=posixpath.relpath(self._path, self._store.prefix or "."),
            size=h.size,
            crc32c=h.checksum,
            checkpoint_id=h.checkpoint_id,
            key_group_range=h.key_group_range or (0, -1),
            shared=[],
            uploaded_bytes=0,
            reused_bytes=0,
        )

    @property
    def manifest(self) -> IncrementalManifest:
        if self._manifest is None:
            self._manifest = load_manifest(self.store, self.incremental_handle)
        return self._manifest

    @property
    def states(self) -> list[StateMetaSnapshot]:  # type: ignore[override]
        if self._reader is not None:
            return self._reader.states
        m = self.manifest
        return [*m.states, *(block.meta for block in m.timers)]

    def _open(self) -> KeyedSnapshotReader:
        if self._reader is not None:
            return self._reader
        tmp = self._tmp = tempfile.mkdtemp(prefix="streamstate-native-")
        f: IO[bytes] | None = None
        try:
            manifest = self.manifest
            database = os.path.join(tmp, "db")
            download_snapshot(self.store, manifest, database, f"RocksDB snapshot {self.path}")
            try:
                snapshot = open_native_snapshot(
                    manifest, database, self.only_states, self.serializers
                )
                canonical = os.path.join(tmp, "canonical.state")
                try:
                    with open(canonical, "wb") as out:
                        write_keyed_snapshot(
                            snapshot,
                            out,
                            path=canonical,
                            compression="none",
                            pause=_no_pause,
                            key_groups=self._key_groups_read(snapshot.key_group_range),
                        )
                finally:
                    snapshot.release()
            except (CheckpointError, StateMigrationException) as exc:
                raise type(exc)(
                    f"{self.path} is a native RocksDB snapshot and could not be converted to the "
                    f"canonical format outside the RocksDB backend: {exc}. Restore it with "
                    "state_backend='rocksdb'; a savepoint taken there is canonical and can be "
                    "restored or read anywhere"
                ) from exc
            f = open(canonical, "rb")  # noqa: SIM115 - closed by close()
            size = os.fstat(f.fileno()).st_size
            self._reader = KeyedSnapshotReader(f, self.path, size)
            self._file = f
        except BaseException:
            if f is not None:
                f.close()
            self._remove_tmp()
            raise
        return self._reader

    def _key_groups_read(self, snapshot_range: KeyGroupRange) -> list[int]:
        """The key groups the canonical view holds: those of the restore (and of
        ``only_key_groups``) in the snapshot's range."""
        wanted = snapshot_range.intersection(self.key_groups)
        only = self.only_key_groups
        return [kg for kg in wanted if only is None or kg in only]

    def close(self) -> None:
        super().close()
        self._remove_tmp()

    def _remove_tmp(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


def _no_pause() -> None:
    return None
