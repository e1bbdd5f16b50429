"""The driver side of a checkpoint: collect every subtask's handles, then commit (SPEC §6.1).

Writing a subtask's files (:class:`~streamstate.checkpoint.writer.SubtaskCheckpointer`, on an
executor) and committing the checkpoint (this module, on the driver) are separate steps joined
only by plain-data :class:`~streamstate.checkpoint.metadata.SubtaskStateHandle` values.
:meth:`CheckpointCoordinator.commit` writes ``_metadata`` only when every subtask of every
operator is present, every key group is covered exactly once, and every listed file exists with
its size; then it applies retention (in a background thread by default: deleting an old full
snapshot must not delay the next micro-batch). A checkpoint that is declined or incomplete is never
committed, so the last complete checkpoint stays the one restore picks.

With an ``epoch`` (:meth:`~streamstate.checkpoint.storage.CheckpointStorage.acquire_epoch`), the
coordinator checks right before writing ``_metadata`` and before each retention pass that no
newer run took the job over; a fenced run raises
:class:`~streamstate.errors.CheckpointFencedError` and writes and deletes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from streamstate.checkpoint.metadata import (
    CheckpointMetadata,
    OperatorMetadata,
    SubtaskStateHandle,
)
from streamstate.checkpoint.storage import CheckpointStorage, CompletedCheckpoint, Epoch, now_ms
from streamstate.errors import CheckpointError, CheckpointFencedError
from streamstate.keygroups import (
    PLACEMENT_PROPERTY,
    PLACEMENT_VERSION,
    compute_key_group_range_for_operator_index,
)

__all__ = ["CheckpointCoordinator"]

log = logging.getLogger(__name__)


class CheckpointCoordinator:
    """Commits checkpoints and savepoints of one job into ``storage``.

    Either pass all handles to :meth:`commit` at once (a Spark driver after collecting task
    results), or :meth:`acknowledge` them as they arrive and :meth:`complete` at the end.
    """

    def __init__(
        self,
        storage: CheckpointStorage,
        *,
        retained: int | None = None,
        background_retention: bool = True,
        epoch: Epoch | None = None,
    ) -> None:
        self.storage = storage
        self.retained = retained
        self.background_retention = background_retention
        #: the epoch this run holds (None: no fencing, e.g. a LocalRunner)
        self.epoch = epoch
        self._acks: dict[int, list[SubtaskStateHandle]] = {}
        self._declined: dict[int, str] = {}
        self._retention: Future[Any] | None = None
        self._pool: ThreadPoolExecutor | None = None

    def next_checkpoint_id(self) -> int:
        """An id larger than every checkpoint directory in the storage."""
        return self.storage.next_checkpoint_id()

    # ---- collecting ----------------------------------------------------------------------------

    def acknowledge(self, checkpoint_id: int, handle: SubtaskStateHandle) -> None:
        """A subtask wrote its files for ``checkpoint_id``."""
        self._acks.setdefault(checkpoint_id, []).append(handle)

    def decline(self, checkpoint_id: int, reason: str) -> None:
        """A subtask failed to write ``checkpoint_id``: it will not be committed."""
        self._declined[checkpoint_id] = reason

    def complete(
        self,
        checkpoint_id: int,
        *,
        expected: dict[str, int] | None = None,
        properties: dict[str, Any] | None = None,
    ) -> CompletedCheckpoint:
        """Commit the acknowledged handles of ``checkpoint_id`` (see :meth:`commit`)."""
        handles = self._acks.pop(checkpoint_id, [])
        reason = self._declined.pop(checkpoint_id, None)
        if reason is not None:
            raise CheckpointError(
                f"checkpoint {checkpoint_id} was declined and is not committed: {reason}"
            )
        return self.commit(checkpoint_id, handles, expected=expected, properties=properties)

    def abort(self, checkpoint_id: int) -> None:
        """Forget a checkpoint and delete what its subtasks wrote into its directory."""
        self._acks.pop(checkpoint_id, None)
        self._declined.pop(checkpoint_id, None)
        self.storage.delete(self.storage.checkpoint_directory(checkpoint_id))

    # ---- committing ----------------------------------------------------------------------------

    def commit(
        self,
        checkpoint_id: int,
        handles: Iterable[SubtaskStateHandle],
        *,
        expected: dict[str, int] | None = None,
        properties: dict[str, Any] | None = None,
        savepoint_directory: str | None = None,
    ) -> CompletedCheckpoint:
        """Write ``_metadata`` for ``checkpoint_id`` (or a savepoint into
        ``savepoint_directory``) if the handles make a complete checkpoint.

        ``expected`` maps operator names to their parallelism; every listed operator must be
        present. Raises :class:`CheckpointError` naming what is missing; nothing is written then.
        """
        operators = self._assemble(checkpoint_id, list(handles), expected)
        kind = "checkpoint" if savepoint_directory is None else "savepoint"
        directory = savepoint_directory or self.storage.checkpoint_directory(checkpoint_id)
        properties = dict(properties or {})
        # every writer computes key groups as assign_to_key_group does; a savepoint rewrite that
        # carries an older checkpoint's key groups says so itself
        properties.setdefault(PLACEMENT_PROPERTY, PLACEMENT_VERSION)
        if self.epoch is not None:
            properties.setdefault("run", self.epoch.run)
            properties.setdefault("epoch", self.epoch.number)
        metadata = CheckpointMetadata(
            kind=kind,
            job_id=self.storage.job_id,
            checkpoint_id=checkpoint_id,
            timestamp=now_ms(),
            operators=operators,
            properties=properties,
        )
        candidate = CompletedCheckpoint(self.storage, directory, metadata)
        problems = self.storage.problems(candidate)
        if problems:
            raise CheckpointError(f"{kind} {checkpoint_id} is not committed: {'; '.join(problems)}")
        if self.epoch is not None:
            # the last moment before the commit: a run that a newer one took over stops here
            self.storage.check_epoch(self.epoch)
        completed = self.storage.write_metadata(directory, metadata)
        if kind == "checkpoint":
            self._start_retention()
        return completed

    # ---- retention -----------------------------------------------------------------------------

    def _retain(self) -> None:
        try:
            self.storage.apply_retention(self.retained, epoch=self.epoch)
        except CheckpointFencedError as exc:
            log.warning("no checkpoint retention in %s: %s", self.storage.url, exc)
        except Exception as exc:  # retention must never fail a committed checkpoint
            log.warning("checkpoint retention in %s failed: %s", self.storage.url, exc)

    def _start_retention(self) -> None:
        """Delete what the new checkpoint made obsolete; off the commit's critical path unless
        ``background_retention`` is False (one retention pass at a time)."""
        self.wait_for_retention()
        if not self.background_retention:
            self._retain()
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="streamstate-gc")
        self._retention = self._pool.submit(self._retain)

    def wait_for_retention(self) -> None:
        """Wait until the last retention pass is done."""
        if self._retention is not None:
            self._retention.result()
            self._retention = None

    def close(self) -> None:
        self.wait_for_retention()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def _assemble(
        self,
        checkpoint_id: int,
        handles: list[SubtaskStateHandle],
        expected: dict[str, int] | None,
    ) -> dict[str, OperatorMetadata]:
        by_op: dict[str, dict[int, SubtaskStateHandle]] = {}
        for h in handles:
            if h.checkpoint_id not in (0, checkpoint_id):
                raise CheckpointError(
                    f"a handle of operator {h.operator!r} subtask {h.subtask_index} belongs to "
                    f"checkpoint {h.checkpoint_id}, not {checkpoint_id}"
                )
            subtasks = by_op.setdefault(h.operator, {})
            prev = subtasks.get(h.subtask_index)
            if prev is None or h.attempt > prev.attempt:  # the latest attempt wins
                subtasks[h.subtask_index] = h
        for name, p in (expected or {}).items():
            if name not in by_op:
                raise CheckpointError(
                    f"checkpoint {checkpoint_id} is not committed: operator {name!r} "
                    f"acknowledged no subtask (expected {p})"
                )
        out: dict[str, OperatorMetadata] = {}
        for name, subtasks in sorted(by_op.items()):
            first = next(iter(subtasks.values()))
            p, max_p = first.parallelism, first.max_parallelism
            if expected and name in expected and expected[name] != p:
                raise CheckpointError(
                    f"operator {name!r} reports parallelism {p}, expected {expected[name]}"
                )
            missing = sorted(set(range(p)) - set(subtasks))
            if missing:
                raise CheckpointError(
                    f"checkpoint {checkpoint_id} is not committed: operator {name!r} is missing "
                    f"subtasks {missing} of {p}"
                )
            ordered = [subtasks[i] for i in range(p)]
            for h in ordered:
                if h.parallelism != p or h.max_parallelism != max_p:
                    raise CheckpointError(
                        f"operator {name!r}: subtask {h.subtask_index} reports parallelism "
                        f"{h.parallelism}/max {h.max_parallelism}, subtask 0 {p}/max {max_p}"
                    )
                want = compute_key_group_range_for_operator_index(max_p, p, h.subtask_index)
                if tuple(h.key_group_range) != want.to_tuple():
                    raise CheckpointError(
                        f"operator {name!r}: subtask {h.subtask_index} covers key groups "
                        f"{tuple(h.key_group_range)}, expected {want.to_tuple()}"
                    )
            out[name] = OperatorMetadata(
                name=name,
                parallelism=p,
                max_parallelism=max_p,
                key_serializer=first.key_serializer,
                subtasks=ordered,
            )
        return out
