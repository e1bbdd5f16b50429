"""The ``streamstate`` command line.

``streamstate demo``: the main job, page views per app per hour, as a streaming query on embedded
Spark with a local checkpoint directory; a second run resumes from its checkpoint (``--fresh``
starts over, ``--runner local`` uses the in-process LocalRunner).

``streamstate checkpoints inspect <path>``: the checkpoints of a job directory (or one checkpoint
or savepoint directory): operators, subtasks, key-group ranges, states, entry counts, sizes.

``streamstate checkpoints verify <path>``: reads every file and checks every checksum (whole
file and every key-group block; a RocksDB manifest's own checksum); exits with status 1 naming
the file and key group of any corruption.

``streamstate checkpoints rollback <dir> --to N``: rolls a streaming job back to checkpoint
``chk-N``: later checkpoints go, Spark's offset and commit logs are rolled back with them, and
(with ``--sink``) the parquet sink's later batches, so the restarted query re-runs the Spark
micro-batch after chk-N's and every later one exactly once
(:mod:`streamstate.spark.offline.rollback`).

``streamstate checkpoints regroup <source> <target>``: a savepoint of ``source`` with every key
in the key group this version gives it (the remedy a ``KeyGroupPlacementError`` names).
"""

from __future__ import annotations

import datetime
import os
from enum import StrEnum
from inspect import cleandoc
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from streamstate.backends.rocksdb.snapshot_strategy import MANIFEST_KIND, SST_KIND
from streamstate.checkpoint.metadata import SubtaskStateHandle
from streamstate.checkpoint.operator_format import OperatorStateReader
from streamstate.checkpoint.restore import keyed_file_restore
from streamstate.checkpoint.storage import (
    METADATA_FILE,
    CheckpointStorage,
    CompletedCheckpoint,
    open_location,
)
from streamstate.errors import CheckpointError
from streamstate.format.keyed_file import KeyedSnapshotReader
from streamstate.format.meta import StateMetaSnapshot
from streamstate.keygroups import KeyGroupRange

__all__ = ["app", "main"]

app = typer.Typer(help="streamstate: Flink's state layer for PySpark.", no_args_is_help=True)
checkpoints_app = typer.Typer(
    help="Inspect, verify, roll back and regroup checkpoints.", no_args_is_help=True
)
app.add_typer(checkpoints_app, name="checkpoints")


def _one_line_paragraphs(command: Any) -> Any:
    """Typer shows a command's docstring as its help keeping the line breaks of every paragraph
    after the first, so that a terminal wider or narrower than the source breaks sentences in
    the middle: give each paragraph as one line, for the terminal to wrap."""
    text = cleandoc(command.__doc__ or "")
    command.__doc__ = "\n\n".join(" ".join(p.split()) for p in text.split("\n\n"))
    return command


PathArg = Annotated[str, typer.Argument(help="job, checkpoint or savepoint directory (or URL)")]


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def _directories(storage: CheckpointStorage, directory: str | None) -> list[str]:
    if directory is not None:
        return [directory]
    dirs = [storage.checkpoint_directory(i) for i in storage.checkpoint_ids()]
    dirs += [storage.savepoint_directory(i) for i in storage.savepoint_ids()]
    return dirs


def _load(storage: CheckpointStorage, directory: str) -> tuple[CompletedCheckpoint | None, str]:
    try:
        metadata = storage.read_metadata(directory)
    except CheckpointError as exc:
        return None, f"unreadable {METADATA_FILE}: {exc}"
    if metadata is None:
        return None, f"incomplete (no {METADATA_FILE})"
    cp = CompletedCheckpoint(storage, directory, metadata)
    problems = storage.problems(cp)
    return cp, ("complete" if not problems else "incomplete: " + "; ".join(problems))


def _console() -> Console:
    """The console of a table command: the terminal's width, or (output piped into a file or
    another program) wide enough that no column is cut."""
    import sys

    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return Console()
    return Console(width=1000)


