"""State as a Spark data source against Parquet: ``spark.read.format("streamstate")`` of a
checkpoint against ``spark.read.parquet`` of the same ``(key, value)`` rows, in one
``local[2]`` session.

Two checkpoints of a job (``LocalRunner``, parallelism 2, keys ``"u<i>"``), ``--entries`` keys
each (default 1M), written by the ``--backends`` (default ``heap``):

=========  ==========================================================================
state      value
=========  ==========================================================================
``int``    a ``ValueState[int]``
``record`` a ``ValueState`` of a ``msgspec.Struct`` ``Visit(page: str, clicks: int,
           score: float)``: a ``struct<page: string, clicks: bigint, score: double>``
=========  ==========================================================================

The Parquet files are the format's own rows (``select("key", "value")``) written by Spark, so
both sides hold the same rows with the same types, in two files (the checkpoint's two
subtasks). Each side is read two ways:

* ``count``: ``df.count()``, "read and counted". Parquet answers it from its row groups'
  metadata without reading a value; a Python data source reads every row.
* ``read``: ``df.select(count(*), bit_xor(xxhash64(key, value)))``: every value read by both
  sides (what a query that looks at the state costs).

Every contender runs once untimed first; then ``--repeat`` rounds (default 5) alternate the
sides; each figure is the median over the rounds (range in the JSON) and the ratio is
``streamstate / parquet``. Goal: at most 3x for the ``read`` of both states. Run the whole
benchmark at least twice (each run starts its own Spark session): the figures move with the
machine's load, which the JSON records.

Writes ``bench/results/state_source.json`` (``--out``).

    python bench/state_source.py [--entries 1000000] [--repeat 5] [--backends heap,rocksdb]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import msgspec

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

from streamstate import KeyedProcessFunction, LocalRunner, ValueStateDescriptor


class Visit(msgspec.Struct):
    page: str
    clicks: int
    score: float


class Put(KeyedProcessFunction):
    """Writes one value per key: the record's number, or a ``Visit`` of it."""

    def __init__(self, record: bool) -> None:
        self.record = record

    def open(self, ctx: Any) -> None:
        self.value = ctx.get_state(ValueStateDescriptor("value", Visit if self.record else int))

    def process_element(self, value: Any, ctx: Any) -> Any:
        i = value[1]
        self.value.update(Visit(f"/p{i % 1000}", i, i / 3) if self.record else i)
        return None


def write_checkpoint(directory: str, entries: int, record: bool, backend: str) -> str:
    """A job directory whose latest checkpoint holds ``entries`` keys of state ``value``."""
    runner = LocalRunner(
        Put(record),
        key_selector=lambda r: r[0],
        parallelism=2,
        state_backend=backend,
        checkpoint_storage=directory,
    )
    runner.run(((f"u{i}", i) for i in range(entries)), final_watermark=False)
    runner.checkpoint()
    runner.close()
    return os.path.join(directory, "job")


def session() -> Any:
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("bench-state-source")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _timed(run: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    result = run()
    return time.perf_counter() - start, result


def bench_state(spark: Any, job: str, parquet: str, entries: int, repeat: int) -> dict[str, Any]:
    """Medians (s) of ``count`` and ``read`` of both sides over ``repeat`` alternating rounds."""
    from pyspark.sql import functions as F  # noqa: N812 - Spark's spelling

    def state() -> Any:
        return spark.read.format("streamstate").option("state", "value").load(job)

    def table() -> Any:
        return spark.read.parquet(parquet)

    def count(df: Any) -> int:
        return int(df.count())

    def read(df: Any) -> tuple[int, int]:
        row = df.select(F.count("*").alias("n"), F.bit_xor(F.xxhash64("key", "value")).alias("h"))
        got = row.collect()[0]
        return int(got.n), int(got.h)

    sides = {"streamstate": state, "parquet": table}
    ops = {"count": count, "read": read}
    times: dict[str, dict[str, list[float]]] = {s: {o: [] for o in ops} for s in sides}
    results: dict[str, dict[str, Any]] = {s: {} for s in sides}
    for side, make in sides.items():  # warm-up, untimed
        for op, run in ops.items():
            results[side][op] = run(make())
    if results["streamstate"] != results["parquet"] or results["parquet"]["count"] != entries:
        raise AssertionError(f"the two sides differ: {results}")
    for r in range(repeat):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for side in order:
            for op, run in ops.items():
                seconds, _ = _timed(lambda run=run, side=side: run(sides[side]()))
                times[side][op].append(seconds)
    out: dict[str, Any] = {}
    for op in ops:
        mine, base = times["streamstate"][op], times["parquet"][op]
        out[op] = {
            "streamstate_s": round(statistics.median(mine), 3),
            "parquet_s": round(statistics.median(base), 3),
            "ratio": round(statistics.median(mine) / statistics.median(base), 2),
            "streamstate_range_s": [round(min(mine), 3), round(max(mine), 3)],
            "parquet_range_s": [round(min(base), 3), round(max(base), 3)],
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--backends", default="heap")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "state_source.json"))
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="bench-state-source-")
    spark = session()
    from streamstate.spark import register

    register(spark)
    out: dict[str, Any] = {
        "entries": args.entries,
        "repeat": args.repeat,
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average_start": os.getloadavg(),
        },
        "results": [],
    }
    try:
        for backend in args.backends.split(","):
            for kind in ("int", "record"):
                directory = os.path.join(root, f"{backend}-{kind}")
                seconds, job = _timed(
                    lambda d=directory, k=kind, b=backend: write_checkpoint(
                        d, args.entries, k == "record", b
                    )
                )
                parquet = os.path.join(directory, "parquet")
                state = spark.read.format("streamstate").option("state", "value").load(job)
                state.select("key", "value").write.parquet(parquet)
                figures = bench_state(spark, job, parquet, args.entries, args.repeat)
                row = {"backend": backend, "state": kind, "write_checkpoint_s": round(seconds, 1)}
                row.update(figures)
                out["results"].append(row)
                print(
                    f"{backend:8} {kind:7} "
                    + "  ".join(
                        f"{op}: {f['streamstate_s']:.2f}s vs parquet {f['parquet_s']:.2f}s "
                        f"= {f['ratio']:.2f}x"
                        for op, f in figures.items()
                    ),
                    flush=True,
                )
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    out["machine"]["load_average_end"] = os.getloadavg()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
