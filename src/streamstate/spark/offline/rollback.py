"""Roll a streaming job back to an earlier complete checkpoint (``streamstate checkpoints
rollback <dir> --to N``), for when its latest ``_metadata`` is lost or corrupt and the query
refuses to start.

The job directory and Spark's streaming checkpoint must agree on the progress (SPEC §7), so both
are rolled back together. Checkpoint ``chk-N`` records the Spark micro-batch ``B`` whose input
its state has consumed (its ``batch_id``: ``B == N`` until the query's first no-data
micro-batch, which takes the next checkpoint id; ``streamstate.spark.driver.step.no_data``):

===============================  ============================================================
what                             after the rollback
===============================  ============================================================
``chk-M``, ``M > N``             deleted (complete or not), with the shared files (SSTs,
                                 incremental chains) that checkpoints after ``N`` wrote and the
                                 staged outputs ``outputs/batch-M``
Spark ``commits/M``              deleted for ``M > B``: micro-batch ``B`` stays done for Spark
Spark ``offsets/M``              deleted for ``M > B + 1``; ``offsets/B+1`` is kept, so Spark
                                 re-runs micro-batch ``B + 1`` on exactly the input it had
Spark ``sources/<i>/M``          deleted for ``M > B + 1`` (a file source's list of files
                                 taken; a compacted source log past ``B + 1`` is refused)
the parquet sink (``sink=``)     batches ``> N`` (checkpoint ids) are deleted, marker first:
                                 the re-run delivers each of them exactly once from the
                                 rolled-back state
===============================  ============================================================

Restarting the query then re-runs micro-batch ``B + 1`` (the state hosts reload ``chk-N``; a
no-data micro-batch that ``chk-N`` owes runs first, as checkpoint ``N + 1`` again) and every
later one. Without ``sink=``, batches the sink already delivered keep their first delivery (a
parquet sink skips a batch whose marker exists), which is exact for a deterministic function on
a source that plans the same batches again (files with ``maxFilesPerTrigger``); otherwise pass
the sink. The rollback takes a new epoch first, so a driver still running on the directory is
fenced and cannot commit over it.

The Spark checkpoint is the one of the directory given: the newest epoch records it relative to
the job directory, so a copied or moved directory rolls back its own. A recorded location outside
the directory (a Spark checkpoint kept elsewhere, or the absolute path an older streamstate
recorded, which in a copy names the original's) is refused unless ``spark_checkpoint=`` names it.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from typing import Any

from streamstate.checkpoint.storage import (
    CheckpointStorage,
    shared_file_checkpoint_id,
)
from streamstate.errors import CheckpointError
from streamstate.spark.driver.spark_checkpoint import (
    DEFAULT_SPARK_CHECKPOINT,
    SparkLog,
    batch_of,
    inside_job,
    resolve_spark_checkpoint,
    rollback_command,
)

__all__ = ["RollbackPlan", "plan_rollback", "rollback", "spark_checkpoint_of"]

OUTPUTS_DIR = "outputs"


@dataclasses.dataclass
class RollbackPlan:
    """What :func:`rollback` deletes (paths relative to their location)."""

    to: int
    storage: CheckpointStorage
    spark_checkpoint: str | None
    #: the Spark micro-batch whose input ``chk-<to>`` has consumed: Spark re-runs the next one
    spark_batch: int = 0
    checkpoints: list[str] = dataclasses.field(default_factory=list)
    shared: list[str] = dataclasses.field(default_factory=list)
    outputs: list[str] = dataclasses.field(default_factory=list)
    spark_files: list[str] = dataclasses.field(default_factory=list)
    sink_batches: list[int] = dataclasses.field(default_factory=list)
    sink: Any = None
    _spark_log: SparkLog | None = None

    def summary(self) -> list[tuple[str, str]]:
        def few(items: list[Any]) -> str:
            shown = ", ".join(str(i) for i in items[:6])
            return f"{len(items)}: {shown}{', ...' if len(items) > 6 else ''}" if items else "0"

        return [
            ("checkpoints removed", few(self.checkpoints)),
            ("shared files removed", few(self.shared)),
            ("staged outputs removed", few(self.outputs)),
            ("Spark log files removed", few(self.spark_files)),
            ("sink batches removed", few(self.sink_batches)),
            ("Spark checkpoint", self.spark_checkpoint or "(none found)"),
            ("Spark re-runs from micro-batch", str(self.spark_batch + 1)),
        ]


def spark_checkpoint_of(storage: CheckpointStorage) -> str:
    """Where the job's queries kept Spark's streaming checkpoint, seen from the directory
    ``storage`` was opened on: what the newest epoch that says so recorded (``spark_checkpoint=``;
    relative to the job directory when inside it), else ``<job>/spark``."""
    for number in reversed(storage.epoch_numbers()):
        where = storage.read_epoch(number).owner.get("spark_checkpoint")
        if where:
            try:
                return resolve_spark_checkpoint(str(where), storage)
            except ValueError as exc:
                raise CheckpointError(str(exc)) from None
    return storage.url_of(DEFAULT_SPARK_CHECKPOINT)


def _own_spark_checkpoint(storage: CheckpointStorage, to: int) -> str:
    """The Spark checkpoint of the job directory ``storage`` was opened on, when the epochs say
    it is inside that directory; a CheckpointError otherwise.

    A recorded location outside the directory may be another job's: a copy or a move of a job
    directory whose epochs an older streamstate wrote with absolute paths names the original's
    Spark checkpoint, and so does a copy of a job that kept its Spark checkpoint elsewhere.
    Editing it would roll back the other job's Spark log (and leave this one's ahead of its
    state), so the user says which one it is."""
    where = spark_checkpoint_of(storage)
    job = storage.url_of("")
    if inside_job(where, job) is not None:
        return where
    own = storage.url_of(DEFAULT_SPARK_CHECKPOINT)
    raise CheckpointError(
        f"the epochs of {job} record Spark's streaming checkpoint at {where}, outside this "
        "directory: if the directory is a copy or a move of a job directory, that is the "
        "original job's Spark checkpoint, and rolling it back would change the original. Name "
        f"the Spark checkpoint of this directory: {rollback_command(job, to)} "
        f"--spark-checkpoint {own} (a copy that brought its spark/ directory), or "
        f"--spark-checkpoint {where} if it really is this job's"
    )


def plan_rollback(
    storage: CheckpointStorage,
    to: int,
    *,
    spark_checkpoint: str | None = None,
    sink: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> RollbackPlan:
    """What rolling back to ``chk-<to>`` deletes; raises CheckpointError (nothing changed) if
    ``chk-<to>`` is not complete and intact or Spark's logs cannot be rolled back."""
    target = storage.load(to)
    if target.is_savepoint:
        raise CheckpointError(f"{target.url} is a savepoint; roll back to a checkpoint id")
    problems = storage.problems(target, deep=True)
    if problems:
        raise CheckpointError(
            f"cannot roll back to {target.url}: it is not intact ({'; '.join(problems)}); "
            "pick an earlier checkpoint"
        )
    where = spark_checkpoint or _own_spark_checkpoint(storage, to)
    # the Spark micro-batch of the checkpoint (older checkpoints: their id)
    batch = int(target.metadata.properties.get("batch_id", to))
    plan = RollbackPlan(to, storage, where, batch)
    plan.checkpoints = [storage.checkpoint_directory(c) for c in storage.checkpoint_ids() if c > to]
    plan.shared = [
        p for p in storage.walk_files("shared") if (shared_file_checkpoint_id(p) or -1) > to
    ]
    for name, is_dir in storage.list_dir(OUTPUTS_DIR):
        m = re.match(r"^batch-(\d+)$", name)
        if is_dir and m and int(m.group(1)) > to:
            plan.outputs.append(f"{OUTPUTS_DIR}/{name}")
    spark_log = plan._spark_log = SparkLog(where, storage_options)
    if spark_log.exists():
        offsets = {f.batch for f in spark_log.files("offsets")}
        if any(b > batch for b in offsets):
            # Spark re-runs batch+1 from offsets/batch+1 and reads offsets/batch as its start
            missing = sorted({batch, batch + 1} - offsets - {-1})
            if missing:
                raise CheckpointError(
                    f"cannot roll Spark's offset log in {spark_log.root}/offsets back to batch "
                    f"{batch + 1}: it no longer has batch(es) {missing} (Spark keeps the last "
                    "spark.sql.streaming.minBatchesToRetain batches); roll back to a later "
                    "checkpoint"
                )
        for log, keep_upto in (("commits", batch), ("offsets", batch + 1)):
            plan.spark_files += [f.path for f in spark_log.files(log) if f.batch > keep_upto]
        for source in spark_log.source_logs():
            for f in source:
                if f.batch <= batch + 1:
                    continue
                if f.compacted:
                    raise CheckpointError(
                        f"cannot roll Spark's source log back to batch {batch + 1}: {f.path} is "
                        f"a compaction of it up to batch {f.batch} (roll back to a checkpoint at "
                        "or after the last compaction, or restart the query with a new "
                        "Spark checkpoint)"
                    )
                plan.spark_files.append(f.path)
    if sink is not None:
        from streamstate.spark.driver.sinks import FileSink

        plan.sink = FileSink(sink, storage_options)
        plan.sink_batches = [b for b in plan.sink.committed_batches() if b > to]
        try:
            names = plan.sink.fs.ls(plan.sink.root, detail=False)
        except FileNotFoundError:
            names = []
        for name in names:
            m = re.match(r"^batch=(\d+)$", posixpath.basename(str(name).rstrip("/")))
            if m and int(m.group(1)) > to and int(m.group(1)) not in plan.sink_batches:
                plan.sink_batches.append(int(m.group(1)))
        plan.sink_batches.sort()
    return plan


