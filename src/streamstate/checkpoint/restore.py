"""Restore and rescale from a completed checkpoint or savepoint (SPEC §7).

Keyed state moves by key group: new subtask ``i`` of ``p'`` owns
``range_for_subtask(max_p, p', i)``; for each old subtask whose range intersects it, the files of
its chain (full snapshot, then deltas) are read for the intersection only, block by block via the
key-group offset index. Timers are keyed state and follow their key groups. Operator state is
redistributed with Flink's rules
(:func:`~streamstate.checkpoint.rescale.repartition_operator_state`). ``max_parallelism``
cannot change.

>>> from streamstate.keygroups import KeyGroupRange
>>> old = [KeyGroupRange(0, 42), KeyGroupRange(43, 85), KeyGroupRange(86, 127)]
>>> [r.intersection(KeyGroupRange(64, 127)) for r in old]
[KeyGroupRange(0, -1), KeyGroupRange(64, 85), KeyGroupRange(86, 127)]
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO, Any

from streamstate.backends.base import RestoreInput
from streamstate.backends.operator import OperatorStateSnapshot
from streamstate.checkpoint.metadata import OperatorMetadata, StateFileHandle
from streamstate.checkpoint.operator_format import read_operator_state
from streamstate.checkpoint.rescale import repartition_operator_state
from streamstate.checkpoint.storage import CompletedCheckpoint
from streamstate.errors import CheckpointError, CorruptCheckpointError, MaxParallelismMismatchError
from streamstate.format.keyed_file import KeyedSnapshotReader
from streamstate.format.meta import StateMetaSnapshot
from streamstate.format.restore import KeyedStateRestore, RestoredBlock
from streamstate.keygroups import KeyGroupRange

__all__ = [
    "FileKeyedStateRestore",
    "keyed_file_restore",
    "keyed_restore_files",
    "operator_metadata",
    "operator_state_for_subtask",
    "restore_subtask",
]


class FileKeyedStateRestore(KeyedStateRestore):
    """One keyed snapshot file of a checkpoint, limited to a key-group range.

    The file is opened on first use and closed once its blocks were read.
    """

    def __init__(
        self, checkpoint: CompletedCheckpoint, handle: StateFileHandle, key_groups: KeyGroupRange
    ) -> None:
        self.checkpoint = checkpoint
        self.handle = handle
        self.key_groups = key_groups
        self._path = checkpoint.resolve(handle.path)
        self.path = checkpoint.storage.url_of(self._path)
        self._file: IO[bytes] | None = None
        self._reader: KeyedSnapshotReader | None = None

    def _open(self) -> KeyedSnapshotReader:
        if self._reader is None:
            f = self.checkpoint.storage.open_read(self._path)
            try:
                f.seek(0, 2)
                size = f.tell()
                if size != self.handle.size:
                    kgs = self.key_groups
                    raise CorruptCheckpointError(
                        f"corrupt checkpoint file {self.path} (key groups {kgs.start}-{kgs.end}): "
                        f"it has {size} bytes but the checkpoint metadata says {self.handle.size}"
                    )
                self._reader = KeyedSnapshotReader(f, self.path, size, self.key_groups)
            except BaseException:
                f.close()
                raise
            self._file = f
        return self._reader

    @property
    def kind(self) -> str:  # type: ignore[override]
        return self._open().kind

    @property
    def key_serializer(self) -> dict[str, Any]:  # type: ignore[override]
        return self._open().key_serializer

    @property
    def max_parallelism(self) -> int:  # type: ignore[override]
        return self._open().max_parallelism

    @property
    def states(self) -> list[StateMetaSnapshot]:  # type: ignore[override]
        return self._open().states

    def blocks(self) -> Iterator[RestoredBlock]:
        reader = self._open()
        states = reader.states
        try:
            for kg, records in reader.read(self.key_groups):
                for r in records:
                    yield RestoredBlock(kg, states[r.state_id], r.count, r.entries, r.removed)
        finally:
            self.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = None
        self._reader = None


def keyed_file_restore(
    checkpoint: CompletedCheckpoint, handle: StateFileHandle, key_groups: KeyGroupRange
) -> FileKeyedStateRestore:
    """The reader of one keyed file handle: a snapshot file, or a native RocksDB manifest."""
    from streamstate.checkpoint.native import MANIFEST_KIND, NativeKeyedStateRestore

    if handle.kind == MANIFEST_KIND:
        return NativeKeyedStateRestore(checkpoint, handle, key_groups)
    return FileKeyedStateRestore(checkpoint, handle, key_groups)


def operator_metadata(checkpoint: CompletedCheckpoint, operator_name: str) -> OperatorMetadata:
    """The metadata of one operator in a checkpoint (a clear error if it is absent)."""
    op = checkpoint.metadata.operators.get(operator_name)
    if op is None:
        raise CheckpointError(
            f"{checkpoint.url} has no state of operator {operator_name!r} (it has: "
            f"{sorted(checkpoint.metadata.operators) or 'none'})"
        )
    return op


def _check_max_parallelism(
    checkpoint: CompletedCheckpoint, op: OperatorMetadata, max_parallelism: int
) -> None:
    if op.max_parallelism != max_parallelism:
        raise MaxParallelismMismatchError(
            f"operator {op.name!r} was checkpointed in {checkpoint.url} with "
            f"max_parallelism={op.max_parallelism}, but is restored with "
            f"max_parallelism={max_parallelism}; the number of key groups is fixed for the life "
            "of a job (restore with the old max_parallelism)"
        )


def keyed_restore_files(
    checkpoint: CompletedCheckpoint,
    operator_name: str,
    key_group_range: KeyGroupRange,
    max_parallelism: int,
) -> list[FileKeyedStateRestore]:
    """The files a subtask owning ``key_group_range`` reads, in the order to apply them.

    A native RocksDB snapshot is one :class:`~streamstate.checkpoint.native.NativeKeyedStateRestore`
    (its manifest; the SST files it lists are its own business).
    """
    from streamstate.checkpoint.native import NativeKeyedStateRestore, is_native

    op = operator_metadata(checkpoint, operator_name)
    _check_max_parallelism(checkpoint, op, max_parallelism)
    files: list[FileKeyedStateRestore] = []
    for sub in op.subtasks:
        wanted = KeyGroupRange(*sub.key_group_range).intersection(key_group_range)
        if not wanted:
            continue
        if is_native(sub):
            files.append(NativeKeyedStateRestore(checkpoint, sub.keyed[0], wanted))
            continue
        if sub.keyed and sub.keyed[0].kind != "full":
            raise CorruptCheckpointError(
                f"{checkpoint.url}: the keyed state chain of operator {operator_name!r} subtask "
                f"{sub.subtask_index} does not start with a full snapshot"
            )
        files.extend(FileKeyedStateRestore(checkpoint, h, wanted) for h in sub.keyed)
    return files


def operator_state_for_subtask(
    checkpoint: CompletedCheckpoint, operator_name: str, parallelism: int, subtask_index: int
) -> OperatorStateSnapshot | None:
    """The operator state new subtask ``subtask_index`` of ``parallelism`` gets (Flink's
    redistribution rules), or None if the operator had none."""
    op = operator_metadata(checkpoint, operator_name)
    old: list[OperatorStateSnapshot] = []
    for sub in op.subtasks:
        h = sub.operator_state
        if h is None:
            old.append(OperatorStateSnapshot())
            continue
        path = checkpoint.resolve(h.path)
        data = checkpoint.storage.read_bytes(path)
        if len(data) != h.size:
            raise CorruptCheckpointError(
                f"corrupt checkpoint file {checkpoint.storage.url_of(path)}: it has {len(data)} "
                f"bytes but the checkpoint metadata says {h.size}"
            )
        old.append(read_operator_state(data, checkpoint.storage.url_of(path)))
    if all(s.is_empty() for s in old):
        return None
    return repartition_operator_state(old, parallelism)[subtask_index]


def restore_subtask(
    target: Any, checkpoint: CompletedCheckpoint, *, reuse_shared_files: bool = False
) -> None:
    """Restore one subtask (a ``KeyedProcessOperator``, before ``open()``) from ``checkpoint``,
    at whatever parallelism it now has.

    A RocksDB backend restores native RocksDB snapshots natively. With ``reuse_shared_files``
    (the checkpoint is in the storage the subtask checkpoints to), its next incremental
    checkpoint references the restored SST files instead of uploading them again.
    """
    files = keyed_restore_files(
        checkpoint, target.operator_name, target.key_group_range, target.max_parallelism
    )
    operator_state = operator_state_for_subtask(
        checkpoint, target.operator_name, target.parallelism, target.subtask_index
    )
    try:
        target.keyed_backend.restore(RestoreInput(files, reuse_shared_files=reuse_shared_files))
    finally:
        for f in files:
            f.close()
    if operator_state is not None:
        target.operator_backend.restore(operator_state)
    target.restored = True
