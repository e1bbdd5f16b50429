"""Writing a subtask's snapshots: asynchronously, fully or incrementally (SPEC §5.4, §6.3).

A :class:`SubtaskCheckpointer` lives next to one operator subtask (on a Spark executor, in the
state host). :meth:`SubtaskCheckpointer.checkpoint` runs the synchronous phase on the calling
(processing) thread — function hooks, operator state copy, the keyed backend's snapshot — and
returns a future of the :class:`~streamstate.checkpoint.metadata.SubtaskStateHandle` that an
:class:`AsyncSnapshotWriter` thread produces while processing continues. The handle is plain
data for the driver's :class:`~streamstate.checkpoint.coordinator.CheckpointCoordinator`.

The writer thread yields the GIL between key-group blocks and between 16k-value chunks of large
blocks (``time.sleep(0)``), so the processing thread is never locked out for longer than one
chunk's C call (about a millisecond).

A RocksDB keyed backend (with ``RocksDBStateBackend.incremental``, the default) checkpoints in
its native format: the writer uploads the SST files that no confirmed earlier checkpoint
uploaded, then a manifest, and the handle lists both (``native.py``).

Incremental mode (heap backend with ``incremental=True``): the first checkpoint writes a full
snapshot into ``shared/``; each later one writes only a delta (the entries changed since the
previous checkpoint, captured in the synchronous phase), and its handle lists the chain
``[full, delta, delta, ...]``. When the chain gets long (:class:`IncrementalPolicy`), a new full
snapshot is taken in the same synchronous phase and written by a second background thread; the
checkpoints after it completes reference ``[new full, later deltas]``. Any failed write makes the
next checkpoint start a new chain with a full snapshot; a failed write never touches files
of a committed checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import posixpath
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from streamstate.backends.base import KeyedStateBackend
from streamstate.backends.operator import OperatorStateBackend, OperatorStateSnapshot
from streamstate.checkpoint.metadata import StateFileHandle, SubtaskStateHandle
from streamstate.checkpoint.operator_format import write_operator_state
from streamstate.checkpoint.storage import CheckpointStorage
from streamstate.errors import CheckpointError
from streamstate.format.keyed_file import write_keyed_snapshot
from streamstate.format.snapshot import FULL_SNAPSHOT, KeyedStateSnapshot
from streamstate.keygroups import KeyGroupRange

__all__ = [
    "AsyncSnapshotWriter",
    "IncrementalPolicy",
    "SnapshotTarget",
    "SubtaskCheckpointer",
    "write_keyed_file",
    "write_operator_file",
    "yield_gil",
]

log = logging.getLogger(__name__)


_YIELD_EVERY = 0.002
_last_yield = [0.0]


def yield_gil() -> None:
    """Give the GIL to any thread waiting for it (the processing thread), at most every 2 ms.

    ``time.sleep(0)`` releases the GIL at once; a waiting thread takes it. Between yields, work
    is made of Python code (interruptible at CPython's 5 ms switch interval) and C calls on at
    most one 16k-value chunk.
    """
    now = time.perf_counter()
    if now - _last_yield[0] >= _YIELD_EVERY:
        _last_yield[0] = now
        time.sleep(0)


class AsyncSnapshotWriter:
    """One background thread that runs write tasks in submission order."""

    def __init__(self, name: str = "streamstate-writer") -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future[Any]:
        return self._pool.submit(fn, *args, **kwargs)

    def close(self, wait: bool = True) -> None:
        self._pool.shutdown(wait=wait)


class SnapshotTarget(Protocol):
    """What a checkpointer needs of a subtask (``KeyedProcessOperator`` provides it)."""

    operator_name: str
    subtask_index: int
    parallelism: int
    max_parallelism: int
    key_group_range: KeyGroupRange
    keyed_backend: KeyedStateBackend
    operator_backend: OperatorStateBackend

    def prepare_snapshot(self, checkpoint_id: int) -> None: ...


def write_keyed_file(
    storage: CheckpointStorage,
    path: str,
    handle_path: str,
    snapshot: KeyedStateSnapshot,
    checkpoint_id: int,
    *,
    compression: str = "lz4",
    pause: Callable[[], None] | None = None,
) -> StateFileHandle:
    """Write a keyed snapshot to ``path`` (relative to the storage root) and release it.

    ``handle_path`` is the path recorded in the handle (relative to the checkpoint directory);
    ``pause`` runs between blocks and chunks (default :func:`yield_gil`).
    """
    try:
        with storage.open_write(path) as f:
            summary = write_keyed_snapshot(
                snapshot,
                f,
                path=storage.url_of(path),
                compression=compression,
                pause=pause or yield_gil,
            )
    finally:
        snapshot.release()
    r = summary.key_group_range
    return StateFileHandle(
        path=handle_path,
        size=summary.size,
        checksum=summary.checksum,
        kind=summary.kind,
        checkpoint_id=checkpoint_id,
        key_group_range=(r.start, r.end),
        entries=sorted(summary.entries.items()),
        states=summary.state_names,
    )


def write_operator_file(
    storage: CheckpointStorage,
    path: str,
    handle_path: str,
    snapshot: OperatorStateSnapshot,
    checkpoint_id: int,
) -> StateFileHandle | None:
    """Write a subtask's operator state (None when it has none)."""
    if snapshot.is_empty():
        return None
    with storage.open_write(path) as f:
        summary = write_operator_state(snapshot, f, path=storage.url_of(path))
    return StateFileHandle(
        path=handle_path,
        size=summary.size,
        checksum=summary.checksum,
        kind="operator",
        checkpoint_id=checkpoint_id,
        entries=[],
        states=sorted(summary.counts),
    )


@dataclasses.dataclass
class IncrementalPolicy:
    """When an incremental chain gets a new full snapshot (materialized in the background)."""

    #: deltas after the full snapshot that trigger a new one
    max_deltas: int = 16
    #: ... or when the deltas' bytes exceed this fraction of the full snapshot's
    max_delta_ratio: float = 0.5

    def should_materialize(self, base_size: int | None, delta_sizes: list[int]) -> bool:
        if len(delta_sizes) >= self.max_deltas:
            return True
        return base_size is not None and sum(delta_sizes) > self.max_delta_ratio * base_size


class _Link:
    """One file of an incremental chain: the checkpoint that wrote it and its pending handle."""

    __slots__ = ("checkpoint_id", "future", "kind")

    def __init__(self, checkpoint_id: int, future: Future[Any], kind: str) -> None:
        self.checkpoint_id = checkpoint_id
        self.future = future
        self.kind = kind

    def handle(self) -> StateFileHandle:
        result = self.future.result()
        return result.keyed[-1] if isinstance(result, SubtaskStateHandle) else result

    def size(self) -> int | None:
        if not self.future.done() or self.future.exception() is not None:
            return None
        return self.handle().size


def _done(value: Any) -> Future[Any]:
    f: Future[Any] = Future()
    f.set_result(value)
    return f


class SubtaskCheckpointer:
    """Takes and writes the snapshots of one subtask (see the module docstring).

    Parameters:
        storage: where files go.
        target: the subtask (a ``KeyedProcessOperator``).
        attempt: the attempt number of this run of the subtask (names its files).
        compression: block codec of keyed files ("none", "lz4", "zstd").
        incremental: write deltas (needs a heap backend with ``incremental=True``); True for
            the default :class:`IncrementalPolicy` or a policy.
        writer: a shared writer thread (one is created if None).
        unique_names: a random token in the names of a checkpoint's own files (Spark: attempt
            numbers of two drivers can collide).
    """

    def __init__(
        self,
        storage: CheckpointStorage,
        target: SnapshotTarget,
        *,
        attempt: int = 0,
        compression: str = "lz4",
        incremental: bool | IncrementalPolicy = False,
        writer: AsyncSnapshotWriter | None = None,
        unique_names: bool = False,
    ) -> None:
        self.storage = storage
        self.target = target
        self.attempt = attempt
        self.unique_names = unique_names
        self.compression = compression
        #: a RocksDB backend checkpoints natively: new SST files only, plus a manifest
        self.native = target.keyed_backend.native_incremental
        if incremental is True:
            incremental = IncrementalPolicy()
        self.policy: IncrementalPolicy | None = None if self.native else (incremental or None)
        if self.policy is not None and not target.keyed_backend.incremental:
            raise CheckpointError(
                f"incremental checkpoints of {target.operator_name!r} need a keyed backend with "
                "change tracking (HeapStateBackend(incremental=True))"
            )
        self._own_writer = writer is None
        self.writer = writer or AsyncSnapshotWriter()
        self._materializer: AsyncSnapshotWriter | None = None
        self._chain: list[_Link] | None = None
        self._materializing: tuple[_Link, str] | None = None
        self._broken = False

    # ---- public --------------------------------------------------------------------------------

    def checkpoint(self, checkpoint_id: int) -> Future[SubtaskStateHandle]:
        """Synchronous phase now; the returned future completes when the files are written."""
        t = self.target
        t.prepare_snapshot(checkpoint_id)
        operator_snapshot = t.operator_backend.snapshot()
        directory = self.storage.checkpoint_directory(checkpoint_id)
        backend = t.keyed_backend
        # with unique_names a checkpoint's own files get a random token: two drivers racing on
        # one directory (the older one is fenced before it commits) never write the same name
        token = uuid.uuid4().hex[:8] if self.unique_names else ""
        if self.native:
            keyed = backend.snapshot(checkpoint_id)
            handle_path = self.storage.subtask_file(
                t.operator_name, t.subtask_index, self.attempt, token=token
            )
            return self.writer.submit(
                self._write_native,
                checkpoint_id,
                directory,
                keyed,
                handle_path,
                operator_snapshot,
                token,
            )
        if self.policy is None:
            keyed = backend.snapshot(checkpoint_id)
            handle_path = self.storage.subtask_file(
                t.operator_name, t.subtask_index, self.attempt, token=token
            )
            return self.writer.submit(
                self._write,
                checkpoint_id,
                directory,
                keyed,
                handle_path,
                [],
                operator_snapshot,
                [],
                token,
            )
        self._collect_materialized()
        if self._chain is None or self._broken:
            self._broken = False
            keyed = backend.snapshot(checkpoint_id)
            backend.reset_change_tracking()
            kind, before = FULL_SNAPSHOT, []
        else:
            keyed = backend.snapshot_delta(checkpoint_id)
            kind, before = "delta", list(self._chain)
        handle_path = self.storage.shared_file(
            t.operator_name, t.subtask_index, self.attempt, checkpoint_id, kind
        )
        materialize = (
            kind == "delta" and self._materializing is None and self._should_materialize(before)
        )
        if materialize:
            self._start_materialization(checkpoint_id, backend.snapshot(checkpoint_id))
        pending = [self._materializing[1]] if self._materializing is not None else []
        future = self.writer.submit(
            self._write,
            checkpoint_id,
            directory,
            keyed,
            handle_path,
            before,
            operator_snapshot,
            pending,
            token,
        )
        self._chain = [*before, _Link(checkpoint_id, future, kind)]
        future.add_done_callback(self._on_done)
        return future

    def savepoint(self, directory: str, savepoint_id: int) -> Future[SubtaskStateHandle]:
        """A self-contained full snapshot into ``directory`` (relative to the storage root)."""
        t = self.target
        t.prepare_snapshot(savepoint_id)
        operator_snapshot = t.operator_backend.snapshot()
        keyed = t.keyed_backend.snapshot(savepoint_id)
        handle_path = self.storage.subtask_file(t.operator_name, t.subtask_index, self.attempt)
        return self.writer.submit(
            self._write, savepoint_id, directory, keyed, handle_path, [], operator_snapshot, []
        )

    def resume(self, handle: SubtaskStateHandle) -> bool:
        """Continue the incremental chain of a restored checkpoint (same subtask and range):
        the next checkpoint writes a delta on top of it instead of a full snapshot."""
        t = self.target
        if (
            self.policy is None
            or not handle.keyed
            or handle.keyed[0].kind != FULL_SNAPSHOT
            or handle.operator != t.operator_name
            or handle.subtask_index != t.subtask_index
            or handle.parallelism != t.parallelism
            or handle.max_parallelism != t.max_parallelism
            or tuple(handle.key_group_range) != t.key_group_range.to_tuple()
            or not all(f.path.startswith("../shared/") for f in handle.keyed)
        ):
            return False
        self._chain = [_Link(f.checkpoint_id, _done(f), f.kind) for f in handle.keyed]
        t.keyed_backend.reset_change_tracking()
        return True

    def close(self) -> None:
        """Wait for every write and stop the threads."""
        if self._own_writer:
            self.writer.close()
        if self._materializer is not None:
            self._materializer.close()

    # ---- internals -----------------------------------------------------------------------------

    def _on_done(self, future: Future[Any]) -> None:
        if future.exception() is not None:
            self._broken = True

    def _should_materialize(self, chain: list[_Link]) -> bool:
        assert self.policy is not None
        if not chain:
            return False
        base = chain[0].size()
        deltas = [s for link in chain[1:] if (s := link.size()) is not None]
        if len(chain) - 1 >= self.policy.max_deltas:
            return True
        return self.policy.should_materialize(base, deltas)

    def _start_materialization(self, checkpoint_id: int, keyed: KeyedStateSnapshot) -> None:
        t = self.target
        if self._materializer is None:
            self._materializer = AsyncSnapshotWriter("streamstate-materializer")
        handle_path = self.storage.shared_file(
            t.operator_name, t.subtask_index, self.attempt, checkpoint_id, FULL_SNAPSHOT
        )
        directory = self.storage.checkpoint_directory(checkpoint_id)
        future = self._materializer.submit(
            write_keyed_file,
            self.storage,
            self._resolve(directory, handle_path),
            handle_path,
            keyed,
            checkpoint_id,
            compression=self.compression,
        )
        self._materializing = (_Link(checkpoint_id, future, FULL_SNAPSHOT), handle_path)

    def _collect_materialized(self) -> None:
        if self._materializing is None:
            return
        link, _ = self._materializing
        if not link.future.done():
            return
        self._materializing = None
        if link.future.exception() is not None:
            log.warning(
                "background full snapshot of %s subtask %d for checkpoint %d failed: %s",
                self.target.operator_name,
                self.target.subtask_index,
                link.checkpoint_id,
                link.future.exception(),
            )
            return
        if self._chain is not None and not self._broken:
            self._chain = [link, *(x for x in self._chain if x.checkpoint_id > link.checkpoint_id)]

    @staticmethod
    def _resolve(directory: str, handle_path: str) -> str:
        return posixpath.normpath(posixpath.join(directory, handle_path))

    def _write(
        self,
        checkpoint_id: int,
        directory: str,
        keyed: KeyedStateSnapshot,
        handle_path: str,
        before: list[_Link],
        operator_snapshot: OperatorStateSnapshot,
        pending: list[str],
        token: str = "",
    ) -> SubtaskStateHandle:
        written: list[str] = []
        try:
            path = self._resolve(directory, handle_path)
            keyed_handle = write_keyed_file(
                self.storage, path, handle_path, keyed, checkpoint_id, compression=self.compression
            )
            written.append(path)
            chain = [link.handle() for link in before] + [keyed_handle]
            op_handle = self._write_operator_state(
                checkpoint_id, directory, operator_snapshot, token
            )
        except BaseException:
            keyed.release()
            for p in written:
                with contextlib.suppress(Exception):
                    self.storage.delete(p)
            raise
        return self._subtask_handle(checkpoint_id, chain, op_handle, pending)

    def _write_native(
        self,
        checkpoint_id: int,
        directory: str,
        keyed: Any,
        handle_path: str,
        operator_snapshot: OperatorStateSnapshot,
        token: str = "",
    ) -> SubtaskStateHandle:
        """Upload a RocksDB snapshot's new SST files and its manifest (``native.py``)."""
        from streamstate.checkpoint.native import job_file_store, native_file_handles

        path = self._resolve(directory, handle_path)
        store = job_file_store(self.storage, directory)
        manifest = posixpath.relpath(path, store.prefix or ".")
        try:
            states = keyed.state_names
            incremental = keyed.write_incremental(store, manifest, shared_dir="shared")
        except BaseException:
            keyed.release()
            raise
        try:
            op_handle = self._write_operator_state(
                checkpoint_id, directory, operator_snapshot, token
            )
        except BaseException:
            with contextlib.suppress(Exception):
                self.storage.delete(path)
            raise
        chain = native_file_handles(incremental, directory, states)
        return self._subtask_handle(checkpoint_id, chain, op_handle, [])

    def _write_operator_state(
        self,
        checkpoint_id: int,
        directory: str,
        snapshot: OperatorStateSnapshot,
        token: str = "",
    ) -> StateFileHandle | None:
        t = self.target
        op_path = self.storage.subtask_file(
            t.operator_name, t.subtask_index, self.attempt, "opstate", token=token
        )
        return write_operator_file(
            self.storage, self._resolve(directory, op_path), op_path, snapshot, checkpoint_id
        )

    def _subtask_handle(
        self,
        checkpoint_id: int,
        keyed: list[StateFileHandle],
        operator_state: StateFileHandle | None,
        pending: list[str],
    ) -> SubtaskStateHandle:
        t = self.target
        r = t.key_group_range
        return SubtaskStateHandle(
            operator=t.operator_name,
            subtask_index=t.subtask_index,
            parallelism=t.parallelism,
            max_parallelism=t.max_parallelism,
            key_group_range=(r.start, r.end),
            attempt=self.attempt,
            checkpoint_id=checkpoint_id,
            key_serializer=t.keyed_backend.key_serializer.snapshot(),
            keyed=keyed,
            operator_state=operator_state,
            pending=pending,
        )
