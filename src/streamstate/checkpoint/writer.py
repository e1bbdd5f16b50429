"""Writing a subtask's snapshots: asynchronously, through its backend's strategy (SPEC §5.4).

A :class:`SubtaskCheckpointer` lives next to one operator subtask (on a Spark executor, in the
state host). :meth:`SubtaskCheckpointer.checkpoint` runs the synchronous phase on the calling
(processing) thread — function hooks, operator state copy, the keyed backend's snapshot
strategy — and returns a future of the :class:`~streamstate.checkpoint.metadata.
SubtaskStateHandle` that an :class:`~streamstate.backends.snapshot_strategy.AsyncSnapshotWriter`
thread produces while processing continues. The handle is plain data for the driver's
:class:`~streamstate.checkpoint.coordinator.CheckpointCoordinator`.

How the keyed state is written is the backend's business (``KeyedStateBackend.
snapshot_strategy``: a canonical file, an incremental chain of deltas, a snapshot in the
backend's own format); this module gives the strategy a :class:`StorageStreams` (where this
checkpoint's own and shared files go, named by the checkpoint storage's layout) and records the
files it reports. The writer
thread yields the GIL between key-group blocks and between 16k-value chunks of large blocks, so
the processing thread is never locked out for longer than one chunk's C call.
"""

from __future__ import annotations

import contextlib
import posixpath
import uuid
from concurrent.futures import Future
from typing import IO, Protocol

from streamstate.backends.base import KeyedStateBackend
from streamstate.backends.operator import OperatorStateBackend, OperatorStateSnapshot
from streamstate.backends.snapshot_strategy import (
    AsyncSnapshotWriter,
    IncrementalPolicy,
    SnapshotOptions,
    SnapshotWrite,
)
from streamstate.checkpoint.metadata import StateFileHandle, SubtaskStateHandle
from streamstate.checkpoint.operator_format import write_operator_state
from streamstate.checkpoint.storage import CheckpointStorage
from streamstate.errors import CheckpointError
from streamstate.format.handles import CANONICAL_KINDS, KeyedStateHandle
from streamstate.keygroups import KeyGroupRange

__all__ = [
    "AsyncSnapshotWriter",
    "IncrementalPolicy",
    "SnapshotTarget",
    "StorageStreams",
    "SubtaskCheckpointer",
    "write_operator_file",
]


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


class StorageStreams:
    """Where one checkpoint (or savepoint) of one subtask writes (``CheckpointStreams`` of the
    backends' snapshot strategies): paths relative to the checkpoint's ``directory``, named by
    the storage's layout (``CheckpointStorage.subtask_file`` / ``shared_file``)."""

    def __init__(
        self,
        storage: CheckpointStorage,
        directory: str,
        checkpoint_id: int,
        operator: str,
        subtask: int,
        attempt: int,
        token: str = "",
    ) -> None:
        self.storage = storage
        self.directory = directory
        self.checkpoint_id = checkpoint_id
        self.operator = operator
        self.subtask = subtask
        self.attempt = attempt
        self.token = token

    def exclusive_path(self, suffix: str = "state") -> str:
        return self.storage.subtask_file(
            self.operator, self.subtask, self.attempt, suffix, token=self.token
        )

    def shared_path(self, kind: str) -> str:
        return self.storage.shared_file(
            self.operator, self.subtask, self.attempt, self.checkpoint_id, kind
        )

    def _resolve(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.directory, path))

    def open_write(self, path: str) -> contextlib.AbstractContextManager[IO[bytes]]:
        return self.storage.open_write(self._resolve(path))

    def url_of(self, path: str) -> str:
        return self.storage.url_of(self._resolve(path))

    def delete(self, path: str) -> None:
        self.storage.delete(self._resolve(path))


def write_operator_file(
    streams: StorageStreams, snapshot: OperatorStateSnapshot
) -> StateFileHandle | None:
    """Write a subtask's operator state (None when it has none)."""
    if snapshot.is_empty():
        return None
    path = streams.exclusive_path("opstate")
    with streams.open_write(path) as f:
        summary = write_operator_state(snapshot, f, path=streams.url_of(path))
    return StateFileHandle(
        path=path,
        size=summary.size,
        checksum=summary.checksum,
        kind="operator",
        checkpoint_id=streams.checkpoint_id,
        entries=[],
        states=sorted(summary.counts),
    )


