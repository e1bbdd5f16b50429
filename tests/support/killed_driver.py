"""``tests/support/stream_driver.py`` as a child driver process that a test SIGKILLs: its start
(JVM and SparkSession at once, the query on a signal), the kill at a chosen point with the
check that every process of the query goes with it, and the state hosts left afterwards."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from streamstate.devtools.local_cluster import descendants, live_processes
from streamstate.spark.job import src_path
from support.jvm import JAVA_OPTIONS

__all__ = ["STREAM_DRIVER", "driver_env", "processes_naming", "run_until_killed", "start_driver"]

#: the driver script (``tests/support/stream_driver.py``)
STREAM_DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stream_driver.py")
#: the tests' directory (``support`` is a package in it)
_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def driver_env() -> dict[str, str]:
    """This process's environment for a child process (a driver, a cluster's daemons): it
    imports the same streamstate (a source checkout is not installed), and the tests' helpers
    as the tests do (``support.<module>``: ``tests/`` last on its path)."""
    env = dict(os.environ)
    paths = (src_path(), env.get("PYTHONPATH"), _TESTS)
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def start_driver(cfg: dict[str, Any], path: str, start_when: str) -> subprocess.Popen[str]:
    """Start ``stream_driver.py`` on ``cfg`` (written to ``path``: the checkpoint must not be
    on the driver's command line, or the driver would pass for one of the query's processes).
    Its JVM and SparkSession start at once; its query starts once the file ``start_when``
    exists (:func:`run_until_killed` creates it)."""
    with open(path, "w") as f:
        json.dump({"java_options": JAVA_OPTIONS, **cfg, "start_when": start_when}, f)
    return subprocess.Popen(
        [sys.executable, STREAM_DRIVER, "@" + path],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=os.path.dirname(STREAM_DRIVER),
        env=driver_env(),
    )


def _tree(root: int, marker: str) -> set[int]:
    """``root``, its descendants, and every process whose command line names ``marker``."""
    procs = live_processes()
    found = {root} | descendants(root, procs)
    found |= {pid for pid, (_, cmd) in procs.items() if marker in cmd}
    return {p for p in found if p in procs}


def run_until_killed(
    proc: subprocess.Popen[str], start: str, until: Callable[[list[str]], bool], marker: str
) -> list[str]:
    """Let the driver ``proc`` (from :func:`start_driver`, waiting for the file ``start``)
    start its query, wait until ``until(lines of its stdout)`` holds, SIGKILL the driver, and
    check that every process of the query (JVM, Python workers, state hosts: those naming
    ``marker``, its checkpoint) goes away. Returns the driver's stdout lines."""
    lines: list[str] = []
    assert proc.stdout is not None
    stdout = proc.stdout
    reader = threading.Thread(target=lambda: lines.extend(map(str.strip, stdout)))
    reader.start()
    try:
        with open(start, "w"):
            pass
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
            proc.kill()  # our own child, by its handle
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
