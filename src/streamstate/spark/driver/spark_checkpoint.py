"""Spark's own streaming checkpoint: where it is, and what its logs say of a query's progress.

By default it is ``<checkpoint>/spark``, next to the state checkpoint; ``write_stream(...,
spark_checkpoint=...)`` puts it elsewhere, e.g. a local or HDFS path when the state checkpoint
is on an object store Spark has no Hadoop connector for (``s3a://`` needs ``hadoop-aws``).

A query records where it put Spark's checkpoint in its epoch file, so that ``streamstate
checkpoints rollback`` edits the right logs. Inside the state checkpoint (the default) the record
is relative to it (``"spark"``): a copied or moved job directory then names its own Spark
checkpoint, never the original's (:func:`recorded_spark_checkpoint`,
:func:`resolve_spark_checkpoint`). A location outside it is recorded as given.

Spark keeps there an *offset log* (``offsets/<b>``: the input of micro-batch ``b``, written
before it runs) and a *commit log* (``commits/<b>``: written after its sink finished), plus a
log per file source (``sources/<i>/<b>``). The names of their files are all the driver needs:
when the query starts, Spark re-runs the last planned micro-batch if it has no commit, and
otherwise plans the next one (:meth:`SparkLog.next_batch`). The driver reads them through
fsspec before Spark starts (``CheckpointLog.check_start`` of
``streamstate.spark.driver.step.commit``), and ``streamstate checkpoints rollback`` cuts them
(``streamstate.spark.offline.rollback``). Both the per-batch driver and the offline tools use
this module, so it sits directly in ``driver/``.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import re
from typing import Any

from streamstate.spark.driver.session import is_connect
from streamstate.spark.driver.sinks import spark_readable

__all__ = [
    "DEFAULT_SPARK_CHECKPOINT",
    "LogFile",
    "SparkLog",
    "batch_of",
    "inside_job",
    "recorded_spark_checkpoint",
    "resolve_spark_checkpoint",
    "rollback_command",
    "spark_checkpoint_location",
]

#: Spark's checkpoint relative to the state checkpoint directory, unless ``spark_checkpoint=``
DEFAULT_SPARK_CHECKPOINT = "spark"


def spark_checkpoint_location(
    spark: Any, default: str, given: str | None, state_checkpoint: str
) -> str:
    """The location of Spark's streaming checkpoint as Spark reads it: ``given`` (made
    absolute) or ``default``; a ValueError naming the setting if Hadoop has no filesystem for
    its scheme (``s3a://`` needs the ``hadoop-aws`` jar) or if it is the state checkpoint
    directory itself."""
    if given is not None:
        if not isinstance(given, str) or not given.strip():
            raise ValueError(f"spark_checkpoint must be a path or URL, got {given!r}")
        location = given if "://" in given else os.path.abspath(given)
        if location.rstrip("/") == state_checkpoint.rstrip("/"):
            raise ValueError(
                f"spark_checkpoint={given!r} is the state checkpoint directory itself; give "
                f"Spark its own directory (the default is {default})"
            )
    else:
        location = default
    location = spark_readable(location)
    scheme = location.split("://", 1)[0] if "://" in location else "file"
    if scheme != "file" and not is_connect(spark):  # Connect: no py4j, the server checks
        try:
            jvm = spark.sparkContext._jvm
            conf = spark.sparkContext._jsc.hadoopConfiguration()
            jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass(scheme, conf)
        except Exception as exc:
            what = "spark_checkpoint" if given is not None else "the default spark_checkpoint"
            raise ValueError(
                f"Spark cannot write its streaming checkpoint to {location} ({what}): Hadoop "
                f"has no filesystem for {scheme}:// ({str(exc).splitlines()[0][:200]}). Add the "
                "connector (for s3a:// the hadoop-aws jar matching Spark's Hadoop) or pass "
                "write_stream(..., spark_checkpoint=<a local or HDFS path>)"
            ) from None
    return location


def _comparable(url: str) -> str:
    """``url`` in one spelling per place: no ``file:`` scheme, ``s3a://`` as ``s3://``, no
    trailing slash."""
    for prefix in ("file://", "file:"):
        if url.startswith(prefix):
            url = url[len(prefix) :]
            break
    if url.startswith("s3a://"):
        url = "s3://" + url[len("s3a://") :]
    return url.rstrip("/")


def inside_job(location: str, job_url: str) -> str | None:
    """``location`` relative to the job directory ``job_url`` when it lies inside it (a plain
    relative path, "/"-separated), else None.

    >>> inside_job("/data/ck/spark", "/data/ck"), inside_job("s3a://b/ck/spark", "s3://b/ck")
    ('spark', 'spark')
    >>> inside_job("/data/ck-copy/spark", "/data/ck") is None
    True
    """
    where, job = _comparable(location), _comparable(job_url)
    if not where.startswith(job + "/"):
        return None
    relative = posixpath.normpath(where[len(job) + 1 :])
    return None if relative in (".", "") or relative.startswith("..") else relative


def recorded_spark_checkpoint(location: str, job_url: str) -> str:
    """What a query records in its epoch for Spark's checkpoint ``location``: the path relative
    to the job directory when it is inside it, else ``location`` itself."""
    return inside_job(location, job_url) or location


def resolve_spark_checkpoint(recorded: str, storage: Any) -> str:
    """The location of a Spark checkpoint an epoch recorded, seen from the job directory
    ``storage`` was opened on: a relative record is inside it; an absolute one (a location
    outside the job directory, or the record of a streamstate that stored absolute paths) is
    taken as it is. A relative record that leaves the directory raises ValueError."""
    if "://" in recorded or recorded.startswith("/") or recorded.startswith("file:"):
        return recorded
    relative = posixpath.normpath(recorded)
    if relative in (".", "") or relative.startswith("..") or "\\" in recorded:
        raise ValueError(
            f"the Spark checkpoint recorded in {storage.url_of('_epochs')} is {recorded!r}, "
            "which is not a path inside the job directory"
        )
    return str(storage.url_of(relative))


def rollback_command(job_url: str, to: int, spark_checkpoint: str | None = None) -> str:
    """The command that rolls the job in ``job_url`` back to ``chk-<to>``: with
    ``--spark-checkpoint`` when Spark's checkpoint lies outside the job directory (the rollback
    does not take it from the epoch then, see :func:`plan_rollback`)."""
    command = f"streamstate checkpoints rollback {job_url} --to {to}"
    if spark_checkpoint is not None and inside_job(spark_checkpoint, job_url) is None:
        command += f" --spark-checkpoint {spark_checkpoint}"
    return command


#: Spark's metadata-log file names: "<batch>", "<batch>.compact", and Hadoop's ".<name>.crc"
_LOG_FILE = re.compile(r"^\.?(\d+)(\.compact)?(\.crc)?$")


@dataclasses.dataclass(frozen=True)
class LogFile:
    """One file of a Spark metadata log."""

    path: str
    batch: int
    #: a compaction of the log up to ``batch`` (file-source logs)
    compacted: bool


def batch_of(path: str) -> int:
    """The micro-batch of a log file's path (-1 if it is not one).

    >>> batch_of("ck/spark/offsets/.7.crc"), batch_of("ck/spark/offsets/7"), batch_of("x/tmp")
    (7, 7, -1)
    """
    m = _LOG_FILE.match(posixpath.basename(path))
    return int(m.group(1)) if m else -1


class SparkLog:
    """The logs of one Spark streaming checkpoint (a path or URL fsspec understands)."""

    def __init__(self, location: str, storage_options: dict[str, Any] | None = None) -> None:
        import fsspec

        url = location
        if url.startswith("s3a://"):
            url = "s3://" + url[len("s3a://") :]
        fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
        self.location = location
        self.fs = fs
        self.root = root.rstrip("/")

    def exists(self) -> bool:
        return bool(self.fs.exists(self.root))

    def files(self, log: str) -> list[LogFile]:
        """Every file of the log ``log`` (``"offsets"``, ``"commits"``, ``"sources/0"``, ...)."""
        return self._files(f"{self.root}/{log}")

    def _files(self, directory: str) -> list[LogFile]:
        fs = self.fs
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
                out.append(LogFile(str(name), int(m.group(1)), m.group(2) is not None))
        return out

    def source_logs(self) -> list[list[LogFile]]:
        """The files of each file source's log (``sources/<i>``)."""
        try:
            sources = self.fs.ls(f"{self.root}/sources", detail=False)
        except FileNotFoundError:
            return []
        return [self._files(str(source)) for source in sources]

    def last(self, log: str) -> int:
        """The newest micro-batch of ``log`` (-1: none)."""
        return max((f.batch for f in self.files(log) if not f.compacted), default=-1)

    def next_batch(self) -> int:
        """The micro-batch Spark runs first when the query starts on this checkpoint: the last
        planned one again if it has no commit, else the one after the last commit (0 for a new
        checkpoint)."""
        planned, committed = self.last("offsets"), self.last("commits")
        return planned if planned > committed else committed + 1

    def remove(self, path: str) -> None:
        if self.fs.exists(path):
            self.fs.rm(path)