class SubtaskCheckpointer:
    """Takes and writes the snapshots of one subtask (see the module docstring).

    Parameters:
        storage: where files go.
        target: the subtask (a ``KeyedProcessOperator``).
        attempt: the attempt number of this run of the subtask (names its files).
        compression: block codec of canonical keyed files ("none", "lz4", "zstd").
        incremental: write deltas (needs a backend with change tracking); True for the default
            :class:`IncrementalPolicy` or a policy.
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
        if incremental is True:
            incremental = IncrementalPolicy()
        options = SnapshotOptions(compression, incremental or None)
        try:
            self.strategy = target.keyed_backend.snapshot_strategy(options)
        except CheckpointError as exc:
            raise CheckpointError(f"operator {target.operator_name!r}: {exc}") from None
        self._own_writer = writer is None
        self.writer = writer or AsyncSnapshotWriter()

    # ---- public --------------------------------------------------------------------------------

    def checkpoint(self, checkpoint_id: int) -> Future[SubtaskStateHandle]:
        """Synchronous phase now; the returned future completes when the files are written."""
        t = self.target
        t.prepare_snapshot(checkpoint_id)
        operator_snapshot = t.operator_backend.snapshot()
        # with unique_names a checkpoint's own files get a random token: two drivers racing on
        # one directory (the older one is fenced before it commits) never write the same name
        token = uuid.uuid4().hex[:8] if self.unique_names else ""
        streams = self._streams(self.storage.checkpoint_directory(checkpoint_id), checkpoint_id)
        streams.token = token
        write = self.strategy.snapshot(checkpoint_id, streams)
        counts = self._counts()
        return self.writer.submit(self._write, write, streams, operator_snapshot, counts)

    def savepoint(self, directory: str, savepoint_id: int) -> Future[SubtaskStateHandle]:
        """A self-contained full snapshot into ``directory`` (relative to the storage root)."""
        t = self.target
        t.prepare_snapshot(savepoint_id)
        operator_snapshot = t.operator_backend.snapshot()
        streams = self._streams(directory, savepoint_id)
        write = self.strategy.savepoint(savepoint_id, streams)
        counts = self._counts()
        return self.writer.submit(self._write, write, streams, operator_snapshot, counts)

    def resume(self, handle: SubtaskStateHandle) -> bool:
        """Continue from a restored checkpoint of this same subtask and key-group range: the
        backend's strategy may build on its files (the next checkpoint of an incremental chain
        writes a delta instead of a full snapshot)."""
        t = self.target
        if (
            not handle.keyed
            or handle.keyed[0].kind not in CANONICAL_KINDS
            or handle.operator != t.operator_name
            or handle.subtask_index != t.subtask_index
            or handle.parallelism != t.parallelism
            or handle.max_parallelism != t.max_parallelism
            or tuple(handle.key_group_range) != t.key_group_range.to_tuple()
        ):
            return False
        return self.strategy.resume(list(handle.keyed))

    def close(self) -> None:
        """Wait for every write and stop the threads."""
        if self._own_writer:
            self.writer.close()
        self.strategy.close()

    # ---- internals -----------------------------------------------------------------------------

    def _streams(self, directory: str, checkpoint_id: int) -> StorageStreams:
        t = self.target
        return StorageStreams(
            self.storage, directory, checkpoint_id, t.operator_name, t.subtask_index, self.attempt
        )

    def _counts(self) -> tuple[dict[str, int], int]:
        """The entries of every state and the timers, as the synchronous phase left them."""
        backend = self.target.keyed_backend
        return backend.state_entries(), backend.timer_queues.num_timers()

    def _write(
        self,
        write: SnapshotWrite,
        streams: StorageStreams,
        operator_snapshot: OperatorStateSnapshot,
        counts: tuple[dict[str, int], int],
    ) -> SubtaskStateHandle:
        keyed: KeyedStateHandle | None = None
        try:
            keyed = write.run()
            op_handle = write_operator_file(streams, operator_snapshot)
        except BaseException:
            write.abort()
            for path in keyed.created if keyed is not None else ():
                with contextlib.suppress(Exception):
                    streams.delete(path)
            raise
        return self._subtask_handle(streams.checkpoint_id, keyed, op_handle, counts)

    def _subtask_handle(
        self,
        checkpoint_id: int,
        keyed: KeyedStateHandle,
        operator_state: StateFileHandle | None,
        counts: tuple[dict[str, int], int],
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
            keyed=keyed.files,
            operator_state=operator_state,
            pending=keyed.pending,
            entries=counts[0],
            timers=counts[1],
        )