@checkpoints_app.command("inspect")
@_one_line_paragraphs
def inspect(
    path: PathArg,
    as_json: Annotated[
        bool, typer.Option("--json", help="print one JSON document instead of tables")
    ] = False,
) -> None:
    """Show checkpoints: operators, subtasks, key-group ranges, states, entries, timers, sizes.

    Entries are counted as everywhere in streamstate (one per key and namespace of a value state,
    one per mapping of a map state, one per element of a list state), timers apart: what each
    subtask held when its snapshot was taken, recorded in the checkpoint (n/a in checkpoints
    written before streamstate recorded them)."""
    console = _console()
    storage, directory = open_location(path)
    dirs = _directories(storage, directory)
    if as_json:
        import json

        print(json.dumps(_inspect_document(storage, dirs), indent=1))
        raise typer.Exit(0 if dirs else 1)
    if not dirs:
        console.print(f"[yellow]no checkpoints in {storage.url}[/]")
        raise typer.Exit(1)
    overview = Table(title=f"checkpoints in {storage.url}")
    columns = ("directory", "id", "kind", "status", "taken", "operators", "entries", "timers")
    for col in (*columns, "size"):
        right = col in ("id", "entries", "timers", "size")
        overview.add_column(col, justify="right" if right else "left")
    loaded = []
    for d in dirs:
        cp, status = _load(storage, d)
        if cp is None:
            overview.add_row(d, "", "", f"[red]{escape(status)}[/]", "", "", "", "", "")
            continue
        loaded.append(cp)
        files = cp.metadata.files()
        subtasks = [sub for op in cp.metadata.operators.values() for sub in op.subtasks]
        timers = [sub.timers for sub in subtasks]
        taken = datetime.datetime.fromtimestamp(cp.metadata.timestamp / 1000, datetime.UTC)
        overview.add_row(
            d,
            str(cp.checkpoint_id),
            cp.metadata.kind,
            status if status == "complete" else f"[red]{escape(status)}[/]",
            taken.strftime("%Y-%m-%d %H:%M:%S"),
            ", ".join(f"{n} (p={o.parallelism})" for n, o in cp.metadata.operators.items()),
            _count(_entries(subtasks)),
            _count(None if None in timers else sum(t for t in timers if t is not None)),
            _size(sum(f.size for f in files)),
        )
    console.print(overview)
    for cp in loaded:
        _print_checkpoint(console, cp)


def _inspect_document(storage: CheckpointStorage, dirs: list[str]) -> dict[str, Any]:
    """What ``inspect`` shows, as one JSON-able document."""
    checkpoints = []
    for d in dirs:
        cp, status = _load(storage, d)
        entry: dict[str, Any] = {"directory": d, "status": status}
        if cp is not None:
            files = cp.metadata.files()
            entry.update(
                id=cp.checkpoint_id,
                kind=cp.metadata.kind,
                taken_ms=cp.metadata.timestamp,
                size=sum(f.size for f in files),
                properties={
                    k: v
                    for k, v in cp.metadata.properties.items()
                    if k in ("watermark", "max_event_time", "batch_mode", "created")
                },
                operators={},
            )
            for name, op in cp.metadata.operators.items():
                subtasks = []
                states: dict[tuple[str, str], Any] = {}
                for sub in op.subtasks:
                    native = not sub.is_canonical
                    subtasks.append(
                        {
                            "subtask": sub.subtask_index,
                            "key_groups": list(sub.key_group_range),
                            "files": len(sub.files()),
                            "entries": _subtask_entries(sub),
                            "state_entries": sub.entries,
                            "timers": sub.timers,
                            "size": sum(f.size for f in sub.files()),
                            "backend": "rocksdb" if native else "canonical",
                        }
                    )
                    if sub.keyed and not states:
                        states.update(_state_rows(cp, name, sub))
                entry["operators"][name] = {
                    "entries": _entries(op.subtasks),
                    "parallelism": op.parallelism,
                    "max_parallelism": op.max_parallelism,
                    "subtasks": subtasks,
                    "states": [
                        {
                            "name": state,
                            "kind": meta.kind,
                            "namespace": _ser(meta.namespace_serializer),
                            "value": _ser(meta.state_serializer),
                            "ttl": meta.ttl,
                        }
                        for (_, state), meta in sorted(states.items())
                    ],
                }
        checkpoints.append(entry)
    return {"url": storage.url, "checkpoints": checkpoints}


def _subtask_entries(sub: Any) -> int | None:
    """The entries a subtask's checkpoint recorded (``streamstate.format.entries``), None in
    checkpoints written before they were recorded."""
    return None if sub.entries is None else sum(sub.entries.values())


def _entries(subtasks: list[Any]) -> int | None:
    counts = [_subtask_entries(sub) for sub in subtasks]
    return None if None in counts else sum(c for c in counts if c is not None)


def _count(n: int | None) -> str:
    return "n/a" if n is None else f"{n:,}"


