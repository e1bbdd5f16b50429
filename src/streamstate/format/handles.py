"""Handles of written snapshot files: what a backend's snapshot strategy hands to checkpoint
storage, which records them in ``_metadata`` (SPEC §6.1) and hands them back on restore.

File paths are relative to the directory of the checkpoint that lists them (``op/0-0.state``)
or point into the job's shared directory (``../shared/op/...``).
"""

from __future__ import annotations

import dataclasses

import msgspec

__all__ = ["CANONICAL_KINDS", "DELTA_FILE", "FULL_FILE", "KeyedStateHandle", "StateFileHandle"]

FULL_FILE = "full"
"""Kind of a canonical keyed snapshot file holding every entry of its key groups."""
DELTA_FILE = "delta"
"""Kind of a canonical keyed snapshot file holding the changes since the previous checkpoint."""
CANONICAL_KINDS = frozenset({FULL_FILE, DELTA_FILE})
"""Kinds of the canonical keyed snapshot files (``streamstate.format``)."""


class StateFileHandle(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One written file: where it is and what it must look like."""

    #: relative to the checkpoint (or savepoint) directory; "../shared/..." for shared files
    path: str
    size: int
    #: CRC32C of the whole file
    checksum: int
    #: "full" or "delta" (keyed snapshot files), "operator" (operator-state files), or a kind
    #: "<backend>-<role>" of a snapshot in a backend's own format (its entry file, then every
    #: file it references; ``streamstate.backends.registry``)
    kind: str
    #: the checkpoint that wrote the file
    checkpoint_id: int
    #: inclusive key-group range of a keyed file
    key_group_range: tuple[int, int] | None = None
    #: (key group, entries) of the non-empty key groups of a keyed file
    entries: list[tuple[int, int]] = []
    #: names of the states in the file
    states: list[str] = []

    @property
    def total_entries(self) -> int:
        return sum(n for _, n in self.entries)


@dataclasses.dataclass
class KeyedStateHandle:
    """What a snapshot strategy wrote for one checkpoint of one subtask's keyed state."""

    #: the files of the snapshot, in the order a restore applies them: a full canonical file
    #: then deltas, or the entry file of a snapshot in the backend's own format then the files it
    #: references
    files: list[StateFileHandle]
    #: shared files still being written by the strategy (a background full snapshot): never
    #: deleted while a retained checkpoint lists them
    pending: list[str] = dataclasses.field(default_factory=list)
    #: files (relative to the checkpoint directory) this checkpoint created that nothing else
    #: references: deleted if the checkpoint fails before it commits
    created: list[str] = dataclasses.field(default_factory=list)
