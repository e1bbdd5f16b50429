"""RocksDB's native incremental snapshots inside streamstate checkpoints (SPEC §6.3, §10).

A RocksDB subtask's keyed state in a checkpoint is a *manifest* at the subtask's usual path
(``chk-<id>/<operator>/<subtask>-<attempt>.state``, kind ``"rocksdb-manifest"``) followed, in the
subtask's handle, by every SST file the manifest references (kind ``"rocksdb-sst"``, paths
``../shared/<operator>/...``). Because ``_metadata`` lists each SST, the checkpoint storage's
rules apply to them unchanged: a checkpoint is complete only if every SST exists with its size
(and CRC32C when checked deeply), and retention deletes a shared file only when no retained
checkpoint lists it.

Restoring: a RocksDB backend restores natively (download the base snapshot, ``delete_range``
outside its range, copy in the other snapshots' key groups). Every other reader (the heap
backend, ``read_state``, the CLI) gets a canonical view through :class:`NativeKeyedStateRestore`:
the snapshot's files are downloaded into a temporary directory, opened read-only and written as
a local canonical snapshot file, which is then read like any checkpoint file.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import tempfile
from typing import IO, TYPE_CHECKING

from streamstate.checkpoint.metadata import StateFileHandle, SubtaskStateHandle
from streamstate.checkpoint.restore import FileKeyedStateRestore
from streamstate.checkpoint.storage import shared_file_checkpoint_id
from streamstate.errors import CheckpointError, StateMigrationException
from streamstate.format.keyed_file import KeyedSnapshotReader, write_keyed_snapshot
from streamstate.format.meta import StateMetaSnapshot
from streamstate.keygroups import KeyGroupRange

if TYPE_CHECKING:
    from streamstate.backends.rocksdb import (
        CheckpointStorageFileStore,
        IncrementalManifest,
        IncrementalStateHandle,
    )
    from streamstate.checkpoint.storage import CheckpointStorage, CompletedCheckpoint

__all__ = [
    "MANIFEST_KIND",
    "SST_KIND",
    "NativeKeyedStateRestore",
    "is_native",
    "job_file_store",
    "native_file_handles",
]

MANIFEST_KIND = "rocksdb-manifest"
SST_KIND = "rocksdb-sst"


def is_native(subtask: SubtaskStateHandle) -> bool:
    """Whether a subtask's keyed state is a native RocksDB snapshot."""
    return bool(subtask.keyed) and subtask.keyed[0].kind == MANIFEST_KIND


def job_file_store(storage: CheckpointStorage, directory: str) -> CheckpointStorageFileStore:
    """The file store rooted at the job directory of the checkpoint directory ``directory``
    (where a manifest's ``shared/...`` paths point)."""
    from streamstate.backends.rocksdb import CheckpointStorageFileStore

    return CheckpointStorageFileStore(storage, posixpath.normpath(posixpath.join(directory, "..")))


def native_file_handles(
    handle: IncrementalStateHandle, directory: str, state_names: list[str]
) -> list[StateFileHandle]:
    """The checkpoint-metadata handles of an incremental snapshot written with paths relative to
    the job directory; ``directory`` is the checkpoint's directory (``chk-<id>``)."""
    job = posixpath.normpath(posixpath.join(directory, ".."))

    def relative(path: str) -> str:
        return posixpath.relpath(posixpath.normpath(posixpath.join(job, path)), directory)

    out = [
        StateFileHandle(
            path=relative(handle.path),
            size=handle.size,
            checksum=handle.crc32c,
            kind=MANIFEST_KIND,
            checkpoint_id=handle.checkpoint_id,
            key_group_range=handle.key_group_range,
            states=state_names,
        )
    ]
    for f in handle.shared:
        writer = shared_file_checkpoint_id(f.path)
        out.append(
            StateFileHandle(
                path=relative(f.path),
                size=f.size,
                checksum=f.crc32c,
                kind=SST_KIND,
                checkpoint_id=handle.checkpoint_id if writer is None else writer,
            )
        )
    return out


class NativeKeyedStateRestore(FileKeyedStateRestore):
    """A native RocksDB snapshot of a checkpoint, limited to a key-group range.

    A RocksDB backend takes :attr:`incremental_handle` and restores natively; any other backend
    reads it like a canonical snapshot file (converted locally on first use, see the module
    docstring). The temporary files go away on :meth:`close`.
    """

    def __init__(
        self, checkpoint: CompletedCheckpoint, handle: StateFileHandle, key_groups: KeyGroupRange
    ) -> None:
        super().__init__(checkpoint, handle, key_groups)
        self.store = job_file_store(checkpoint.storage, checkpoint.directory)
        #: convert only these states (and no timers); None: everything (a restore needs it all)
        self.only_states: set[str] | None = None
        self._manifest: IncrementalManifest | None = None
        self._tmp: str | None = None

    def native_snapshot(self) -> NativeKeyedStateRestore:
        return self

    @property
    def incremental_handle(self) -> IncrementalStateHandle:
        """The manifest's handle for a RocksDB backend's native restore
        (paths relative to :attr:`store`); size and CRC32C are checked on load."""
        from streamstate.backends.rocksdb import IncrementalStateHandle

        h = self.handle
        return IncrementalStateHandle(
            path=posixpath.relpath(self._path, self.store.prefix or "."),
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
            from streamstate.backends.rocksdb import load_manifest

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
        from streamstate.backends.rocksdb import download_snapshot, open_native_snapshot

        tmp = self._tmp = tempfile.mkdtemp(prefix="streamstate-native-")
        f: IO[bytes] | None = None
        try:
            manifest = self.manifest
            database = os.path.join(tmp, "db")
            download_snapshot(self.store, manifest, database, f"RocksDB snapshot {self.path}")
            try:
                snapshot = open_native_snapshot(manifest, database, self.only_states)
                canonical = os.path.join(tmp, "canonical.state")
                try:
                    with open(canonical, "wb") as out:
                        write_keyed_snapshot(
                            snapshot, out, path=canonical, compression="none", pause=_no_pause
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

    def close(self) -> None:
        super().close()
        self._remove_tmp()

    def _remove_tmp(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


def _no_pause() -> None:
    return None
