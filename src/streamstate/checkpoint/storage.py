"""Checkpoint storage: where a job's checkpoints live and how they are kept (SPEC §6.1).

::

    <root>/<job-id>/chk-<id>/<operator>/<subtask>-<attempt>.state     keyed snapshot (full)
    <root>/<job-id>/chk-<id>/<operator>/<subtask>-<attempt>.opstate   operator state
                                          (Spark: <subtask>-<attempt>-<token>.state/.opstate)
    <root>/<job-id>/chk-<id>/_metadata                                 written last, once
    <root>/<job-id>/_epochs/epoch-<n>                                  the drivers' epochs
    <root>/<job-id>/shared/<operator>/...                              incremental chains, SSTs
    <root>/<job-id>/savepoints/sp-<id>/...                             self-contained savepoints

A checkpoint is complete iff its ``_metadata`` exists and every file it lists exists with the
listed size (and, when checked deeply, the listed CRC32C). ``_metadata`` is written once and
never replaced: it is created only if absent (a temporary file hard-linked into place locally, a
conditional put with ``If-None-Match: *`` on S3), so a committed checkpoint cannot be
overwritten by another run.

Fencing (SPEC §6.1): a driver takes an *epoch* when it starts (:meth:`CheckpointStorage.
acquire_epoch` creates ``_epochs/epoch-<n+1>`` if absent); it checks right before each commit
and before each retention pass that no newer epoch exists, and stops with
:class:`~streamstate.errors.CheckpointFencedError` (naming both runs) if one does.

:class:`CheckpointStorage` implements the layout, listing, completeness and retention on top of
a handful of file operations; :class:`FileSystemCheckpointStorage` provides them through fsspec
for any URL it understands (local path, ``file://``, ``memory://``, ``s3://``, ``hdfs://``, ...)
and :class:`MemoryCheckpointStorage` is a private in-memory instance for tests.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import os
import posixpath
import re
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import IO, Any

from streamstate.checkpoint.local_files import LocalTree
from streamstate.checkpoint.metadata import (
    CheckpointMetadata,
    decode_metadata,
    encode_metadata,
)
from streamstate.errors import (
    CheckpointError,
    CheckpointFencedError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
)
from streamstate.format.codec import crc32c_extend
from streamstate.format.names import handle_path, plain_name

__all__ = [
    "DEFAULT_RETAINED_CHECKPOINTS",
    "EPOCHS_DIR",
    "METADATA_FILE",
    "CheckpointStorage",
    "CompletedCheckpoint",
    "Epoch",
    "FileSystemCheckpointStorage",
    "MemoryCheckpointStorage",
    "checkpoint_storage_from",
    "open_location",
    "resolve_checkpoint",
    "shared_file_checkpoint_id",
]

log = logging.getLogger(__name__)

METADATA_FILE = "_metadata"
DEFAULT_RETAINED_CHECKPOINTS = 3
EPOCHS_DIR = "_epochs"
_CHK = re.compile(r"^chk-(\d+)$")
_EPOCH = re.compile(r"^epoch-(\d+)$")
_SP = re.compile(r"^sp-(\d+)$")
#: shared files (incremental chains' ".full.state"/".delta.state", backends' own files), named
#: "<subtask>-<attempt>-<checkpoint id>-<token>.<kind>"
_SHARED = re.compile(r"^\d+-\d+-(\d+)-[0-9a-f]+\.[a-z][a-z.]*$")
_OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss", "r2"})


def shared_file_checkpoint_id(path: str) -> int | None:
    """The id of the checkpoint that wrote a shared file (from its name), or None if the name is
    not one of a shared file.

    >>> shared_file_checkpoint_id("shared/op/0-1-7-0a1b2c3d.delta.state")
    7
    """
    m = _SHARED.match(posixpath.basename(path))
    return None if m is None else int(m.group(1))


class CompletedCheckpoint:
    """A checkpoint or savepoint whose ``_metadata`` was found: its storage, directory (relative
    to the storage root) and metadata."""

    __slots__ = ("directory", "metadata", "storage")

    def __init__(
        self, storage: CheckpointStorage, directory: str, metadata: CheckpointMetadata
    ) -> None:
        self.storage = storage
        self.directory = directory
        self.metadata = metadata

    @property
    def checkpoint_id(self) -> int:
        return self.metadata.checkpoint_id

    @property
    def is_savepoint(self) -> bool:
        return self.metadata.kind == "savepoint"

    def resolve(self, path: str) -> str:
        """A handle's path relative to the storage root; a path that is not a file of this
        checkpoint (``streamstate.format.names.handle_path``) is refused."""
        handle_path(
            path,
            shared=not self.is_savepoint,
            checkpoint=self.url,
            file=METADATA_FILE,
            field="a file path",
        )
        return posixpath.normpath(posixpath.join(self.directory, path))

    @property
    def url(self) -> str:
        return self.storage.url_of(self.directory)

    def __repr__(self) -> str:
        return f"CompletedCheckpoint({self.url!r}, id={self.checkpoint_id})"


@dataclasses.dataclass(frozen=True)
class Epoch:
    """The epoch a run holds in a job's checkpoint storage, and who it is (for messages)."""

    number: int
    #: a uuid of the run, plus what it says about itself (host, pid, started, ...)
    run: str
    owner: dict[str, Any] = dataclasses.field(default_factory=dict)

    def describe(self) -> str:
        extra = ", ".join(f"{k}={v}" for k, v in sorted(self.owner.items()) if k != "run")
        return f"run {self.run} (epoch {self.number}{', ' + extra if extra else ''})"


