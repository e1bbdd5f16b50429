"""The RocksDB backend's snapshot strategy: native incremental checkpoints (SPEC §6.3, §10).

A RocksDB subtask's keyed state in a checkpoint is a *manifest* at the subtask's own path
(``chk-<id>/<operator>/<subtask>-<attempt>.state``, kind :data:`MANIFEST_KIND`) followed, in the
subtask's handle, by every SST file the manifest references (kind :data:`SST_KIND`, paths
``../shared/<operator>/...``). Because ``_metadata`` lists each SST, the checkpoint storage's
rules apply to them unchanged: a checkpoint is complete only if every SST exists with its size
(and CRC32C when checked deeply), and retention deletes a shared file only when no retained
checkpoint lists it.

With ``RocksDBStateBackend(incremental=False)`` every checkpoint is a canonical full file.
"""

from __future__ import annotations

import contextlib
import posixpath
import re
from typing import Protocol

from streamstate.backends.rocksdb.incremental import (
    MANIFEST_KIND,
    SST_KIND,
    IncrementalStateHandle,
)
from streamstate.backends.rocksdb.instance import RocksDBConfig
from streamstate.backends.rocksdb.snapshot import RocksDBKeyedStateSnapshot
from streamstate.backends.rocksdb.storage import CheckpointStorageFileStore
from streamstate.backends.snapshot_strategy import (
    CheckpointStreams,
    FullSnapshotStrategy,
    SnapshotOptions,
    SnapshotStrategy,
    SnapshotWrite,
)
from streamstate.errors import CheckpointError
from streamstate.format.handles import KeyedStateHandle, StateFileHandle

__all__ = [
    "MANIFEST_KIND",
    "SST_KIND",
    "RocksDBSnapshotStrategy",
    "SnapshottingBackend",
    "job_file_store",
    "native_file_handles",
    "rocksdb_snapshot_strategy",
]


class SnapshottingBackend(Protocol):
    """What the strategy needs of the backend it snapshots (``RocksDBKeyedStateBackend``)."""

    config: RocksDBConfig

    def snapshot(self, checkpoint_id: int) -> RocksDBKeyedStateSnapshot: ...


#: shared files are named "<subtask>-<attempt>-<checkpoint id>-<token>.<kind>"
_SHARED = re.compile(r"^\d+-\d+-(\d+)-[0-9a-f]+\.[a-z][a-z.]*$")


def rocksdb_snapshot_strategy(
    backend: SnapshottingBackend, options: SnapshotOptions
) -> SnapshotStrategy:
    """Native incremental checkpoints (``RocksDBStateBackend.incremental``, the default), else a
    canonical full file per checkpoint; delta chains need change tracking, which RocksDB has
    not."""
    if backend.config.incremental:
        return RocksDBSnapshotStrategy(backend, options)
    if options.incremental is not None:
        raise CheckpointError(
            "incremental checkpoints need a keyed backend with change tracking "
            "(HeapStateBackend(incremental=True)); RocksDB checkpoints incrementally with "
            "RocksDBStateBackend(incremental=True)"
        )
    return FullSnapshotStrategy(backend.snapshot, options)


def job_file_store(storage: object, directory: str) -> CheckpointStorageFileStore:
    """The file store rooted at the job directory of the checkpoint directory ``directory``
    (where a manifest's ``shared/...`` paths point)."""
    return CheckpointStorageFileStore(storage, posixpath.normpath(posixpath.join(directory, "..")))


def _writer_checkpoint_id(path: str) -> int | None:
    m = _SHARED.match(posixpath.basename(path))
    return None if m is None else int(m.group(1))


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
        writer = _writer_checkpoint_id(f.path)
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


class _NativeWrite(SnapshotWrite):
    """Uploads a snapshot's new SST files and its manifest."""

    def __init__(self, streams: CheckpointStreams, snapshot: RocksDBKeyedStateSnapshot) -> None:
        self.streams = streams
        self.snapshot = snapshot
        self.path = streams.exclusive_path()

    def run(self) -> KeyedStateHandle:
        streams = self.streams
        store = job_file_store(streams.storage, streams.directory)
        full = posixpath.normpath(posixpath.join(streams.directory, self.path))
        manifest = posixpath.relpath(full, store.prefix or ".")
        try:
            states = self.snapshot.state_names
            incremental = self.snapshot.write_incremental(store, manifest, shared_dir="shared")
        except BaseException:
            self.snapshot.release()
            with contextlib.suppress(Exception):
                streams.delete(self.path)
            raise
        files = native_file_handles(incremental, streams.directory, states)
        return KeyedStateHandle(files, created=[self.path])

    def abort(self) -> None:
        self.snapshot.release()


class RocksDBSnapshotStrategy(SnapshotStrategy):
    """Native incremental checkpoints of one RocksDB backend; canonical savepoints."""

    def __init__(self, backend: SnapshottingBackend, options: SnapshotOptions) -> None:
        self.backend = backend
        self.full = FullSnapshotStrategy(backend.snapshot, options)

    def snapshot(self, checkpoint_id: int, streams: CheckpointStreams) -> SnapshotWrite:
        return _NativeWrite(streams, self.backend.snapshot(checkpoint_id))

    def savepoint(self, checkpoint_id: int, streams: CheckpointStreams) -> SnapshotWrite:
        return self.full.savepoint(checkpoint_id, streams)
