"""streamstate's window aggregation against Spark SQL's, on the demo's job (SPEC §13.2).

The job: views per key per hour, ``window(TumblingEventTimeWindows.of(1 h)).aggregate(...,
EmitHour())`` keyed by ``app`` with ``watermark_delay`` 5 min, over ``--events`` page views
(default 1M) in ``--files`` Parquet files (default 10) read one per micro-batch
(``maxFilesPerTrigger=1``, ``trigger(availableNow=True)``), each file 20 minutes of event time
with up to 2 minutes of disorder (as the demo generates them), for each of ``--keys`` distinct
keys (default 5, 10k, 1M). Contenders, all in one ``local[2]`` session (Spark's RocksDB state
store provider, 2 shuffle partitions):

======================  ========================================================================
contender               what runs
======================  ========================================================================
``spark-sql``           ``withWatermark("ts", "5 minutes").groupBy(window("ts", "1 hour"),
                        "app").count()``, append mode, the Parquet file sink
``builtin-count``       ``keyed_process`` (parallelism 2, heap) with the built-in ``Count()``:
                        pre-aggregated by Spark SQL's partial aggregation before the shuffle
``python-aggregate``    the same with a Python ``AggregateFunction`` (the demo's ``CountViews``):
                        pre-aggregated by the Python fold before the shuffle
``per-record``          the Python ``AggregateFunction`` with ``pre_aggregate=False``: every
                        record crosses the shuffle and reaches the state host
======================  ========================================================================

streamstate's contenders write the exactly-once Parquet sink. Spark SQL's shuffle partitions
are 2, the parallelism of streamstate's contenders, on the 2 cores of ``local[2]``: each side
runs its stateful step in as many tasks as there are cores (Spark's default of 200 partitions
would schedule 200 state-store tasks per micro-batch for 2 cores, and streamstate's
``parallelism`` is the number of its stateful tasks).

Fairness as in ``bench/spark_pipeline.py`` (whose helpers this script uses): every contender
first runs once, untimed, over the same warm-up input, then the JIT settles; ``--repeat`` rotates
the order; each contender's figure is the median over its repeats, printed with the range.
"wall" is the whole query including its start, as events per second.

Printed per run: wall time and events/s, the rows Spark shuffled per steady micro-batch (both
shuffles when there are two; Spark's status store), the rows that reached the state hosts per
micro-batch (folded rows, or every record), CPU seconds per process kind, and whether the
output equals Spark SQL's row for row (``equal``; ``missing N`` when streamstate's rows are a
subset, as without no-data micro-batches: the hours whose end the last batch's watermark passes
close only in a micro-batch without new data; ``differs`` otherwise).
Per key count the ratios to Spark SQL and the goals (issue 22): built-in count >= 1.5x at 5 and
10k keys, Python aggregate >= 1.2x, both >= 1.0x at 1M keys.

    python bench/spark_windows.py [--events 1000000] [--keys 5,10000,1000000] [--files 10]
        [--repeat 2] [--contenders spark-sql,builtin-count,python-aggregate,per-record]
        [--no-warm-up] [--warm-up-events 300000] [--out bench/results/spark_windows.json]

Writes ``--out`` (JSON) and, with matplotlib, ``docs/img/spark_windows.png``.
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
from collections import Counter
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from spark_pipeline import (
    _cpu_line,
    _median_cpu,
    _median_stages,
    bench_session,
    cpu_delta,
    hosts_cpu,
    jit_settle,
    jvm_counters,
    jvm_delta,
    jvm_pid,
    process_cpu,
    rotations,
    stage_breakdown,
)

HERE = os.path.dirname(os.path.abspath(__file__))
CONTENDERS = ("spark-sql", "builtin-count", "python-aggregate", "per-record")
STREAMSTATE = ("builtin-count", "python-aggregate", "per-record")
HOUR_MS = 3_600_000
#: 2026-01-05 00:00 UTC, as the demo; each file holds 20 minutes, disorder up to 2 minutes
START_MS = 1_767_571_200_000
SLICE_MS = 20 * 60_000
DISORDER_MS = 2 * 60_000
DELAY_MS = 5 * 60_000
GOALS = {  # (contender, keys) -> events/s ratio to Spark SQL (issue 22)
    "builtin-count": {5: 1.5, 10_000: 1.5, 1_000_000: 1.0},
    "python-aggregate": {5: 1.2, 10_000: 1.2, 1_000_000: 1.0},
}


def write_input(directory: str, events: int, keys: int, files: int, seed: int) -> None:
    """``files`` Parquet files (``app`` string, ``ts`` timestamp) with increasing modification
    times; every key appears at least once when ``events >= keys``."""
    os.makedirs(directory)
    rng = np.random.default_rng(seed)
    ks = rng.permutation(
        np.concatenate([np.arange(min(keys, events)), rng.integers(0, keys, max(0, events - keys))])
    )
    ts = START_MS + np.arange(events, dtype=np.int64) * (files * SLICE_MS) // events
    ts = np.maximum(ts + rng.integers(-DISORDER_MS, DISORDER_MS + 1, events), START_MS)
    apps = np.char.add("app-", ks.astype(str))
    for i, part in enumerate(np.array_split(np.arange(events), files)):
        path = os.path.join(directory, f"part-{i:04d}.parquet")
        table = pa.table({"app": apps[part], "ts": ts[part].astype("datetime64[ms]")})
        pq.write_table(table, path)
        stamp = 1_700_000_000 + 10 * i  # the file source orders by modification time
        os.utime(path, (stamp, stamp))


def source(spark: Any, directory: str) -> Any:
    return (
        spark.readStream.schema("app string, ts timestamp")
        .option("maxFilesPerTrigger", 1)
        .parquet(directory)
    )


def _rows(table: Any) -> Counter[tuple[str, int, int]]:
    """The output's rows, each with how often it occurs (a duplicate is a difference)."""
    return Counter(
        zip(
            table["app"].to_pylist(),
            table["hour"].to_pylist(),
            table["views"].to_pylist(),
            strict=True,
        )
    )