def _print_checkpoint(console: Console, cp: CompletedCheckpoint) -> None:
    table = Table(title=f"{cp.directory}: subtasks")
    columns = ("operator", "subtask", "key groups", "files", "states", "entries", "timers", "size")
    for col in columns:
        right = col in ("subtask", "entries", "timers", "size")
        table.add_column(col, justify="right" if right else "left")
    states: dict[tuple[str, str], StateMetaSnapshot] = {}
    for name, op in cp.metadata.operators.items():
        for sub in op.subtasks:
            kinds = [f.kind for f in sub.keyed]
            native = not sub.is_canonical
            if native:
                new_files = sum(1 for f in sub.keyed[1:] if f.checkpoint_id == cp.checkpoint_id)
                chain = f"rocksdb: {len(kinds) - 1} SST ({new_files} new)"
            else:
                chain = "full" + (f" + {len(kinds) - 1} delta" if len(kinds) > 1 else "")
            if sub.operator_state is not None:
                chain += " + operator state"
            names = sorted({s for f in sub.files() for s in f.states})
            table.add_row(
                name,
                f"{sub.subtask_index}/{sub.parallelism}",
                f"{sub.key_group_range[0]}-{sub.key_group_range[1]}",
                chain,
                ", ".join(names),
                _count(_subtask_entries(sub)),
                _count(sub.timers),
                _size(sum(f.size for f in sub.files())),
            )
            if sub.keyed and not any(k[0] == name for k in states):
                states.update(_state_rows(cp, name, sub))
    console.print(table)
    if states:
        st = Table(title=f"{cp.directory}: states")
        for col in ("operator", "state", "kind", "namespace", "value serializer", "ttl"):
            st.add_column(col)
        for (op_name, state_name), meta in sorted(states.items()):
            st.add_row(
                op_name,
                state_name,
                meta.kind,
                escape(_ser(meta.namespace_serializer)),
                escape(_ser(meta.state_serializer)),
                "yes" if meta.ttl else "",
            )
        console.print(st)


def _ser(snap: dict[str, Any]) -> str:
    t = str(snap.get("type"))
    inner = [snap[k] for k in ("inner", "element", "key", "value") if k in snap]
    inner += list(snap.get("fields", ()))
    if "class" in snap:
        return f"{t}[{str(snap['class']).split(':')[-1]}]"
    return f"{t}[{', '.join(_ser(i) for i in inner)}]" if inner else t


def _state_rows(
    cp: CompletedCheckpoint, operator: str, sub: SubtaskStateHandle
) -> dict[tuple[str, str], StateMetaSnapshot]:
    try:
        restore = keyed_file_restore(cp, list(sub.keyed), KeyGroupRange(*sub.key_group_range))[0]
    except CheckpointError:
        return {}
    try:
        return {(operator, s.name): s for s in restore.states}
    except CheckpointError:
        return {}
    finally:
        restore.close()


@checkpoints_app.command("verify")
@_one_line_paragraphs
def verify(path: PathArg) -> None:
    """Check every checksum of every file; exit 1 on corruption (naming file and key group)."""
    console = _console()
    storage, directory = open_location(path)
    dirs = _directories(storage, directory)
    if not dirs:
        console.print(f"[red]no checkpoints in {storage.url}[/]")
        raise typer.Exit(1)
    table = Table(title=f"verification of {storage.url}")
    for col in ("directory", "file", "result"):
        table.add_column(col)
    failures = 0
    for d in dirs:
        cp, status = _load(storage, d)
        if cp is None:
            if status.startswith("unreadable"):  # a _metadata that exists but is refused
                failures += 1
                table.add_row(d, METADATA_FILE, f"[red]{escape(status)}[/]")
            else:
                table.add_row(d, "", f"[yellow]skipped: {escape(status)}[/]")
            continue
        for handle in cp.metadata.files():
            problem = _verify_file(cp, handle)
            if problem:
                failures += 1
            result = f"[red]{escape(problem)}[/]" if problem else "[green]ok[/]"
            table.add_row(d, handle.path, result)
    console.print(table)
    if failures:
        console.print(f"[red]{failures} corrupt or missing file(s)[/]")
        raise typer.Exit(1)
    console.print("[green]every checksum matches[/]")


