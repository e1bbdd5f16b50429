"""A streaming keyed query on a standalone cluster, as a child process of the cluster tests
(one SparkContext per process: the other Spark tests hold a local one).

usage: python cluster_driver.py '<json config>'; config keys:

- ``conf``: Spark settings (the cluster's ``LocalCluster.spark_conf()`` and more),
  ``executors``: executors to wait for before the first query;
- ``runs``: queries run one after the other, each with ``input``, ``checkpoint``, ``sink``,
  ``parallelism``, ``backend``, optionally ``pause`` ({trigger, marker, seconds, go}: the
  function sleeps once at that record, until the file ``go`` exists if given), ``add_files``
  (a directory whose files are moved into ``input`` before the run: more input for a restarted
  query) and ``wait_after`` ({batch, go}: after delivering that batch the sink prints
  ``WAITING <batch>`` and waits for the file ``go``);
- ``out``: where the results go (JSON): per run the batches' figures and ``read_state``;
- ``serve``: instead of ``runs``, read one request per stdin line (``{"run", "out",
  "executors"}``), run it, write its figures to ``out`` and print ``DONE <i>`` (one driver for
  many tests: its start is the slow part). A run may carry ``options`` for ``write_stream``.

Prints ``BATCH <run> <id>`` after each delivered batch and ``DONE`` at the end.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from cluster_functions import Count, CountPausingOnce
from pyspark.sql import SparkSession

from streamstate.devtools.local_cluster import wait_for_executors
from streamstate.spark import FileSink, keyed_process, read_state


class ReportingSink(FileSink):
    def __init__(self, path: str, run: int, wait_after: dict[str, Any] | None) -> None:
        super().__init__(path)
        self.run = run
        self.wait_after = wait_after

    def write(self, batch: Any) -> None:
        super().write(batch)
        print(f"BATCH {self.run} {batch.batch_id}", flush=True)
        if self.wait_after and batch.batch_id == self.wait_after["batch"]:
            print(f"WAITING {batch.batch_id}", flush=True)
            deadline = time.monotonic() + 300
            while not os.path.exists(self.wait_after["go"]) and time.monotonic() < deadline:
                time.sleep(0.1)


def run_query(spark: Any, run: dict[str, Any], i: int) -> dict[str, Any]:
    """Run one query of the config (see the module docstring); its figures."""
    if run.get("add_files"):
        for name in sorted(os.listdir(run["add_files"])):
            os.rename(os.path.join(run["add_files"], name), os.path.join(run["input"], name))
    function: Any = Count()
    if run.get("pause"):
        p = run["pause"]
        function = CountPausingOnce(p["trigger"], p["marker"], p["seconds"], p.get("go"))
    source = (
        spark.readStream.schema("user string, v long")
        .option("maxFilesPerTrigger", 1)
        .parquet(run["input"])
    )
    t0 = time.perf_counter()
    query = keyed_process(
        source,
        key="user",
        function=function,
        output_schema="user string, n long",
        checkpoint=run["checkpoint"],
        parallelism=run["parallelism"],
        state_backend=run["backend"],
    ).write_stream(
        ReportingSink(run["sink"], i, run.get("wait_after")),
        trigger={"availableNow": True},
        **run.get("options", {}),
    )
    query.await_termination()
    wall = time.perf_counter() - t0
    state = read_state(spark, run["checkpoint"], state="n").collect()
    print(f"RUN {i} {wall:.1f} s", flush=True)
    return {"wall_s": wall, "batches": query.batches, "state": {r.key: r.value for r in state}}


def main() -> None:
    cfg = json.loads(sys.argv[1])
    builder = SparkSession.builder.appName("streamstate-cluster-test")
    for key, value in cfg["conf"].items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    wait_for_executors(spark, cfg["executors"])
    if cfg.get("serve"):
        # one query per line of stdin ({"run": ..., "out": ..., "executors": n}), until EOF
        print("SERVING", flush=True)
        for i, line in enumerate(sys.stdin):
            request = json.loads(line)
            wait_for_executors(spark, request.get("executors", cfg["executors"]), timeout=300)
            result = run_query(spark, request["run"], i)
            with open(request["out"], "w") as f:
                json.dump(result, f, default=str)
            print(f"DONE {i}", flush=True)
        spark.stop()
        os._exit(0)
    results = [run_query(spark, run, i) for i, run in enumerate(cfg["runs"])]
    with open(cfg["out"], "w") as f:
        json.dump(results, f, default=str)
    print("DONE", flush=True)
    spark.stop()
    os._exit(0)


if __name__ == "__main__":
    main()
