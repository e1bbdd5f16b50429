"""Checkpoint metadata: the plain-data handles of written files and the ``_metadata`` document.

Everything here is a ``msgspec.Struct``: executors return :class:`SubtaskStateHandle` values to
the driver (they pickle, and encode to msgpack/JSON), and the driver commits a checkpoint by
writing one :class:`CheckpointMetadata` as ``_metadata`` (versioned JSON, SPEC §6.1).

File paths in handles are relative to the directory that holds the ``_metadata`` naming them
(``op/0-0.state``) or point into the job's shared directory (``../shared/op/...``), so that a
savepoint directory can be moved and still be restored. :func:`decode_metadata` refuses any
other path (``streamstate.format.names``): a savepoint names only files inside its directory.
"""

from __future__ import annotations

from typing import Any

import msgspec

from streamstate.errors import CorruptCheckpointError
from streamstate.format.handles import CANONICAL_KINDS, StateFileHandle
from streamstate.format.names import handle_path

__all__ = [
    "METADATA_FORMAT",
    "METADATA_VERSION",
    "READABLE_METADATA_VERSIONS",
    "CheckpointMetadata",
    "OperatorMetadata",
    "StateFileHandle",
    "SubtaskStateHandle",
    "check_file_names",
    "decode_metadata",
    "encode_metadata",
]

METADATA_FORMAT = "streamstate-checkpoint-metadata"
#: version 2 added file kinds of snapshots in a backend's own format ("<backend>-<role>")
METADATA_VERSION = 2
#: versions this build reads (a version-1 document is a version-2 one without such kinds)
READABLE_METADATA_VERSIONS = (1, 2)


class SubtaskStateHandle(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Everything one subtask wrote for one checkpoint (returned by executors to the driver)."""

    operator: str
    subtask_index: int
    parallelism: int
    max_parallelism: int
    key_group_range: tuple[int, int]
    attempt: int = 0
    checkpoint_id: int = 0
    #: snapshot of the key serializer
    key_serializer: dict[str, Any] | None = None
    #: keyed state: a full snapshot, then the deltas to apply on it, in order; or a backend's
    #: snapshot in its own format (its entry file first, then the files it references)
    keyed: list[StateFileHandle] = []
    operator_state: StateFileHandle | None = None
    #: shared files still being written (a background full snapshot): never deleted while a
    #: retained checkpoint lists them
    pending: list[str] = []
    #: the entries of each registered keyed state when the snapshot was taken
    #: (``streamstate.format.entries``), and the timers; None in checkpoints written before
    #: they were recorded
    entries: dict[str, int] | None = None
    timers: int | None = None

    @property
    def is_canonical(self) -> bool:
        """Whether the keyed state is in the canonical format (full snapshot and deltas), not a
        snapshot in a backend's own format."""
        return not self.keyed or self.keyed[0].kind in CANONICAL_KINDS

    def files(self) -> list[StateFileHandle]:
        out = list(self.keyed)
        if self.operator_state is not None:
            out.append(self.operator_state)
        return out


class OperatorMetadata(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The subtasks of one operator in a checkpoint."""

    name: str
    parallelism: int
    max_parallelism: int
    key_serializer: dict[str, Any] | None = None
    subtasks: list[SubtaskStateHandle] = []


class CheckpointMetadata(msgspec.Struct, kw_only=True):
    """The ``_metadata`` document: a checkpoint is complete once it exists and every file it
    lists exists with the listed size and checksum."""

    format: str = METADATA_FORMAT
    version: int = METADATA_VERSION
    #: "checkpoint" or "savepoint"
    kind: str = "checkpoint"
    job_id: str = ""
    checkpoint_id: int
    #: milliseconds since the epoch
    timestamp: int
    operators: dict[str, OperatorMetadata] = {}
    #: free-form values of the runtime (watermark, batch id, ...)
    properties: dict[str, Any] = {}

    def files(self) -> list[StateFileHandle]:
        return [f for op in self.operators.values() for s in op.subtasks for f in s.files()]

    def pending_files(self) -> list[str]:
        return [p for op in self.operators.values() for s in op.subtasks for p in s.pending]


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(CheckpointMetadata)


def encode_metadata(metadata: CheckpointMetadata) -> bytes:
    """The JSON bytes of ``_metadata``."""
    return msgspec.json.format(_ENCODER.encode(metadata), indent=1)


def decode_metadata(data: bytes, path: str) -> CheckpointMetadata:
    """Parse ``_metadata``; unreadable or newer-versioned documents raise a clear error."""
    try:
        head = msgspec.json.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise CorruptCheckpointError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(head, dict) or head.get("format") != METADATA_FORMAT:
        raise CorruptCheckpointError(f"{path} is not a streamstate checkpoint metadata file")
    if head.get("version") not in READABLE_METADATA_VERSIONS:
        raise CorruptCheckpointError(
            f"{path} has metadata version {head.get('version')}; this streamstate reads versions "
            f"{', '.join(map(str, READABLE_METADATA_VERSIONS))} (a newer streamstate wrote it?)"
        )
    try:
        metadata = _DECODER.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise CorruptCheckpointError(f"{path} is malformed ({exc})") from None
    check_file_names(metadata, path)
    return metadata


def check_file_names(metadata: CheckpointMetadata, path: str) -> None:
    """Refuse (:class:`CorruptCheckpointError` naming the field) a file path of ``metadata``
    (read from ``path``) that is not a plain name inside its checkpoint or, for a checkpoint
    (not a savepoint), ``../shared/<plain name>`` (``streamstate.format.names``)."""
    checkpoint, file = path.rsplit("/", 1) if "/" in path else ("", path)
    shared = metadata.kind != "savepoint"
    for operator, op in metadata.operators.items():
        for i, sub in enumerate(op.subtasks):
            where = f"operators[{operator!r}].subtasks[{i}]"
            named = [(f"{where}.keyed[{j}].path", h.path) for j, h in enumerate(sub.keyed)]
            if sub.operator_state is not None:
                named.append((f"{where}.operator_state.path", sub.operator_state.path))
            named += [(f"{where}.pending[{j}]", p) for j, p in enumerate(sub.pending)]
            for field, name in named:
                handle_path(name, shared=shared, checkpoint=checkpoint, file=file, field=field)
