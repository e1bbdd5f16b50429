"""The few checkpoint-storage operations an incremental RocksDB snapshot needs.

Paths are relative to a job's checkpoint directory (``<root>/<job-id>/``, SPEC §6.1): shared SST
files go to ``shared/``, the per-subtask manifest to
``chk-<id>/<operator>/<subtask>-<attempt>.state``.

:class:`SnapshotFileStore` is the minimal interface this backend writes against;
:class:`CheckpointStorageFileStore` implements it over the checkpoint package's
``CheckpointStorage`` (``open_write``, ``open_read``, ``put_atomic``, ``size``, ``delete``), for
any filesystem the storage reaches (a local path, ``memory://``, ``s3://``...).
"""

from __future__ import annotations

import shutil
from typing import Any, Protocol, runtime_checkable

import google_crc32c

from streamstate.format.names import create_exclusive

__all__ = [
    "CheckpointStorageFileStore",
    "SnapshotFileStore",
    "crc32c_of_file",
]

_CHUNK = 1 << 20


def crc32c_of_file(path: str) -> tuple[int, int]:
    """``(size, crc32c)`` of a local file."""
    crc = 0
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = google_crc32c.extend(crc, chunk)
            size += len(chunk)
    return size, crc


@runtime_checkable
class SnapshotFileStore(Protocol):
    """Atomic file operations on checkpoint storage (paths relative to the job directory)."""

    @property
    def location(self) -> str:
        """Where the files are (a URL): uploads are reused only within one location."""
        ...

    def put_file(self, local_path: str, path: str) -> None:
        """Upload a local file; ``path`` appears complete or not at all."""

    def put_bytes(self, data: bytes, path: str) -> None:
        """Write ``data``; ``path`` appears complete or not at all."""

    def get_file(self, path: str, local_path: str) -> None:
        """Download ``path`` to a new local file, created exclusively and never through a link
        (``FileExistsError`` if anything is at ``local_path``)."""

    def get_bytes(self, path: str) -> bytes: ...

    def exists(self, path: str) -> bool: ...

    def delete(self, path: str) -> None:
        """Delete ``path`` (no error if it is already gone)."""


class CheckpointStorageFileStore:
    """A :class:`SnapshotFileStore` over ``streamstate.checkpoint.storage.CheckpointStorage``.

    Paths are relative to the storage's job directory, or to ``prefix`` below it. Uploads stream
    through ``open_write`` (which removes a partial file on failure); small files use
    ``put_atomic``.
    """

    def __init__(self, storage: Any, prefix: str = "") -> None:
        self.storage = storage
        self.prefix = "" if prefix in ("", ".") else prefix.strip("/")

    def _path(self, path: str) -> str:
        return f"{self.prefix}/{path}" if self.prefix else path

    @property
    def location(self) -> str:
        return str(self.storage.url_of(self.prefix))

    def put_file(self, local_path: str, path: str) -> None:
        with open(local_path, "rb") as src, self.storage.open_write(self._path(path)) as dst:
            shutil.copyfileobj(src, dst, _CHUNK)

    def put_bytes(self, data: bytes, path: str) -> None:
        self.storage.put_atomic(self._path(path), data)

    def get_file(self, path: str, local_path: str) -> None:
        with self.storage.open_read(self._path(path)) as src, create_exclusive(local_path) as dst:
            shutil.copyfileobj(src, dst, _CHUNK)

    def get_bytes(self, path: str) -> bytes:
        with self.storage.open_read(self._path(path)) as f:
            return bytes(f.read())

    def exists(self, path: str) -> bool:
        return self.storage.size(self._path(path)) is not None

    def delete(self, path: str) -> None:
        self.storage.delete(self._path(path))

    def __repr__(self) -> str:
        suffix = f", prefix={self.prefix!r}" if self.prefix else ""
        return f"CheckpointStorageFileStore({self.storage!r}{suffix})"
