"""``streamstate demo --cluster N``: the demo on a local standalone cluster it starts and stops."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from streamstate.devtools.local_cluster import live_processes
from streamstate.spark.job import src_path
from support.jvm import JAVA_OPTIONS


def test_demo_runs_on_a_two_node_cluster_and_leaves_nothing_behind(tmp_path: Any) -> None:
    # every JVM of the demo (driver, master, workers, executors) with the tests' JVM options;
    # the java launcher notes them on its stderr, which this test does not read
    env = dict(os.environ, COLUMNS="160", PYTHONPATH=src_path(), JDK_JAVA_OPTIONS=JAVA_OPTIONS)
    env.pop("STREAMSTATE_RUN_DIR", None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "streamstate",
            "demo",
            "--cluster",
            "2",
            "--events",
            "6000",
            "--batches",
            "4",
            "--dir",
            str(tmp_path / "demo"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    assert "2 workers" in out
    # every micro-batch after the first found its state hot on the cluster's two nodes, the
    # no-data one that closes hour 0 after the fourth too (its tasks reach the hosts anywhere)
    assert "5 micro-batches (1 without input, closing hours)" in out, out[-2000:]
    assert "state per batch: empty x1, hot x4" in out, out[-2000:]
    assert not {p for p, (_, cmd) in live_processes().items() if "streamstate-demo-cluster-" in cmd}
