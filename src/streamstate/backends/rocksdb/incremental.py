"""Incremental RocksDB checkpoints: the manifest, its handle, and the shared-file registry.

An incremental snapshot of one subtask is

* the SST files of a native RocksDB checkpoint, uploaded to the job's ``shared/`` area **once**:
  a file that a confirmed earlier checkpoint uploaded is referenced again, not uploaded;
* a manifest at the subtask's path (``chk-<id>/<operator>/<subtask>-<attempt>.state``) listing
  every SST file (local name, shared path, size, CRC32C), carrying the small private files of the
  checkpoint (``MANIFEST-*``, ``CURRENT``, ``OPTIONS-*``) inline with their checksums, the states'
  meta data, and the subtask's timers (timers live on the heap, as with Flink's
  ``timer-service.factory=HEAP``).

Manifest bytes: ``"SSRI" | u16 version | u32 crc32c(body) | body`` where ``body`` is msgpack.

Shared files are deleted only when no retained checkpoint references them
(:class:`SharedStateRegistry`, reference counts per retained checkpoint, for programs driving the
backend directly; the runtimes list every SST in ``_metadata`` and the checkpoint storage's
retention keeps what retained checkpoints list).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any

import google_crc32c
import msgspec

from streamstate.backends.rocksdb.storage import SnapshotFileStore
from streamstate.errors import CorruptCheckpointError

__all__ = [
    "MANIFEST_MAGIC",
    "MANIFEST_VERSION",
    "IncrementalManifest",
    "IncrementalStateHandle",
    "PrivateFile",
    "SharedFile",
    "SharedStateRegistry",
    "TimerBlock",
]

MANIFEST_MAGIC = b"SSRI"
MANIFEST_VERSION = 1
_PREFIX = struct.Struct(">4sHI")


class SharedFile(msgspec.Struct, frozen=True, array_like=True):
    """One SST file in the shared area."""

    #: name in the RocksDB directory ("000042.sst")
    name: str
    #: path relative to the job directory ("shared/...")
    path: str
    size: int
    crc32c: int


class PrivateFile(msgspec.Struct, frozen=True, array_like=True):
    """A small non-SST file of a native checkpoint, stored inline in the manifest."""

    name: str
    size: int
    crc32c: int
    data: bytes


class TimerBlock(msgspec.Struct, array_like=True):
    """The timers of one timer queue: ``(key group, key bytes, namespace bytes, timestamp)``."""

    meta: dict[str, Any]
    entries: list[tuple[int, bytes, bytes, int]]


class IncrementalManifest(msgspec.Struct, kw_only=True):
    """Everything needed to rebuild one subtask's RocksDB instance."""

    checkpoint_id: int
    backend_uid: str
    key_serializer: dict[str, Any]
    max_parallelism: int
    key_group_range: tuple[int, int]
    #: StateMetaInfo.to_dict() of every state in the database
    states: list[dict[str, Any]]
    shared: list[SharedFile]
    private: list[PrivateFile]
    timers: list[TimerBlock] = []

    def encode(self) -> bytes:
        body = msgspec.msgpack.encode(self)
        return _PREFIX.pack(MANIFEST_MAGIC, MANIFEST_VERSION, google_crc32c.value(body)) + body

    @classmethod
    def decode(cls, data: bytes, path: str = "<manifest>") -> IncrementalManifest:
        if len(data) < _PREFIX.size:
            raise CorruptCheckpointError(f"RocksDB manifest {path!r} is truncated")
        magic, version, crc = _PREFIX.unpack_from(data)
        if magic != MANIFEST_MAGIC:
            raise CorruptCheckpointError(
                f"{path!r} is not a RocksDB incremental manifest (magic {magic!r})"
            )
        if version != MANIFEST_VERSION:
            raise CorruptCheckpointError(
                f"RocksDB manifest {path!r} has version {version}; this build reads "
                f"{MANIFEST_VERSION}"
            )
        body = data[_PREFIX.size :]
        if google_crc32c.value(body) != crc:
            raise CorruptCheckpointError(f"RocksDB manifest {path!r} fails its checksum")
        try:
            return msgspec.msgpack.decode(body, type=cls)
        except msgspec.DecodeError as exc:
            raise CorruptCheckpointError(f"RocksDB manifest {path!r} is unreadable: {exc}") from exc


