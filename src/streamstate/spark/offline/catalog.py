"""What a checkpoint holds, read from its ``_metadata`` and its files' headers alone.

A reader first opens the checkpoint the options name (:func:`open_checkpoint`: the latest complete
checkpoint of a job directory, one of its checkpoints by id, a ``chk-<id>`` directory or a
savepoint), then finds the state it reads: a keyed state or timer queue (:func:`keyed_state`,
from the header of the first snapshot file holding it: a canonical file's header or a RocksDB
manifest) or an operator state (:func:`operator_state`, from the operator-state files' headers).
:func:`checkpoint_states` lists them all (the metadata format). Nothing here decodes an entry.

A :class:`CheckpointRef` names an opened checkpoint in a message to a Spark task, which opens it
again with :meth:`CheckpointRef.open` (the planning checked that it is complete).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import msgspec

from streamstate.checkpoint.metadata import OperatorMetadata, SubtaskStateHandle
from streamstate.checkpoint.operator_format import OperatorStateReader
from streamstate.checkpoint.restore import keyed_file_restore, operator_metadata
from streamstate.checkpoint.storage import (
    CheckpointStorage,
    CompletedCheckpoint,
    FileSystemCheckpointStorage,
    open_location,
)
from streamstate.errors import CheckpointError, CheckpointNotFoundError, CorruptCheckpointError
from streamstate.format.handles import CANONICAL_KINDS
from streamstate.format.meta import TIMER_STATE_KIND, StateMetaSnapshot
from streamstate.format.restore import FileKeyedStateRestore
from streamstate.keygroups import KeyGroupRange
from streamstate.spark.offline.options import ReadOptions

__all__ = [
    "CheckpointRef",
    "KeyedStateRef",
    "OperatorStateRef",
    "checkpoint_states",
    "keyed_state",
    "open_checkpoint",
    "operator_state",
    "subtask_range",
]


class CheckpointRef(msgspec.Struct, frozen=True):
    """An opened checkpoint, as a task finds it again: the storage root's URL, the checkpoint's
    directory below it, and the storage's fsspec options."""

    url: str
    directory: str
    checkpoint_id: int
    storage_options: dict[str, Any] = {}

    @classmethod
    def of(cls, cp: CompletedCheckpoint, storage_options: dict[str, Any]) -> CheckpointRef:
        return cls(cp.storage.url_of(""), cp.directory, cp.checkpoint_id, storage_options)

    def open(self) -> CompletedCheckpoint:
        """The checkpoint, its ``_metadata`` read again (its files are not listed again)."""
        storage = _storage(self.url, self.storage_options)
        metadata = storage.read_metadata(self.directory)
        if metadata is None:
            raise CheckpointNotFoundError(
                f"{storage.url_of(self.directory)} has no _metadata any more (deleted by the "
                "job's retention while it was being read?)"
            )
        return CompletedCheckpoint(storage, self.directory, metadata)


def _storage(url: str, storage_options: dict[str, Any]) -> CheckpointStorage:
    return FileSystemCheckpointStorage(url, "", durable=False, storage_options=storage_options)


_RELATIVE = (
    "it was resolved in the process that plans the read, a Spark Python worker whose working "
    "directory need not be yours; give an absolute path"
)


def open_checkpoint(options: ReadOptions, checkpoint_id: int | None = None) -> CompletedCheckpoint:
    """The checkpoint ``options.path`` names: a checkpoint or savepoint directory, or a job's
    checkpoint directory, of which ``checkpoint_id`` (default ``options.checkpoint_id``; None:
    the latest complete one) is read. A clear error when it is missing or incomplete."""
    path = options.path if "://" in options.path else os.path.abspath(options.path)
    wanted = options.checkpoint_id if checkpoint_id is None else checkpoint_id
    storage, directory = open_location(path, options.storage_options)
    if directory is None:
        if not storage.checkpoint_ids() and storage.size("_metadata") is None:
            relative = (
                ""
                if "://" in options.path or os.path.isabs(options.path)
                else f" ({options.path!r} is relative: {_RELATIVE})"
            )
            raise CheckpointNotFoundError(
                f"{storage.url} is neither a checkpoint, a savepoint nor a job's checkpoint "
                "directory (it holds no chk-<id> directory); for a LocalRunner give "
                f"<checkpoint_storage>/job{relative}"
            )
        return storage.load(wanted)
    cp = storage.load(directory)
    if wanted is not None and wanted != cp.checkpoint_id:
        raise CheckpointError(
            f"{cp.url} is checkpoint {cp.checkpoint_id}, not {wanted}: give checkpointId with "
            "the job's checkpoint directory"
        )
    return cp


def subtask_range(sub: SubtaskStateHandle) -> KeyGroupRange:
    """The key groups an old subtask wrote."""
    return KeyGroupRange(*sub.key_group_range)


