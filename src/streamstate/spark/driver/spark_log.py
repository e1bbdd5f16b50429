"""What Spark's streaming checkpoint says about a query's progress, read without Spark.

Spark keeps, in the query's ``checkpointLocation``, an *offset log* (``offsets/<b>``: the input of
micro-batch ``b``, written before it runs) and a *commit log* (``commits/<b>``: written after its
sink finished), plus a log per file source (``sources/<i>/<b>``). The names of their files are all
the driver needs: when the query starts, Spark re-runs the last planned micro-batch if it has no
commit, and otherwise plans the next one (:meth:`SparkLog.next_batch`). The driver reads them
through fsspec, before Spark starts (``streamstate.spark.driver.commit.check_start``), and
``streamstate checkpoints rollback`` cuts them (``streamstate.spark.driver.rollback``).
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from typing import Any

__all__ = ["LogFile", "SparkLog"]

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
