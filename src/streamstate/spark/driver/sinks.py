"""Where the outputs of a streaming keyed query go.

The subtasks of a micro-batch stage their outputs as Parquet files next to the state
checkpoint; the driver commits the checkpoint and then hands the staged files to the sink as a
:class:`StagedBatch`. If the driver dies after the commit and Spark replays the micro-batch, the
sink gets the same staged files again (the batch is not recomputed), so a sink that is idempotent
per batch id makes the query exactly-once end to end.

The batch id a sink sees is the **checkpoint id** of the step: the same as Spark's micro-batch
id until the query's first no-data micro-batch (:mod:`streamstate.spark.driver.step.no_data`),
which takes the next id, as every later step does. It is stable across replays and restarts,
so it stays the key to deduplicate by; :attr:`StagedBatch.spark_batch` names Spark's micro-batch and
:attr:`StagedBatch.no_data` marks a micro-batch without input.

===================  ==================================  =====================================
name                 class                               guarantee
===================  ==================================  =====================================
``"parquet"``        :class:`FileSink` (``path=``)       exactly-once: ``<path>/batch=<b>/`` is
                                                         renamed into place, then
                                                         ``<path>/_commits/<b>`` is written; a
                                                         replayed batch with a marker is
                                                         skipped
``"memory"``         :class:`MemorySink`                 exactly-once (a replay replaces the
                                                         batch); for tests
``"console"``        :class:`ConsoleSink`                prints each batch (at-least-once)
``"foreach_batch"``  :class:`ForeachBatchSink`           ``callback(df, batch_id)``;
                     (``callback=``)                     at-least-once unless the callback
                                                         dedups by batch id
===================  ==================================  =====================================
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import threading
from abc import ABC, abstractmethod
from typing import Any

__all__ = [
    "ConsoleSink",
    "FileSink",
    "ForeachBatchSink",
    "MemorySink",
    "Sink",
    "StagedBatch",
    "sink_from",
    "spark_readable",
]


def spark_readable(url: str) -> str:
    """A URL Spark's Hadoop filesystems understand (``s3://`` is ``s3a://`` there)."""
    if url.startswith("s3://"):
        return "s3a://" + url[len("s3://") :]
    return url


@dataclasses.dataclass
class StagedBatch:
    """The committed outputs of one micro-batch, as staged files in checkpoint storage."""

    #: the checkpoint id of the step (see the module docstring): the sink's dedup key
    batch_id: int
    #: StagedOutput values (path relative to the storage root, size, rows)
    files: list[Any]
    storage: Any
    #: Arrow and Spark schemas of the outputs
    schema: Any
    struct: Any
    spark: Any
    #: the Spark micro-batch whose input the state had consumed (None: unknown)
    spark_batch: int | None = None
    #: a no-data micro-batch: only timers fired (streamstate.spark.driver.step.no_data)
    no_data: bool = False

    @property
    def rows(self) -> int:
        """Every staged row as dicts (reads the files)."""
        return sum(f.rows for f in self.files)

    def urls(self) -> list[str]:
        """The staged files' URLs (each checked to be a file of the checkpoint, not a link:
        whoever reads a URL follows links)."""
        for f in self.files:
            self.storage.size(f.path)
        return [self.storage.url_of(f.path) for f in self.files]

    def to_arrow(self) -> Any:
        """All outputs of the batch as one Arrow table (read on the driver)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        tables = []
        for f in self.files:
            with self.storage.open_read(f.path) as fh:
                tables.append(pq.read_table(fh))
        if not tables:
            return self.schema.empty_table()
        return pa.concat_tables(tables).cast(self.schema)

    def to_dataframe(self) -> Any:
        """The outputs as a Spark DataFrame (read by Spark where it can reach the files)."""
        if not self.files:
            return self.spark.createDataFrame([], self.struct)
        if self.storage.url.startswith("memory://"):
            return self.spark.createDataFrame(self.to_arrow())
        urls = [spark_readable(u) for u in self.urls()]
        return self.spark.read.schema(self.struct).parquet(*urls)


class Sink(ABC):
    """Receives the committed outputs of each micro-batch, in batch-id order."""

    def open(self, query_name: str) -> None:  # noqa: B027 - optional hook
        """The query starts."""

    @abstractmethod
    def write(self, batch: StagedBatch) -> None:
        """Deliver one committed micro-batch (called again with the same id on a replay)."""

    def mirror_to(self, storage: Any, directory: str) -> None:  # noqa: B027 - optional hook
        """Spark Connect: the query's micro-batches run on the server, which writes what this
        sink receives in its process under ``directory`` of the checkpoint's ``storage``, for
        the client's copy to :meth:`sync` (a sink that keeps its batches in memory; the others
        deliver where the client reads them anyway)."""

    def sync(self) -> None:  # noqa: B027 - optional hook
        """Spark Connect client: take in what the server's copy received (:meth:`mirror_to`)."""


