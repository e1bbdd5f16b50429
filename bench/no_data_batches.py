"""What timely firing costs: the time of a no-data micro-batch against a micro-batch with input,
and an ``availableNow`` run with and without them (SPEC §13.1, ``docs/spark/streaming.md``,
"Timely firing").

The demo's job — views per app per hour of event time, ``watermark_delay`` 5 minutes — over
``--files`` Parquet files of ``--events`` generated page views (20 minutes of event time per
file, one file per micro-batch, ``availableNow``, ``local[2]``, parallelism 2, heap, Parquet
sink). With no-data micro-batches (the default) a micro-batch whose input moves the watermark
past an hour's end is followed by one without input that closes the hour; without them the hour
closes at the start of the next micro-batch with input, and the run ends with the last hour its
input closed still open (13 files: the last one's input closes hour 3). Both contenders run
alternately in one session, after an untimed warm-up of each; ``--repeat`` runs of each.

Printed and written to ``bench/results/no_data_batches.json``: per contender the median wall
time of a run, the median ``batch_ms`` of micro-batches with input (after the first) and of
no-data ones, and the windows emitted (with no-data micro-batches: every hour the input's
watermark closed).

    python bench/no_data_batches.py [--events 200000] [--files 13] [--apps 1000] [--repeat 2]
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

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

import pyarrow as pa
import pyarrow.parquet as pq

from streamstate.demo.job import HOUR_MS, page_view_batch, page_views_per_hour

HERE = os.path.dirname(os.path.abspath(__file__))
SLICE_MS = 20 * 60_000
DELAY_MS = 5 * 60_000


def write_input(directory: str, events: int, files: int, apps: int) -> list[tuple[str, int]]:
    os.makedirs(directory)
    out = []
    for i in range(files):
        rows = page_view_batch(
            i, events // files, start_ms=0, span_ms=SLICE_MS, apps=apps, disorder_ms=60_000
        )
        out += rows
        path = os.path.join(directory, f"part-{i:04d}.parquet")
        pq.write_table(pa.table({"app": [a for a, _ in rows], "ts": [t for _, t in rows]}), path)
        os.utime(path, (1_700_000_000 + 10 * i, 1_700_000_000 + 10 * i))
    return out


def run(spark: Any, directory: str, work: str, no_data: bool) -> dict[str, Any]:
    from streamstate.spark import FileSink, keyed_process

    if os.path.exists(work):
        shutil.rmtree(work)
    source = (
        spark.readStream.schema("app string, ts long")
        .option("maxFilesPerTrigger", 1)
        .parquet(directory)
    )
    t0 = time.perf_counter()
    query = keyed_process(
        source,
        key="app",
        function=page_views_per_hour(),
        output_schema="app string, hour long, views long",
        event_time="ts",
        watermark_delay=DELAY_MS,
        checkpoint=os.path.join(work, "ck"),
        parallelism=2,
    ).write_stream(
        "parquet",
        path=os.path.join(work, "out"),
        trigger={"availableNow": True},
        no_data_batches=no_data,
    )
    query.await_termination()
    wall = time.perf_counter() - t0
    table = FileSink(os.path.join(work, "out")).read_arrow()
    data = [b["batch_ms"] for b in query.batches if not b["no_data"]][1:]
    empty = [b["batch_ms"] for b in query.batches if b["no_data"]]
    return {
        "no_data_batches": no_data,
        "wall_s": wall,
        "data_batch_ms": data,
        "no_data_batch_ms": empty,
        "no_data_job_ms": [b["job_ms"] for b in query.batches if b["no_data"]],
        "windows": 0 if table is None else table.num_rows,
        "final_watermark": query.batches[-1]["watermark"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--files", type=int, default=13)
    parser.add_argument("--apps", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "no_data_batches.json"))
    args = parser.parse_args()

    from streamstate.demo.streaming import spark_session

    spark = spark_session(parallelism=2)
    tmp = tempfile.mkdtemp(prefix="ss-bench-nodata-")
    try:
        events = write_input(os.path.join(tmp, "in"), args.events, args.files, args.apps)
        top = max(t for _, t in events)
        closable = {
            (a, t // HOUR_MS) for a, t in events if (t // HOUR_MS + 1) * HOUR_MS <= top - DELAY_MS
        }
        for no_data in (True, False):  # warm-up: JIT, the hosts' imports, Spark's caches
            run(spark, os.path.join(tmp, "in"), os.path.join(tmp, "warm"), no_data)
        runs = []
        for r in range(args.repeat):
            for no_data in (True, False) if r % 2 == 0 else (False, True):
                got = run(spark, os.path.join(tmp, "in"), os.path.join(tmp, "run"), no_data)
                runs.append(got)
                print(
                    f"  no_data_batches={no_data!s:5}  {got['wall_s']:6.1f} s  "
                    f"{len(got['data_batch_ms']) + 1} with input, "
                    f"{len(got['no_data_batch_ms'])} without; {got['windows']} windows"
                )
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    def med(values: list[float]) -> float | None:
        return statistics.median(values) if values else None

    summary = {}
    for no_data in (True, False):
        mine = [r for r in runs if r["no_data_batches"] is no_data]
        summary["on" if no_data else "off"] = {
            "wall_s": med([r["wall_s"] for r in mine]),
            "data_batch_ms": med([x for r in mine for x in r["data_batch_ms"]]),
            "no_data_batch_ms": med([x for r in mine for x in r["no_data_batch_ms"]]),
            "no_data_job_ms": med([x for r in mine for x in r["no_data_job_ms"]]),
            "no_data_batches_per_run": med([len(r["no_data_batch_ms"]) for r in mine]),
            "windows": mine[0]["windows"],
        }
    on, off = summary["on"], summary["off"]
    print(
        f"\nmedian micro-batch with input {on['data_batch_ms']:.0f} ms, no-data micro-batch "
        f"{on['no_data_batch_ms']:.0f} ms (its Spark job {on['no_data_job_ms']:.0f} ms), "
        f"{on['no_data_batches_per_run']:.0f} per run; run {on['wall_s']:.1f} s with them, "
        f"{off['wall_s']:.1f} s without ({on['wall_s'] / off['wall_s']:.2f}x)"
    )
    print(
        f"windows emitted: {on['windows']} with (every closable one: {len(closable)}), "
        f"{off['windows']} without"
    )
    assert on["windows"] == len(closable), (on["windows"], len(closable))
    result = {
        "config": vars(args) | {"machine": platform.node(), "cpus": os.cpu_count()},
        "summary": summary,
        "runs": runs,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