@checkpoints_app.command("rollback")
@_one_line_paragraphs
def rollback_command(
    path: Annotated[str, typer.Argument(help="the job's checkpoint directory (or URL)")],
    to: Annotated[int, typer.Option("--to", help="the checkpoint id to go back to")],
    sink: Annotated[
        str | None,
        typer.Option(help="the query's parquet sink path: its batches after N are re-delivered"),
    ] = None,
    spark_checkpoint: Annotated[
        str | None,
        typer.Option(
            help="Spark's streaming checkpoint (default: the one the query recorded inside the "
            "directory, else <dir>/spark; one recorded outside it must be named here)"
        ),
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do it without asking")] = False,
) -> None:
    """Roll a streaming job back to checkpoint N (after a lost or corrupt latest _metadata).

    Stop the query first (a running one is fenced anyway): the restarted query re-runs the
    Spark micro-batch after chk-N's (N+1 until the query's first no-data micro-batch) and every
    later one from chk-N."""
    from streamstate.spark.offline.rollback import plan_rollback, rollback

    console = Console()
    storage, directory = open_location(path)
    if directory is not None:
        console.print(
            f"[red]{escape(path)} is a checkpoint directory; give the job directory and --to[/]"
        )
        raise typer.Exit(2)
    try:
        plan = plan_rollback(storage, to, spark_checkpoint=spark_checkpoint, sink=sink)
    except CheckpointError as exc:
        console.print(f"[red]{escape(str(exc))}[/]")
        raise typer.Exit(1) from None
    table = Table(title=f"rollback of {storage.url} to chk-{to}")
    table.add_column("what")
    table.add_column("")
    for what, detail in plan.summary():
        table.add_row(what, escape(detail))
    console.print(table)
    if sink is None:
        console.print(
            "[yellow]no --sink: batches the sink already delivered after checkpoint "
            f"{to} keep their first delivery[/]"
        )
    if not yes and not typer.confirm("roll back?", default=False):
        raise typer.Exit(1)
    try:
        rollback(storage, to, spark_checkpoint=spark_checkpoint, sink=sink)
    except CheckpointError as exc:
        console.print(f"[red]{escape(str(exc))}[/]")
        raise typer.Exit(1) from None
    console.print(
        f"[green]rolled back to chk-{to}: restart the query to re-run micro-batch "
        f"{plan.spark_batch + 1}[/]"
    )


@checkpoints_app.command("regroup")
@_one_line_paragraphs
def regroup_command(
    source: Annotated[
        str, typer.Argument(help="a job directory (its latest checkpoint), a chk-N or savepoint")
    ],
    target: Annotated[str, typer.Argument(help="the new savepoint's directory")],
    operator: Annotated[
        str, typer.Option(help="the operator (keyed_process's operator_name)")
    ] = "keyed-process",
) -> None:
    """Write a savepoint with every key in the key group this version gives it.

    The remedy for a checkpoint that a Spark job with an INT, SMALLINT or TINYINT key column
    wrote before key group placement 2 (every key in one key group; its restore is refused with
    KeyGroupPlacementError). Start the job from the savepoint: initial_state=TARGET and a new
    checkpoint directory."""
    from streamstate.checkpoint.rewrite import regroup_savepoint

    console = Console()
    try:
        done = regroup_savepoint(source, target, operator=operator)
    except CheckpointError as exc:
        console.print(f"[red]{escape(str(exc))}[/]")
        raise typer.Exit(1) from None
    console.print(
        f"[green]savepoint {escape(str(done.url))}: operator {escape(operator)}'s keys in "
        "their key groups; start the job with initial_state= it and a new checkpoint "
        "directory[/]"
    )


def _verify_file(cp: CompletedCheckpoint, handle: Any) -> str | None:
    storage = cp.storage
    resolved = cp.resolve(handle.path)
    url = storage.url_of(resolved)
    try:
        size = storage.size(resolved)
    except CheckpointError as exc:  # a link in the checkpoint
        return str(exc)
    if size is None:
        return f"missing file {url}"
    if size != handle.size:
        return f"{url} has {size} bytes, the metadata says {handle.size}"
    try:
        if handle.kind == "operator":
            reader = OperatorStateReader(storage.read_bytes(resolved), url)
            for s in reader.states:
                reader.read_encoded(s["name"])
        elif handle.kind == MANIFEST_KIND:
            from streamstate.backends.rocksdb.incremental import IncrementalManifest

            IncrementalManifest.decode(storage.read_bytes(resolved), url)
        elif handle.kind == SST_KIND:
            pass  # an SST file is opaque here: its whole-file CRC32C is checked below
        else:
            with storage.open_read(resolved) as f:
                KeyedSnapshotReader(f, url, size).verify()
    except CheckpointError as exc:
        return str(exc)
    if storage.file_checksum(resolved) != handle.checksum:
        return f"checksum mismatch in {url} (whole-file CRC32C differs from the metadata)"
    return None


class Runner(StrEnum):
    spark = "spark"
    local = "local"


class Backend(StrEnum):
    heap = "heap"
    rocksdb = "rocksdb"


@app.command("demo")
@_one_line_paragraphs
def demo(
    events: Annotated[
        int | None,
        typer.Option(help="page views to generate (default 200,000)"),
    ] = None,
    batches: Annotated[int, typer.Option(min=1, help="micro-batches (one input file each)")] = 8,
    parallelism: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="subtasks (default: the checkpoint's, else 2); a new value "
            "rescales the state by key group",
        ),
    ] = None,
    directory: Annotated[
        str, typer.Option("--dir", help="input files, checkpoints, outputs and Spark's log")
    ] = ".streamstate-demo",
    fresh: Annotated[
        bool, typer.Option("--fresh", help="delete the demo directory first and start over")
    ] = False,
    runner: Annotated[
        Runner,
        typer.Option(
            help="spark: a streaming query on embedded Spark; local: the "
            "in-process LocalRunner (no checkpoint, nothing to resume)"
        ),
    ] = Runner.spark,
    master: Annotated[str, typer.Option(help="the Spark master")] = "local[2]",
    cluster: Annotated[
        int,
        typer.Option(
            min=0,
            help="run on a Spark standalone cluster of N local workers (1 core each, each its "
            "own node with its own state-host directory) started for the demo; overrides "
            "--master",
        ),
    ] = 0,
    state_backend: Annotated[
        Backend | None,
        typer.Option(
            help="keyed state backend (default: the checkpoint's, else heap); a checkpoint of "
            "either backend resumes on the other"
        ),
    ] = None,
    remote: Annotated[
        str | None,
        typer.Option(
            help="run through a Spark Connect server (sc://host:port) instead of embedded "
            "Spark; its Python must have streamstate installed, and --dir must be a path the "
            "server can read and write"
        ),
    ] = None,
) -> None:
    """The main job: page views per app per hour, streamed through keyed_process on Spark."""
    console = Console()
    if runner is Runner.local:
        from streamstate.demo.local import run_local

        run_local(
            events or 200_000,
            parallelism or 2,
            console=console,
            state_backend=state_backend.value if state_backend else "heap",
            batches=batches,
        )
        return
    from streamstate.demo.streaming import run_streaming

    kwargs: dict[str, Any] = dict(
        events=events or 200_000,
        batches=batches,
        parallelism=parallelism,
        fresh=fresh,
        master=master,
        console=console,
        state_backend=state_backend.value if state_backend else None,
    )
    try:
        if remote:
            _demo_on_connect(directory, remote, console, kwargs)
        elif cluster:
            _demo_on_cluster(directory, cluster, console, kwargs)
        else:
            run_streaming(directory, **kwargs)
    except ValueError as exc:
        console.print(f"[red]{escape(str(exc))}[/]")
        raise typer.Exit(2) from exc


