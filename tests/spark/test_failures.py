"""Failures: a state host killed mid-batch (Spark retries the task) and the driver SIGKILLed
between and inside micro-batches (the query restarts from its checkpoints)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from data import final_counts, make_batches, running_counts, write_batches
from functions import CountWithFaults

from streamstate.devtools.local_cluster import descendants, live_processes
from streamstate.spark import FileSink, keyed_process, read_state
from streamstate.spark.job import src_path
from support.stream_query import start_stream_query

pytestmark = pytest.mark.spark
HERE = os.path.dirname(os.path.abspath(__file__))


def _env() -> dict[str, str]:
    """The child driver imports the same streamstate (a source checkout is not installed)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src_path(), env.get("PYTHONPATH")) if p)
    return env


def test_a_host_killed_mid_batch_fails_the_task_and_the_retry_restores_the_base(
    spark: Any, tmp_path: Any
) -> None:
    batches = make_batches(3, 300, users=30, seed=3)
    write_batches(str(tmp_path / "in"), batches)
    marker = str(tmp_path / "killed")
    trigger = batches[1][150][1]  # a record in the middle of micro-batch 1
    query = keyed_process(
        spark.readStream.schema("user string, v long")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(tmp_path / "in")),
        key="user",
        function=CountWithFaults(trigger, marker, mode="kill"),
        output_schema="user string, n long",
        checkpoint=str(tmp_path / "ck"),
        parallelism=2,
    ).write_stream("memory", trigger={"availableNow": True})
    query.await_termination()
    assert os.path.exists(marker)  # the host of one subtask killed itself once
    restores = [b["restore"] for b in query.batches]
    assert restores[0] == ["empty"]
    assert "reload" in restores[1]  # the retried task's new host restored chk-0
    assert restores[2] == ["hot"]
    got = sorted((r["user"], r["n"]) for r in query.sink.rows())
    assert got == running_counts(batches)


def _tree(root: int, marker: str) -> set[int]:
    """``root``, its descendants, and every process whose command line names ``marker``."""
    procs = live_processes()
    found = {root} | descendants(root, procs)
    found |= {pid for pid, (_, cmd) in procs.items() if marker in cmd}
    return {p for p in found if p in procs}


def _start(cfg: dict[str, Any], path: str, start_when: str) -> subprocess.Popen[str]:
    """Start ``stream_driver.py`` on ``cfg`` (written to ``path``: the checkpoint must not be
    on the driver's command line, or the driver would pass for one of the query's processes).
    Its JVM and SparkSession start at once; its query starts once ``start_when`` exists."""
    with open(path, "w") as f:
        json.dump({**cfg, "start_when": start_when}, f)
    return subprocess.Popen(
        [sys.executable, os.path.join(HERE, "stream_driver.py"), "@" + path],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=HERE,
        env=_env(),
    )


def _go(path: str) -> None:
    with open(path, "w"):
        pass


def _run_until(proc: subprocess.Popen[str], start: str, until: Any, marker: str) -> list[str]:
    """Let the started driver ``proc`` start its query, wait until ``until(lines)`` holds,
    SIGKILL the driver, and check that every process of the query (JVM, Python workers, state
    hosts) goes away."""
    lines: list[str] = []
    assert proc.stdout is not None
    stdout = proc.stdout
    reader = threading.Thread(target=lambda: lines.extend(map(str.strip, stdout)))
    reader.start()
    try:
        _go(start)
        deadline = time.monotonic() + 300
        while not until(lines):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the driver did not reach the kill point: {lines}")
            time.sleep(0.1)
        time.sleep(0.3)
        victims = _tree(proc.pid, marker)
        assert any(marker in live_processes().get(p, (0, ""))[1] for p in victims)  # a state host
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (alive := victims & set(live_processes())):
            time.sleep(0.2)
        assert not alive, f"processes left after the driver was killed: {alive}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join()
    return lines


def processes_naming(text: str, timeout: float = 10) -> dict[int, str]:
    """The live processes whose command line holds ``text`` (a checkpoint: its state hosts)
    after up to ``timeout`` s: hosts told to stop exit on their own time."""
    deadline = time.monotonic() + timeout
    while True:
        left = {p: cmd for p, (_, cmd) in live_processes().items() if text in cmd}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def restart(spark: Any, cfg: dict[str, Any], function: Any, **options: Any) -> list[int]:
    """Run the query of ``stream_driver.py``'s ``cfg`` (input, checkpoint, sink, parallelism)
    to the end in ``spark``, as a driver restarted after a kill does; the ids of the batches
    it delivered to the sink, in order. ``options`` go to ``keyed_process``."""
    delivered: list[int] = []

    class RecordingSink(FileSink):
        def write(self, batch: Any) -> None:
            super().write(batch)
            delivered.append(batch.batch_id)

    query = start_stream_query(spark, cfg, function, RecordingSink(cfg["sink"]), **options)
    query.await_termination()  # raises the error of a failed micro-batch; stops the hosts
    return delivered


def test_driver_killed_between_and_inside_micro_batches(spark: Any, tmp_path: Any) -> None:
    batches = make_batches(6, 200, users=25, seed=11)
    write_batches(str(tmp_path / "in"), batches)
    checkpoint = str(tmp_path / "ck")
    cfg = {
        "input": str(tmp_path / "in"),
        "checkpoint": checkpoint,
        "sink": str(tmp_path / "out"),
        "parallelism": 2,
    }
    # the second driver's JVM starts while the first one runs; its query starts only after
    # the first was killed (``start_when``)
    starts = [str(tmp_path / f"start-{i}") for i in range(2)]
    marker = str(tmp_path / "inside")
    fault = {"fault_marker": marker, "fault_at": batches[3][100][1]}
    first = _start({**cfg, "sleep_after_batch": 1}, str(tmp_path / "cfg-0.json"), starts[0])
    second = _start({**cfg, **fault}, str(tmp_path / "cfg-1.json"), starts[1])
    try:
        # 1. killed after batch 1 was committed and delivered, before Spark logged its commit
        _run_until(first, starts[0], lambda ls: "SLEEPING" in ls, checkpoint)
        # 2. killed inside batch 3: a host is in the middle of applying it
        _run_until(second, starts[1], lambda ls: os.path.exists(marker), checkpoint)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()  # our own children, by their handles
                proc.communicate()
    # 3. restart and run to the end: in this process's session (what the restart reads is the
    # checkpoint and the sink; a third driver process would only add a JVM start)
    restart(spark, cfg, CountWithFaults(fault["fault_at"], marker, mode="sleep"))
    out = FileSink(cfg["sink"]).read_arrow().to_pylist()
    assert sorted((r["user"], r["n"]) for r in out) == running_counts(batches)  # once each
    assert sorted({r["batch"] for r in out}) == list(range(6))
    state = read_state(spark, checkpoint, state="n").collect()
    assert {r.key: r.value for r in state} == final_counts(batches)
    left = processes_naming(checkpoint)
    assert not left, left