def _owner_defaults() -> dict[str, Any]:
    import socket

    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


class CheckpointStorage(ABC):
    """Layout, listing, completeness and retention of one job's checkpoints.

    Subclasses implement the file operations on paths relative to the job directory.
    """

    #: complete checkpoints kept by :meth:`apply_retention`
    retained_checkpoints: int = DEFAULT_RETAINED_CHECKPOINTS
    #: the job's name, recorded in checkpoint metadata ("" when the storage has none)
    job_id: str = ""

    # ---- file operations (relative paths, "/" separated) -----------------------------------------

    @abstractmethod
    def url_of(self, path: str) -> str:
        """The full URL of a relative path (for messages)."""

    @abstractmethod
    def open_write(self, path: str) -> contextlib.AbstractContextManager[IO[bytes]]:
        """A new file for writing (parents created); raises CheckpointError if not writable."""

    @abstractmethod
    def open_read(self, path: str) -> IO[bytes]:
        """A seekable file for reading; raises CheckpointError naming the path if missing."""

    @abstractmethod
    def put_atomic(self, path: str, data: bytes) -> None:
        """Write ``data`` so that readers see the whole file or none of it."""

    def put_if_absent(self, path: str, data: bytes) -> bool:
        """Create ``path`` with ``data`` unless it exists; False (nothing written) if it does.
        Readers see the whole file or none of it.

        This default checks, then writes (a storage without an exclusive create); subclasses
        that have one override it."""
        if self.size(path) is not None:
            return False
        self.put_atomic(path, data)
        return True

    @abstractmethod
    def size(self, path: str) -> int | None:
        """Size of a file, or None if it does not exist."""

    @abstractmethod
    def list_dir(self, path: str) -> list[tuple[str, bool]]:
        """``(name, is_directory)`` of the entries of a directory ([] if missing)."""

    @abstractmethod
    def delete(self, path: str) -> None:
        """Delete a file or a directory tree (missing is fine)."""

    def read_bytes(self, path: str) -> bytes:
        with self.open_read(path) as f:
            return f.read()

    def walk_files(self, path: str) -> Iterator[str]:
        """Relative paths of every file below ``path``."""
        for name, is_dir in self.list_dir(path):
            child = f"{path}/{name}" if path else name
            if is_dir:
                yield from self.walk_files(child)
            else:
                yield child

    def ensure_writable(self) -> None:
        """Create the job directory and check that files can be written there."""
        probe = f".probe-{uuid.uuid4().hex[:8]}"
        with self.open_write(probe) as f:
            f.write(b"ok")
        self.delete(probe)

    # ---- layout --------------------------------------------------------------------------------

    @staticmethod
    def checkpoint_directory(checkpoint_id: int) -> str:
        return f"chk-{checkpoint_id}"

    @staticmethod
    def savepoint_directory(savepoint_id: int) -> str:
        return f"savepoints/sp-{savepoint_id}"

    @staticmethod
    def subtask_file(
        operator: str, subtask: int, attempt: int, suffix: str = "state", *, token: str = ""
    ) -> str:
        """Path of a subtask's file relative to its checkpoint directory (``token``: a random
        part that keeps the names of concurrent writers apart)."""
        return f"{operator}/{subtask}-{attempt}{'-' + token if token else ''}.{suffix}"

    @staticmethod
    def shared_file(
        operator: str, subtask: int, attempt: int, checkpoint_id: int, kind: str
    ) -> str:
        """Path of a new shared (incremental) file relative to a checkpoint directory."""
        token = uuid.uuid4().hex[:8]
        return f"../shared/{operator}/{subtask}-{attempt}-{checkpoint_id}-{token}.{kind}.state"

    # ---- checkpoints ---------------------------------------------------------------------------

    def checkpoint_ids(self) -> list[int]:
        """Ids of every ``chk-<id>`` directory, complete or not, ascending."""
        return sorted(
            int(m.group(1))
            for name, is_dir in self.list_dir("")
            if is_dir and (m := _CHK.match(name))
        )

    def savepoint_ids(self) -> list[int]:
        return sorted(
            int(m.group(1))
            for name, is_dir in self.list_dir("savepoints")
            if is_dir and (m := _SP.match(name))
        )

    def next_checkpoint_id(self) -> int:
        ids = self.checkpoint_ids()
        return ids[-1] + 1 if ids else 1

    def next_savepoint_id(self) -> int:
        ids = self.savepoint_ids()
        return ids[-1] + 1 if ids else 1

    def write_metadata(self, directory: str, metadata: CheckpointMetadata) -> CompletedCheckpoint:
        """Commit: create ``directory/_metadata`` (the last write of a checkpoint).

        A committed checkpoint is never replaced: if ``_metadata`` exists already (another run
        committed this id), nothing is written and :class:`CheckpointFencedError` names both
        runs, unless the existing file is byte for byte this commit (a retried write)."""
        path = f"{directory}/{METADATA_FILE}"
        data = encode_metadata(metadata)
        if self.put_if_absent(path, data):
            return CompletedCheckpoint(self, directory, metadata)
        try:
            existing = self.read_bytes(path)
        except CheckpointError:
            existing = b""
        if existing == data:
            return CompletedCheckpoint(self, directory, metadata)
        theirs = "another run"
        try:
            other = decode_metadata(existing, self.url_of(path))
            theirs = _describe_commit(other)
        except CheckpointError:
            theirs = "another run (its _metadata is unreadable)"
        raise CheckpointFencedError(
            f"{metadata.kind} {self.url_of(directory)} is already committed by {theirs}; this "
            f"commit by {_describe_commit(metadata)} was not written (two drivers share the "
            "checkpoint directory?)"
        )

    # ---- epochs (fencing concurrent drivers) ---------------------------------------------------

    def epoch_numbers(self) -> list[int]:
        """The epochs taken so far, ascending."""
        return sorted(
            int(m.group(1))
            for name, is_dir in self.list_dir(EPOCHS_DIR)
            if not is_dir and (m := _EPOCH.match(name))
        )

    def read_epoch(self, number: int) -> Epoch:
        path = f"{EPOCHS_DIR}/epoch-{number}"
        try:
            owner = json.loads(self.read_bytes(path))
        except (CheckpointError, ValueError):
            owner = {"run": "?"}
        return Epoch(number, str(owner.get("run", "?")), owner)

    def current_epoch(self) -> Epoch | None:
        numbers = self.epoch_numbers()
        return self.read_epoch(numbers[-1]) if numbers else None

    def acquire_epoch(self, **owner: Any) -> Epoch:
        """Take over the job: create ``_epochs/epoch-<n+1>`` (n: the newest epoch) if absent.
        Every run with an older epoch is fenced from then on (:meth:`check_epoch`)."""
        run = uuid.uuid4().hex
        info = {"run": run, **_owner_defaults(), **owner}
        data = json.dumps(info, sort_keys=True, default=str).encode()
        for _ in range(100):
            numbers = self.epoch_numbers()
            number = (numbers[-1] if numbers else 0) + 1
            if self.put_if_absent(f"{EPOCHS_DIR}/epoch-{number}", data):
                return Epoch(number, run, info)
        raise CheckpointError(f"could not take an epoch in {self.url_of(EPOCHS_DIR)}")

    def check_epoch(self, epoch: Epoch, action: str = "commit") -> None:
        """Raise :class:`CheckpointFencedError` if a newer epoch than ``epoch`` exists."""
        numbers = self.epoch_numbers()
        if numbers and numbers[-1] > epoch.number:
            newer = self.read_epoch(numbers[-1])
            raise CheckpointFencedError(
                f"{epoch.describe()} was fenced off {self.url}: {newer.describe()} took over "
                f"the job; this run does not {action} (stop it; the newer run continues)"
            )

    def read_metadata(self, directory: str) -> CheckpointMetadata | None:
        """The metadata of a directory, or None when ``_metadata`` does not exist."""
        path = f"{directory}/{METADATA_FILE}"
        if self.size(path) is None:
            return None
        return decode_metadata(self.read_bytes(path), self.url_of(path))

    def problems(self, checkpoint: CompletedCheckpoint, *, deep: bool = False) -> list[str]:
        """What makes a checkpoint incomplete ([] if complete). ``deep`` also checks CRC32C
        of every file (reads everything)."""
        out = []
        for handle in checkpoint.metadata.files():
            path = checkpoint.resolve(handle.path)
            try:
                size = self.size(path)
            except CorruptCheckpointError as exc:  # a link in the checkpoint
                out.append(str(exc))
                continue
            if size is None:
                out.append(f"missing file {self.url_of(path)}")
            elif size != handle.size:
                out.append(
                    f"file {self.url_of(path)} has {size} bytes, the metadata says {handle.size}"
                )
            elif deep and self.file_checksum(path) != handle.checksum:
                out.append(f"checksum mismatch in {self.url_of(path)}")
        return out

    def file_checksum(self, path: str) -> int:
        crc = 0
        with self.open_read(path) as f:
            while chunk := f.read(8 << 20):
                crc = crc32c_extend(crc, chunk)
        return crc

    def complete_checkpoints(self, *, deep: bool = False) -> list[CompletedCheckpoint]:
        """Every complete checkpoint, oldest first."""
        out = []
        for cid in self.checkpoint_ids():
            cp = self._try_load(self.checkpoint_directory(cid))
            if cp is not None and not self.problems(cp, deep=deep):
                out.append(cp)
        return out

    def _try_load(self, directory: str) -> CompletedCheckpoint | None:
        try:
            metadata = self.read_metadata(directory)
        except (CorruptCheckpointError, CheckpointError) as exc:
            log.warning("ignoring %s: %s", self.url_of(directory), exc)
            return None
        return None if metadata is None else CompletedCheckpoint(self, directory, metadata)

    def latest_checkpoint(self, *, deep: bool = False) -> CompletedCheckpoint:
        """The latest complete checkpoint; CheckpointNotFoundError if there is none."""
        for cid in reversed(self.checkpoint_ids()):
            cp = self._try_load(self.checkpoint_directory(cid))
            if cp is None:
                continue
            problems = self.problems(cp, deep=deep)
            if not problems:
                return cp
            log.warning("checkpoint %s is incomplete: %s", cp.url, "; ".join(problems))
        raise CheckpointNotFoundError(f"nothing to restore: no complete checkpoint in {self.url}")

    def load(self, ref: int | str | CompletedCheckpoint | None = None) -> CompletedCheckpoint:
        """A checkpoint by id, by directory (``"chk-3"``, ``"savepoints/sp-1"``), or the latest
        complete one (None). Raises a clear error if it is missing or incomplete."""
        if isinstance(ref, CompletedCheckpoint):
            return ref
        if ref is None:
            return self.latest_checkpoint()
        if isinstance(ref, int):
            directory = self.checkpoint_directory(ref)
        else:
            directory = plain_name(
                ref.strip("/"), checkpoint=self.url, file="a reference", field="directory"
            )
        metadata = self.read_metadata(directory)
        if metadata is None:
            raise CheckpointNotFoundError(
                f"{self.url_of(directory)} has no {METADATA_FILE}: it is not a complete "
                "checkpoint (its write failed or is still in progress)"
            )
        cp = CompletedCheckpoint(self, directory, metadata)
        problems = self.problems(cp)
        if problems:
            raise CheckpointNotFoundError(
                f"checkpoint {cp.url} is incomplete: {'; '.join(problems)}"
            )
        return cp

    # ---- retention -----------------------------------------------------------------------------

    def apply_retention(self, retained: int | None = None, epoch: Epoch | None = None) -> list[str]:
        """Keep the last ``retained`` complete checkpoints; delete older ones, failed attempts
        older than the latest complete one, unlisted files in kept checkpoints, and shared files
        no kept checkpoint needs. Returns what was deleted (relative paths).

        With ``epoch``, a run that a newer epoch fenced deletes nothing
        (:class:`CheckpointFencedError`)."""
        retained = self.retained_checkpoints if retained is None else retained
        if retained < 1:
            raise ValueError(f"at least one checkpoint must be retained, got {retained}")
        if epoch is not None:
            self.check_epoch(epoch, "apply retention")
        ids = self.checkpoint_ids()
        loaded = {cid: self._try_load(self.checkpoint_directory(cid)) for cid in ids}
        complete = [cid for cid in ids if loaded[cid] and not self.problems(loaded[cid])]  # type: ignore[arg-type]
        if not complete:
            return []
        latest = complete[-1]
        keep = set(complete[-retained:])
        deleted: list[str] = []
        for cid in ids:
            directory = self.checkpoint_directory(cid)
            if cid in keep:
                deleted += self._delete_unlisted(loaded[cid])  # type: ignore[arg-type]
            elif cid < latest:
                self.delete(directory)
                deleted.append(directory)
        referenced: set[str] = set()
        for cid in keep:
            cp = loaded[cid]
            assert cp is not None
            referenced.update(cp.resolve(f.path) for f in cp.metadata.files())
            referenced.update(cp.resolve(p) for p in cp.metadata.pending_files())
        for path in self.walk_files("shared"):
            writer = shared_file_checkpoint_id(path)
            if writer is None or path in referenced or writer > latest:
                continue  # unknown, needed, or written for a checkpoint still in progress
            self.delete(path)
            deleted.append(path)
        return deleted

    def _delete_unlisted(self, cp: CompletedCheckpoint) -> list[str]:
        listed = {cp.resolve(f.path) for f in cp.metadata.files()}
        listed.add(f"{cp.directory}/{METADATA_FILE}")
        out = []
        for path in self.walk_files(cp.directory):
            if path not in listed:
                self.delete(path)
                out.append(path)
        return out

    @property
    def url(self) -> str:
        return self.url_of("")


