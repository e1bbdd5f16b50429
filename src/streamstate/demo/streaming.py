"""The main job on Spark: a resumable streaming query with a local checkpoint directory.

Each run appends ``batches`` Parquet files of generated page views (one micro-batch each, event
time continuing where the previous run stopped) to ``<directory>/input/`` and runs
:func:`~streamstate.demo.job.page_views_per_hour` over them with
``keyed_process(...).write_stream("parquet", ...)`` until they are consumed
(``availableNow``). The state is checkpointed after every micro-batch in
``<directory>/checkpoint/``; the hours the watermark closed are written exactly once to
``<directory>/output/``. A second run resumes from the latest checkpoint: the hour that was
still open continues counting from its restored state.

Layout of ``<directory>``::

    streamstate-demo.json   what was generated so far (slices, apps, seed)
    input/part-<i>.parquet  slice i of the event stream (app string, ts long ms)
    checkpoint/             streamstate checkpoints, staged outputs, Spark's own checkpoint
    output/                 the results: batch=<b>/*.parquet and _commits/<b>
    spark.log               the Spark JVM's own output (when the demo starts Spark)
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import logging
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from streamstate.demo.job import HOUR_MS, page_view_batch, page_views_per_hour
from streamstate.spark.driver.plan.resolve import (
    BACKEND_SWITCH,
    STREAMSTATE_EVENT,
    checkpointed_backend,
)

__all__ = [
    "DEFAULT_DIRECTORY",
    "DemoRun",
    "hour_label",
    "print_run",
    "run_streaming",
    "spark_session",
]

DEFAULT_DIRECTORY = ".streamstate-demo"
MARKER = "streamstate-demo.json"
OPERATOR = "page-views-per-hour"
OUTPUT_SCHEMA = "app string, hour long, views long"
#: event time of the first view, and event time covered by each micro-batch (input file)
STREAM_START_MS = int(datetime.datetime(2026, 1, 5, tzinfo=datetime.UTC).timestamp() * 1000)
SLICE_MS = 20 * 60_000
DISORDER_MS = 2 * 60_000
#: larger than the disorder: no view arrives after the watermark passed it (none is dropped)
WATERMARK_DELAY_MS = 5 * 60_000
#: input files get increasing modification times from here (Spark's file source takes files
#: in modification-time order)
_MTIME_BASE = 1_700_000_000


@dataclasses.dataclass
class DemoRun:
    """What one run of the streaming demo did."""

    directory: str
    #: the checkpoint the run started from (None: a fresh start) and its parallelism
    resumed_from: int | None
    resumed_parallelism: int | None
    parallelism: int
    #: the figures of each micro-batch (``KeyedStreamingQuery.batches``; those without input,
    #: which close the hours the last input's watermark passed, have ``no_data``)
    batches: list[dict[str, Any]]
    #: views generated for this run, views processed by it, seconds of streaming
    events: int
    processed: int
    seconds: float
    #: the latest complete checkpoint after the run, and the watermark of its last batch
    checkpoint_id: int | None
    watermark: int
    #: every closed hour so far (all runs): (app, hour number, views), and those of this run
    results: list[tuple[str, int, int]]
    new: set[tuple[str, int]]
    #: event time at which this run's input starts: a new result of an earlier hour was
    #: counted partly from the state restored from ``resumed_from``
    input_start_ms: int = 0
    #: "heap" or "rocksdb"
    state_backend: str = "heap"

    @property
    def events_per_second(self) -> float:
        return self.processed / self.seconds if self.seconds else 0.0


def spark_session(
    master: str = "local[2]",
    parallelism: int = 2,
    log: str | None = None,
    conf: dict[str, str] | None = None,
) -> Any:
    """A quiet local SparkSession for the demo: no UI, no console progress bars, ERROR logs.

    With ``log`` (a file path) the Spark JVM's own output (its start-up warnings, and anything
    it prints later) goes to that file instead of the terminal; errors still reach Python as
    exceptions.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName("streamstate-demo")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(parallelism))
    )
    for key, value in (conf or {}).items():  # e.g. a local cluster's driver settings
        builder = builder.config(key, value)
    saved = None
    if log is not None:
        # the JVM is started by getOrCreate() and inherits file descriptor 2 for its lifetime
        sys.stderr.flush()
        saved = os.dup(2)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
    try:
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel("ERROR")
    finally:
        if saved is not None:
            os.dup2(saved, 2)
            os.close(saved)
    return session


