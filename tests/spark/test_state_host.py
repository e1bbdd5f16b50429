"""The state host without Spark: versions (hot / reload), failures, lifecycle, start-up errors."""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
from typing import Any

import msgspec
import pyarrow as pa
import pytest
from functions import Count, CountWithFaults

from streamstate.errors import StateHostError
from streamstate.spark.commit import CheckpointLog
from streamstate.spark.host_client import connect, ping, run_batch, shutdown
from streamstate.spark.job import JobSpec, arrow_schema_to_bytes, pickle_function
from streamstate.spark.state_host import HostSpec, host_id, proc_start_time
from streamstate.spark.subtask import BatchResult, job_storage

SCHEMA = pa.schema([("user", pa.string()), ("v", pa.int64()), ("_kg", pa.int32())])
OUT = pa.schema([("user", pa.string()), ("n", pa.int64())])


def begin_header(job: JobSpec, plan: Any, attempt: int) -> dict[str, Any]:
    """The BEGIN message a task of subtask 0 sends for ``plan``."""
    return {
        "job": msgspec.msgpack.encode(job),
        "batch": plan.batch,
        "base": plan.base,
        "lineage": plan.lineage,
        "new_lineage": plan.new_lineage,
        "base_attempt": plan.base_attempts.get(0),
        "attempt": attempt,
        "watermark": plan.watermark,
        "processing_time": plan.processing_time,
    }


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
        begin = begin_header(self.job, plan, self.attempt)
        batch = user_batch(users)
        raw, _ = run_batch(self.spec, begin, [batch])
        result = msgspec.msgpack.decode(raw, type=BatchResult)
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


@pytest.fixture
def driver(tmp_path: Any) -> Any:
    d = Driver(tmp_path, Count())
    yield d
    d.close()


def test_state_stays_hot_and_a_killed_host_reloads(driver: Driver) -> None:
    r0 = driver.batch(0, ["a", "b", "a"])
    assert r0.restore == "empty"
    r1 = driver.batch(1, ["a", "c"])
    assert r1.restore == "hot"
    assert r1.stats["host_pid"] == r0.stats["host_pid"]
    assert sorted(driver.outputs(r1)) == [("a", 3), ("c", 1)]
    os.kill(int(r1.stats["host_pid"]), signal.SIGKILL)
    r2 = driver.batch(2, ["a", "b"])
    assert r2.restore == "reload"  # a new host restored chk-1
    assert sorted(driver.outputs(r2)) == [("a", 4), ("b", 2)]


def test_an_uncommitted_batch_is_not_mistaken_for_its_version(driver: Driver) -> None:
    driver.batch(0, ["a"])
    lost = driver.batch(1, ["a", "a"], commit=False)  # the driver never committed it
    assert sorted(driver.outputs(lost)) == [("a", 2), ("a", 3)]
    again = driver.batch(1, ["a"])  # Spark runs batch 1 again (other input even)
    assert again.restore == "reload"
    assert driver.outputs(again) == [("a", 2)]
    assert driver.batch(2, ["a"]).restore == "hot"


def test_a_failing_function_fails_the_batch_and_the_retry_starts_from_the_base(
    tmp_path: Any,
) -> None:
    marker = str(tmp_path / "fault")
    d = Driver(tmp_path, CountWithFaults(trigger=1, marker=marker, mode="raise"))
    try:
        d.batch(0, ["a"])
        with pytest.raises(StateHostError, match="injected failure at v=1"):
            d.batch(1, ["a", "a"])  # the second record raises after the first was applied
        retry = d.batch(1, ["a", "a"])
        assert retry.restore == "reload"
        assert sorted(d.outputs(retry)) == [("a", 2), ("a", 3)]
    finally:
        d.close()


def test_hosts_start_once_under_concurrent_clients_and_shut_down(driver: Driver) -> None:
    pids: list[int] = []

    def client() -> None:
        got = connect(driver.spec, pythonpath=None)
        assert got is not None
        conn, hello, _ = got
        pids.append(hello["pid"])
        conn.close()

    threads = [threading.Thread(target=client) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(pids)) == 1
    assert ping(driver.spec) is not None
    assert shutdown(driver.spec, "test")
    _wait_gone(pids[0])
    assert ping(driver.spec) is None


def test_idle_host_exits(tmp_path: Any) -> None:
    d = Driver(tmp_path, Count(), idle_timeout=1.0)
    r = d.batch(0, ["a"])
    _wait_gone(int(r.stats["host_pid"]), timeout=10)
    assert not os.path.exists(os.path.join(d.spec.run_dir, d.spec.id + ".sock"))


def test_a_host_that_cannot_start_says_why(tmp_path: Any) -> None:
    d = Driver(tmp_path, Count())
    gone = msgspec.structs.replace(d.spec, watch_pid=999_999_999, watch_start=1)
    with pytest.raises(StateHostError, match=r"failed to start: ERROR the executor process"):
        connect(gone)


def _wait_gone(pid: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} is still alive after {timeout} s")


def test_a_window_functions_module_travels_by_value(tmp_path: Any) -> None:
    # the operator (streamstate's WindowOperator) only refers to the user's window and reduce
    # functions: their module, which state hosts cannot import, must be pickled by value too
    import subprocess
    import sys

    (tmp_path / "my_windows.py").write_text(
        "from streamstate.windows import ProcessWindowFunction, TumblingEventTimeWindows, window\n"
        "class Size(ProcessWindowFunction):\n"
        "    def process(self, key, context, elements):\n"
        "        yield key, len(elements)\n"
        "def build():\n"
        "    return window(TumblingEventTimeWindows.of(10)).process(Size())\n"
        "def build_reduce():\n"
        "    return window(TumblingEventTimeWindows.of(10)).reduce(lambda a, b: a + b)\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        import my_windows

        blobs = [pickle_function(my_windows.build()), pickle_function(my_windows.build_reduce())]
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("my_windows", None)
    for blob in blobs:
        (tmp_path / "f.pkl").write_bytes(blob)
        probe = (
            "import cloudpickle, sys; "
            f"op = cloudpickle.loads(open({str(tmp_path / 'f.pkl')!r}, 'rb').read()); "
            "assert 'my_windows' not in sys.modules; print(type(op).__name__)"
        )
        done = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, cwd="/", check=False
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "WindowOperator"
