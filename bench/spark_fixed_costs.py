"""Fixed costs of streamstate on Spark (issue 14, goal 2), side by side with the JVM, in one run.

Streaming: a per-key count (heap backend) over ``--events`` events in ``--batches`` Parquet
files (one per micro-batch, ``availableNow``), against ``groupBy(k).count()`` on the same input.
For each, the wall time is split into the micro-batches (Spark's ``triggerExecution`` of
each, for both) and the rest (start and stop); streamstate's start and stop are broken down
per phase from ``query.timings`` and its first micro-batch from ``query.batches[0]``.
Goals: streamstate's first micro-batch <= the JVM's first + 1 s; <= 1 s outside batches.
Both contenders run once, untimed, before the first timed run (the session's cold start
belongs to neither), and their order alternates between repeats.

Batch: ``keyed_process(...).collect()`` over ``--batch-rows`` rows against
``groupBy(k).count().collect()`` (goal: within 1.5x), with one output row per key as
``groupBy`` (the count emitted by a timer at the end of the input) and one per record. Spark's
floor beside them: the same placement as streamstate (``place(df, ["k"], 2, 128)``) and a
``mapInArrow`` pass-through yielding one one-row batch per input batch, collected; what Spark
itself costs any Python ``mapInArrow`` job over the placed rows. Its ratio to ``groupBy`` splits
streamstate's ratio into Spark's floor and streamstate's own work (streamstate / floor).

``--driver-phases N``: instead of the above, where the driver's time of one batch
``keyed_process(...)`` call goes (the ``sum`` job of ``spark_batch.py`` over ``--batch-rows``
rows and ``--keys`` keys, parallelism 2, batch execution, collected), phase by phase: medians
over ``N`` calls after 3 untimed ones, of the wall time, this process's CPU and its Py4J round
trips (every command sent to the JVM, the deletions of collected Java objects included), and the
JVM's CPU on the thread that serves this driver (its analyses of the job's Datasets), each for a
new input DataFrame per job ("first job over an input") and for the same one again ("same
input"). Written to the JSON's ``driver_phases``.

    python bench/spark_fixed_costs.py [--events 100000] [--batches 3] [--keys 10000]
        [--batch-rows 100000] [--repeat 2]
    python bench/spark_fixed_costs.py --driver-phases 20
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from spark_pipeline import CountPerKey, bench_session, source, write_input

HERE = os.path.dirname(os.path.abspath(__file__))


def stream_streamstate(spark: Any, src: Any, work: str) -> dict[str, Any]:
    from streamstate.spark import keyed_process

    t0 = time.perf_counter()
    query = keyed_process(
        src,
        key="k",
        function=CountPerKey(),
        output_schema="k long, n long",
        checkpoint=os.path.join(work, "ck"),
        parallelism=2,
        state_backend="heap",
    ).write_stream("parquet", path=os.path.join(work, "out"), trigger={"availableNow": True})
    query.await_termination()
    query.stop()
    wall = (time.perf_counter() - t0) * 1e3
    batches = query.batches
    # Spark's own figure per trigger, as for the JVM contender: our foreachBatch plus
    # Spark's offset and commit logs of the micro-batch
    trigger_ms = [
        p["durationMs"]["triggerExecution"] for p in query.recent_progress if p["numInputRows"] > 0
    ]
    in_batches = sum(trigger_ms)
    first = batches[0]
    return {
        "wall_ms": wall,
        "batches_ms": in_batches,
        "outside_ms": wall - in_batches,
        "foreach_batch_ms": [b["batch_ms"] for b in batches],
        "first_batch_ms": trigger_ms[0],
        "first_batch": {
            k: first.get(k) for k in ("plan_ms", "job_ms", "commit_ms", "sink_ms", "subtasks")
        },
        "steady_batch_ms": statistics.median(trigger_ms[1:]) if len(trigger_ms) > 1 else None,
        "timings": query.timings,
    }


def stream_jvm(spark: Any, src: Any, work: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    q = (
        src.groupBy("k")
        .count()
        .writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", os.path.join(work, "spark"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    q.stop()
    wall = (time.perf_counter() - t0) * 1e3
    progress = [p for p in q.recentProgress if p["numInputRows"] > 0]
    ms = [p["durationMs"]["triggerExecution"] for p in progress]
    return {
        "wall_ms": wall,
        "batches_ms": sum(ms),
        "outside_ms": wall - sum(ms),
        "first_batch_ms": ms[0],
        "steady_batch_ms": statistics.median(ms[1:]) if len(ms) > 1 else None,
    }


class FinalCount(CountPerKey):
    """The count per key, emitted once at the end of the input (as ``groupBy(k).count()``):
    an event-time timer per key, registered when the key is first seen, fires at the end."""

    def __init__(self) -> None:
        super().__init__(emit=False)

    def process_element(self, value: Any, ctx: Any) -> Any:
        n = self.n.value() + 1
        self.n.update(n)
        if n == 1:
            ctx.timer_service().register_event_time_timer(1 << 62)
        return None

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        yield ctx.get_current_key(), self.n.value()


def _pass_through(batches: Any) -> Any:
    """Reads every Arrow batch and yields one row per batch (its row count): the least a
    ``mapInArrow`` task can do."""
    import pyarrow as pa

    for batch in batches:
        yield pa.RecordBatch.from_pydict({"n": pa.array([batch.num_rows], pa.int64())})


def spark_floor_ms(df: Any, rows: int, sort: list[str] | None = None) -> float:
    """Spark's floor under a batch ``keyed_process(...).collect()``: streamstate's placement
    (key group column, ``repartitionById``), with ``sort`` the sort of each partition that
    batch execution adds (``sortWithinPartitions(*sort)``), and a Python ``mapInArrow``
    pass-through, collected; no state, no function, no output rows beyond one per Arrow batch.
    Milliseconds."""
    from streamstate.spark.driver.plan.placement import place

    t0 = time.perf_counter()
    placed = place(df, ["k"], 2, 128)
    if sort:
        placed = placed.sortWithinPartitions(*sort)
    got = placed.mapInArrow(_pass_through, "n long").collect()
    took = (time.perf_counter() - t0) * 1e3
    assert sum(r["n"] for r in got) == rows, "the pass-through lost rows"
    return took


def batch_collect(spark: Any, rows: int, keys: int) -> dict[str, Any]:
    """``keyed_process(...).collect()`` (one output row per key, and one per record) against
    ``groupBy(k).count().collect()`` over the same cached input."""
    from streamstate.spark import keyed_process

    df = spark.range(rows).selectExpr(f"id % {keys} as k", "timestamp_millis(id) as ts").cache()
    df.count()
    out: dict[str, Any] = {}
    for name, function in (("per_key", FinalCount()), ("per_record", CountPerKey(emit=True))):
        t0 = time.perf_counter()
        got = keyed_process(
            df,
            key="k",
            function=function,
            output_schema="k long, n long",
            parallelism=2,
            event_time="ts",
        ).collect()
        out[f"streamstate_{name}_ms"] = (time.perf_counter() - t0) * 1e3
        assert len(got) == (min(keys, rows) if name == "per_key" else rows), name
    t0 = time.perf_counter()
    jvm_rows = df.groupBy("k").count().collect()
    out["jvm_groupby_ms"] = jvm = (time.perf_counter() - t0) * 1e3
    out["floor_ms"] = spark_floor_ms(df, rows)
    df.unpersist()
    assert len(jvm_rows) == min(keys, rows)
    out["ratio"] = out["streamstate_per_key_ms"] / jvm
    out["ratio_per_record"] = out["streamstate_per_record_ms"] / jvm
    out["floor_ratio"] = out["floor_ms"] / jvm
    out["ratio_over_floor"] = out["streamstate_per_key_ms"] / out["floor_ms"]
    return out


#: (name, module, attribute): the phases of a batch keyed_process call, timed where they are
#: called (``query/keyed.py``, ``query/batch.py``), in the order they run
DRIVER_PHASES = [
    ("resolve: arguments, schemas, parallelism", "keyed", "resolve_options"),
    ("the workers' Python", "keyed", "ensure_worker_path"),
    ("register the state formats", "keyed", "register"),
    ("checks: schemas, the function opened", "keyed", "check_before_first_job"),
    ("pickle the function", "batch", "pickle_function"),
    ("placement: key group, repartitionById", "batch", "place"),
    ("sortWithinPartitions", "batch", "_sorted_within_partitions"),
    ("sortWithinPartitions", "dataframe", "sortWithinPartitions"),
    ("mapInArrow: the task's UDF, its Dataset", "dataframe", "mapInArrow"),
]


def driver_phases(spark: Any, rows: int, keys: int, calls: int) -> dict[str, Any]:
    """The driver's time of a batch ``keyed_process`` call, by phase (module docstring)."""
    import functools

    import py4j.clientserver
    from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame

    from spark_batch import SumAtEnd, make_input
    from streamstate.spark.driver.query import batch, keyed

    df = make_input(spark, rows, keys, "sum")
    mx = spark._jvm.java.lang.management.ManagementFactory.getThreadMXBean()
    owners = {"keyed": keyed, "batch": batch, "dataframe": ClassicDataFrame}
    sent = [0]
    figures: dict[str, dict[str, list[float]]] = {}

    def record(name: str, wall: float, cpu: float, trips: int) -> None:
        got = figures.setdefault(name, {"wall_ms": [], "cpu_ms": [], "py4j": []})
        got["wall_ms"].append(wall * 1e3)
        got["cpu_ms"].append(cpu * 1e3)
        got["py4j"].append(trips)

    def timed(name: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def phase(*args: Any, **kwargs: Any) -> Any:
            t0, c0, n0 = time.perf_counter(), time.process_time(), sent[0]
            try:
                return fn(*args, **kwargs)
            finally:
                record(name, time.perf_counter() - t0, time.process_time() - c0, sent[0] - n0)

        return phase

    connection = py4j.clientserver.ClientServerConnection
    send = connection.send_command

    def counted(self: Any, command: str) -> Any:
        sent[0] += 1
        return send(self, command)

    # (a phase a version of the driver does not have is left out)
    phases = [(n, owners[o], a) for n, o, a in DRIVER_PHASES if hasattr(owners[o], a)]
    saved = [(owner, attr, getattr(owner, attr)) for _, owner, attr in phases]
    results: dict[str, Any] = {}
    try:
        connection.send_command = counted
        for name, owner, attr in phases:
            setattr(owner, attr, timed(name, getattr(owner, attr)))
        for case, fresh in (("first job over an input", True), ("same input", False)):
            jvm_ms = []
            for i in range(3 + calls):
                data = df.select("*") if fresh else df  # a new DataFrame object, same rows
                if i == 3:
                    figures.clear()
                j0 = mx.getCurrentThreadCpuTime()
                t0, c0, n0 = time.perf_counter(), time.process_time(), sent[0]
                out = keyed.keyed_process(
                    data,
                    key="k",
                    function=SumAtEnd(),
                    output_schema="k long, total long",
                    parallelism=2,
                    execution_mode="batch",
                )
                took = (time.perf_counter() - t0, time.process_time() - c0, sent[0] - n0)
                j1 = mx.getCurrentThreadCpuTime()
                record("keyed_process call, all of it", *took)
                jvm_ms.append((j1 - j0) / 1e6)
                t0, c0, n0 = time.perf_counter(), time.process_time(), sent[0]
                assert len(out.collect()) == min(rows, keys)
                record("collect: the Spark job", time.perf_counter() - t0,
                       time.process_time() - c0, sent[0] - n0)  # fmt: skip
            medians = {
                name: {k: statistics.median(v) for k, v in got.items()}
                for name, got in figures.items()
            }
            medians["keyed_process call, all of it"]["jvm_thread_cpu_ms"] = statistics.median(
                jvm_ms[3:]
            )
            results[case] = medians
            print(
                f"[driver phases, {case}] median of {calls} calls, load {os.getloadavg()[0]:.1f}:"
            )
            for name, m in medians.items():
                jvm = (
                    f", JVM thread {m['jvm_thread_cpu_ms']:5.1f} ms"
                    if "jvm_thread_cpu_ms" in m
                    else ""
                )
                print(f"  {name:42s} wall {m['wall_ms']:7.1f} ms, CPU {m['cpu_ms']:5.1f} ms, "
                      f"py4j {m['py4j']:4.0f}{jvm}")  # fmt: skip
    finally:
        connection.send_command = send
        for owner, attr, fn in saved:
            setattr(owner, attr, fn)
        df.unpersist()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--batch-rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--driver-phases", type=int, default=0, metavar="N")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "spark_fixed_costs.json"))
    args = parser.parse_args()

    spark = bench_session("streamstate-bench-fixed")
    if args.driver_phases:
        batch_collect(spark, 1000, 10)  # the session's first jobs belong to no phase
        try:
            phases = driver_phases(spark, args.batch_rows, args.keys, args.driver_phases)
        finally:
            spark.stop()
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(
                {
                    "benchmark": "spark_fixed_costs",
                    "command": "python " + " ".join(sys.argv),
                    "load_average": os.getloadavg(),
                    "driver_phases": phases,
                },
                f,
                indent=2,
            )
        print(f"wrote {args.out}")
        return
    tmp = tempfile.mkdtemp(prefix="bench-fixed-")
    results: dict[str, Any] = {
        "benchmark": "spark_fixed_costs",
        "command": "python " + " ".join(sys.argv),
        "cpus": os.cpu_count(),
        "runs": [],
    }
    try:
        data = os.path.join(tmp, "in")
        write_input(data, args.events, args.keys, args.batches, seed=1)
        # warm-up, untimed, of every contender: the session's first query pays the JVM's
        # class loading and JIT and Spark's first streaming query, whichever contender it is
        batch_collect(spark, 1000, 10)
        stream_jvm(spark, source(spark, data), tempfile.mkdtemp(dir=tmp))
        stream_streamstate(spark, source(spark, data), tempfile.mkdtemp(dir=tmp))
        for r in range(args.repeat):
            run: dict[str, Any] = {}
            contenders = [("streamstate", stream_streamstate), ("jvm", stream_jvm)]
            # the order alternates between repeats: neither always runs right after the other
            for name, fn in contenders[r % 2 :] + contenders[: r % 2]:
                res = fn(spark, source(spark, data), tempfile.mkdtemp(dir=tmp))
                run[name] = res
                print(
                    f"[stream {r}] {name:<12} wall {res['wall_ms']:7.0f} ms, batches "
                    f"{res['batches_ms']:7.0f}, outside {res['outside_ms']:6.0f}, first batch "
                    f"{res['first_batch_ms']:6.0f}, steady {res['steady_batch_ms'] or 0:6.0f}"
                )
            ss, jvm = run["streamstate"], run["jvm"]
            print(f"  streamstate timings: {json.dumps(ss['timings'])}")
            fb = {k: v for k, v in ss["first_batch"].items() if k != "subtasks"}
            print(f"  first batch: {json.dumps(fb)}")
            for s in ss["first_batch"]["subtasks"] or []:
                print(f"    subtask {json.dumps(s)}")
            print(
                f"  first batch - JVM's: {ss['first_batch_ms'] - jvm['first_batch_ms']:6.0f} ms "
                f"(goal <= 1000); outside batches {ss['outside_ms']:6.0f} ms (goal <= 1000)"
            )
            run["batch"] = batch_collect(spark, args.batch_rows, args.keys)
            b = run["batch"]
            print(
                f"[batch {r}] keyed_process collect: one row per key "
                f"{b['streamstate_per_key_ms']:6.0f} ms, one per record "
                f"{b['streamstate_per_record_ms']:6.0f} ms; groupBy {b['jvm_groupby_ms']:6.0f} "
                f"ms: {b['ratio']:.2f}x (goal <= 1.5), per record {b['ratio_per_record']:.2f}x"
            )
            print(
                f"[batch {r}] Spark's floor (placement + mapInArrow pass-through) "
                f"{b['floor_ms']:6.0f} ms: {b['floor_ratio']:.2f}x groupBy; streamstate one row "
                f"per key {b['ratio']:.2f}x = floor {b['floor_ratio']:.2f}x * own work "
                f"{b['ratio_over_floor']:.2f}x"
            )
            results["runs"].append(run)
        batch = [run["batch"] for run in results["runs"]]
        # medians of the times over the repeats, and the ratios of those medians
        m = {k: statistics.median(b[k] for b in batch) for k in batch[0] if k.endswith("_ms")}
        m["ratio"] = m["streamstate_per_key_ms"] / m["jvm_groupby_ms"]
        m["floor_ratio"] = m["floor_ms"] / m["jvm_groupby_ms"]
        m["ratio_over_floor"] = m["streamstate_per_key_ms"] / m["floor_ms"]
        results["batch_medians"] = m
        print(
            f"[batch] medians over {len(batch)} repeats: groupBy {m['jvm_groupby_ms']:.0f} ms, "
            f"Spark's floor {m['floor_ms']:.0f} ms ({m['floor_ratio']:.2f}x), streamstate one row "
            f"per key {m['streamstate_per_key_ms']:.0f} ms ({m['ratio']:.2f}x, "
            f"{m['ratio_over_floor']:.2f}x the floor)"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        spark.stop()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2, default=str)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