class FileSystemCheckpointStorage(CheckpointStorage):
    """Checkpoints under ``<url>/<job_id>`` on any filesystem fsspec understands.

    Parameters:
        url: a local path or URL (``file://``, ``memory://``, ``s3://bucket/x``, ``hdfs://``...).
        job_id: the job's directory name below ``url`` ("" to use ``url`` itself).
        retained_checkpoints: complete checkpoints kept by retention (default 3).
        durable: fsync local files before the metadata that names them is written.
        storage_options: passed to fsspec (credentials, endpoints, ...).
    """

    def __init__(
        self,
        url: str,
        job_id: str = "job",
        *,
        retained_checkpoints: int = DEFAULT_RETAINED_CHECKPOINTS,
        durable: bool = True,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        if "/" in job_id or "\\" in job_id or job_id in (".", ".."):
            raise ValueError(f"job_id {job_id!r} must be a plain directory name")
        self.base_url = url
        self.job_id = job_id
        self.retained_checkpoints = retained_checkpoints
        self.durable = durable
        self.storage_options = dict(storage_options or {})
        self._fs: Any = None
        self._root = ""
        self._connect()

    def _connect(self) -> None:
        import fsspec

        fs, root = fsspec.core.url_to_fs(self.base_url, **self.storage_options)
        self._fs = fs
        root = root.rstrip("/") or "/"
        self._root = posixpath.join(root, self.job_id) if self.job_id else root
        protocols = fs.protocol if isinstance(fs.protocol, tuple | list) else (fs.protocol,)
        self._object_store = bool(_OBJECT_STORES.intersection(protocols))
        # s3fs implements pipe_file(mode="create") as a conditional PUT (If-None-Match: *);
        # other filesystems may ignore the mode, so they get the generic check-then-write
        self._conditional_put = bool({"s3", "s3a"}.intersection(protocols))
        self._local = "file" in protocols or "local" in protocols
        self._memory = "memory" in protocols
        self._tree = LocalTree(self._root)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_fs"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._connect()

    @property
    def fs(self) -> Any:
        return self._fs

    def _abs(self, path: str) -> str:
        """The full path of ``path`` (relative to the job directory): never outside it, for
        whatever storage (a name a checkpoint gave was checked before, ``format/names.py``;
        this is the storage's own guard)."""
        if not path:
            return self._root
        if path.startswith("/") or ".." in path.split("/") or "\x00" in path:
            raise CorruptCheckpointError(
                f"{path!r} is outside the checkpoint storage {self.url_of('')}; refused"
            )
        return posixpath.join(self._root, path)

    def url_of(self, path: str) -> str:
        full = posixpath.join(self._root, path) if path else self._root
        if self._local:
            return full
        protocol = self._fs.protocol
        protocol = protocol[0] if isinstance(protocol, tuple | list) else protocol
        return f"{protocol}://{full.lstrip('/')}" if protocol != "memory" else f"memory://{full}"

    def _not_writable(self, path: str, exc: BaseException) -> CheckpointError:
        return CheckpointError(
            f"checkpoint directory {self.url_of(posixpath.dirname(path))} is not writable "
            f"({type(exc).__name__}: {exc})"
        )

    def _create(self, path: str, *, exclusive: bool = False) -> IO[bytes]:
        """A new file open for writing (parents created): 0600 (less if the umask says so) on a
        local disk, never through a link there (:class:`LocalTree`)."""
        if self._local:
            return self._tree.create(path, exclusive=exclusive)
        full = self._abs(path)
        self._fs.makedirs(posixpath.dirname(full), exist_ok=True)
        return self._fs.open(full, "wb")  # type: ignore[no-any-return]

    def _remove(self, path: str) -> None:
        if self._local:
            self._tree.delete(path)
        else:
            self._fs.rm(self._abs(path))

    @contextlib.contextmanager
    def open_write(self, path: str) -> Iterator[IO[bytes]]:
        self._abs(path)
        try:
            f = self._create(path)
        except (OSError, PermissionError) as exc:
            raise self._not_writable(path, exc) from exc
        try:
            yield f
            if self.durable and self._local:
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            with contextlib.suppress(Exception):
                f.close()
            with contextlib.suppress(Exception):
                self._remove(path)
            raise
        try:
            f.close()
        except OSError as exc:
            raise self._not_writable(path, exc) from exc

    def open_read(self, path: str) -> IO[bytes]:
        full = self._abs(path)
        try:
            if self._local:
                return self._tree.open_read(path)
            if self._memory:
                # fsspec's memory filesystem hands every reader the same file object (one
                # position): a retention thread reading beside a restore cut its reads short
                return io.BytesIO(self._fs.cat_file(full))
            return self._fs.open(full, "rb")  # type: ignore[no-any-return]
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint file {self.url_of(path)} is missing") from None

    def _write_temporary(self, path: str, data: bytes) -> str:
        """A complete temporary file next to ``path`` (local disk); returns its path."""
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with self._tree.create(tmp, exclusive=True) as f:
            f.write(data)
            if self.durable:
                f.flush()
                os.fsync(f.fileno())
        return tmp

    def put_atomic(self, path: str, data: bytes) -> None:
        full = self._abs(path)
        try:
            if self._local:
                tmp = self._write_temporary(path, data)
                try:
                    self._tree.replace(tmp, path)
                except BaseException:
                    self._tree.delete(tmp)
                    raise
                return
            self._fs.makedirs(posixpath.dirname(full), exist_ok=True)
            if self._object_store:
                self._fs.pipe_file(full, data)  # one PUT: visible whole or not at all
                return
            tmp = f"{full}.tmp-{uuid.uuid4().hex[:8]}"
            with self._fs.open(tmp, "wb") as f:
                f.write(data)
            self._fs.mv(tmp, full)
        except (OSError, PermissionError) as exc:
            raise self._not_writable(path, exc) from exc

    def put_if_absent(self, path: str, data: bytes) -> bool:
        full = self._abs(path)
        try:
            if self._local:
                # a complete temporary file hard-linked to its name: link() fails if the name
                # exists, so a file is created whole, once, whatever other processes do
                tmp = self._write_temporary(path, data)
                try:
                    return self._tree.link_if_absent(tmp, path)
                finally:
                    self._tree.delete(tmp)
            self._fs.makedirs(posixpath.dirname(full), exist_ok=True)
            if self._conditional_put:
                # one conditional PUT (If-None-Match: *): S3 and moto refuse it atomically when
                # the key exists; a server that ignores the header overwrites
                # (docs/checkpoints/storage.md)
                try:
                    self._fs.pipe_file(full, data, mode="create")
                except FileExistsError:
                    return False
                return True
            with _ABSENT_LOCK:
                # no exclusive create in fsspec's generic API (memory://, hdfs://, ...): check,
                # then write; the window between the two is documented (docs/checkpoints/storage.md)
                self._fresh(full)
                if self._fs.exists(full):
                    return False
                self._fs.pipe_file(full, data)
                return True
        except (OSError, PermissionError) as exc:
            raise self._not_writable(path, exc) from exc

    def _fresh(self, full: str) -> None:
        """Forget cached listings of ``full`` (s3fs caches them; another process may have
        written since)."""
        if not self._local:
            with contextlib.suppress(Exception):
                self._fs.invalidate_cache(full)

    def size(self, path: str) -> int | None:
        full = self._abs(path)
        if self._local:
            return self._tree.size(path)
        self._fresh(full)
        try:
            info = self._fs.info(full)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if info.get("type") == "directory":
            return None
        return int(info["size"])

    def list_dir(self, path: str) -> list[tuple[str, bool]]:
        full = self._abs(path)
        if self._local:
            return self._tree.list_dir(path)
        self._fresh(full)
        try:
            entries = self._fs.ls(full, detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return []
        base = full.rstrip("/")
        out = []
        for e in entries:
            name = posixpath.basename(str(e["name"]).rstrip("/"))
            if str(e["name"]).rstrip("/") == base:
                continue
            out.append((name, e.get("type") == "directory"))
        return out

    def delete(self, path: str) -> None:
        full = self._abs(path)
        if self._local:
            self._tree.delete(path)
            return
        with contextlib.suppress(FileNotFoundError):
            self._fs.rm(full, recursive=True)
        self._fresh(full)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


class MemoryCheckpointStorage(FileSystemCheckpointStorage):
    """A private in-memory storage (fsspec's memory filesystem under a unique root); for tests."""

    def __init__(
        self, job_id: str = "job", *, retained_checkpoints: int = DEFAULT_RETAINED_CHECKPOINTS
    ) -> None:
        super().__init__(
            f"memory://streamstate-{uuid.uuid4().hex}",
            job_id,
            retained_checkpoints=retained_checkpoints,
            durable=False,
        )


def checkpoint_storage_from(
    value: CheckpointStorage | str | os.PathLike[str] | None, job_id: str = "job"
) -> CheckpointStorage:
    """A storage from an instance, a URL/path, or None (a new in-memory storage)."""
    if value is None:
        return MemoryCheckpointStorage(job_id)
    if isinstance(value, CheckpointStorage):
        return value
    return FileSystemCheckpointStorage(os.fspath(value), job_id)


_RELATIVE_REF = re.compile(r"^(chk-\d+|savepoints/sp-\d+)/?$")


def open_location(
    url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
) -> tuple[CheckpointStorage, str | None]:
    """A storage and directory for a URL that names a checkpoint or savepoint directory (one
    holding ``_metadata``), or a job directory (directory None). ``storage_options`` go to
    fsspec."""
    url = os.fspath(url).rstrip("/")
    head, name = posixpath.split(url)
    if name and head:
        parent = FileSystemCheckpointStorage(
            head, "", durable=False, storage_options=storage_options
        )
        if parent.size(f"{name}/{METADATA_FILE}") is not None:
            return parent, name
    return (
        FileSystemCheckpointStorage(url, "", durable=False, storage_options=storage_options),
        None,
    )


def resolve_checkpoint(
    ref: CompletedCheckpoint | int | str | os.PathLike[str] | None, storage: CheckpointStorage
) -> CompletedCheckpoint:
    """A completed checkpoint from a reference: a :class:`CompletedCheckpoint`, None (the latest
    complete one in ``storage``), a checkpoint id, a directory relative to ``storage``
    (``"chk-3"``, ``"savepoints/sp-1"``), or the path/URL of a checkpoint or savepoint directory
    or of a job directory (its latest complete checkpoint)."""
    if isinstance(ref, CompletedCheckpoint):
        return ref
    if ref is None or isinstance(ref, int):
        return storage.load(ref)
    text = os.fspath(ref)
    if _RELATIVE_REF.match(text):
        return storage.load(text)
    other, directory = open_location(text)
    return other.load(directory)


def _describe_commit(metadata: CheckpointMetadata) -> str:
    props = metadata.properties
    parts = [f"lineage {props.get('lineage', '?')}"]
    if "run" in props:
        parts.insert(0, f"run {props['run']}")
    if "epoch" in props:
        parts.append(f"epoch {props['epoch']}")
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(metadata.timestamp / 1000))
    return f"{', '.join(parts)}, at {when}"


#: one check-then-write at a time in this process for filesystems without exclusive create
_ABSENT_LOCK = threading.Lock()


def now_ms() -> int:
    return time.time_ns() // 1_000_000