def hour_label(hour: int) -> str:
    t = datetime.datetime.fromtimestamp(hour * HOUR_MS / 1000, datetime.UTC)
    return t.strftime("%Y-%m-%d %H:00")


def _time_label(ms: int) -> str:
    if ms < STREAM_START_MS:
        return "-"
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%H:%M")


def _prepare_directory(directory: str, fresh: bool) -> dict[str, Any]:
    """Read the demo's marker; with ``fresh`` delete the directory first (only if it is a demo
    directory or empty: ``--fresh`` must never delete anything else)."""
    marker = os.path.join(directory, MARKER)
    if fresh and os.path.exists(directory):
        if not os.path.isdir(directory):
            raise ValueError(f"{directory} is not a directory")
        if os.listdir(directory) and not os.path.exists(marker):
            raise ValueError(
                f"--fresh deletes the demo directory, but {directory} has no {MARKER}: "
                "it does not look like one; choose another --dir"
            )
        shutil.rmtree(directory)
    os.makedirs(os.path.join(directory, "input"), exist_ok=True)
    if os.path.exists(marker):
        with open(marker) as f:
            return dict(json.load(f))
    if len(os.listdir(directory)) > 1:
        raise ValueError(f"{directory} is not empty and has no {MARKER}; choose another --dir")
    return {"slices": 0, "events": 0}


def _write_marker(directory: str, info: dict[str, Any]) -> None:
    path = os.path.join(directory, MARKER)
    with open(path + ".tmp", "w") as f:
        json.dump(info, f, indent=1)
    os.replace(path + ".tmp", path)