def run_spark_sql(spark: Any, src: Any, work: str) -> dict[str, Any]:
    from pyspark.sql import functions as sf

    out = os.path.join(work, "out")
    query = (
        src.withWatermark("ts", "5 minutes")
        .groupBy(sf.window("ts", "1 hour"), "app")
        .count()
        .select(
            "app",
            (sf.unix_millis(sf.col("window.start")) / HOUR_MS).cast("long").alias("hour"),
            sf.col("count").alias("views"),
        )
        .writeStream.outputMode("append")
        .format("parquet")
        .option("path", out)
        .option("checkpointLocation", os.path.join(work, "spark"))
        .trigger(availableNow=True)
    )
    t0 = time.perf_counter()
    q = query.start()
    q.awaitTermination()
    wall = time.perf_counter() - t0
    progress = list(q.recentProgress)
    table = pads.dataset(out, format="parquet", exclude_invalid_files=True).to_table()
    return {
        "wall_s": wall,
        "progress": progress,
        "rows": sum(p["numInputRows"] for p in progress),
        "output": _rows(table),
    }


def run_streamstate(spark: Any, src: Any, work: str, name: str) -> dict[str, Any]:
    from streamstate.demo.job import CountViews, EmitHour
    from streamstate.spark import FileSink, keyed_process
    from streamstate.windows import Count, TumblingEventTimeWindows, window

    aggregate = Count() if name == "builtin-count" else CountViews()
    out = os.path.join(work, "out")
    t0 = time.perf_counter()
    query = keyed_process(
        src,
        key="app",
        function=window(TumblingEventTimeWindows.of(HOUR_MS)).aggregate(aggregate, EmitHour()),
        output_schema="app string, hour long, views long",
        event_time="ts",
        watermark_delay=DELAY_MS,
        checkpoint=os.path.join(work, "ck"),
        parallelism=2,
        pre_aggregate=None if name != "per-record" else False,
    ).write_stream("parquet", path=out, trigger={"availableNow": True})
    query.await_termination()
    wall = time.perf_counter() - t0
    host_cpu = hosts_cpu(query.batches)  # before stop() ends the hosts
    query.stop()
    mode = "per-record" if name == "per-record" else query.job.pre_aggregation
    with_input = [b for b in query.batches if b.get("rows")]
    # what reached the hosts per micro-batch with input: folded rows, or every record
    to_hosts = statistics.median(b.get("partials", b["rows"]) for b in with_input or [{"rows": 0}])
    return {
        "wall_s": wall,
        "hosts_cpu_s": host_cpu,
        "progress": list(query.recent_progress),
        "rows": sum(b.get("rows", 0) for b in query.batches),
        "pre_aggregation": mode,
        "rows_to_hosts_per_batch": to_hosts,
        "batches": [{k: v for k, v in b.items() if k != "subtasks"} for b in query.batches],
        "output": _rows(FileSink(out).read_arrow()),
    }


def run_contender(spark: Any, name: str, data: str, work: str) -> dict[str, Any]:
    if name == "spark-sql":
        return run_spark_sql(spark, source(spark, data), work)
    return run_streamstate(spark, source(spark, data), work, name)