def _demo_on_connect(directory: str, url: str, console: Any, kwargs: dict[str, Any]) -> None:
    """The demo as a Spark Connect client of the server at ``url``."""
    from pyspark.sql import SparkSession

    from streamstate.demo.streaming import run_streaming

    with console.status(f"connecting to {url}"):
        spark = SparkSession.builder.remote(url).getOrCreate()
    console.print(f"Spark Connect: {url}")
    try:
        run_streaming(os.path.abspath(directory), spark=spark, **kwargs)
    finally:
        spark.stop()


def _demo_on_cluster(directory: str, workers: int, console: Any, kwargs: dict[str, Any]) -> None:
    """The demo on a local standalone cluster of ``workers`` nodes, stopped at the end."""
    import tempfile

    from streamstate.demo.streaming import run_streaming, spark_session
    from streamstate.devtools.local_cluster import LocalCluster, wait_for_executors
    from streamstate.spark.job import src_path

    # executors and their state hosts import this streamstate (a source checkout included)
    pythonpath = os.pathsep.join(p for p in (src_path(), os.environ.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory(prefix="streamstate-demo-cluster-") as tmp:
        with console.status(f"starting a Spark standalone cluster of {workers} workers"):
            local = LocalCluster(workers, directory=tmp, env={"PYTHONPATH": pythonpath})
            # the workers register while the driver's JVM starts (both take seconds)
            local.start(wait=False)
        try:
            parallelism = kwargs["parallelism"] or workers
            with console.status(f"starting the driver ({local.master_url})"):
                spark = spark_session(
                    local.master_url,
                    parallelism,
                    # the driver JVM's own output; the demo directory may not exist yet
                    log=os.path.join(tmp, "driver.log"),
                    conf=local.spark_conf(),
                )
                local.wait_for_workers(workers)
                wait_for_executors(spark, workers)
            console.print(
                f"cluster: master {local.master_url}, {workers} workers, state-host directories "
                + ", ".join(n.run_dir for n in local.nodes)
            )
            try:
                run_streaming(directory, spark=spark, **kwargs)
            finally:
                spark.stop()
        finally:
            local.stop()


def main() -> None:
    """Entry point of the ``streamstate`` command."""
    app()


if __name__ == "__main__":
    main()