class MemorySink(Sink):
    """Keeps every batch's outputs in driver memory (tests, notebooks).

    A replayed batch replaces the earlier delivery, so the content is exactly-once.
    """

    def __init__(self) -> None:
        self.batches: dict[int, Any] = {}
        self._lock = threading.Lock()

    #: Spark Connect: (checkpoint storage, directory) where the server-side copy of this sink
    #: writes each batch (Arrow IPC) for the client's copy to read (:meth:`sync`)
    _mirror: tuple[Any, str] | None = None

    def mirror_to(self, storage: Any, directory: str) -> None:
        self._mirror = (storage, directory)

    def sync(self) -> None:
        """Client of a Spark Connect query: load the batches the server delivered so far."""
        import pyarrow as pa

        if self._mirror is None:
            return
        storage, directory = self._mirror
        loaded = {}
        for name, is_dir in storage.list_dir(directory):
            name = name.rsplit("/", 1)[-1]
            if is_dir or not name.endswith(".arrow"):
                continue
            with pa.ipc.open_stream(storage.read_bytes(f"{directory}/{name}")) as reader:
                loaded[int(name.split(".")[0])] = reader.read_all()
        with self._lock:
            self.batches.update(loaded)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def write(self, batch: StagedBatch) -> None:
        table = batch.to_arrow()
        with self._lock:
            self.batches[batch.batch_id] = table
        if self._mirror is not None:
            import pyarrow as pa

            storage, directory = self._mirror
            out = pa.BufferOutputStream()
            with pa.ipc.new_stream(out, table.schema) as writer:
                writer.write_table(table)
            storage.put_atomic(
                f"{directory}/{batch.batch_id:012d}.arrow", out.getvalue().to_pybytes()
            )

    def table(self) -> Any:
        """Every output so far, in batch order, as one Arrow table."""
        import pyarrow as pa

        with self._lock:
            tables = [self.batches[b] for b in sorted(self.batches)]
        return pa.concat_tables(tables) if tables else None

    def rows(self) -> list[dict[str, Any]]:
        """Every delivered row, as dicts, in batch order."""
        table = self.table()
        return [] if table is None else table.to_pylist()

    def to_pandas(self) -> Any:
        """The delivered rows as a pandas DataFrame."""
        import pandas as pd

        table = self.table()
        return pd.DataFrame() if table is None else table.to_pandas()


class ConsoleSink(Sink):
    """Prints up to ``rows`` outputs of every batch."""

    def __init__(self, rows: int = 20) -> None:
        self.max_rows = rows

    def write(self, batch: StagedBatch) -> None:
        table = batch.to_arrow()
        print(f"-------------------------------------------\nBatch: {batch.batch_id}")
        print(f"({table.num_rows} rows)")
        if table.num_rows:
            print(table.slice(0, self.max_rows).to_pandas().to_string(index=False))


class ForeachBatchSink(Sink):
    """Calls ``callback(df, batch_id)`` with each batch's outputs as a Spark DataFrame.

    Like Spark's ``foreachBatch``, a replayed batch calls it again with the same id: dedup by
    ``batch_id`` (or write idempotently) for exactly-once. ``batch_id`` is the checkpoint id of
    the step (Spark's micro-batch id until the first no-data micro-batch; see the module
    docstring).
    """

    def __init__(self, callback: Any) -> None:
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {callback!r}")
        self.callback = callback

    def write(self, batch: StagedBatch) -> None:
        self.callback(batch.to_dataframe(), batch.batch_id)