def compare(output: Counter[Any], reference: Counter[Any]) -> str:
    """``equal`` (row for row), ``missing N of M rows`` (a subset) or ``differs (...)``."""
    if output == reference:
        return "equal"
    total = sum(reference.values())
    if output <= reference:
        return f"missing {total - sum(output.values())} of {total} rows"
    return f"differs ({sum((output - reference).values())} rows not in Spark SQL's)"


def _finish(spark: Any, res: dict[str, Any], events: int) -> None:
    """Per-run figures read after the query ended (outside its wall time)."""
    progress = res.pop("progress")
    with_input = [p for p in progress if p["numInputRows"] > 0]
    res["run_id"] = progress[0]["runId"] if progress else None
    res["batch_ms"] = [p["durationMs"]["triggerExecution"] for p in progress]
    res["input_batches"] = len(with_input)
    res["no_data_batches"] = len(progress) - len(with_input)
    if "batches" in res:  # streamstate runs its no-data steps inside Spark's micro-batches
        res["no_data_batches"] = sum(1 for b in res["batches"] if b.get("no_data"))
    res["stages"] = stage_breakdown(
        spark, res["run_id"], {p["batchId"]: p["durationMs"]["triggerExecution"] for p in progress}
    )
    res["events"] = events
    res["events_per_s"] = events / res["wall_s"]


def warm_up(spark: Any, contenders: list[str], tmp: str, args: argparse.Namespace) -> dict:
    """Every contender once, untimed, over the same input (see bench/spark_pipeline.py)."""
    data = os.path.join(tmp, "warm-up")
    keys = int(args.keys.split(",")[0])
    write_input(data, args.warm_up_events, keys, args.files, seed=0)
    took = {}
    for name in contenders:
        work = tempfile.mkdtemp(dir=tmp)
        t0 = time.perf_counter()
        run_contender(spark, name, data, work)
        took[name] = time.perf_counter() - t0
        shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(data, ignore_errors=True)
    settle = jit_settle(spark)
    print(
        f"[warm-up] {args.warm_up_events:,} events in {args.files} files: "
        + ", ".join(f"{n} {s:.1f} s" for n, s in took.items())
    )
    return {"events": args.warm_up_events, "wall_s": took, "jit_settle": settle}


