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

from typing import Any

from streamstate.backends.base import RestoreInput, RestoreMode
from streamstate.backends.operator import OperatorStateSnapshot
from streamstate.backends.registry import backend_format_restore
from streamstate.checkpoint.metadata import OperatorMetadata, StateFileHandle
from streamstate.checkpoint.operator_format import read_operator_state
from streamstate.checkpoint.rescale import repartition_operator_state
from streamstate.checkpoint.storage import CompletedCheckpoint
from streamstate.errors import CheckpointError, CorruptCheckpointError, MaxParallelismMismatchError
from streamstate.format.handles import CANONICAL_KINDS, FULL_FILE
from streamstate.format.restore import FileKeyedStateRestore, KeyedStateRestore
from streamstate.keygroups import KeyGroupRange

__all__ = [
    "keyed_file_restore",
    "keyed_restore_files",
    "operator_metadata",
    "operator_state_for_subtask",
    "restore_subtask",
]


def keyed_file_restore(
    checkpoint: CompletedCheckpoint, files: list[StateFileHandle], key_groups: KeyGroupRange
) -> list[KeyedStateRestore]:
    """The restore files of one old subtask's keyed state, limited to ``key_groups``: one per
    canonical file (full snapshot, then deltas), or one for a snapshot in the own format of the
    backend that wrote it (``streamstate.backends.registry``; its entry file's kind names it)."""
    if not files:
        return []
    kind = files[0].kind
    if kind in CANONICAL_KINDS:
        if kind != FULL_FILE:
            raise CorruptCheckpointError(
                f"{checkpoint.url}: the keyed state chain {files[0].path} does not start with a "
                "full snapshot"
            )
        return [FileKeyedStateRestore(checkpoint, h, key_groups) for h in files]
    return [backend_format_restore(checkpoint, files, key_groups)]


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
) -> list[KeyedStateRestore]:
    """The files a subtask owning ``key_group_range`` reads, in the order to apply them (for each
    old subtask whose range intersects it: :func:`keyed_file_restore`)."""
    op = operator_metadata(checkpoint, operator_name)
    _check_max_parallelism(checkpoint, op, max_parallelism)
    files: list[KeyedStateRestore] = []
    for sub in op.subtasks:
        wanted = KeyGroupRange(*sub.key_group_range).intersection(key_group_range)
        if not wanted:
            continue
        try:
            files.extend(keyed_file_restore(checkpoint, list(sub.keyed), wanted))
        except CorruptCheckpointError as exc:
            raise CorruptCheckpointError(
                f"operator {operator_name!r} subtask {sub.subtask_index}: {exc}"
            ) from None
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


def restore_subtask(target: Any, checkpoint: CompletedCheckpoint, *, claim: bool = False) -> None:
    """Restore one subtask (a ``KeyedProcessOperator``, before ``open()``) from ``checkpoint``,
    at whatever parallelism it now has.

    With ``claim`` (the checkpoint is in the storage the subtask checkpoints to:
    ``RestoreMode.CLAIM``) the backend's next checkpoints may reference the restored files
    instead of writing them again.
    """
    files = keyed_restore_files(
        checkpoint, target.operator_name, target.key_group_range, target.max_parallelism
    )
    operator_state = operator_state_for_subtask(
        checkpoint, target.operator_name, target.parallelism, target.subtask_index
    )
    try:
        mode = RestoreMode.CLAIM if claim else RestoreMode.NO_CLAIM
        target.keyed_backend.restore(RestoreInput(files, mode))
    finally:
        for f in files:
            f.close()
    if operator_state is not None:
        target.operator_backend.restore(operator_state)
    target.restored = True
