"""How a keyed backend's checkpoints are written: its snapshot strategy (SPEC §5.4, §6.3).

As in Flink, the backend owns the strategy (``KeyedStateBackend.snapshot_strategy``): the
heap backend writes a canonical file per checkpoint or an incremental chain of deltas
(``heap/snapshot_strategy.py``), RocksDB uploads its native incremental snapshots
(``rocksdb/snapshot_strategy.py``), any other backend gets :class:`FullSnapshotStrategy`.
Checkpoint storage gives the strategy a :class:`CheckpointStreams` (Flink's
``CheckpointStreamFactory``: where this checkpoint's own and shared files go, and their names)
and stores, names and retains the files of the :class:`~streamstate.format.handles.
KeyedStateHandle` it gets back, without knowing which backend wrote them.

A snapshot has two phases: :meth:`SnapshotStrategy.snapshot` runs the synchronous phase on the
processing thread and returns a :class:`SnapshotWrite`, whose :meth:`~SnapshotWrite.run` is the
asynchronous phase, run by an :class:`AsyncSnapshotWriter` thread while processing continues.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO, Any, Protocol

from streamstate.format.handles import KeyedStateHandle, StateFileHandle
from streamstate.format.keyed_file import write_keyed_snapshot
from streamstate.format.snapshot import KeyedStateSnapshot

__all__ = [
    "AsyncSnapshotWriter",
    "CheckpointStreams",
    "FullSnapshotStrategy",
    "IncrementalPolicy",
    "SnapshotOptions",
    "SnapshotStrategy",
    "SnapshotWrite",
    "write_canonical_file",
    "yield_gil",
]

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


class CheckpointStreams(Protocol):
    """Where one checkpoint of one subtask writes its files (checkpoint storage provides it).

    Paths are relative to the checkpoint's directory: ``exclusive_path`` names a file only this
    checkpoint lists, ``shared_path`` a file in the job's shared area that later checkpoints may
    list again (``../shared/...``).
    """

    @property
    def checkpoint_id(self) -> int: ...

    @property
    def storage(self) -> Any:
        """The checkpoint storage (``streamstate.checkpoint.storage.CheckpointStorage``)."""
        ...

    @property
    def directory(self) -> str:
        """The checkpoint's directory relative to the storage root."""
        ...

    def exclusive_path(self, suffix: str = "state") -> str: ...

    def shared_path(self, kind: str) -> str: ...

    def open_write(self, path: str) -> contextlib.AbstractContextManager[IO[bytes]]: ...

    def url_of(self, path: str) -> str: ...

    def delete(self, path: str) -> None: ...


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


@dataclasses.dataclass(frozen=True)
class SnapshotOptions:
    """How the runtime asks checkpoints to be written (the backend's strategy decides how)."""

    #: block codec of canonical files ("none", "lz4", "zstd")
    compression: str = "lz4"
    #: write deltas between full snapshots (a backend with change tracking), or None
    incremental: IncrementalPolicy | None = None


class SnapshotWrite(ABC):
    """The asynchronous phase of one snapshot (returned by the synchronous phase)."""

    @abstractmethod
    def run(self) -> KeyedStateHandle:
        """Write the files (on the writer thread); on failure nothing it wrote is left behind."""

    def abort(self) -> None:  # noqa: B027 - optional
        """The checkpoint failed after (or instead of) :meth:`run`: the strategy must not build
        on it."""


class SnapshotStrategy(ABC):
    """Flink's ``SnapshotStrategy``: how one backend's checkpoints and savepoints are written."""

    @abstractmethod
    def snapshot(self, checkpoint_id: int, streams: CheckpointStreams) -> SnapshotWrite:
        """The synchronous phase of a checkpoint (processing thread)."""

    @abstractmethod
    def savepoint(self, checkpoint_id: int, streams: CheckpointStreams) -> SnapshotWrite:
        """The synchronous phase of a self-contained canonical full snapshot."""

    def resume(self, files: list[StateFileHandle]) -> bool:
        """Continue from the restored snapshot ``files`` of this same subtask (its key-group
        range unchanged): True if the next checkpoint builds on them."""
        return False

    def close(self) -> None:  # noqa: B027 - optional
        """Wait for background work and release it."""


def write_canonical_file(
    streams: CheckpointStreams,
    path: str,
    snapshot: KeyedStateSnapshot,
    *,
    compression: str = "lz4",
    pause: Callable[[], None] | None = None,
) -> StateFileHandle:
    """Write ``snapshot`` as a canonical keyed file at ``path`` (relative to the checkpoint
    directory) and release it; ``pause`` runs between blocks and chunks (default
    :func:`yield_gil`)."""
    try:
        with streams.open_write(path) as f:
            summary = write_keyed_snapshot(
                snapshot,
                f,
                path=streams.url_of(path),
                compression=compression,
                pause=pause or yield_gil,
            )
    finally:
        snapshot.release()
    r = summary.key_group_range
    return StateFileHandle(
        path=path,
        size=summary.size,
        checksum=summary.checksum,
        kind=summary.kind,
        checkpoint_id=snapshot.checkpoint_id,
        key_group_range=(r.start, r.end),
        entries=sorted(summary.entries.items()),
        states=summary.state_names,
    )


class _CanonicalWrite(SnapshotWrite):
    """Writes one canonical full file at a checkpoint's own path."""

    def __init__(
        self, streams: CheckpointStreams, snapshot: KeyedStateSnapshot, compression: str
    ) -> None:
        self.streams = streams
        self.snapshot = snapshot
        self.compression = compression
        self.path = streams.exclusive_path()

    def run(self) -> KeyedStateHandle:
        handle = write_canonical_file(
            self.streams, self.path, self.snapshot, compression=self.compression
        )
        return KeyedStateHandle([handle], created=[self.path])

    def abort(self) -> None:
        self.snapshot.release()


class FullSnapshotStrategy(SnapshotStrategy):
    """A canonical full file per checkpoint (the default of every backend).

    ``take_snapshot(checkpoint_id)`` is the backend's synchronous phase
    (``KeyedStateBackend.snapshot``).
    """

    def __init__(
        self, take_snapshot: Callable[[int], KeyedStateSnapshot], options: SnapshotOptions
    ) -> None:
        self.take_snapshot = take_snapshot
        self.compression = options.compression

    def snapshot(self, checkpoint_id: int, streams: CheckpointStreams) -> SnapshotWrite:
        return _CanonicalWrite(streams, self.take_snapshot(checkpoint_id), self.compression)

    def savepoint(self, checkpoint_id: int, streams: CheckpointStreams) -> SnapshotWrite:
        return _CanonicalWrite(streams, self.take_snapshot(checkpoint_id), self.compression)
