"""Spark Connect: what only a Connect client session shows (the shared cases run against both
session kinds through the ``any_spark`` fixture in test_batch.py and test_streaming.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from streamstate.spark import FileSink, keyed_process, read_state
from streamstate.spark.driver.query.connect import CONNECT_DIR, CONNECT_REPORTS_KEPT
from streamstate.spark.driver.session import default_parallelism, is_connect, master
from support.killed_driver import STREAM_DRIVER, driver_env
from support.spark_data import final_counts, make_batches, running_counts, write_batches
from support.spark_functions import Count

pytestmark = pytest.mark.spark


def _source(spark: Any, directory: str) -> Any:
    return (
        spark.readStream.schema("user string, v long")
        .option("maxFilesPerTrigger", 1)
        .parquet(directory)
    )


def test_session_helpers_answer_for_both_kinds(spark: Any, connect_spark: Any) -> None:
    assert not is_connect(spark)
    assert is_connect(connect_spark)
    assert is_connect(connect_spark.range(1))
    assert master(connect_spark) == master(spark) == "local[2,3]"
    assert default_parallelism(connect_spark) == default_parallelism(spark) == 2
    with pytest.raises(Exception, match="sparkContext"):
        connect_spark.sparkContext  # noqa: B018 - what streamstate must never touch


class _RecordKind:
    """A foreach_batch callback; it runs in the server's foreachBatch process, so it reports
    through a file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, df: Any, batch_id: int) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps([batch_id, type(df).__module__, df.count()]) + "\n")


def test_foreach_batch_gets_a_connect_dataframe(connect_spark: Any, tmp_path: Any) -> None:
    batches = make_batches(2, 100, users=10, seed=2)
    write_batches(str(tmp_path / "in"), batches)
    seen = str(tmp_path / "seen.jsonl")
    # reports of earlier Connect runs on this checkpoint: the query keeps the newest ones
    old_runs = [f"{1_700_000_000_000 + i:013d}-run{i}" for i in range(4)]
    for name in old_runs:
        os.makedirs(tmp_path / "ck" / CONNECT_DIR / name / "batches")
    query = keyed_process(
        _source(connect_spark, str(tmp_path / "in")),
        key="user",
        function=Count(),
        output_schema="user string, n long",
        checkpoint=str(tmp_path / "ck"),
        parallelism=2,
    ).write_stream("foreach_batch", callback=_RecordKind(seen), trigger={"availableNow": True})
    query.await_termination()
    with open(seen) as f:
        calls = [json.loads(line) for line in f]
    assert [(b, n) for b, _, n in calls] == [(0, 100), (1, 100)]
    assert all(kind.startswith("pyspark.sql.connect") for _, kind, _ in calls)
    # the figures of the server's batches reach the client
    assert [b["batch"] for b in query.batches] == [0, 1]
    assert [b["rows"] for b in query.batches] == [100, 100]
    runs = sorted(os.listdir(tmp_path / "ck" / CONNECT_DIR))
    assert len(runs) == CONNECT_REPORTS_KEPT == 3
    assert runs[:2] == old_runs[-2:] and runs[2].endswith(query.hosts.run_id)
    assert len(os.listdir(tmp_path / "ck" / CONNECT_DIR / runs[2] / "batches")) == 2


def test_a_spark_checkpoint_the_server_cannot_write_fails_clearly(
    connect_spark: Any, tmp_path: Any
) -> None:
    """A Connect client cannot ask Hadoop up front (no py4j): the server's refusal at start
    becomes the same ValueError a classic session raises, naming the location."""
    write_batches(str(tmp_path / "in"), make_batches(1, 10, users=3, seed=1))
    with pytest.raises(ValueError, match=r"nosuchfs://bucket/spark.*no filesystem") as e:
        keyed_process(
            _source(connect_spark, str(tmp_path / "in")),
            key="user",
            function=Count(),
            output_schema="user string, n long",
            checkpoint=str(tmp_path / "ck"),
            parallelism=2,
        ).write_stream("memory", spark_checkpoint="nosuchfs://bucket/spark")
    assert "spark_checkpoint=" in str(e.value)


def test_a_connect_client_killed_mid_batch(
    connect_server: Any, connect_spark: Any, tmp_path: Any
) -> None:
    """A Connect client (a pure Connect process) SIGKILLed while the server runs one of its
    micro-batches: the query goes on on the server without its client; a new client restarts
    the query on the same checkpoint (Spark stops the orphaned run, streamstate fences it) and
    every record is counted exactly once."""
    batches = make_batches(4, 200, users=25, seed=5)
    write_batches(str(tmp_path / "in"), batches)
    checkpoint, sink = str(tmp_path / "ck"), str(tmp_path / "out")
    marker, go = str(tmp_path / "in-flight"), str(tmp_path / "go")
    cfg = {
        "remote": connect_server.url,
        "input": str(tmp_path / "in"),
        "checkpoint": checkpoint,
        "sink": sink,
        "parallelism": 2,
        "delay": 0.001,
        "marker": marker,
        "marker_at": batches[1][100][1],
        "go": go,
    }
    env = driver_env()
    env.pop("SPARK_REMOTE", None)
    proc = subprocess.Popen(
        [sys.executable, STREAM_DRIVER, json.dumps(cfg)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=os.path.dirname(STREAM_DRIVER),
        env=env,
    )
    try:
        deadline = time.monotonic() + 300
        while not os.path.exists(marker):
            assert proc.poll() is None, "the Connect client exited before batch 1 ran"
            assert time.monotonic() < deadline, "batch 1 never started"
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with open(go, "w"):
        pass  # the orphaned run's batch may go on: the restart must take the job over anyway
    query = keyed_process(
        _source(connect_spark, str(tmp_path / "in")),
        key="user",
        function=Count(),
        output_schema="user string, n long",
        checkpoint=checkpoint,
        parallelism=2,
    ).write_stream("parquet", path=sink, trigger={"availableNow": True})
    query.await_termination()
    out = FileSink(sink).read_arrow().to_pylist()
    assert sorted((r["user"], r["n"]) for r in out) == running_counts(batches)  # once each
    assert sorted({r["batch"] for r in out}) == [0, 1, 2, 3]
    state = read_state(connect_spark, checkpoint, state="n").collect()
    assert {r.key: r.value for r in state} == final_counts(batches)


def test_the_demo_job_through_connect(connect_spark: Any, tmp_path: Any) -> None:
    """``streamstate demo --remote``'s job: the closed hours equal a brute-force count."""
    import io

    import pyarrow.parquet as pq
    from rich.console import Console

    from streamstate.demo import HOUR_MS, run_streaming

    directory = str(tmp_path / "demo")
    console = Console(file=io.StringIO(), width=160)
    run = run_streaming(directory, events=1_000, batches=5, spark=connect_spark, console=console)
    # the no-data micro-batch after micro-batch 3 closes hour 0 (test_demo.py)
    assert [b["restore"] for b in run.batches] == [["empty"]] + [["hot"]] * 5
    assert [b["batch"] for b in run.batches if b["no_data"]] == [3]
    table = pq.read_table(os.path.join(directory, "input"))
    views: dict[tuple[str, int], int] = {}
    for app, ts in zip(table["app"].to_pylist(), table["ts"].to_pylist(), strict=True):
        views[(app, ts // HOUR_MS)] = views.get((app, ts // HOUR_MS), 0) + 1
    closed = {k: n for k, n in views.items() if (k[1] + 1) * HOUR_MS - 1 <= run.watermark}
    assert closed and len(closed) < len(views)
    assert sorted(run.results) == sorted((app, hour, n) for (app, hour), n in closed.items())
