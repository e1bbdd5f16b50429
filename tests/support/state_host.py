"""The state host without Spark, driven from the test process: a stand-in for the Spark driver and
one task of a 1-subtask job (``Driver``), and the records and steps it sends."""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

import msgspec
import pyarrow as pa

from streamstate.spark.driver.step.commit import CheckpointLog
from streamstate.spark.job import JobSpec, arrow_schema_to_bytes, pickle_function
from streamstate.spark.subtask import job_storage
from streamstate.spark.task.host_client import run_batch, shutdown
from streamstate.spark.wire.hosts import HostSpec, host_id, proc_start_time
from streamstate.spark.wire.results import BatchResult
from streamstate.spark.wire.step import StepTask

__all__ = ["OUT", "SCHEMA", "Driver", "step_task", "user_batch", "wait_gone"]

SCHEMA = pa.schema([("user", pa.string()), ("v", pa.int64()), ("_kg", pa.int32())])
OUT = pa.schema([("user", pa.string()), ("n", pa.int64())])


def step_task(job: JobSpec, plan: Any) -> StepTask:
    """The step a task of subtask 0 runs for ``plan`` (what the driver ships)."""
    return plan.task(msgspec.msgpack.encode(job))


def user_batch(users: list[str]) -> pa.RecordBatch:
    """Records ``(user, v = position)`` with their key groups, as placement sends them."""
    from streamstate.keygroups import assign_key_groups

    return pa.record_batch(
        [
            pa.array(users),
            pa.array(range(len(users)), pa.int64()),
            pa.array(assign_key_groups(pa.array(users), 128), pa.int32()),
        ],
        schema=SCHEMA,
    )


class Driver:
    """Plays the Spark driver and one task of a 1-subtask job."""

    def __init__(self, tmp_path: Any, function: Any, idle_timeout: float = 60.0) -> None:
        root = str(tmp_path / "ck")
        blob = pickle_function(function)
        sha = hashlib.sha256(blob).hexdigest()
        self.job = JobSpec(
            operator="op",
            parallelism=1,
            max_parallelism=128,
            key_columns=["user"],
            value_columns=["user", "v"],
            input_schema=arrow_schema_to_bytes(SCHEMA),
            output_schema=arrow_schema_to_bytes(OUT),
            checkpoint_url=root,
            function_path=f"functions/{sha}.pkl",
            function_sha=sha,
        )
        storage = job_storage(self.job)
        storage.put_atomic(self.job.function_path, blob)
        self.log = CheckpointLog(storage, "op", 1)
        self.spec = HostSpec(
            id=host_id(root, "op", 0, 1),
            job=root,
            operator="op",
            subtask=0,
            parallelism=1,
            run_dir=str(tmp_path / "run"),
            watch_pid=os.getpid(),
            watch_start=proc_start_time(os.getpid()),
            idle_timeout=idle_timeout,
        )
        os.makedirs(self.spec.run_dir, exist_ok=True)
        self.attempt = 0

    def batch(self, b: int, users: list[str], *, commit: bool = True) -> BatchResult:
        plan = self.log.plan(b)
        self.attempt += 1
        batch = user_batch(users)
        result = run_batch(self.spec, step_task(self.job, plan), self.attempt, [batch]).result
        assert result is not None
        if commit:
            self.log.commit(plan, [result])
        return result

    def outputs(self, result: BatchResult) -> list[tuple[str, int]]:
        import pyarrow.parquet as pq

        storage = job_storage(self.job)
        with storage.open_read(result.outputs.path) as f:
            return [(r["user"], r["n"]) for r in pq.read_table(f).to_pylist()]

    def close(self) -> None:
        shutdown(self.spec, "test done")
        self.log.close()


def wait_gone(pid: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} is still alive after {timeout} s")
