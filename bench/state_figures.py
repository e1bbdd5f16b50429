"""What the state figures in Spark's progress cost (SPEC §13.5, ``docs/spark/monitoring.md``).

Question 1, ``subtask``: the per-micro-batch cost of taking the figures in a subtask (the
backend's ``state_figures()``: table sizes and change counts on the heap backend, property reads
on RocksDB; the checkpoint's file sizes; the resident memory), against the whole micro-batch.
One in-process :class:`~streamstate.spark.subtask.SubtaskRuntime` per backend holds ``--keys``
keys (a ValueState count); each micro-batch processes ``--records`` records over random keys and
checkpoints. Contender and baseline alternate batch by batch (AB BA ...) over ``--batches``
batches: the baseline's ``state_figures`` returns a constant and the resident memory is not
read. Figures: median CPU time (``time.process_time``) per micro-batch and the ratio.

Question 2, ``spark``: the per-row cost of the ``streamstate`` observation in the JVM (a
``max`` over a null literal per figure per row) and of setting its value from the
driver, on a classic ``local[2]`` session: a streaming query over ``--files`` Parquet files of
``--rows`` rows (one file per micro-batch, ``availableNow``) whose ``foreachBatch`` counts the
rows, with and without ``observe_state`` plus ``ProgressPublisher.publish``; the two alternate
``--repeat`` times after an untimed warm-up of each. Figure: median wall time of a micro-batch
(Spark's ``batchDuration``, the first batch left out) and the ratio.

Printed and written to ``bench/results/state_figures.json``:

    python bench/state_figures.py [--keys 100000] [--records 20000] [--batches 40]
                                  [--files 8] [--rows 200000] [--repeat 3] [--skip-spark]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

import pyarrow as pa

from streamstate import KeyedProcessFunction, ValueStateDescriptor
from streamstate.backends.figures import StateFigures
from streamstate.keygroups import assign_key_groups
from streamstate.spark import subtask as subtask_module
from streamstate.spark.job import JobSpec, arrow_schema_to_bytes
from streamstate.spark.subtask import SubtaskRuntime

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64()), ("_kg", pa.int32())])
OUT = pa.schema([("k", pa.int64()), ("n", pa.int64())])


class Count(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.n = ctx.get_state(ValueStateDescriptor("n", int, default=0))

    def process_element(self, value: Any, ctx: Any) -> Any:
        n = self.n.value() + 1
        self.n.update(n)
        return None


def _runtime(directory: str, backend: str) -> SubtaskRuntime:
    job = JobSpec(
        operator="op",
        parallelism=1,
        max_parallelism=128,
        key_columns=["k"],
        value_columns=["k", "v"],
        input_schema=arrow_schema_to_bytes(SCHEMA),
        output_schema=arrow_schema_to_bytes(OUT),
        checkpoint_url=os.path.join(directory, "ck"),
        state_backend=backend,
    )
    return SubtaskRuntime(job, 0, Count, local_dir=os.path.join(directory, "local"))


def _batch(keys: list[int]) -> pa.RecordBatch:
    column = pa.array(keys, pa.int64())
    return pa.record_batch(
        [column, column, pa.array(assign_key_groups(column, 128), pa.int32())], schema=SCHEMA
    )


class _Off:
    """The baseline: no figures taken."""

    def __init__(self, runtime: SubtaskRuntime) -> None:
        self.backend = runtime.op.keyed_backend
        self.real = self.backend.state_figures
        self.real_rss = subtask_module.resident_bytes

    def __enter__(self) -> None:
        self.backend.state_figures = lambda: StateFigures(rows=0)
        subtask_module.resident_bytes = lambda: None

    def __exit__(self, *exc: object) -> None:
        self.backend.state_figures = self.real
        subtask_module.resident_bytes = self.real_rss


def bench_subtask(backend: str, keys: int, records: int, batches: int) -> dict[str, Any]:
    directory = tempfile.mkdtemp(prefix="bench-figures-")
    rnd = random.Random(1)
    runtime = _runtime(directory, backend)
    try:
        runtime.prepare(-1, "L0")
        version = -1
        times: dict[str, list[float]] = {"on": [], "off": []}
        figures_ms: list[float] = []

        def run(batch_keys: list[int], off: bool) -> float:
            nonlocal version
            if version >= 0:
                runtime.prepare(version, "L1", 1)
            t0 = time.process_time()
            runtime.begin(None, None)
            runtime.process(_batch(batch_keys))
            if off:
                with _Off(runtime):
                    runtime.finish(version + 1, 1, "L1")
            else:
                runtime.finish(version + 1, 1, "L1")
            version += 1
            return (time.process_time() - t0) * 1e3

        run(list(range(keys)), off=True)  # every key gets state
        for i in range(batches):
            order = ("on", "off") if i % 2 == 0 else ("off", "on")
            for which in order:
                batch_keys = [rnd.randrange(keys) for _ in range(records)]
                times[which].append(run(batch_keys, off=which == "off"))
        # the figures alone, for scale
        backend_obj = runtime.op.keyed_backend
        for _ in range(20):
            t0 = time.process_time()
            backend_obj.state_figures()
            subtask_module.resident_bytes()
            figures_ms.append((time.process_time() - t0) * 1e3)
    finally:
        runtime.close()
        shutil.rmtree(directory, ignore_errors=True)
    on, off = statistics.median(times["on"]), statistics.median(times["off"])
    return {
        "backend": backend,
        "keys": keys,
        "records_per_batch": records,
        "batches_each": batches,
        "batch_ms_with_figures": round(on, 3),
        "batch_ms_without": round(off, 3),
        "ratio": round(on / off, 4),
        "figures_alone_ms": round(statistics.median(figures_ms), 4),
    }


def bench_spark(files: int, rows: int, repeat: int) -> dict[str, Any]:
    import pyarrow.parquet as pq
    from pyspark.sql import SparkSession

    from streamstate.spark.driver.monitor.progress import (
        ProgressPublisher,
        micro_batch_figures,
        observe_state,
    )

    directory = tempfile.mkdtemp(prefix="bench-figures-spark-")
    for i in range(files):
        path = os.path.join(directory, "in", f"part-{i:04d}.parquet")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        pq.write_table(pa.table({"k": pa.array(range(i * rows, (i + 1) * rows), pa.int64())}), path)
        os.utime(path, (1_700_000_000 + 10 * i, 1_700_000_000 + 10 * i))
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    figures = {"numInputRows": rows, "numRowsTotal": rows}
    publish_ms: list[float] = []

    def run(observed: bool, n: int) -> list[float]:
        source = (
            spark.readStream.schema("k long")
            .option("maxFilesPerTrigger", 1)
            .parquet(os.path.join(directory, "in"))
        )
        publisher = ProgressPublisher()
        holder: dict[str, Any] = {}
        df = observe_state(source) if observed else source

        def each(batch: Any, batch_id: int) -> None:
            batch.count()
            if observed:
                while "q" not in holder:
                    time.sleep(0.01)
                t0 = time.perf_counter()
                publisher.publish(spark, str(holder["q"].id), micro_batch_figures([figures]) or {})
                publish_ms.append((time.perf_counter() - t0) * 1e3)

        query = (
            df.writeStream.foreachBatch(each)
            .option("checkpointLocation", os.path.join(directory, f"spark-{n}"))
            .trigger(availableNow=True)
            .start()
        )
        holder["q"] = query
        query.awaitTermination()
        progress = query.recentProgress
        if observed:
            assert progress[-1]["observedMetrics"]["streamstate"]["numRowsTotal"] == rows
        return [float(p["batchDuration"]) for p in progress[1:]]

    try:
        run(True, -1)
        run(False, -2)
        durations: dict[str, list[float]] = {"with": [], "without": []}
        for r in range(repeat):
            for which in ("with", "without") if r % 2 == 0 else ("without", "with"):
                durations[which] += run(which == "with", r * 2 + (which == "with"))
    finally:
        spark.stop()
        shutil.rmtree(directory, ignore_errors=True)
    on, off = statistics.median(durations["with"]), statistics.median(durations["without"])
    return {
        "files": files,
        "rows_per_batch": rows,
        "repeat": repeat,
        "batch_ms_with_observation": on,
        "batch_ms_without": off,
        "ratio": round(on / off, 4),
        "publish_ms": round(statistics.median(publish_ms), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-spark", action="store_true")
    args = parser.parse_args()
    out: dict[str, Any] = {
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg(),
        },
        "subtask": [
            bench_subtask(b, args.keys, args.records, args.batches) for b in ("heap", "rocksdb")
        ],
    }
    for row in out["subtask"]:
        print(json.dumps(row))
    if not args.skip_spark:
        out["spark"] = bench_spark(args.files, args.rows, args.repeat)
        print(json.dumps(out["spark"]))
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "state_figures.json"), "w") as f:
        json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