class KeyedStateRef(msgspec.Struct, frozen=True):
    """A keyed state (or timer queue) of a checkpointed operator: its meta data as the snapshot
    files describe it, and the snapshot of the operator's key serializer."""

    operator: str
    meta: StateMetaSnapshot
    key_serializer: dict[str, Any]
    max_parallelism: int

    @property
    def is_timer(self) -> bool:
        return self.meta.kind == TIMER_STATE_KIND


class OperatorStateRef(msgspec.Struct, frozen=True):
    """An operator state: its name, mode (``split_distribute``, ``union`` or ``broadcast``) and
    serializer snapshots (``element_serializer``, or ``key_serializer`` and
    ``value_serializer``), from an operator-state file's header."""

    operator: str
    name: str
    mode: str
    serializers: dict[str, Any]


def _file_states(cp: CompletedCheckpoint, sub: SubtaskStateHandle) -> list[StateMetaSnapshot]:
    """The states of an old subtask's snapshot, from its files' headers: a canonical chain's
    full file and deltas (a state registered after the full file is in the deltas' only; the
    latest file's description of a state wins), or a backend's own snapshot's entry file."""
    if not sub.keyed:
        return []
    key_groups = subtask_range(sub)
    if sub.keyed[0].kind not in CANONICAL_KINDS:
        files = keyed_file_restore(cp, list(sub.keyed), key_groups)
    else:
        files = [FileKeyedStateRestore(cp, h, key_groups) for h in sub.keyed]
    found: dict[str, StateMetaSnapshot] = {}
    for f in files:
        try:
            found.update((m.name, m) for m in f.states)
        finally:
            f.close()
    return list(found.values())


def _key_serializer(cp: CompletedCheckpoint, op: OperatorMetadata) -> dict[str, Any]:
    for snap in (op.key_serializer, *(s.key_serializer for s in op.subtasks)):
        if snap is not None:
            return snap
    raise CorruptCheckpointError(f"{cp.url}: operator {op.name!r} names no key serializer")


def keyed_state(cp: CompletedCheckpoint, operator: str, name: str) -> KeyedStateRef:
    """The keyed state or timer queue ``name`` of ``operator``; a
    :class:`~streamstate.errors.CheckpointError` listing every readable name when absent."""
    op = operator_metadata(cp, operator)
    for sub in op.subtasks:
        if any(name in handle.states for handle in sub.keyed):
            meta = next((m for m in _file_states(cp, sub) if m.name == name), None)
            if meta is not None:
                return KeyedStateRef(operator, meta, _key_serializer(cp, op), op.max_parallelism)
    names = sorted({n for s in op.subtasks for h in s.keyed for n in h.states})
    operator_names = sorted({r.name for r in _operator_states(cp, op)})
    raise CheckpointError(
        f"{cp.url} has no keyed state {name!r} in operator {operator!r}; the states it holds: "
        f"{[n for n in names if not n.startswith('_timers.')]}, its timers: "
        f"{[n for n in names if n.startswith('_timers.')]}"
        + (
            f", its operator states (read with option operatorState): {operator_names}"
            if operator_names
            else ""
        )
    )


def _operator_states(cp: CompletedCheckpoint, op: OperatorMetadata) -> Iterator[OperatorStateRef]:
    """Every operator state of ``op`` (each name once), from its subtasks' file headers."""
    seen: set[str] = set()
    for sub in op.subtasks:
        handle = sub.operator_state
        if handle is None:
            continue
        path = cp.resolve(handle.path)
        reader = OperatorStateReader(cp.storage.read_bytes(path), cp.storage.url_of(path))
        for meta in reader.states:
            if meta["name"] in seen:
                continue
            seen.add(meta["name"])
            serializers = {k: v for k, v in meta.items() if k.endswith("_serializer")}
            yield OperatorStateRef(op.name, meta["name"], meta["mode"], serializers)


def operator_state(cp: CompletedCheckpoint, operator: str, name: str) -> OperatorStateRef:
    """The operator state ``name`` of ``operator``; a clear error listing them when absent."""
    op = operator_metadata(cp, operator)
    found = list(_operator_states(cp, op))
    for ref in found:
        if ref.name == name:
            return ref
    raise CheckpointError(
        f"{cp.url} has no operator state {name!r} in operator {operator!r}; its operator "
        f"states: {sorted(r.name for r in found)} (keyed states are read with option state)"
    )


def checkpoint_states(
    cp: CompletedCheckpoint,
) -> Iterator[tuple[OperatorMetadata, KeyedStateRef | OperatorStateRef]]:
    """Every state of every operator: keyed states and timer queues (each name once, from the
    first subtask file holding it), then operator states."""
    for op in cp.metadata.operators.values():
        seen: set[str] = set()
        for sub in op.subtasks:
            if not {n for h in sub.keyed for n in h.states} - seen:
                continue
            for meta in _file_states(cp, sub):
                if meta.name not in seen:
                    seen.add(meta.name)
                    yield (
                        op,
                        KeyedStateRef(op.name, meta, _key_serializer(cp, op), op.max_parallelism),
                    )
        for ref in _operator_states(cp, op):
            yield op, ref
