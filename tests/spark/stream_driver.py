"""A streaming keyed query as a child process, for the tests that SIGKILL the driver.

usage: python stream_driver.py '<json config>'; config keys: input, checkpoint, sink,
parallelism, fault_marker (a host sleeps at record v == fault_at until killed, once),
fault_at, sleep_after_batch (the sink sleeps after delivering this batch, before Spark's
commit). Prints ``BATCH <id>`` after each delivered batch and ``SLEEPING`` before a sleep.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from functions import Count, CountWithFaults
from pyspark.sql import SparkSession

from streamstate.spark import FileSink, keyed_process


class ReportingSink(FileSink):
    def __init__(self, path: str, sleep_after: int | None) -> None:
        super().__init__(path)
        self.sleep_after = sleep_after

    def write(self, batch: Any) -> None:
        super().write(batch)
        print(f"BATCH {batch.batch_id}", flush=True)
        if batch.batch_id == self.sleep_after:
            print("SLEEPING", flush=True)
            time.sleep(600)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    function: Any = Count()
    if cfg.get("fault_marker"):
        function = CountWithFaults(cfg["fault_at"], cfg["fault_marker"], mode="sleep")
    source = (
        spark.readStream.schema("user string, v long")
        .option("maxFilesPerTrigger", 1)
        .parquet(cfg["input"])
    )
    query = keyed_process(
        source,
        key="user",
        function=function,
        output_schema="user string, n long",
        checkpoint=cfg["checkpoint"],
        parallelism=cfg["parallelism"],
    ).write_stream(
        ReportingSink(cfg["sink"], cfg.get("sleep_after_batch")), trigger={"availableNow": True}
    )
    query.await_termination()
    restores = [b.get("restore", "replayed") for b in query.batches]
    print("DONE " + json.dumps(restores), flush=True)
    spark.stop()
    os._exit(0)


if __name__ == "__main__":
    main()
