"""The heap backend's snapshot strategy: a canonical full file per checkpoint, or an incremental
chain of deltas (SPEC §6.3; Flink's ``HeapSnapshotStrategy`` and changelog materialization).

Incremental mode (``HeapStateBackend(incremental=True)`` and an
:class:`~streamstate.backends.snapshot_strategy.IncrementalPolicy`): the first checkpoint writes
a full snapshot into ``shared/``; each later one writes only a delta (the entries changed since
the previous checkpoint, captured in the synchronous phase), and its handle lists the chain
``[full, delta, delta, ...]``. When the chain gets long, a new full snapshot is taken in the
same synchronous phase and written by a second background thread; the checkpoints after it
completes reference ``[new full, later deltas]``. Any failed write makes the next checkpoint
start a new chain with a full snapshot; a failed write never touches files of a committed
checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
from concurrent.futures import Future
from typing import Any, Protocol

from streamstate.backends.snapshot_strategy import (
    AsyncSnapshotWriter,
    CheckpointStreams,
    FullSnapshotStrategy,
    IncrementalPolicy,
    SnapshotOptions,
    SnapshotStrategy,
    SnapshotWrite,
    write_canonical_file,
)
from streamstate.errors import CheckpointError
from streamstate.format.handles import DELTA_FILE, FULL_FILE, KeyedStateHandle, StateFileHandle
from streamstate.format.snapshot import KeyedStateSnapshot

__all__ = ["ChangeTrackingBackend", "HeapSnapshotStrategy", "heap_snapshot_strategy"]

log = logging.getLogger(__name__)


class ChangeTrackingBackend(Protocol):
    """What the strategy needs of the backend it snapshots (``HeapKeyedStateBackend``)."""

    @property
    def incremental(self) -> bool:
        """Whether the backend tracks changes (``snapshot_delta``)."""
        ...

    def snapshot(self, checkpoint_id: int) -> KeyedStateSnapshot: ...

    def snapshot_delta(self, checkpoint_id: int) -> KeyedStateSnapshot: ...

    def reset_change_tracking(self, count: bool = False) -> None: ...

    def take_full_snapshot_request(self) -> bool:
        """Whether the next checkpoint must be a full snapshot (a restored state migrated)."""
        ...


def heap_snapshot_strategy(
    backend: ChangeTrackingBackend, options: SnapshotOptions
) -> SnapshotStrategy:
    """The strategy ``options`` ask for: an incremental chain (which needs the backend's change
    tracking) or a full file per checkpoint."""
    if options.incremental is None:
        return FullSnapshotStrategy(backend.snapshot, options)
    if not backend.incremental:
        raise CheckpointError(
            "incremental checkpoints need a keyed backend with change tracking "
            "(HeapStateBackend(incremental=True))"
        )
    return HeapSnapshotStrategy(backend, options.incremental, options.compression)


class _Link:
    """One file of an incremental chain: the checkpoint that wrote it and its pending handle."""

    __slots__ = ("checkpoint_id", "future", "kind")

    def __init__(self, checkpoint_id: int, future: Future[StateFileHandle], kind: str) -> None:
        self.checkpoint_id = checkpoint_id
        self.future = future
        self.kind = kind

    def handle(self) -> StateFileHandle:
        return self.future.result()

    def size(self) -> int | None:
        if not self.future.done() or self.future.exception() is not None:
            return None
        return self.handle().size


def _done(value: StateFileHandle) -> Future[StateFileHandle]:
    f: Future[StateFileHandle] = Future()
    f.set_result(value)
    return f


class _ChainWrite(SnapshotWrite):
    """Writes one file of the chain (a full snapshot or a delta) after the links before it."""

    def __init__(
        self,
        strategy: HeapSnapshotStrategy,
        streams: CheckpointStreams,
        snapshot: KeyedStateSnapshot,
        path: str,
        before: list[_Link],
        pending: list[str],
    ) -> None:
        self.strategy = strategy
        self.streams = streams
        self.snapshot = snapshot
        self.path = path
        self.before = before
        self.pending = pending
        self.link: Future[StateFileHandle] = Future()

    def run(self) -> KeyedStateHandle:
        written = False
        try:
            handle = write_canonical_file(
                self.streams, self.path, self.snapshot, compression=self.strategy.compression
            )
            written = True
            chain = [link.handle() for link in self.before] + [handle]
        except BaseException as exc:
            self.snapshot.release()
            if written:  # an earlier link failed: this file will never be listed
                with contextlib.suppress(Exception):
                    self.streams.delete(self.path)
            self.link.set_exception(exc)
            self.strategy.broken = True
            raise
        self.link.set_result(handle)
        return KeyedStateHandle(chain, pending=self.pending, created=[self.path])

    def abort(self) -> None:
        self.snapshot.release()
        self.strategy.broken = True
        if not self.link.done():
            self.link.set_exception(CheckpointError("the checkpoint was aborted"))


class HeapSnapshotStrategy(SnapshotStrategy):
    """Incremental chains of one heap backend with change tracking (see the module docstring)."""

    def __init__(
        self, backend: ChangeTrackingBackend, policy: IncrementalPolicy, compression: str
    ) -> None:
        self.backend = backend
        self.policy = policy
        self.compression = compression
        self.broken = False
        self._chain: list[_Link] | None = None
        self._materializer: AsyncSnapshotWriter | None = None
        self._materializing: tuple[_Link, str] | None = None

    def snapshot(self, checkpoint_id: int, streams: CheckpointStreams) -> SnapshotWrite:
        backend = self.backend
        self._collect_materialized()
        if backend.take_full_snapshot_request() or self._chain is None or self.broken:
            self.broken = False
            keyed = backend.snapshot(checkpoint_id)
            backend.reset_change_tracking(count=True)
            kind, before = FULL_FILE, []
        else:
            keyed = backend.snapshot_delta(checkpoint_id)
            kind, before = DELTA_FILE, list(self._chain)
        path = streams.shared_path(kind)
        if kind == DELTA_FILE and self._materializing is None and self._should_materialize(before):
            self._start_materialization(checkpoint_id, streams, backend.snapshot(checkpoint_id))
        pending = [self._materializing[1]] if self._materializing is not None else []
        write = _ChainWrite(self, streams, keyed, path, before, pending)
        self._chain = [*before, _Link(checkpoint_id, write.link, kind)]
        return write

    def savepoint(self, checkpoint_id: int, streams: CheckpointStreams) -> SnapshotWrite:
        full = FullSnapshotStrategy(self.backend.snapshot, SnapshotOptions(self.compression))
        return full.savepoint(checkpoint_id, streams)

    def start_new_chain(self) -> None:
        """The next checkpoint writes a full snapshot (a new chain), whatever the policy says."""
        self.broken = True

    def resume(self, files: list[StateFileHandle]) -> bool:
        if not files or files[0].kind != FULL_FILE:
            return False
        if not all(f.path.startswith("../shared/") for f in files):
            return False
        self._chain = [_Link(f.checkpoint_id, _done(f), f.kind) for f in files]
        self.backend.reset_change_tracking()
        return True

    def close(self) -> None:
        if self._materializer is not None:
            self._materializer.close()

    # ---- internals -----------------------------------------------------------------------------

    def _should_materialize(self, chain: list[_Link]) -> bool:
        if not chain:
            return False
        base = chain[0].size()
        deltas = [s for link in chain[1:] if (s := link.size()) is not None]
        if len(chain) - 1 >= self.policy.max_deltas:
            return True
        return self.policy.should_materialize(base, deltas)

    def _start_materialization(
        self, checkpoint_id: int, streams: CheckpointStreams, keyed: KeyedStateSnapshot
    ) -> None:
        if self._materializer is None:
            self._materializer = AsyncSnapshotWriter("streamstate-materializer")
        path = streams.shared_path(FULL_FILE)
        future: Future[Any] = self._materializer.submit(
            write_canonical_file, streams, path, keyed, compression=self.compression
        )
        self._materializing = (_Link(checkpoint_id, future, FULL_FILE), path)

    def _collect_materialized(self) -> None:
        if self._materializing is None:
            return
        link, _ = self._materializing
        if not link.future.done():
            return
        self._materializing = None
        if link.future.exception() is not None:
            log.warning(
                "background full snapshot for checkpoint %d failed: %s",
                link.checkpoint_id,
                link.future.exception(),
            )
            return
        if self._chain is not None and not self.broken:
            self._chain = [link, *(x for x in self._chain if x.checkpoint_id > link.checkpoint_id)]
