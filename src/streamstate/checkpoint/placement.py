"""Whether a checkpoint's keys are in the key groups this version looks for them in.

Every checkpoint records its key group placement (``streamstate.keygroups.PLACEMENT_VERSION``).
One of placement 1 (written before the property existed) is placed as placement 2 places, except
one that a Spark job with a key column of type INT, SMALLINT or TINYINT wrote: its placement
hashed those values at 32 bits, which gives 0, so every key of the operator is in key group
``assign_to_key_group(0, max_parallelism)``. Both hold ``int64`` keys (a Python ``int``), so only
the keys tell them apart: :func:`misplaced_key` reads the keys of that one key group until one
belongs elsewhere. In a checkpoint of that bug almost every key does (the first one read, unless
it is one of the 1 in ``max_parallelism`` keys that belong there); in any other checkpoint that
key group holds only its own keys, about 1/``max_parallelism`` of them, and the read stops after
``SAMPLE`` keys.

A restore that would miss every key's state is refused with
:class:`~streamstate.errors.KeyGroupPlacementError` (:func:`check_placement`), naming the key and
the remedy: ``streamstate checkpoints regroup``
(:func:`~streamstate.checkpoint.rewrite.regroup_savepoint`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import msgspec

from streamstate.checkpoint.restore import keyed_file_restore
from streamstate.checkpoint.storage import CompletedCheckpoint
from streamstate.errors import KeyGroupPlacementError
from streamstate.keygroups import (
    PLACEMENT_VERSION,
    KeyGroupRange,
    assign_to_key_group,
    placement_version,
)

__all__ = ["SAMPLE", "MisplacedKey", "check_placement", "misplaced_key"]

log = logging.getLogger(__name__)

#: the most keys of the one key group :func:`misplaced_key` reads
SAMPLE = 64
_INT_KEYS = msgspec.msgpack.Decoder(tuple[list[int], list[msgspec.Raw], list[msgspec.Raw]])


@dataclasses.dataclass(frozen=True)
class MisplacedKey:
    """A key that a checkpoint holds in ``stored`` where this version looks for it in
    ``expected``."""

    key: int
    stored: int
    expected: int


def misplaced_key(checkpoint: CompletedCheckpoint, operator: str) -> MisplacedKey | None:
    """The first key of ``operator``'s keyed state in ``checkpoint`` found outside its key group
    (see the module docstring), or None: the checkpoint is of placement 2, the operator holds no
    int keys, or the keys read are where they belong."""
    if placement_version(checkpoint.metadata.properties) >= PLACEMENT_VERSION:
        return None
    op = checkpoint.metadata.operators.get(operator)
    if op is None or (op.key_serializer is not None and op.key_serializer.get("type") != "int64"):
        return None
    one = assign_to_key_group(0, op.max_parallelism)
    for sub in op.subtasks:
        if not sub.keyed or not KeyGroupRange(*sub.key_group_range).contains(one):
            continue
        # once per such checkpoint: the job's next checkpoint records placement 2 (a native
        # RocksDB snapshot is downloaded to be read, as a heap backend's restore of it would)
        log.info(
            "%s records no key group placement: reading the keys of key group %d of operator %r "
            "to check that they belong there",
            checkpoint.url,
            one,
            operator,
        )
        restores = keyed_file_restore(checkpoint, list(sub.keyed), KeyGroupRange(one, one))
        try:
            found = _first_misplaced(restores, one, op.max_parallelism)
        finally:
            for restore in restores:
                restore.close()
        return found
    return None


def _first_misplaced(restores: list[Any], one: int, max_parallelism: int) -> MisplacedKey | None:
    read = 0
    for restore in restores:  # the full snapshot, then its deltas (new keys)
        if restore.key_serializer.get("type") != "int64":
            return None
        restore.only_key_groups = frozenset({one})
        for block in restore.blocks():
            try:
                keys = _INT_KEYS.decode(block.entries)[0]
            except (msgspec.DecodeError, ValueError):
                return None  # not int keys after all: the restore reports what it is
            for key in keys[: SAMPLE - read]:
                expected = assign_to_key_group(key, max_parallelism)
                if expected != one:
                    return MisplacedKey(key, one, expected)
            read += len(keys)
            if read >= SAMPLE:
                return None
    return None


def check_placement(checkpoint: CompletedCheckpoint, operator: str, restorer: str) -> None:
    """Raise :class:`~streamstate.errors.KeyGroupPlacementError` if :func:`misplaced_key` finds
    a key of ``operator`` outside its key group; ``restorer`` says who restores (``"this job (key
    'k')"``, ``"this runner"``)."""
    found = misplaced_key(checkpoint, operator)
    if found is None:
        return
    raise KeyGroupPlacementError(
        f"the keyed state of operator {operator!r} in {checkpoint.url} was written before key "
        f"group placement {PLACEMENT_VERSION} by a Spark job whose key column was an INT, "
        f"SMALLINT or TINYINT: it holds every key in key group {found.stored} (key "
        f"{found.key!r} among them), where {restorer} looks for each key in its own (key "
        f"{found.key!r}: key group {found.expected}). Restoring it would miss every key's "
        "state. Write a savepoint with the keys in their key groups once, `streamstate "
        f"checkpoints regroup {checkpoint.url} <new savepoint directory> --operator "
        f"{operator}`, and start the job from it (on Spark: initial_state=<that directory> and "
        "a new checkpoint= directory; docs: Upgrading a job, 'Integer keys of an older "
        "placement')"
    )
