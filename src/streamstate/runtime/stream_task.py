"""One subtask's lifecycle (Flink's ``StreamTask``): restore, open, watermark, checkpoint, notify.

A :class:`StreamTask` owns one :class:`~streamstate.runtime.operator.KeyedProcessOperator` and
the checkpointer of its snapshots, and is the one place that orders the steps of a subtask's
life: restore (before ``open``), the restored watermark, ``open``, continuing the backend's
incremental chain, checkpoints and savepoints, and the notifications that let the backend build
on (or forget) what a checkpoint wrote. Every runtime drives its subtasks through it: the
``LocalRunner`` (``p`` tasks in one process) and the Spark runtime's ``SubtaskRuntime`` (one task
in a state host or a Spark task). Records go through the operator's record loop
(``process_elements``, ``process_records``).
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from streamstate.backends.snapshot_strategy import AsyncSnapshotWriter, IncrementalPolicy
from streamstate.checkpoint.metadata import SubtaskStateHandle
from streamstate.checkpoint.restore import restore_subtask
from streamstate.checkpoint.storage import CheckpointStorage, CompletedCheckpoint
from streamstate.checkpoint.writer import SubtaskCheckpointer
from streamstate.runtime.operator import KeyedProcessOperator

__all__ = ["StreamTask"]


class StreamTask:
    """The lifecycle of one subtask (see the module docstring).

    Parameters:
        operator: the subtask, not opened yet.
        storage: where its checkpoints go (asked for on the first checkpoint or restore; a
            callable returning it, so that a runner may create its storage lazily).
        compression: block codec of canonical keyed files.
        incremental: ask the backend for delta chains (True or an :class:`IncrementalPolicy`).
        writer: a writer thread shared by several tasks (one is created if None).
        unique_names: a random token in the names of a checkpoint's own files (Spark).
    """

    def __init__(
        self,
        operator: KeyedProcessOperator,
        storage: Any,
        *,
        compression: str = "lz4",
        incremental: bool | IncrementalPolicy = False,
        writer: AsyncSnapshotWriter | None = None,
        unique_names: bool = False,
    ) -> None:
        self.operator = operator
        self._storage = storage
        self.compression = compression
        self.incremental = incremental
        self.writer = writer
        self.unique_names = unique_names
        self._checkpointer: SubtaskCheckpointer | None = None

    @property
    def storage(self) -> CheckpointStorage:
        storage = self._storage
        return storage() if callable(storage) else storage  # type: ignore[no-any-return]

    @property
    def checkpointer(self) -> SubtaskCheckpointer:
        """The checkpointer of this task (created on first use, with the backend's strategy)."""
        if self._checkpointer is None:
            self._checkpointer = SubtaskCheckpointer(
                self.storage,
                self.operator,
                compression=self.compression,
                incremental=self.incremental,
                writer=self.writer,
                unique_names=self.unique_names,
            )
        return self._checkpointer

    # ---- lifecycle -----------------------------------------------------------------------------

    def restore(
        self,
        checkpoint: CompletedCheckpoint,
        *,
        claim: bool = False,
        watermark: int | None = None,
    ) -> None:
        """Restore the operator from ``checkpoint`` (before :meth:`open`), at its parallelism.

        ``claim``: the checkpoint is in the storage this task checkpoints to, so the backend
        may build on its files (the next checkpoint of an incremental chain is a delta, a
        native snapshot references the restored files). ``watermark``: where event time starts
        (no timer fires before the next ``advance_watermark``)."""
        op = self.operator
        restore_subtask(op, checkpoint, claim=claim)
        if watermark is not None:
            op.initialize_watermark(watermark)
        if claim:
            for handle in checkpoint.metadata.operators[op.operator_name].subtasks:
                if handle.subtask_index == op.subtask_index:
                    self.checkpointer.resume(handle)

    def open(self) -> None:
        self.operator.open()

    def checkpoint(self, checkpoint_id: int) -> Future[SubtaskStateHandle]:
        """The synchronous phase of checkpoint ``checkpoint_id`` now; the future completes when
        its files are written."""
        return self.checkpointer.checkpoint(checkpoint_id)

    def savepoint(self, directory: str, savepoint_id: int) -> Future[SubtaskStateHandle]:
        """A self-contained canonical snapshot into ``directory`` (relative to the storage)."""
        return self.checkpointer.savepoint(directory, savepoint_id)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` was committed with this task's files: later checkpoints
        may build on them."""
        self.operator.notify_checkpoint_complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` will never commit with this task's files: nothing may
        build on them."""
        self.operator.notify_checkpoint_aborted(checkpoint_id)

    def close_checkpointer(self) -> None:
        """Wait for the writes in flight and drop the checkpointer (a new storage, attempt or
        parallelism gets a new one)."""
        if self._checkpointer is not None:
            self._checkpointer.close()
            self._checkpointer = None

    def dispose(self) -> None:
        """Close the operator and release its state."""
        self.close_checkpointer()
        self.operator.dispose()