def rollback(
    storage: CheckpointStorage,
    to: int,
    *,
    spark_checkpoint: str | None = None,
    sink: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> RollbackPlan:
    """Roll the job back to ``chk-<to>`` (see the module docstring); returns what was done.

    The order makes an interrupted rollback safe to run again: a new epoch first (a running
    driver is fenced), then the sink's markers and batches, Spark's logs, and last the
    checkpoints and their files."""
    plan = plan_rollback(
        storage, to, spark_checkpoint=spark_checkpoint, sink=sink, storage_options=storage_options
    )
    storage.acquire_epoch(action=f"rollback to chk-{to}")
    if plan.sink is not None:
        s = plan.sink
        for b in plan.sink_batches:
            marker, final = s._p("_commits", str(b)), s._p(f"batch={b}")
            for path in (marker, final, s._p("_staging", f"batch={b}")):
                if s.fs.exists(path):
                    s.fs.rm(path, recursive=True)
    spark_log = plan._spark_log
    assert spark_log is not None
    # newest first: Spark reads the latest entry of each log
    for path in sorted(plan.spark_files, key=batch_of, reverse=True):
        spark_log.remove(path)
    for directory in reversed(plan.checkpoints):
        storage.delete(directory)
    for path in plan.shared + plan.outputs:
        storage.delete(path)
    return plan