def _write_slices(
    directory: str, first: int, count: int, per_slice: int, apps: int, seed: int
) -> int:
    """Write input files ``first .. first + count - 1``; returns the number of views."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    total = 0
    for i in range(first, first + count):
        views = page_view_batch(
            i,
            per_slice,
            start_ms=STREAM_START_MS,
            span_ms=SLICE_MS,
            apps=apps,
            seed=seed,
            disorder_ms=DISORDER_MS,
        )
        table = pa.table(
            {"app": [a for a, _ in views], "ts": pa.array([t for _, t in views], pa.int64())}
        )
        path = os.path.join(directory, "input", f"part-{i:06d}.parquet")
        pq.write_table(table, path + ".tmp")
        stamp = _MTIME_BASE + 10 * i
        os.utime(path + ".tmp", (stamp, stamp))
        os.replace(path + ".tmp", path)  # the file source ignores names starting with "."
        total += len(views)
    return total


def _latest(checkpoint: str) -> Any:
    from streamstate.checkpoint.storage import FileSystemCheckpointStorage
    from streamstate.errors import CheckpointNotFoundError

    if not os.path.isdir(checkpoint):
        return None
    try:
        return FileSystemCheckpointStorage(checkpoint, "").latest_checkpoint()
    except CheckpointNotFoundError:
        return None


def run_streaming(
    directory: str = DEFAULT_DIRECTORY,
    *,
    events: int = 200_000,
    batches: int = 8,
    apps: int = 5,
    parallelism: int | None = None,
    fresh: bool = False,
    seed: int = 7,
    spark: Any = None,
    master: str = "local[2]",
    console: Any = None,
    state_backend: str | None = None,
) -> DemoRun:
    """Generate ``events`` more page views as ``batches`` micro-batches and stream them through
    the job, resuming from the checkpoint in ``directory`` if there is one; prints progress per
    micro-batch, then the results table and a summary on ``console``.

    ``spark``: a SparkSession to use (default: a quiet ``master`` session, stopped at the end).
    ``parallelism``: subtasks (default: the checkpoint's, else 2); another value than the
    checkpoint's rescales the state by key group. ``state_backend``: ``"heap"`` or
    ``"rocksdb"`` (default: the checkpoint's, else heap); a checkpoint of either restores into
    the other.
    """
    from rich.console import Console

    if events < batches or batches < 1:
        raise ValueError(f"need batches >= 1 and events >= batches, got {events=}, {batches=}")
    console = console or Console()
    directory = os.path.abspath(directory)
    info = _prepare_directory(directory, fresh)
    if info["slices"] and (info.get("apps"), info.get("seed")) != (apps, seed):
        apps, seed = info["apps"], info["seed"]  # the stream continues as it started
    checkpoint = os.path.join(directory, "checkpoint")
    latest = _latest(checkpoint)
    resumed_parallelism = None
    #: events of streamstate's log that the demo announced itself (not logged again)
    announced: set[str] = set()
    if latest is None:
        console.print(f"[bold]fresh start[/] in {directory}")
    else:
        op = latest.metadata.operators.get(OPERATOR)
        resumed_parallelism = None if op is None else op.parallelism
        props = latest.metadata.properties
        console.print(
            f"[bold]resuming from checkpoint {latest.checkpoint_id}[/] in {checkpoint} "
            f"(watermark {_time_label(int(props.get('watermark', 0)))}, "
            f"{info['events']:,} views in earlier runs)"
        )
        if parallelism and resumed_parallelism and parallelism != resumed_parallelism:
            console.print(
                f"rescaling by key group from {resumed_parallelism} to {parallelism} subtasks"
            )
        previous = checkpointed_backend(latest, OPERATOR)
        if state_backend is not None and previous is not None and previous != state_backend:
            console.print(
                f"switching backends: the {previous} backend's checkpoint is restored into the "
                f"{state_backend} backend (converted by key group)"
            )
            announced.add(BACKEND_SWITCH)
    first = int(info["slices"])
    # views an earlier run generated but did not finish (it was stopped): this run streams them
    # too; markers of earlier versions have no count: their runs finished
    pending = int(info["events"]) - int(info.get("processed", info["events"]))
    new_events = _write_slices(directory, first, batches, events // batches, apps, seed)
    info.update(
        slices=first + batches, events=int(info["events"]) + new_events, apps=apps, seed=seed
    )
    info.setdefault("processed", int(info["events"]) - new_events - pending)
    _write_marker(directory, info)
    end = STREAM_START_MS + (first + batches) * SLICE_MS
    console.print(
        f"generated {new_events:,} page views of {apps} apps in {batches} input files (a "
        f"micro-batch each), event time {_time_label(STREAM_START_MS + first * SLICE_MS)}"
        f"-{_time_label(end)}"
    )
    own_session = spark is None
    if own_session:
        with console.status(f"starting Spark ({master})"):
            spark = spark_session(
                master, parallelism or 2, log=os.path.join(directory, "spark.log")
            )
    try:
        with _log_to(console, announced):
            run = _stream(
                spark,
                directory,
                console,
                parallelism or resumed_parallelism or 2,
                new_events + pending,
                state_backend,
            )
    finally:
        if own_session:
            spark.stop()
    info["processed"] = info["events"]  # the query consumed every input file
    _write_marker(directory, info)
    run.resumed_from = None if latest is None else latest.checkpoint_id
    run.input_start_ms = STREAM_START_MS + first * SLICE_MS
    run.resumed_parallelism = resumed_parallelism
    print_run(run, console)
    return run


def _stream(
    spark: Any,
    directory: str,
    console: Any,
    parallelism: int,
    events: int,
    state_backend: str | None,
) -> DemoRun:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from streamstate.spark import keyed_process

    source = (
        spark.readStream.schema("app string, ts long")
        .option("maxFilesPerTrigger", 1)
        .parquet(os.path.join(directory, "input"))
    )
    t0 = time.perf_counter()
    query = keyed_process(
        source,
        key="app",
        function=page_views_per_hour(),
        output_schema=OUTPUT_SCHEMA,
        event_time="ts",
        watermark_delay=WATERMARK_DELAY_MS,
        checkpoint=os.path.join(directory, "checkpoint"),
        parallelism=parallelism,
        operator_name=OPERATOR,
        state_backend=state_backend,
    ).write_stream(
        "parquet", path=os.path.join(directory, "output"), trigger={"availableNow": True}
    )
    before = _closed_hours(query.sink)
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:>9,.0f} / {task.total:,.0f} views"),
        TimeElapsedColumn(),
        console=console,
    )
    seen = 0
    with progress:
        task = progress.add_task("micro-batches", total=events)
        done = False
        while not done:
            done = bool(query.await_termination(0.2))
            for figures in query.batches[seen:]:
                seen += 1
                what = "no input" if figures.get("no_data") else "micro-batch"
                progress.update(
                    task,
                    advance=figures.get("rows", 0),
                    description=f"checkpoint {figures['checkpoint']} ({what} {figures['batch']}, "
                    f"watermark {_time_label(figures.get('watermark', 0))})",
                )
    seconds = time.perf_counter() - t0
    results = _closed_hours(query.sink)
    latest = query.log.latest()
    computed = [b for b in query.batches if not b.get("replayed")]
    return DemoRun(
        directory=directory,
        resumed_from=None,
        resumed_parallelism=None,
        parallelism=parallelism,
        state_backend=query.options.state_backend,
        batches=list(query.batches),
        events=events,
        processed=sum(b.get("rows", 0) for b in computed),
        seconds=seconds,
        checkpoint_id=None if latest is None else latest.checkpoint_id,
        watermark=int(computed[-1]["watermark"]) if computed else 0,
        results=sorted(results),
        new={(a, h) for a, h, _ in results} - {(a, h) for a, h, _ in before},
    )


@contextlib.contextmanager
def _log_to(console: Any, announced: set[str]) -> Iterator[None]:
    """While the query runs, streamstate's warnings are printed by ``console`` (above the
    progress bar, not through it), except those of the events the demo ``announced`` itself
    (the record's ``streamstate_event``)."""
    from rich.logging import RichHandler

    logger = logging.getLogger("streamstate")
    handler = RichHandler(console=console, show_time=False, show_path=False, level=logging.WARNING)
    handler.addFilter(lambda record: getattr(record, STREAMSTATE_EVENT, None) not in announced)
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def _closed_hours(sink: Any) -> list[tuple[str, int, int]]:
    table = sink.read_arrow()
    if table is None:
        return []
    return [(r["app"], r["hour"], r["views"]) for r in table.to_pylist()]


def print_run(run: DemoRun, console: Any, max_hours: int = 6) -> None:
    """The results table (the last ``max_hours`` closed hours) and a summary of the run."""
    from rich.table import Table

    hours = sorted({h for _, h, _ in run.results})
    shown = set(hours[-max_hours:])
    table = Table(title="page views per app per hour (closed hours)")
    table.add_column("app")
    table.add_column("hour (UTC)")
    table.add_column("views", justify="right")
    table.add_column("")
    for app, hour, views in sorted(run.results, key=lambda r: (r[1], r[0])):
        if hour not in shown:
            continue
        note = ""
        if (app, hour) in run.new:
            note = "[green]new[/]"
            if run.resumed_from is not None and hour * HOUR_MS < run.input_start_ms:
                note += f" (resumed from checkpoint {run.resumed_from})"
        table.add_row(app, hour_label(hour), f"{views:,}", note)
    if len(hours) > len(shown):
        hidden = sum(1 for _, hour, _ in run.results if hour not in shown)
        table.caption = (
            f"{hidden} more row(s), of {len(hours) - len(shown)} earlier hour(s), in "
            f"{run.directory}/output"
        )
    if run.results:
        console.print(table)
    rest = [b for b in run.batches[1:] if not b.get("replayed")]
    rest_ms = sum(b.get("batch_ms", 0.0) for b in rest)
    warm = ""
    if rest_ms:
        rate = sum(b.get("rows", 0) for b in rest) / rest_ms * 1000
        warm = f"; {rate:,.0f}/s after batch 0"
    no_data = sum(1 for b in run.batches if b.get("no_data"))
    without = f" ({no_data} without input, closing hours)" if no_data else ""
    console.print(
        f"{len(run.batches)} micro-batches{without}: {run.processed:,} views in "
        f"{run.seconds:.1f} s ({run.events_per_second:,.0f}/s{warm})"
    )
    restores = Counter(r for b in run.batches for r in b.get("restore", ()))
    console.print(
        f"parallelism {run.parallelism}, {run.state_backend} backend; state per batch: "
        + ", ".join(f"{how} x{n}" for how, n in sorted(restores.items()))
        + " (hot: kept in the state hosts)"
    )
    if run.watermark < STREAM_START_MS:
        console.print("watermark: no hour is closed yet")
    else:
        console.print(
            f"watermark {_time_label(run.watermark)}: {len(run.new)} new results; "
            f"hours from {hour_label((run.watermark + 1) // HOUR_MS)} are still open (in state)"
        )
    console.print(
        f"[bold]checkpoint {run.checkpoint_id}[/]: run again to resume from it; --fresh starts over"
    )
