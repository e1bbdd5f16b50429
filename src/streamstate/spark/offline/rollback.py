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

__all__ = ["RollbackPlan", "plan_rollback", "rollback", "spark_checkpoint_of"]

#: Spark's metadata-log file names: "<batch>", "<batch>.compact", and Hadoop's ".<name>.crc"
_LOG_FILE = re.compile(r"^\.?(\d+)(\.compact)?(\.crc)?$")
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
    _spark_fs: Any = None

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
    """Where the job's queries kept Spark's streaming checkpoint: what the newest epoch that
    says so recorded (``spark_checkpoint=``), else ``<job>/spark``."""
    for number in reversed(storage.epoch_numbers()):
        where = storage.read_epoch(number).owner.get("spark_checkpoint")
        if where:
            return str(where)
    return storage.url_of("spark")


def _fs_of(url: str, storage_options: dict[str, Any] | None) -> tuple[Any, str]:
    import fsspec

    if url.startswith("s3a://"):
        url = "s3://" + url[len("s3a://") :]
    fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    return fs, root.rstrip("/")


def _log_files(fs: Any, directory: str) -> list[tuple[str, int, bool]]:
    """(path, batch, compacted) of every file of a Spark metadata log directory."""
    try:
        names = fs.ls(directory, detail=False, refresh=True)
    except FileNotFoundError:
        return []
    except TypeError:  # a filesystem without refresh=
        names = fs.ls(directory, detail=False)
    out = []
    for name in names:
        m = _LOG_FILE.match(posixpath.basename(str(name).rstrip("/")))
        if m is not None:
            out.append((str(name), int(m.group(1)), m.group(2) is not None))
    return out


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
    where = spark_checkpoint or spark_checkpoint_of(storage)
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
    fs, root = _fs_of(where, storage_options)
    plan._spark_fs = fs
    if fs.exists(root):
        offsets = {b for _, b, _ in _log_files(fs, f"{root}/offsets")}
        if any(b > batch for b in offsets):
            # Spark re-runs batch+1 from offsets/batch+1 and reads offsets/batch as its start
            missing = sorted({batch, batch + 1} - offsets - {-1})
            if missing:
                raise CheckpointError(
                    f"cannot roll Spark's offset log in {root}/offsets back to batch {batch + 1}: "
                    f"it no longer has batch(es) {missing} (Spark keeps the last "
                    "spark.sql.streaming.minBatchesToRetain batches); roll back to a later "
                    "checkpoint"
                )
        for log, keep_upto in (("commits", batch), ("offsets", batch + 1)):
            plan.spark_files += [p for p, b, _ in _log_files(fs, f"{root}/{log}") if b > keep_upto]
        try:
            sources = fs.ls(f"{root}/sources", detail=False)
        except FileNotFoundError:
            sources = []
        for source in sources:
            for path, logged, compacted in _log_files(fs, str(source)):
                if logged <= batch + 1:
                    continue
                if compacted:
                    raise CheckpointError(
                        f"cannot roll Spark's source log back to batch {batch + 1}: {path} is a "
                        f"compaction of it up to batch {logged} (roll back to a checkpoint at "
                        "or after the last compaction, or restart the query with a new "
                        "Spark checkpoint)"
                    )
                plan.spark_files.append(path)
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
    fs = plan._spark_fs
    # newest first: Spark reads the latest entry of each log
    for path in sorted(plan.spark_files, key=_batch_of, reverse=True):
        if fs.exists(path):
            fs.rm(path)
    for directory in reversed(plan.checkpoints):
        storage.delete(directory)
    for path in plan.shared + plan.outputs:
        storage.delete(path)
    return plan


def _batch_of(path: str) -> int:
    m = _LOG_FILE.match(posixpath.basename(path))
    return int(m.group(1)) if m else -1
