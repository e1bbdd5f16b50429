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

Shared files are deleted only when no retained checkpoint references them: the runtimes list
every SST in ``_metadata`` and the checkpoint storage's retention keeps what retained checkpoints
list. :class:`UploadTracker` decides which uploaded files a backend's next checkpoint reuses.
"""

from __future__ import annotations

import posixpath
import struct
from collections.abc import Iterable
from typing import Any

import google_crc32c
import msgspec

from streamstate.errors import CorruptCheckpointError
from streamstate.format.meta import StateMetaSnapshot
from streamstate.format.names import SHARED_DIRECTORY, file_name, name_below
from streamstate.keygroups import UPPER_BOUND_MAX_PARALLELISM

__all__ = [
    "MANIFEST_KIND",
    "MANIFEST_MAGIC",
    "MANIFEST_VERSION",
    "SST_KIND",
    "IncrementalManifest",
    "IncrementalStateHandle",
    "PrivateFile",
    "SharedFile",
    "TimerBlock",
    "UploadTracker",
]

MANIFEST_KIND = "rocksdb-manifest"
"""Kind of a manifest in checkpoint metadata (the SST files it references follow it)."""
SST_KIND = "rocksdb-sst"
"""Kind of an SST file of a native snapshot in checkpoint metadata."""
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

    meta: StateMetaSnapshot
    entries: list[tuple[int, bytes, bytes, int]]


class IncrementalManifest(msgspec.Struct, kw_only=True):
    """Everything needed to rebuild one subtask's RocksDB instance."""

    checkpoint_id: int
    backend_uid: str
    key_serializer: dict[str, Any]
    max_parallelism: int
    key_group_range: tuple[int, int]
    #: the meta data of every state in the database
    states: list[StateMetaSnapshot]
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
            manifest = msgspec.msgpack.decode(body, type=cls)
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise CorruptCheckpointError(f"RocksDB manifest {path!r} is unreadable: {exc}") from exc
        manifest.check_names(path)
        manifest.check_ranges(path)
        return manifest

    def check_ranges(self, path: str) -> None:
        """Refuse a manifest whose key groups (its range, its timers') are not key groups of
        its ``max_parallelism``."""
        max_p = self.max_parallelism
        start, end = self.key_group_range
        if not 1 <= max_p <= UPPER_BOUND_MAX_PARALLELISM or not (
            start >= 0 and end < max_p and start <= end + 1
        ):
            raise CorruptCheckpointError(
                f"RocksDB manifest {path!r} is corrupt: key groups {start}-{end} of "
                f"max_parallelism {max_p}"
            )
        for block in self.timers:
            if any(not 0 <= kg < max_p for kg, _, _, _ in block.entries):
                raise CorruptCheckpointError(
                    f"RocksDB manifest {path!r} is corrupt: a timer of {block.meta.name!r} is in "
                    f"no key group of max_parallelism {max_p}"
                )

    def check_names(self, path: str) -> None:
        """Refuse (:class:`CorruptCheckpointError` naming the field) a file name that is not
        one plain part, or a shared path that is not a plain name below ``shared/``
        (``streamstate.format.names``): the names become files of a local directory and
        paths in checkpoint storage."""
        checkpoint = posixpath.dirname(path) or "."
        for i, f in enumerate(self.shared):
            file_name(f.name, checkpoint=checkpoint, file=path, field=f"shared[{i}].name")
            name_below(
                f.path,
                SHARED_DIRECTORY,
                checkpoint=checkpoint,
                file=path,
                field=f"shared[{i}].path",
            )
        for i, p in enumerate(self.private):
            file_name(p.name, checkpoint=checkpoint, file=path, field=f"private[{i}].name")


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
        return [(self.path, self.size, self.crc32c, MANIFEST_KIND)] + [
            (f.path, f.size, f.crc32c, SST_KIND) for f in self.shared
        ]


class UploadTracker:
    """Which uploaded SST files a RocksDB backend's next incremental checkpoint may reference.

    ``write_incremental`` offers each checkpoint's shared files with the location (the file
    store's) they were uploaded to (:meth:`offer`); they become reusable only once the runtime
    confirms that checkpoint (:meth:`complete`): files of a checkpoint that never completed may
    be deleted as orphans. An aborted checkpoint's offer is dropped (:meth:`abort`). Files are
    reused only by a checkpoint to the same location (:meth:`reusable`): checkpoints moved to
    another storage upload everything again.
    """

    #: uploads of unconfirmed checkpoints kept for a later confirmation
    MAX_PENDING = 16

    def __init__(self) -> None:
        #: local SST name -> shared file of the last *confirmed* checkpoint
        self.confirmed: dict[str, SharedFile] = {}
        #: where the confirmed files are (None: nowhere a checkpoint may reference them)
        self.location: str | None = None
        self._pending: dict[int, tuple[str | None, dict[str, SharedFile]]] = {}
        self._last_confirmed = -1

    def reusable(self, location: str | None) -> dict[str, SharedFile]:
        """The confirmed files a checkpoint to ``location`` may reference."""
        if location is None or location != self.location:
            return {}
        return dict(self.confirmed)

    def offer(self, checkpoint_id: int, shared: Iterable[SharedFile], location: str | None) -> None:
        """The shared files checkpoint ``checkpoint_id`` uploaded or referenced in
        ``location``."""
        pending = self._pending
        pending[checkpoint_id] = (location, {f.name: f for f in shared})
        for old in [c for c in pending if c < checkpoint_id - self.MAX_PENDING]:
            del pending[old]  # never confirmed (a runtime that does not notify)

    def complete(self, checkpoint_id: int) -> None:
        offered = self._pending.pop(checkpoint_id, None)
        if offered is not None:
            location, uploads = offered
            # checkpoint ids start over in another location
            if checkpoint_id > self._last_confirmed or location != self.location:
                self.confirmed = uploads
                self.location = location
                self._last_confirmed = checkpoint_id
        for cid in [c for c in self._pending if c < checkpoint_id]:
            del self._pending[cid]

    def abort(self, checkpoint_id: int) -> None:
        self._pending.pop(checkpoint_id, None)

    def forget(self) -> None:
        self.confirmed = {}
        self.location = None
        self._pending.clear()
        self._last_confirmed = -1

    def restored(self, shared: Iterable[SharedFile], location: str | None) -> None:
        """The files of the snapshot just restored natively, in ``location`` (None: a location
        no checkpoint may reference them from, ``RestoreMode.NO_CLAIM``)."""
        self.forget()
        self.confirmed = {f.name: f for f in shared}
        self.location = location