def bench(spark: Any, args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    contenders = args.contenders.split(",")
    out: dict[str, Any] = {}
    pid = jvm_pid(spark)
    for n_keys in (int(k) for k in args.keys.split(",")):
        data = os.path.join(tmp, f"in-{n_keys}")
        write_input(data, args.events, n_keys, args.files, seed=n_keys)
        print(f"\n[windows] {args.events:,} events, {n_keys:,} keys, {args.files} files")
        runs: dict[str, list[dict[str, Any]]] = {c: [] for c in contenders}
        reference: Counter[Any] | None = None
        for r, order in enumerate(rotations(contenders, args.repeat)):
            for name in order:
                work = tempfile.mkdtemp(dir=tmp)
                before, cpu_before = jvm_counters(spark), process_cpu(pid)
                res = run_contender(spark, name, data, work)
                res["jvm"] = jvm_delta(before, jvm_counters(spark))
                res["cpu_s"] = cpu_delta(cpu_before, process_cpu(pid))
                hosts = res.pop("hosts_cpu_s", None)
                if hosts is not None and res["cpu_s"]:
                    res["cpu_s"]["state_hosts"] = hosts
                _finish(spark, res, args.events)
                if name == "spark-sql" and reference is None:
                    reference = res["output"]
                res["repeat"] = r
                runs[name].append(res)
                shutil.rmtree(work, ignore_errors=True)
                steady = res["stages"].get("steady", {})
                print(
                    f"  {name:<18}{res['wall_s']:>7.1f} s {res['events_per_s']:>10,.0f} ev/s  "
                    f"{res['input_batches']} batches (+{res['no_data_batches']} without data), "
                    f"shuffled {steady.get('shuffle_records', float('nan')):,.0f} rows/batch"
                    + (
                        f", {res['rows_to_hosts_per_batch']:,.0f} rows/batch to the state hosts"
                        if "rows_to_hosts_per_batch" in res
                        else ""
                    )
                )
                if res["cpu_s"]:
                    print(f"    {_cpu_line(res['cpu_s'], res['wall_s'])}")
        summary: dict[str, Any] = {}
        for name, rs in runs.items():
            if not rs:
                continue
            for res in rs:
                res["output_vs_spark_sql"] = (
                    None if reference is None else compare(res["output"], reference)
                )
            summary[name] = {
                "events_per_s": statistics.median(r["events_per_s"] for r in rs),
                "events_per_s_range": [
                    min(r["events_per_s"] for r in rs),
                    max(r["events_per_s"] for r in rs),
                ],
                "wall_s": statistics.median(r["wall_s"] for r in rs),
                "stages": _median_stages(rs),
                "cpu_s": _median_cpu(rs),
                "output_vs_spark_sql": sorted({r["output_vs_spark_sql"] or "" for r in rs}),
                "output_rows": sum(rs[0]["output"].values()),
                "runs": [{k: v for k, v in r.items() if k != "output"} for r in rs],
            }
        ratios = {}
        if "spark-sql" in summary:
            sql = summary["spark-sql"]
            for name in STREAMSTATE:
                if name not in summary:
                    continue
                mine = summary[name]
                ratio = mine["events_per_s"] / sql["events_per_s"]
                lo = min(
                    a["events_per_s"] / b["events_per_s"]
                    for a, b in zip(mine["runs"], sql["runs"], strict=False)
                )
                hi = max(
                    a["events_per_s"] / b["events_per_s"]
                    for a, b in zip(mine["runs"], sql["runs"], strict=False)
                )
                goal = GOALS.get(name, {}).get(n_keys)
                ratios[name] = {"ratio": ratio, "per_repeat": [lo, hi], "goal": goal}
        print(f"  [{n_keys:,} keys] events/s against Spark SQL (median; range over repeats):")
        for name, v in ratios.items():
            goal = v["goal"]
            verdict = "" if goal is None else (" met" if v["ratio"] >= goal else " MISSED")
            stages = summary[name]["stages"] or {}
            lo, hi = v["per_repeat"]
            print(
                f"    {name:<18}{v['ratio']:.2f}x ({lo:.2f}-{hi:.2f})"
                + ("" if goal is None else f", goal >= {goal}x:{verdict}")
                + f"; {stages.get('shuffle_records', float('nan')):,.0f} rows shuffled per batch"
                + f"; output {', '.join(summary[name]['output_vs_spark_sql'])}"
            )
        if "spark-sql" in summary:
            stages = summary["spark-sql"]["stages"] or {}
            print(
                f"    spark-sql shuffles {stages.get('shuffle_records', float('nan')):,.0f} rows "
                "per batch"
            )
        out[str(n_keys)] = {"contenders": summary, "ratios": ratios}
    return out


def plot(results: dict[str, Any], path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    per_keys = results["windows"]
    names = [c for c in CONTENDERS if any(c in v["contenders"] for v in per_keys.values())]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(names)
    keys = list(per_keys)
    for i, name in enumerate(names):
        xs = [j + i * width for j in range(len(keys))]
        ys = [per_keys[k]["contenders"].get(name, {}).get("events_per_s", 0) for k in keys]
        bars = ax.bar(xs, ys, width, label=name)
        ax.bar_label(bars, labels=[f"{y / 1e3:,.0f}k" if y else "" for y in ys], fontsize=7)
    ax.set_ylabel("events per second (wall)")
    ax.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(keys))])
    ax.set_xticklabels([f"{int(k):,} keys" for k in keys])
    ax.set_title(
        f"Views per key per hour, {results['events']:,} events in {results['files']} "
        "micro-batches, local[2]"
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", default="5,10000,1000000")
    parser.add_argument("--files", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--no-warm-up", dest="warm_up", action="store_false")
    parser.add_argument("--warm-up-events", type=int, default=300_000)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "spark_windows.json"))
    parser.add_argument(
        "--plot", default=os.path.join(HERE, "..", "docs", "img", "spark_windows.png")
    )
    args = parser.parse_args()

    spark = bench_session("streamstate-bench-windows", driver_memory="4g")
    tmp = tempfile.mkdtemp(prefix="bench-windows-")
    results: dict[str, Any] = {
        "benchmark": "spark_windows",
        "command": "python " + " ".join(sys.argv),
        "events": args.events,
        "files": args.files,
        "repeat": args.repeat,
        "spark_sql_shuffle_partitions": spark.conf.get("spark.sql.shuffle.partitions"),
        "python": platform.python_version(),
        "pyspark": spark.version,
        "cpus": os.cpu_count(),
        "load_average_before": os.getloadavg(),
    }
    try:
        contenders = args.contenders.split(",")
        if args.warm_up:
            results["warm_up"] = warm_up(spark, contenders, tmp, args)
        results["windows"] = bench(spark, args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        spark.stop()
    results["load_average_after"] = os.getloadavg()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2, default=str)
    print(f"\nwrote {args.out}")
    if plot(results, args.plot):
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
