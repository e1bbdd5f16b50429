"""A streaming keyed query as a child process, for the tests that SIGKILL the driver.

usage: python stream_driver.py '<json config>' (or ``@<file>`` holding it, which keeps the
checkpoint path out of the driver's command line); config keys: input, checkpoint, sink,
parallelism, remote (a Spark Connect URL: the driver is a Connect client),
fault_marker (a host sleeps at record v == fault_at until killed, once),
fault_at, sleep_after_batch (the sink sleeps after delivering this batch, before Spark's
commit), state_backend, delay (seconds per record) with marker/marker_at/go (SlowCount),
pause_after_batch with go (the sink waits for the file ``go`` after delivering it),
start_when (a file: the driver starts its SparkSession at once, prints ``READY`` and starts
the query only once that file exists - a test overlaps the JVM's start with an earlier
driver's run without changing when the query starts), window (event-time windows of this
size over ``v`` with watermark delay 0: outputs user, start, n) with sleep_at_window (a host
sleeps, once, when it fires the window starting there; marker file ``fault_marker``),
java_options (the local driver JVM's options: ``tests/support/jvm.py``). Prints
``BATCH <id>`` after each delivered batch (its checkpoint id), ``SLEEPING`` before a sleep,
``DONE [...]`` at the end, or ``FENCED <message>`` (exit status 3) if another driver took the
job over.

With ``serve`` the driver starts its session, prints ``SERVING`` and runs one query per line
of its standard input (a config as above, without the session's keys), each printing
``START <i>`` (on stderr too), what a single run prints, then ``END <i> DONE|FENCED|FAILED``
(``FAILED``: the query raised another error, its traceback on stderr); it ends at the end of
its input (one JVM for the queries of several tests: its start is the slow part).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

from pyspark.sql import SparkSession

from streamstate.errors import CheckpointFencedError
from streamstate.spark import FileSink, keyed_process
from streamstate.windows import TumblingEventTimeWindows, window
from support.spark_functions import (
    Count,
    CountWithFaults,
    SlowCount,
    WindowSize,
    WindowSizeWithSleep,
)


class ReportingSink(FileSink):
    def __init__(
        self,
        path: str,
        sleep_after: int | None,
        pause_after: int | None = None,
        go: str | None = None,
    ) -> None:
        super().__init__(path)
        self.sleep_after = sleep_after
        self.pause_after = pause_after
        self.go = go

    def write(self, batch: Any) -> None:
        super().write(batch)
        print(f"BATCH {batch.batch_id}", flush=True)
        if batch.batch_id == self.pause_after and self.go:
            deadline = time.monotonic() + 120
            while not os.path.exists(self.go) and time.monotonic() < deadline:
                time.sleep(0.05)
        if batch.batch_id == self.sleep_after:
            print("SLEEPING", flush=True)
            time.sleep(600)


def session(cfg: dict[str, Any]) -> Any:
    """The config's SparkSession: a Connect client of ``remote``, or a local session."""
    if cfg.get("remote"):
        spark = SparkSession.builder.remote(cfg["remote"]).getOrCreate()
    else:
        builder = SparkSession.builder
        if cfg.get("java_options"):
            builder = builder.config("spark.driver.extraJavaOptions", cfg["java_options"])
        spark = (
            builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
    return spark


def run(spark: Any, cfg: dict[str, Any]) -> str:
    """Run the config's query to its end: ``DONE``, or ``FENCED`` if another driver took the
    job over (printed with the reason); another error is raised."""
    function: Any = Count()
    output_schema = "user string, n long"
    timing: dict[str, Any] = {}
    if cfg.get("window"):
        fires: Any = WindowSize()
        if cfg.get("fault_marker"):
            fires = WindowSizeWithSleep(cfg["sleep_at_window"], cfg["fault_marker"])
        function = window(TumblingEventTimeWindows.of(cfg["window"])).process(fires)
        output_schema = "user string, start long, n long"
        timing = {"event_time": "v", "watermark_delay": 0}
    elif cfg.get("fault_marker"):
        function = CountWithFaults(cfg["fault_at"], cfg["fault_marker"], mode="sleep")
    if cfg.get("delay"):
        function = SlowCount(
            cfg["delay"], cfg.get("marker"), cfg.get("marker_at", -1), cfg.get("go")
        )
    source = (
        spark.readStream.schema("user string, v long")
        .option("maxFilesPerTrigger", 1)
        .parquet(cfg["input"])
    )
    query = keyed_process(
        source,
        key="user",
        function=function,
        output_schema=output_schema,
        checkpoint=cfg["checkpoint"],
        parallelism=cfg["parallelism"],
        state_backend=cfg.get("state_backend", "heap"),
        **timing,
    ).write_stream(
        ReportingSink(
            cfg["sink"], cfg.get("sleep_after_batch"), cfg.get("pause_after_batch"), cfg.get("go")
        ),
        trigger={"availableNow": True},
    )
    try:
        query.await_termination()
    except Exception as exc:
        text = str(exc)
        if isinstance(exc, CheckpointFencedError):
            line = text.splitlines()[0]
        elif "CheckpointFencedError: " in text:
            line = next(ln for ln in text.splitlines() if "CheckpointFencedError: " in ln)
        else:
            raise
        print("FENCED " + line.strip(), flush=True)
        return "FENCED"
    restores = [b.get("restore", "replayed") for b in query.batches]
    print("DONE " + json.dumps(restores), flush=True)
    return "DONE"


def serve(spark: Any) -> None:
    """One query per line of standard input, until its end (see the module docstring)."""
    print("SERVING", flush=True)
    for i, line in enumerate(sys.stdin):
        print(f"START {i}", flush=True)
        print(f"START {i}", file=sys.stderr, flush=True)
        try:
            status = run(spark, json.loads(line))
        except Exception:
            traceback.print_exc()
            sys.stderr.flush()
            status = "FAILED"
        print(f"END {i} {status}", flush=True)


def main() -> None:
    arg = sys.argv[1]
    if arg.startswith("@"):
        with open(arg[1:]) as f:
            arg = f.read()
    cfg = json.loads(arg)
    spark = session(cfg)
    if cfg.get("serve"):
        serve(spark)
        spark.stop()
        os._exit(0)
    if cfg.get("start_when"):
        print("READY", flush=True)
        deadline = time.monotonic() + 600
        while not os.path.exists(cfg["start_when"]):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {cfg['start_when']} after 600 s")
            time.sleep(0.05)
    status = run(spark, cfg)
    spark.stop()
    os._exit(3 if status == "FENCED" else 0)


if __name__ == "__main__":
    main()