class FileSink(Sink):
    """Parquet files under ``path``, exactly-once per micro-batch.

    Batch ``b``'s staged files are copied (hard-linked when possible) into
    ``<path>/_staging/batch=<b>/``, the directory is renamed to ``<path>/batch=<b>/`` and the
    marker ``<path>/_commits/<b>`` is written. A replayed batch whose marker exists is skipped; a
    half-written one is replaced. ``spark.read.parquet(path)`` reads every batch (with a
    ``batch`` partition column); on object stores without atomic rename, read only the batches
    that have a marker (:meth:`FileSink.committed_batches`).
    """

    def __init__(self, path: str, storage_options: dict[str, Any] | None = None) -> None:
        import fsspec

        self.path = path
        self.fs, root = fsspec.core.url_to_fs(path, **(storage_options or {}))
        self.root = root.rstrip("/")
        self._local = "file" in (
            self.fs.protocol if isinstance(self.fs.protocol, tuple | list) else (self.fs.protocol,)
        )

    def _p(self, *parts: str) -> str:
        return "/".join((self.root, *parts))

    def committed_batches(self) -> list[int]:
        """The batch ids whose outputs are committed (a marker under ``_commits/``)."""
        try:
            names = self.fs.ls(self._p("_commits"), detail=False)
        except FileNotFoundError:
            return []
        out = []
        for n in names:
            base = n.rstrip("/").rsplit("/", 1)[-1]
            if base.isdigit():
                out.append(int(base))
        return sorted(out)

    def write(self, batch: StagedBatch) -> None:
        b = batch.batch_id
        marker = self._p("_commits", str(b))
        if self.fs.exists(marker):
            return  # delivered before the crash that made Spark replay it
        staging = self._p("_staging", f"batch={b}")
        final = self._p(f"batch={b}")
        for d in (staging, final):
            if self.fs.exists(d):
                self.fs.rm(d, recursive=True)
        self.fs.makedirs(staging, exist_ok=True)
        for i, f in enumerate(batch.files):
            self._copy(batch.storage, f.path, f"{staging}/part-{b:06d}-{i:05d}.parquet")
        self.fs.makedirs(self._p("_commits"), exist_ok=True)
        self.fs.mv(staging, final, recursive=True)
        info = json.dumps({"batch": b, "files": len(batch.files), "rows": batch.rows}).encode()
        if self._local:
            tmp = marker + ".tmp"
            with open(tmp, "wb") as fh:
                fh.write(info)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, marker)
        else:
            self.fs.pipe_file(marker, info)

    def _copy(self, storage: Any, path: str, target: str) -> None:
        # the storage opens the staged file itself (a regular file inside the checkpoint,
        # reached through no link): a link planted in the checkpoint is refused, not delivered
        with storage.open_read(path) as src:
            source = storage.url_of(path)
            if self._local and "://" not in source and _link_opened(src, source, target):
                return
            with self.fs.open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, 8 << 20)

    def read_arrow(self) -> Any:
        """Every committed batch's outputs (with a ``batch`` column), read on the driver."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        tables = []
        for b in self.committed_batches():
            d = self._p(f"batch={b}")
            for name in sorted(self.fs.ls(d, detail=False)):
                if name.endswith(".parquet"):
                    with self.fs.open(name, "rb") as fh:
                        t = pq.read_table(fh)
                    tables.append(t.append_column("batch", pa.array([b] * t.num_rows, pa.int64())))
        return pa.concat_tables(tables) if tables else None


def _link_opened(src: Any, source: str, target: str) -> bool:
    """Hard-link ``source`` to ``target`` if it is still the file ``src`` has open (the name
    may have been replaced since it was opened); False (nothing left at ``target``) if it
    cannot be linked or is another file now."""
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError:
        return False
    opened, linked = os.fstat(src.fileno()), os.stat(target, follow_symlinks=False)
    if (opened.st_dev, opened.st_ino) == (linked.st_dev, linked.st_ino):
        return True
    os.unlink(target)
    return False


def sink_from(
    sink: Any,
    path: str | None = None,
    callback: Any = None,
    storage_options: dict[str, Any] | None = None,
) -> Sink:
    """A sink from a name (see the module docstring) or a :class:`Sink` instance."""
    if isinstance(sink, Sink):
        return sink
    if sink in ("parquet", "file"):
        if path is None:
            raise ValueError("the parquet sink needs path=")
        return FileSink(path, storage_options)
    if sink == "memory":
        return MemorySink()
    if sink == "console":
        return ConsoleSink()
    if sink == "foreach_batch":
        return ForeachBatchSink(callback)
    raise ValueError(
        f"unknown sink {sink!r}; use 'parquet' (with path=), 'memory', 'console', "
        "'foreach_batch' (with callback=) or a Sink instance"
    )
