"""A Spark standalone cluster on 127.0.0.1 for the cluster tests (marker ``cluster``).

One master and two workers per pytest session, started from pyspark's own ``spark-class``
(``streamstate.devtools.local_cluster``); each worker has its own ``STREAMSTATE_RUN_DIR``, so the
two are separate nodes for the state hosts. Queries run in a child driver process
(``cluster_driver.py``): a pytest process holds one SparkContext, the local one of
``tests/spark``. Skip these tests in a quick local run with ``-m "not cluster"``.

The directory sorts after ``tests/conftest.py``: with ``--doctest-modules`` pytest imports that
file as the module ``conftest``, which must not be this one yet (an "import file mismatch").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from streamstate.devtools.local_cluster import LocalCluster
from support.jvm import JAVA_OPTIONS, spark_java_conf
from support.killed_driver import driver_env

HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    for item in items:
        if str(item.path).startswith(HERE + os.sep):
            item.add_marker(pytest.mark.cluster)


def _env() -> dict[str, str]:
    """Drivers, executors and state hosts import this checkout's streamstate."""
    env = driver_env()
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    return env


@pytest.fixture(scope="session")
def harness() -> Any:
    """The driver class and the process environment, for test modules that start their own
    cluster (``test_netns_faults.py``)."""
    return SimpleNamespace(Driver=Driver, env=_env)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: Any) -> Iterator[LocalCluster]:
    pytest.importorskip("pyspark")
    directory = str(tmp_path_factory.mktemp("cluster"))
    c = LocalCluster(
        workers=2,
        directory=directory,
        env={"PYTHONPATH": _env()["PYTHONPATH"], "SPARK_DAEMON_JAVA_OPTS": JAVA_OPTIONS},
    )
    # the workers register while the first test's driver starts: it waits for an executor
    # on each of them before its first query
    c.start(wait=False)
    try:
        yield c
    finally:
        c.stop()


class Driver:
    """A running ``cluster_driver.py``: its output lines, read as they come."""

    def __init__(
        self,
        cluster: LocalCluster,
        cfg: dict[str, Any],
        out: str,
        conf: dict[str, str] | None = None,
    ) -> None:
        self.out = out
        conf = {
            **cluster.spark_conf(),
            "spark.driver.memory": "512m",
            "spark.sql.shuffle.partitions": "4",
            "spark.default.parallelism": "4",
            "spark.sql.streaming.minBatchesToRetain": "3",
            **spark_java_conf(),
            **(conf or {}),
        }
        self.cfg = {"conf": conf, "executors": len(cluster.alive_nodes), "out": out, **cfg}
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "cluster_driver.py"), json.dumps(self.cfg)],
            stdin=subprocess.PIPE if cfg.get("serve") else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=HERE,
            env=_env(),
        )
        self.requests = 0
        self.lines: list[str] = []
        self.errors: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        stdout, stderr = self.proc.stdout, self.proc.stderr
        self._readers = [
            threading.Thread(target=lambda: self.lines.extend(map(str.strip, stdout))),
            threading.Thread(target=lambda: self.errors.extend(stderr)),
        ]
        for t in self._readers:
            t.start()

    def wait_until(self, ok: Callable[[], bool], what: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while not ok():
            if self.proc.poll() is not None:
                raise AssertionError(f"the driver exited before {what}:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}:\n{self.tail()}")
            time.sleep(0.1)

    def wait_for_line(self, line: str, since: int, what: str, timeout: float = 900) -> None:
        """Wait until the driver printed ``line`` after its first ``since`` lines."""
        self.wait_until(lambda: line in self.lines[since:], what, timeout)

    def request(self, run: dict[str, Any], out: str, executors: int) -> int:
        """Send a driver started with ``serve`` one query (see ``cluster_driver.py``); returns
        how many lines it had printed before (for :meth:`wait_for_line`)."""
        since = len(self.lines)
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"run": run, "out": out, "executors": executors}) + "\n")
        self.proc.stdin.flush()
        self.requests += 1
        return since

    def answer(self, out: str, timeout: float = 900) -> dict[str, Any]:
        """The figures of the last query sent with :meth:`request`."""
        i = self.requests - 1
        self.wait_until(lambda: f"DONE {i}" in self.lines, f"query {i}", timeout)
        with open(out) as f:
            return dict(json.load(f))

    def result(self, timeout: float = 300) -> list[dict[str, Any]]:
        try:
            code = self.proc.wait(timeout)
        finally:
            self.close()
        assert code == 0 and "DONE" in self.lines, self.tail()
        with open(self.out) as f:
            return list(json.load(f))

    def tail(self) -> str:
        return "".join(self.errors)[-4000:] + "\n" + "\n".join(self.lines[-20:])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # the child we started, by its Popen handle
            self.proc.wait()
        for t in self._readers:
            t.join()
