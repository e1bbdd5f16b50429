"""The state host without Spark: versions (hot / reload), failures, lifecycle, start-up errors."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import msgspec
import pytest

from streamstate.errors import StateHostError
from streamstate.spark.job import pickle_function
from streamstate.spark.task.host_client import connect, ping, shutdown
from support.spark_functions import Count, CountWithFaults
from support.state_host import Driver, wait_gone

pytestmark = pytest.mark.subprocess


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
        pids.append(hello.location.pid)
        conn.close()

    threads = [threading.Thread(target=client) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(pids)) == 1
    assert ping(driver.spec) is not None
    assert shutdown(driver.spec, "test")
    wait_gone(pids[0])
    assert ping(driver.spec) is None


def test_idle_host_exits(tmp_path: Any) -> None:
    d = Driver(tmp_path, Count(), idle_timeout=1.0)
    r = d.batch(0, ["a"])
    wait_gone(int(r.stats["host_pid"]), timeout=10)
    assert not os.path.exists(os.path.join(d.spec.run_dir, d.spec.id + ".sock"))


def test_a_host_that_cannot_start_says_why(tmp_path: Any) -> None:
    d = Driver(tmp_path, Count())
    gone = msgspec.structs.replace(d.spec, watch_pid=999_999_999, watch_start=1)
    with pytest.raises(StateHostError, match=r"failed to start: ERROR the executor process"):
        connect(gone)


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