class IncrementalStateHandle(msgspec.Struct, kw_only=True):
    """What the checkpoint metadata records about one subtask's incremental snapshot."""

    #: the manifest's path relative to the job directory
    path: str
    size: int
    crc32c: int
    checkpoint_id: int
    key_group_range: tuple[int, int]
    #: every shared SST file the snapshot references (uploaded now or earlier)
    shared: list[SharedFile]
    #: bytes written to storage by this checkpoint (new SST files + manifest)
    uploaded_bytes: int
    #: bytes of SST files referenced from earlier checkpoints
    reused_bytes: int
    kind: str = "rocksdb-incremental"

    @property
    def shared_paths(self) -> list[str]:
        return [f.path for f in self.shared]

    @property
    def full_size(self) -> int:
        """Bytes a restore downloads (every referenced file)."""
        return self.uploaded_bytes + self.reused_bytes

    def files(self) -> list[tuple[str, int, int, str]]:
        """``(path, size, crc32c, kind)`` of every file the snapshot needs: the manifest
        (``"rocksdb-manifest"``) and each SST (``"rocksdb-sst"``), for checkpoint metadata."""
        return [(self.path, self.size, self.crc32c, "rocksdb-manifest")] + [
            (f.path, f.size, f.crc32c, "rocksdb-sst") for f in self.shared
        ]


class SharedStateRegistry:
    """Reference counts of shared files over the retained checkpoints of a job.

    The checkpoint coordinator registers each completed checkpoint's handles and releases a
    checkpoint when retention drops it; a shared file is deleted when the last retained
    checkpoint referencing it is released.

    >>> class NoStore:
    ...     def delete(self, path): print("delete", path)
    >>> h = lambda cid, paths: IncrementalStateHandle(path=f"chk-{cid}", size=0, crc32c=0,
    ...     checkpoint_id=cid, key_group_range=(0, 1), uploaded_bytes=0, reused_bytes=0,
    ...     shared=[SharedFile(p.rsplit("/", 1)[-1], p, 1, 0) for p in paths])
    >>> r = SharedStateRegistry(NoStore())
    >>> r.register(1, [h(1, ["shared/a", "shared/b"])]); r.register(2, [h(2, ["shared/b"])])
    >>> r.release(1)
    delete shared/a
    ['shared/a']
    """

    def __init__(self, store: SnapshotFileStore) -> None:
        self.store = store
        self._by_checkpoint: dict[int, set[str]] = {}
        self._refs: dict[str, int] = {}

    def register(self, checkpoint_id: int, handles: Iterable[IncrementalStateHandle]) -> None:
        if checkpoint_id in self._by_checkpoint:
            raise ValueError(f"checkpoint {checkpoint_id} is already registered")
        paths = {p for h in handles for p in h.shared_paths}
        self._by_checkpoint[checkpoint_id] = paths
        for p in paths:
            self._refs[p] = self._refs.get(p, 0) + 1

    def release(self, checkpoint_id: int) -> list[str]:
        """Drop a checkpoint; delete and return the shared files nothing references any more."""
        paths = self._by_checkpoint.pop(checkpoint_id, set())
        deleted = []
        for p in sorted(paths):
            n = self._refs[p] - 1
            if n:
                self._refs[p] = n
            else:
                del self._refs[p]
                self.store.delete(p)
                deleted.append(p)
        return deleted

    def referenced(self) -> set[str]:
        return set(self._refs)

    def retained_checkpoints(self) -> list[int]:
        return sorted(self._by_checkpoint)
