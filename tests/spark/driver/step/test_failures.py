"""Failures: a state host killed mid-batch (Spark retries the task) and the driver SIGKILLed
between and inside micro-batches (the query restarts from its checkpoints)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from streamstate.spark import FileSink, keyed_process, read_state
from support.killed_driver import processes_naming, run_until_killed, start_driver
from support.spark_data import final_counts, make_batches, running_counts, write_batches
from support.spark_functions import CountWithFaults
from support.stream_query import restart

pytestmark = pytest.mark.spark


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
    first = start_driver({**cfg, "sleep_after_batch": 1}, str(tmp_path / "cfg-0.json"), starts[0])
    second = start_driver({**cfg, **fault}, str(tmp_path / "cfg-1.json"), starts[1])
    try:
        # 1. killed after batch 1 was committed and delivered, before Spark logged its commit
        run_until_killed(first, starts[0], lambda ls: "SLEEPING" in ls, checkpoint)
        # 2. killed inside batch 3: a host is in the middle of applying it
        run_until_killed(second, starts[1], lambda ls: os.path.exists(marker), checkpoint)
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
