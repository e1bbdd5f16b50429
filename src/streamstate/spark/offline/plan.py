"""What one read of the ``streamstate`` format reads, decided once when Spark plans it.

:func:`plan_read` opens the checkpoint the options name, finds the state and, for a change feed,
the checkpoints of the feed (each with the one before it); :meth:`ReadPlan.partitions` splits the
read like the job that wrote it: one partition per checkpointed subtask (its key-group range; its
operator-state file), per checkpoint of a change feed. A filter on ``key`` narrows the read to the
key groups that can hold the keys (:meth:`ReadPlan.partitions` ``keys``): a partition without any
of them is dropped, the others read only those key groups (not when a Spark job of key group
placement 1 put all its int keys in one key group: ``streamstate.checkpoint.placement``). A
change feed reads only the key groups whose files may differ between the two checkpoints, and
drops the partitions without any.

Everything a task needs travels in its :class:`ReadPartition`, one typed message.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import msgspec

from streamstate.checkpoint.placement import misplaced_key
from streamstate.checkpoint.restore import operator_metadata
from streamstate.checkpoint.storage import CheckpointStorage, CompletedCheckpoint, open_location
from streamstate.errors import CheckpointError
from streamstate.keygroups import assign_to_key_group
from streamstate.spark.offline.catalog import (
    CheckpointRef,
    KeyedStateRef,
    OperatorStateRef,
    keyed_state,
    open_checkpoint,
    operator_state,
    subtask_range,
)
from streamstate.spark.offline.changes import candidate_key_groups
from streamstate.spark.offline.options import ReadOptions

__all__ = ["FeedStep", "ReadPartition", "ReadPlan", "plan_read"]


class FeedStep(msgspec.Struct, frozen=True):
    """One checkpoint of a change feed and the checkpoint before it (None: the job's first
    checkpoint, whose changes are every entry), with the state as each describes it (None:
    the checkpoint does not hold it)."""

    checkpoint: CheckpointRef
    state: KeyedStateRef | None
    previous: CheckpointRef | None = None
    previous_state: KeyedStateRef | None = None


class ReadPartition(msgspec.Struct, frozen=True):
    """What one Spark task reads: the key groups ``key_groups`` of the checkpoint (``only``: just
    these of them) or, for an operator state, the file of old subtask ``subtask``; for a change
    feed, the changes of ``step``."""

    key_groups: tuple[int, int] = (0, -1)
    only: list[int] | None = None
    subtask: int = 0
    step: FeedStep | None = None


class ReadPlan(msgspec.Struct, frozen=True):
    """One read: the checkpoint, the state (keyed or operator state), the processing time TTL
    expiry is judged at, and the steps of a change feed."""

    options: ReadOptions
    checkpoint: CheckpointRef
    now: int
    keyed: KeyedStateRef | None = None
    operator_state: OperatorStateRef | None = None
    feed: list[FeedStep] = []

    def partitions(self, keys: Iterable[Any] | None = None) -> list[ReadPartition]:
        """The partitions of the read (see the module docstring); ``keys``: the only keys the
        rows may have (None: any)."""
        if self.operator_state is not None:
            cp = self.checkpoint.open()
            op = operator_metadata(cp, self.operator_state.operator)
            return [ReadPartition(subtask=i) for i in range(len(op.subtasks))]
        assert self.keyed is not None
        keyed = self.keyed
        wanted = None
        if keys is not None:
            wanted = sorted({assign_to_key_group(k, keyed.max_parallelism) for k in keys})

        misplaced: dict[str, bool] = {}  # per checkpoint: a feed names each one twice

        def narrowed(*cps: CompletedCheckpoint | None) -> list[int] | None:
            # int keys that a Spark job of key group placement 1 put all in one key group:
            # read every key group (misplaced_key reads at most a few keys of one)
            if wanted is None:
                return None
            for cp in filter(None, cps):
                if cp.url not in misplaced:
                    misplaced[cp.url] = misplaced_key(cp, keyed.operator) is not None
                if misplaced[cp.url]:
                    return None
            return wanted

        if not self.feed:
            cp = self.checkpoint.open()
            return _keyed_partitions(cp, keyed.operator, narrowed(cp), None)
        out = []
        for step in self.feed:
            cp = step.checkpoint.open()
            previous = None if step.previous is None else step.previous.open()
            out += _keyed_partitions(cp, keyed.operator, narrowed(cp, previous), step, previous)
        return out


def _keyed_partitions(
    cp: CompletedCheckpoint,
    operator: str,
    wanted: list[int] | None,
    step: FeedStep | None,
    previous: CompletedCheckpoint | None = None,
) -> list[ReadPartition]:
    """One partition per checkpointed subtask of ``cp`` holding any key group of ``wanted``
    (None: any); for a change feed, only the key groups that may have changed since
    ``previous`` (``changes.candidate_key_groups``), none of a subtask that changed nothing."""
    out = []
    for sub in operator_metadata(cp, operator).subtasks:
        kgs = subtask_range(sub)
        only = None if wanted is None else [kg for kg in wanted if kgs.contains(kg)]
        if step is not None and step.state is not None and previous is not None:
            changed = candidate_key_groups(previous, cp, step.state, kgs)
            if changed is not None:
                only = sorted(changed if only is None else changed.intersection(only))
        if only == []:
            continue
        out.append(ReadPartition(kgs.to_tuple(), only, sub.subtask_index, step))
    return out


def _check_choice(options: ReadOptions) -> None:
    if (options.state is None) == (options.operator_state is None):
        raise ValueError(
            "format 'streamstate' reads one state: give option state (a keyed state or timer "
            "queue) or option operatorState (an operator list, union list or broadcast state)"
        )
    feed_options = options.change_start is not None or options.change_end is not None
    if feed_options and not options.read_change_feed:
        raise ValueError(
            "options changeStartCheckpointId and changeEndCheckpointId are for a change feed: "
            "add option readChangeFeed true"
        )
    if options.read_change_feed:
        if options.operator_state is not None:
            raise ValueError("a change feed reads keyed state and timers, not operator state")
        if options.change_start is None:
            raise ValueError("a change feed needs option changeStartCheckpointId")
        if options.checkpoint_id is not None:
            raise ValueError(
                "a change feed names its checkpoints with changeStartCheckpointId and "
                "changeEndCheckpointId, not checkpointId"
            )


def plan_read(options: ReadOptions) -> ReadPlan:
    """The plan of one read (see the module docstring); a clear error for options that do not
    fit or a checkpoint that does not hold the state."""
    _check_choice(options)
    now = options.now if options.now is not None else time.time_ns() // 1_000_000
    if options.read_change_feed:
        return _plan_feed(options, now)
    cp = open_checkpoint(options)
    ref = CheckpointRef.of(cp, options.storage_options)
    if options.operator_state is not None:
        found = operator_state(cp, options.operator, options.operator_state)
        return ReadPlan(options, ref, now, operator_state=found)
    assert options.state is not None
    return ReadPlan(options, ref, now, keyed=keyed_state(cp, options.operator, options.state))


def _plan_feed(options: ReadOptions, now: int) -> ReadPlan:
    path = options.path
    storage, directory = open_location(path, options.storage_options)
    if directory is not None:
        raise ValueError(
            f"a change feed reads the checkpoints of a job: give the job's checkpoint directory, "
            f"not the checkpoint {path}"
        )
    complete = {cp.checkpoint_id: cp for cp in storage.complete_checkpoints()}
    if not complete:
        raise CheckpointError(f"{storage.url} holds no complete checkpoint")
    start = options.change_start
    end = options.change_end if options.change_end is not None else max(complete)
    assert start is not None
    # up to the last checkpoint written when the feed runs to the latest
    last_written = end if options.change_end is not None else max(storage.checkpoint_ids())
    _refuse_damaged(storage, complete, range(start - 1, last_written + 1))
    steps = sorted(c for c in complete if start <= c <= end)
    if start > end or not steps:
        raise CheckpointError(
            f"{storage.url} holds no complete checkpoint in [{start}, {end}] (its complete "
            f"checkpoints: {sorted(complete)})"
        )
    present = set(storage.checkpoint_ids())
    before = max((c for c in complete if c < steps[0]), default=0)
    if any(c not in present for c in range(before + 1, steps[0])):
        # a checkpoint in between is gone, not merely failed (a failed one leaves its directory)
        raise CheckpointError(
            f"the change feed of checkpoint {steps[0]} needs checkpoint {steps[0] - 1}, which "
            f"{storage.url} no longer holds (the job's retention keeps its last complete "
            f"checkpoints: {sorted(complete)}); start the feed at {min(complete) + 1} or later"
        )
    assert options.state is not None
    name, operator, storage_options = options.state, options.operator, options.storage_options
    last = complete[steps[-1]]
    ref = keyed_state(last, operator, name)
    feed = []
    for c in steps:
        previous = complete.get(max((e for e in complete if e < c), default=0))
        feed.append(
            FeedStep(
                CheckpointRef.of(complete[c], storage_options),
                _same_state(complete[c], ref, name),
                None if previous is None else CheckpointRef.of(previous, storage_options),
                None if previous is None else _same_state(previous, ref, name),
            )
        )
    return ReadPlan(options, CheckpointRef.of(last, storage_options), now, keyed=ref, feed=feed)


def _refuse_damaged(
    storage: CheckpointStorage, complete: dict[int, CompletedCheckpoint], ids: range
) -> None:
    """A checkpoint of ``ids`` that wrote its ``_metadata`` but is not complete is damaged (a
    name refused, a file missing): the feed fails with its error rather than skip it as a
    checkpoint that failed (no ``_metadata``) and diff its neighbours instead."""
    for c in sorted(set(storage.checkpoint_ids()) & set(ids) - set(complete)):
        if storage.read_metadata(storage.checkpoint_directory(c)) is not None:
            storage.load(c)


def _same_state(cp: CompletedCheckpoint, ref: KeyedStateRef, name: str) -> KeyedStateRef | None:
    """The state in ``cp`` (None: not there); an error if its types are not those of ``ref``
    (the state at the end of the feed), whose columns the feed has."""
    try:
        found = keyed_state(cp, ref.operator, name)
    except CheckpointError:
        return None
    before = (found.key_serializer, found.meta.namespace_serializer, found.meta.state_serializer)
    after = (ref.key_serializer, ref.meta.namespace_serializer, ref.meta.state_serializer)
    if before != after or found.meta.kind != ref.meta.kind:
        raise CheckpointError(
            f"state {name!r} has other types in checkpoint {cp.checkpoint_id} than at the end of "
            "the change feed (the job's code changed them); read the feed in two ranges, one on "
            "each side of the change"
        )
    return found
