"""streamstate on Spark against Spark's own stateful operators, in one run (SPEC §11).

Question 1, ``pipeline``: throughput of the same per-key count over the same generated input
(``--events`` events, 10 Parquet files read one per micro-batch with ``maxFilesPerTrigger=1`` and
``trigger(availableNow=True)``), for ``--keys`` distinct keys (default 10k and 1M):

=====================  ===========================================================================
contender              what runs
=====================  ===========================================================================
``streamstate-heap``   ``keyed_process`` with a ValueState count, heap backend; emits the new count
                       of every record (update per record, more output than the others) to the
                       exactly-once Parquet sink; checkpoints every micro-batch
``streamstate-rocksdb`` the same on the RocksDB backend
``jvm-groupby``        ``groupBy(k).count()``, update mode, RocksDB state store provider, noop sink
``applyInPandasWithState`` per-key count in pandas, update mode, RocksDB state store, noop sink
``transformWithStateInPandas`` per-key count in a ValueState, update mode, noop sink
=====================  ===========================================================================

All share one ``local[2]`` session with 2 shuffle partitions (streamstate: parallelism 2). The
Python stateful APIs of Spark are slow with many keys: with ``--slow-batches N`` they run only
the first N micro-batches at 1M keys, and their events/s is computed over what they ran (the
output says so). Every contender is checked: streamstate's final counts (the last count per key
in the sink) equal the generated counts; Spark's contenders must have read every event and hold
one state row per distinct key.

Fairness: before the first timed contender every contender runs once, untimed, over the same
warm-up input (``--warm-up-events``, default 300k events, in ``--warm-up-files`` files, default
10, at the first ``--keys`` cardinality; ``--warm-up-rounds`` times; ``--no-warm-up`` skips it):
the first query of a session pays the JVM's and Spark's cold start, and a contender's first run
after a short warm-up leaves its code path to the JIT of its first timed run (seconds slower
than the next ones). What warms the JIT is the number of micro-batches more than the events:
Spark's per-batch and per-task code runs a few times per batch. The driver JVM's JIT and GC
time during each run (JMX) is recorded in its ``jvm``, so a first run that still compiles more
than the next ones shows; after the warm-up the benchmark waits (at most 30 s) until the JIT
goes quiet. ``--repeat R`` rotates the order (repeat ``r`` starts at contender ``r``), and each
contender's figures are the median over its repeats, printed with their range.

Spark's stages of every streaming run, read from Spark's status store after the query ended
(``stage_breakdown``; nothing is added to the timed run): per micro-batch, the map stage
(Parquet read, shuffle write: the JVM's partial aggregation) and the reduce stage (shuffle read,
the stateful operator or streamstate's ``mapInArrow`` task), each with its duration, its tasks'
executor run time and the records shuffled, and the jobs' time within Spark's
``triggerExecution``. Each run's median over batches >= 1 is printed under it and stored in its
``stages``; the contender's ``stages`` is the median over its repeats. A Spark Connect session
or a failure records ``{"skipped": why}`` instead.

Question 2, ``hot``: per-micro-batch time with 10k changed keys while the total state grows
(``--hot-sizes``, default 100k, 1M, 10M keys): the state is preloaded by a batch job that writes
a savepoint, a streaming query starts from it (its first batch loads the savepoint), and the
following batches, each touching 10k existing keys, must cost the same at every size (goal: the
largest within 1.5x of the smallest): the state stays hot in the state hosts.

Writes ``bench/results/spark_pipeline.json`` and, with matplotlib installed (the ``bench``
extra), ``docs/img/spark_pipeline.png``.

    python bench/spark_pipeline.py [--events 1000000] [--keys 10000,1000000] [--batches 10]
        [--repeat 1] [--no-warm-up] [--warm-up-events 300000] [--warm-up-files 10]
        [--contenders ...] [--slow-batches 1]
        [--only pipeline,hot] [--hot-sizes 100000,1000000,10000000]
        [--hot-backends heap,rocksdb] [--connect]

``--connect`` (with ``--only connect`` alone): the streamstate contenders from a Spark Connect
client session against a local Connect server, alternating with classic runs; the overhead is
Connect / classic of the median steady batch (after batch 0), by streamstate's ``batch_ms``
and by Spark's ``triggerExecution`` (``results['connect']``, goal <= 1.2x).
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
from collections.abc import Iterator
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from streamstate import KeyedProcessFunction, ValueStateDescriptor

HERE = os.path.dirname(os.path.abspath(__file__))
STREAMSTATE = ("streamstate-heap", "streamstate-rocksdb")
SPARK_PYTHON = ("applyInPandasWithState", "transformWithStateInPandas")
CONTENDERS = (*STREAMSTATE, "jvm-groupby", *SPARK_PYTHON)
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


class CountPerKey(KeyedProcessFunction):
    """The count of records per key; emits ``(key, count)`` per record when ``emit``."""

    def __init__(self, emit: bool = True) -> None:
        self.emit = emit

    def open(self, ctx: Any) -> None:
        self.n = ctx.get_state(ValueStateDescriptor("n", int, default=0))

    def process_element(self, value: Any, ctx: Any) -> Iterator[tuple[Any, int]]:
        n = self.n.value() + 1
        self.n.update(n)
        if self.emit:
            yield ctx.get_current_key(), n


# ---- input --------------------------------------------------------------------------------------


def write_input(directory: str, events: int, keys: int, batches: int, seed: int) -> np.ndarray:
    """``batches`` Parquet files (columns k, ts) with increasing modification times; returns
    every event's key in order."""
    os.makedirs(directory)
    rng = np.random.default_rng(seed)
    # every key appears at least once when events >= keys, the rest uniformly
    ks = rng.permutation(
        np.concatenate([np.arange(min(keys, events)), rng.integers(0, keys, max(0, events - keys))])
    )
    ks = ks.astype(np.int64)
    ts = (np.arange(events, dtype=np.int64) * 1000).astype("datetime64[ms]")
    for i, part in enumerate(np.array_split(np.arange(events), batches)):
        path = os.path.join(directory, f"part-{i:04d}.parquet")
        pq.write_table(pa.table({"k": ks[part], "ts": ts[part]}), path)
        stamp = 1_700_000_000 + 10 * i  # the file source orders by modification time
        os.utime(path, (stamp, stamp))
    return ks


def source(spark: Any, directory: str, files: int | None = None) -> Any:
    if files is not None:  # a directory holding the first `files` files only
        sub = f"{directory}-first{files}"
        if not os.path.isdir(sub):
            os.makedirs(sub)
            for name in sorted(os.listdir(directory))[:files]:
                os.link(os.path.join(directory, name), os.path.join(sub, name))
        directory = sub
    return (
        spark.readStream.schema("k long, ts timestamp")
        .option("maxFilesPerTrigger", 1)
        .parquet(directory)
    )


def bench_session(app: str, driver_memory: str | None = None) -> Any:
    """The benchmarks' classic session: ``local[2]``, 2 shuffle partitions, no UI, Spark's
    RocksDB state store for the JVM contenders."""
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
    )
    if driver_memory is not None:
        builder = builder.config("spark.driver.memory", driver_memory)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


# ---- contenders ---------------------------------------------------------------------------------


def _count_query(src: Any, backend: str, work: str) -> tuple[Any, float, str]:
    """The streamstate contender's query (a per-key count to Parquet, parallelism 2) run to
    the end of its input: the query, its wall time in seconds and its output directory."""
    from streamstate.spark import keyed_process

    out = os.path.join(work, "out")
    t0 = time.perf_counter()
    query = keyed_process(
        src,
        key="k",
        function=CountPerKey(),
        output_schema="k long, n long",
        checkpoint=os.path.join(work, "ck"),
        parallelism=2,
        state_backend=backend,
    ).write_stream("parquet", path=out, trigger={"availableNow": True})
    query.await_termination()
    return query, time.perf_counter() - t0, out


def run_streamstate(spark: Any, src: Any, backend: str, work: str) -> dict[str, Any]:
    from streamstate.spark import FileSink

    query, wall, out = _count_query(src, backend, work)
    host_cpu = hosts_cpu(query.batches)  # before stop() ends the hosts
    query.stop()
    table = FileSink(out).read_arrow()
    progress = [p for p in query.recent_progress if p["numInputRows"] > 0]
    return {
        "wall_s": wall,
        "hosts_cpu_s": host_cpu,
        "run_id": progress[0]["runId"] if progress else None,
        "batch_ids": [p["batchId"] for p in progress],
        "rows": sum(b.get("rows", 0) for b in query.batches),
        # Spark's triggerExecution per micro-batch, as for Spark's contenders: the foreachBatch
        # (streamstate's own batch_ms) plus Spark's offset and commit logs and planning
        "batch_ms": [p["durationMs"]["triggerExecution"] for p in progress],
        "trigger_ms": [p["durationMs"] for p in progress],
        "foreach_batch_ms": [b["batch_ms"] for b in query.batches],
        "batches": [{k: v for k, v in b.items() if k != "subtasks"} for b in query.batches],
        "restore": [b.get("restore") for b in query.batches],
        # where the fixed costs went (start, host spawn, stop; see KeyedStreamingQuery.timings)
        "timings": dict(query.timings),
        "first_batch": {
            k: query.batches[0].get(k)
            for k in ("plan_ms", "place_ms", "job_ms", "commit_ms", "sink_ms", "subtasks")
        },
        "final": table,
    }


def _spark_query(spark: Any, name: str, src: Any) -> Any:
    import pandas as pd
    from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
    from pyspark.sql.streaming.state import GroupStateTimeout

    if name == "jvm-groupby":
        return src.groupBy("k").count()

    if name == "applyInPandasWithState":

        def count(key: Any, pdfs: Any, state: Any) -> Any:
            n = state.get[0] if state.exists else 0
            for pdf in pdfs:
                n += len(pdf)
            state.update((n,))
            yield pd.DataFrame({"k": [key[0]], "count": [n]})

        return (
            src.select("k")
            .groupBy("k")
            .applyInPandasWithState(
                count, "k long, count long", "c long", "Update", GroupStateTimeout.NoTimeout
            )
        )

    class CountProcessor(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.count = handle.getValueState("count", "c long")

        # the name and argument are Spark's
        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:  # noqa: N802, N803
            n = self.count.get()[0] if self.count.exists() else 0
            for pdf in rows:
                n += len(pdf)
            self.count.update((n,))
            yield pd.DataFrame({"k": [key[0]], "count": [n]})

        def close(self) -> None:
            pass

    return (
        src.select("k")
        .groupBy("k")
        .transformWithStateInPandas(CountProcessor(), "k long, count long", "Update", "None")
    )


def run_spark(spark: Any, name: str, src: Any, work: str) -> dict[str, Any]:
    query = (
        _spark_query(spark, name, src)
        .writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", os.path.join(work, "spark"))
        .trigger(availableNow=True)
    )
    t0 = time.perf_counter()
    q = query.start()
    q.awaitTermination()
    wall = time.perf_counter() - t0
    progress = [p for p in q.recentProgress if p["numInputRows"] > 0]
    return {
        "wall_s": wall,
        "run_id": progress[0]["runId"] if progress else None,
        "batch_ids": [p["batchId"] for p in progress],
        "rows": sum(p["numInputRows"] for p in progress),
        "batch_ms": [p["durationMs"]["triggerExecution"] for p in progress],
        "trigger_ms": [p["durationMs"] for p in progress],
        "state_rows": progress[-1]["stateOperators"][0]["numRowsTotal"] if progress else 0,
    }


# ---- Spark's stages per micro-batch --------------------------------------------------------------


def _status_store_json(spark: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every job and stage attempt Spark's status store holds (the live store behind the UI,
    kept with the UI disabled), as dicts: one Jackson serialization per list, not a py4j call
    per field."""
    jvm = spark._jvm
    store = spark._jsc.sc().statusStore()
    mapper = jvm.com.fasterxml.jackson.databind.ObjectMapper()
    # Scala's Option and Seq fields of the status API classes
    mapper.registerModule(
        getattr(getattr(jvm.com.fasterxml.jackson.module.scala, "DefaultScalaModule$"), "MODULE$")
    )
    jobs = json.loads(mapper.writeValueAsString(store.jobsList(None)))
    no_quantiles = spark.sparkContext._gateway.new_array(jvm.double, 0)
    stages = json.loads(
        mapper.writeValueAsString(
            store.stageList(None, False, False, no_quantiles, jvm.java.util.ArrayList())
        )
    )
    return jobs, stages


def stage_breakdown(spark: Any, run_id: str | None, trigger_ms: dict[int, int]) -> dict[str, Any]:
    """Spark's stages of each micro-batch of the streaming run ``run_id``, read from the
    status store after the query ended (nothing added while it runs): per batch, its map
    stages (Parquet read and shuffle write; the JVM's partial aggregation) and its result
    stage (shuffle read and the stateful operator, or streamstate's ``mapInArrow`` task),
    each with its wall duration (submission to completion), its tasks' summed executor run
    time and its shuffle records, the jobs' wall duration and what of Spark's
    ``triggerExecution`` (``trigger_ms``, by batch id) went outside any job (offset and commit
    logs, planning, streamstate's driver side); ``steady`` holds their medians over batches
    >= 1. Never
    raises: a Spark Connect session (no status store on the client) or a failure gives
    ``{"skipped": why}``."""
    if run_id is None:
        return {"skipped": "no progress with input rows"}
    if not hasattr(spark, "_jsc"):
        return {"skipped": "Spark Connect session: the status store is on the server"}
    try:
        jobs, stages = _status_store_json(spark)
        by_id = {s["stageId"]: s for s in stages if s.get("status") == "COMPLETE"}
        batches: dict[int, dict[str, Any]] = {}
        for job in jobs:
            # Spark's micro-batch runner sets the job group to the run id and the description
            # to "...batch = N"; streamstate's jobs, run inside foreachBatch, inherit both
            if job.get("jobGroup") != run_id or "batch = " not in (job.get("description") or ""):
                continue
            n = int(job["description"].rsplit("batch = ", 1)[1].split()[0])
            b = batches.setdefault(
                n,
                {
                    "batch": n,
                    "jobs": 0,
                    "trigger_ms": trigger_ms.get(n, 0),
                    "job_ms": 0,
                    "outside_jobs_ms": trigger_ms.get(n, 0),
                    "map_ms": 0,
                    "map_run_ms": 0,
                    "map_tasks": 0,
                    "shuffle_records": 0,
                    "reduce_ms": 0,
                    "reduce_run_ms": 0,
                    "reduce_tasks": 0,
                },
            )
            b["jobs"] += 1
            b["job_ms"] += job["completionTime"] - job["submissionTime"]
            b["outside_jobs_ms"] -= job["completionTime"] - job["submissionTime"]
            ids = [i for i in job["stageIds"] if i in by_id]
            for i in ids:
                st = by_id[i]
                # the job's result stage is created last: the highest id; the others feed it
                side = "reduce" if i == max(ids) else "map"
                b[f"{side}_ms"] += st["completionTime"] - st["submissionTime"]
                b[f"{side}_run_ms"] += st["executorRunTime"]
                b[f"{side}_tasks"] += st["numTasks"]
                b["shuffle_records"] += st["shuffleWriteRecords"]
        per_batch = [batches[n] for n in sorted(batches)]
        if not per_batch:
            return {"skipped": f"no job of run {run_id} in the status store (evicted?)"}
        steady = [b for b in per_batch if b["batch"] >= 1] or per_batch
        fields = [k for k in per_batch[0] if k != "batch"]
        return {
            "per_batch": per_batch,
            "steady": {k: statistics.median(b[k] for b in steady) for k in fields},
        }
    except Exception as exc:  # measurement only: a failure here must not end the benchmark
        return {"skipped": f"{type(exc).__name__}: {exc}"[:500]}


def jvm_counters(spark: Any) -> dict[str, float] | None:
    """The driver JVM's cumulative JIT compilation and GC times (ms) and GC count (JMX), read
    between runs: the difference over a run tells whether the JVM was still compiling (or
    collecting) during it, i.e. whether the warm-up sufficed. ``local[*]`` runs every task in
    this JVM. None on Spark Connect or any failure."""
    if not hasattr(spark, "_jsc"):
        return None
    try:
        mf = spark._jvm.java.lang.management.ManagementFactory
        gcs = mf.getGarbageCollectorMXBeans()
        return {
            "jit_ms": float(mf.getCompilationMXBean().getTotalCompilationTime()),
            "gc_ms": float(sum(gcs.get(i).getCollectionTime() for i in range(gcs.size()))),
            "gc_count": float(sum(gcs.get(i).getCollectionCount() for i in range(gcs.size()))),
        }
    except Exception:  # measurement only
        return None


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_stats() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds so far: user + system) of every process (Linux)."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        out[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS)
    return out


def jvm_pid(spark: Any) -> int | None:
    """The driver JVM's pid (classic sessions; None on Spark Connect or any failure)."""
    if not hasattr(spark, "_jsc"):
        return None
    try:
        return int(spark._jvm.java.lang.ProcessHandle.current().pid())
    except Exception:  # measurement only
        return None


def process_cpu(jvm: int | None) -> dict[str, float]:
    """CPU seconds so far of the driver JVM (``local[2]``: every Spark task runs in it), its
    descendants (Spark's Python workers: ``mapInArrow`` tasks forwarding to the state hosts,
    Spark's Python stateful operators) and this driver process. {} when unavailable."""
    if jvm is None or not os.path.isdir("/proc"):
        return {}
    stats = _proc_stats()
    if jvm not in stats:
        return {}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    workers, todo = 0.0, list(children.get(jvm, []))
    while todo:
        pid = todo.pop()
        workers += stats[pid][1]
        todo.extend(children.get(pid, []))
    return {
        "jvm": stats[jvm][1],
        "python_workers": workers,
        "driver": stats.get(os.getpid(), (0, 0.0))[1],
    }


def hosts_cpu(batches: list[dict[str, Any]]) -> float | None:
    """CPU seconds of the query's state hosts since they started (read before the query
    stops them): every host of a run is started for that run. None when unavailable."""
    pids = {int(s["host_pid"]) for b in batches for s in b.get("subtasks", []) if s.get("host_pid")}
    if not pids or not os.path.isdir("/proc"):
        return None
    stats = _proc_stats()
    return sum(stats[p][1] for p in pids if p in stats)


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in before if k in after}


def _cpu_line(cpu: dict[str, float], wall_s: float) -> str:
    names = (
        ("jvm", "JVM"),
        ("python_workers", "Python workers"),
        ("state_hosts", "state hosts"),
        ("driver", "driver"),
    )
    parts = [f"{label} {cpu[k]:.1f} s" for k, label in names if k in cpu]
    return f"CPU: {', '.join(parts)} (total {sum(cpu.values()):.1f} s in {wall_s:.1f} s wall)"


def jit_settle(spark: Any, quiet_s: float = 1.0, limit_s: float = 30.0) -> dict[str, float]:
    """Wait until the driver JVM's JIT compilers go quiet (no compilation time added over
    ``quiet_s``), at most ``limit_s``: the compilations a warm-up queued finish here rather
    than in the first timed run, on a machine whose cores the compiler threads share. Returns
    the seconds waited and the JIT ms spent meanwhile ({} when the counters are unavailable)."""
    first = jvm_counters(spark)
    if first is None:
        return {}
    t0 = time.perf_counter()
    last = first["jit_ms"]
    while time.perf_counter() - t0 < limit_s:
        time.sleep(quiet_s)
        now = jvm_counters(spark)
        if now is None or now["jit_ms"] == last:
            break
        last = now["jit_ms"]
    return {"waited_s": time.perf_counter() - t0, "jit_ms": last - first["jit_ms"]}


def jvm_delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float]:
    if before is None or after is None:
        return {}
    return {k: after[k] - before[k] for k in after}


def _stages_line(steady: dict[str, Any]) -> str:
    return (
        f"map stage {steady['map_ms']:,.0f} ms (run {steady['map_run_ms']:,.0f} ms, "
        f"{steady['shuffle_records']:,.0f} shuffle records), reduce stage "
        f"{steady['reduce_ms']:,.0f} ms (run {steady['reduce_run_ms']:,.0f} ms); jobs "
        f"{steady['job_ms']:,.0f} ms of a {steady['trigger_ms']:,.0f} ms trigger"
    )


def check(name: str, res: dict[str, Any], keys: np.ndarray) -> None:
    """Fail loudly unless the contender computed the per-key counts of ``keys``."""
    if name in STREAMSTATE:
        table = res.pop("final")
        got: dict[int, int] = {}
        for k, n in zip(table["k"].to_pylist(), table["n"].to_pylist(), strict=True):
            if n > got.get(k, 0):
                got[k] = n
        uniq, counts = np.unique(keys, return_counts=True)
        expected = dict(zip(uniq.tolist(), counts.tolist(), strict=True))
        if got != expected or table.num_rows != len(keys):
            raise AssertionError(f"{name}: wrong counts ({table.num_rows} rows for {len(keys)})")
    else:
        if res["rows"] != len(keys) or res["state_rows"] != len(np.unique(keys)):
            raise AssertionError(
                f"{name}: read {res['rows']} of {len(keys)} events, holds {res['state_rows']} "
                f"state rows for {len(np.unique(keys))} keys"
            )


# ---- question 1 ---------------------------------------------------------------------------------


def run_contender(spark: Any, name: str, src: Any, work: str) -> dict[str, Any]:
    if name in STREAMSTATE:
        return run_streamstate(spark, src, name.removeprefix("streamstate-"), work)
    return run_spark(spark, name, src, work)


def warm_up(
    spark: Any, contenders: list[str], tmp: str, events: int, files: int, keys: int, rounds: int = 1
) -> dict[str, Any]:
    """Run every contender once, untimed, over the same input (``events`` events in ``files``
    Parquet files, ``keys`` distinct keys): whichever contender runs first would otherwise pay
    the session's cold start (the JVM's class loading, Spark's first streaming query, the first
    Python workers), and each contender's first timed run its own code path's JIT compilation
    (the JVM compiles a method after thousands of calls: a tiny input leaves the contender's
    hot loops interpreted, and its first timed run seconds slower than the next ones). The
    input is identical for every contender; ``rounds`` runs them all that many times, in
    order. Returns the settings, each contender's warm-up wall seconds (summed over the rounds)
    and the JVM's JIT and GC time during them."""
    data = os.path.join(tmp, "warm-up")
    used = write_input(data, events, keys, files, seed=0)
    took = {}
    jvm: dict[str, dict[str, float]] = {}
    for name in [c for _ in range(rounds) for c in contenders]:
        work = tempfile.mkdtemp(dir=tmp)
        before = jvm_counters(spark)
        t0 = time.perf_counter()
        res = run_contender(spark, name, source(spark, data), work)
        took[name] = took.get(name, 0.0) + time.perf_counter() - t0
        spent = jvm_delta(before, jvm_counters(spark))
        jvm[name] = {k: jvm.get(name, {}).get(k, 0.0) + v for k, v in spent.items()}
        check(name, res, used)
        shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(data, ignore_errors=True)
    settle = jit_settle(spark)
    print(
        f"[warm-up] {rounds} x {events:,} events in {files} files, {keys:,} keys: "
        + ", ".join(
            f"{n} {s:.1f} s" + (f" (JIT {jvm[n]['jit_ms']:,.0f} ms)" if jvm[n] else "")
            for n, s in took.items()
        )
        + (
            f"; then the JIT went quiet in {settle['waited_s']:.1f} s "
            f"({settle['jit_ms']:,.0f} ms compiling)"
            if settle
            else ""
        )
    )
    return {
        "events": events,
        "files": files,
        "keys": keys,
        "rounds": rounds,
        "wall_s": took,
        "jvm": jvm,
        "jit_settle": settle,
    }


def rotations(contenders: list[str], repeat: int) -> list[list[str]]:
    """The contender order of each repeat: repeat ``r`` starts at contender ``r`` (mod the
    number of contenders), so that over ``len(contenders)`` repeats each runs once in every
    position (after any other one, and first).

    >>> rotations(["a", "b", "c"], 4)
    [['a', 'b', 'c'], ['b', 'c', 'a'], ['c', 'a', 'b'], ['a', 'b', 'c']]
    """
    n = len(contenders)
    return [contenders[r % n :] + contenders[: r % n] for r in range(repeat)]


def bench_pipeline(spark: Any, args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    contenders = args.contenders.split(",")
    for n_keys in (int(k) for k in args.keys.split(",")):
        data = os.path.join(tmp, f"in-{n_keys}")
        keys = write_input(data, args.events, n_keys, args.batches, seed=n_keys)
        per_file = np.array_split(keys, args.batches)
        runs: dict[str, list[dict[str, Any]]] = {c: [] for c in contenders}
        print(f"\n[pipeline] {args.events:,} events, {n_keys:,} keys, {args.batches} batches")
        pid = jvm_pid(spark)
        for r, order in enumerate(rotations(contenders, args.repeat)):
            for position, name in enumerate(order):
                files = None
                if name in SPARK_PYTHON and n_keys >= 1_000_000 and args.slow_batches:
                    files = min(args.slow_batches, args.batches)
                used = keys if files is None else np.concatenate(per_file[:files])
                work = tempfile.mkdtemp(dir=tmp)
                before = jvm_counters(spark)
                cpu_before = process_cpu(pid)
                res = run_contender(spark, name, source(spark, data, files), work)
                # JIT compilation and GC in the driver JVM during the run (read outside wall_s)
                res["jvm"] = jvm_delta(before, jvm_counters(spark))
                # CPU seconds per process kind: where a query's work went on the shared cores
                res["cpu_s"] = cpu_delta(cpu_before, process_cpu(pid))
                hosts = res.pop("hosts_cpu_s", None)  # read by run_streamstate before stop()
                if hosts is not None and res["cpu_s"]:
                    res["cpu_s"]["state_hosts"] = hosts
                check(name, res, used)
                # after the query ended and before the next one: outside any timing
                res["stages"] = stage_breakdown(
                    spark, res["run_id"], dict(zip(res["batch_ids"], res["batch_ms"], strict=True))
                )
                res["repeat"], res["position"] = r, position
                res["events"] = len(used)
                res["events_per_s"] = len(used) / res["wall_s"]
                steady = res["batch_ms"][1:] or res["batch_ms"]
                res["steady_events_per_s"] = (len(used) / len(res["batch_ms"])) / (
                    statistics.median(steady) / 1e3
                )
                runs[name].append(res)
                shutil.rmtree(work, ignore_errors=True)
                print(
                    f"  {name:<28}{len(used):>10,} events {res['wall_s']:>7.1f} s "
                    f"{res['events_per_s']:>10,.0f} ev/s  "
                    f"steady {res['steady_events_per_s']:>10,.0f}"
                    + ("" if files is None else f"  (first {files} batches only)")
                )
                if res["jvm"]:
                    print(
                        f"    JVM during the run: JIT {res['jvm']['jit_ms']:,.0f} ms, GC "
                        f"{res['jvm']['gc_ms']:,.0f} ms ({res['jvm']['gc_count']:.0f} collections)"
                    )
                if res["cpu_s"]:
                    print(f"    {_cpu_line(res['cpu_s'], res['wall_s'])}")
                if "steady" in res["stages"]:
                    print(f"    {_stages_line(res['stages']['steady'])}")
                else:
                    print(f"    stages: skipped ({res['stages']['skipped']})")
        # per contender: the median over its repeats (each in a different position), and the
        # range
        summary = {
            name: {
                "events_per_s": statistics.median(r["events_per_s"] for r in rs),
                "steady_events_per_s": statistics.median(r["steady_events_per_s"] for r in rs),
                "events_per_s_range": [
                    min(r["events_per_s"] for r in rs),
                    max(r["events_per_s"] for r in rs),
                ],
                "steady_events_per_s_range": [
                    min(r["steady_events_per_s"] for r in rs),
                    max(r["steady_events_per_s"] for r in rs),
                ],
                "first_batch_ms": statistics.median(r["batch_ms"][0] for r in rs),
                "outside_batches_ms": statistics.median(
                    r["wall_s"] * 1e3 - sum(r["batch_ms"]) for r in rs
                ),
                "events": rs[0]["events"],
                # Spark's stages of a steady micro-batch: the median over the repeats of
                # each run's median over its batches >= 1
                "stages": _median_stages(rs),
                # CPU seconds per process kind: the median over the repeats
                "cpu_s": _median_cpu(rs),
                "wall_s": statistics.median(r["wall_s"] for r in rs),
                "runs": rs,
            }
            for name, rs in runs.items()
            if rs
        }
        ratios = _ratios(summary)
        out[str(n_keys)] = {"contenders": summary, "ratios": ratios}
        for name, v in summary.items():
            low, high = v["events_per_s_range"]
            print(
                f"  median {name:<28}{v['events_per_s']:>10,.0f} ev/s ({low:,.0f}-{high:,.0f}) "
                f"steady {v['steady_events_per_s']:>10,.0f}  first batch "
                f"{v['first_batch_ms']:,.0f} ms, outside batches {v['outside_batches_ms']:,.0f} ms"
            )
        for name, v in summary.items():
            if v["stages"] is not None:
                print(f"  stages {name:<28}{_stages_line(v['stages'])}")
        for name, v in summary.items():
            if v["cpu_s"]:
                print(f"  cpu    {name:<28}{_cpu_line(v['cpu_s'], v['wall_s'])}")
        for label, value in ratios.items():
            print(f"  {label:<54}{value:>8.2f}" + ("" if label.endswith(", s") else "x"))
    return out


def _median_cpu(runs: list[dict[str, Any]]) -> dict[str, float]:
    kinds = [r["cpu_s"] for r in runs if r.get("cpu_s")]
    if not kinds:
        return {}
    return {k: statistics.median(c.get(k, 0.0) for c in kinds) for k in kinds[0]}


def _median_stages(runs: list[dict[str, Any]]) -> dict[str, float] | None:
    steady = [r["stages"]["steady"] for r in runs if "steady" in r["stages"]]
    if not steady:
        return None
    return {k: statistics.median(s[k] for s in steady) for k in steady[0]}


def _ratios(summary: dict[str, Any]) -> dict[str, float]:
    best_python = max(
        (summary[c]["events_per_s"] for c in SPARK_PYTHON if c in summary), default=None
    )
    ratios = {}
    for ss in STREAMSTATE:
        if ss not in summary:
            continue
        mine = summary[ss]["events_per_s"]
        if best_python:
            ratios[f"{ss} / best Python stateful API (goal >= 20)"] = mine / best_python
        if "jvm-groupby" in summary:
            jvm = summary["jvm-groupby"]
            ratios[f"{ss} / JVM groupBy (goal >= 1)"] = mine / jvm["events_per_s"]
            ratios[f"{ss} / JVM groupBy, steady batches"] = (
                summary[ss]["steady_events_per_s"] / jvm["steady_events_per_s"]
            )
            ratios[f"{ss} first batch - JVM's, s"] = (
                summary[ss]["first_batch_ms"] - jvm["first_batch_ms"]
            ) / 1e3
    return ratios


# ---- question 2 ---------------------------------------------------------------------------------


def bench_hot(spark: Any, args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    from streamstate.spark import keyed_process

    out: dict[str, Any] = {}
    # bench/spark_cluster.py runs this on a cluster with one subtask per worker
    parallelism = getattr(args, "hot_parallelism", 2)
    for backend in args.hot_backends.split(","):
        out[backend] = {}
        for size in (int(s) for s in args.hot_sizes.split(",")):
            work = tempfile.mkdtemp(dir=tmp)
            t0 = time.perf_counter()
            preload = spark.range(size).selectExpr("id as k", "timestamp_millis(0) as ts")
            keyed_process(
                preload,
                key="k",
                function=CountPerKey(emit=False),
                output_schema="k long, n long",
                parallelism=parallelism,
                state_backend=backend,
                savepoint=os.path.join(work, "savepoint"),
            ).count()
            preload_s = time.perf_counter() - t0
            data = os.path.join(work, "in")
            os.makedirs(data)
            rng = np.random.default_rng(size)
            for i in range(args.hot_batches):
                ks = rng.choice(size, min(args.hot_changed, size), replace=False).astype(np.int64)
                path = os.path.join(data, f"part-{i:04d}.parquet")
                pq.write_table(pa.table({"k": ks, "ts": ks.astype("datetime64[ms]")}), path)
                os.utime(path, (1_700_000_000 + 10 * i,) * 2)
            query = keyed_process(
                source(spark, data),
                key="k",
                function=CountPerKey(),
                output_schema="k long, n long",
                checkpoint=os.path.join(work, "ck"),
                parallelism=parallelism,
                state_backend=backend,
                initial_state=os.path.join(work, "savepoint"),
            ).write_stream(
                "parquet", path=os.path.join(work, "out"), trigger={"availableNow": True}
            )
            query.await_termination()
            query.stop()
            batches = query.batches
            hot = [b["batch_ms"] for b in batches[1:] if b.get("restore") == ["hot"]]
            routes = [
                sorted({s.get("route") or "" for s in b.get("subtasks", [])}) for b in batches
            ]
            if len(hot) != len(batches) - 1:
                raise AssertionError(
                    f"{backend} {size:,}: state was not hot: {[b.get('restore') for b in batches]}"
                )
            out[backend][str(size)] = {
                "preload_s": preload_s,
                "first_batch_ms": batches[0]["batch_ms"],
                "first_batch_restore": batches[0].get("restore"),
                "hot_batch_ms": hot,
                "median_hot_batch_ms": statistics.median(hot),
                # where a batch's time went, per subtask: staging (incl. the synchronous
                # snapshot phase) and waiting for the checkpoint upload
                "subtask_stats": [b.get("subtasks") for b in batches],
                "job_ms": [b.get("job_ms") for b in batches],
                "routes": routes,
            }
            shutil.rmtree(work, ignore_errors=True)
            print(
                f"  [hot] {backend:<8}{size:>12,} keys: preload {preload_s:6.1f} s, first batch "
                f"{batches[0]['batch_ms']:8.0f} ms ({batches[0].get('restore')}), median hot "
                f"batch {statistics.median(hot):6.0f} ms"
            )
        sizes = out[backend]
        medians = [v["median_hot_batch_ms"] for v in sizes.values()]
        sizes["largest_over_smallest"] = medians[-1] / medians[0]
        print(
            f"  [hot] {backend}: largest / smallest state = {medians[-1] / medians[0]:.2f}x "
            "(goal <= 1.5)"
        )
    return out


# ---- Spark Connect against classic --------------------------------------------------------------


def run_streamstate_session(spark: Any, data: str, backend: str, work: str) -> dict[str, Any]:
    """``run_streamstate`` from a classic or a Spark Connect client session, with Spark's own
    time per micro-batch besides streamstate's: ``batch_ms`` is measured inside foreachBatch
    (through Connect, by the server's foreachBatch Python process), ``trigger_ms`` is Spark's
    ``durationMs.triggerExecution`` of each batch, which also holds what Connect adds around
    the foreachBatch call (the JVM handing the batch to that Python process)."""
    from streamstate.spark import FileSink

    query, wall, out = _count_query(source(spark, data), backend, work)
    # the property: a Connect client's progress (read from JSON) may lack the top-level field
    progress = [p for p in query.recent_progress if p.numInputRows > 0]
    query.stop()
    return {
        "wall_s": wall,
        "batch_ms": [b["batch_ms"] for b in query.batches],
        "trigger_ms": [p.durationMs["triggerExecution"] for p in progress],
        "final": FileSink(out).read_arrow(),
    }


RUN_FIGURES = ("wall_s", "batch_ms", "trigger_ms", "steady_batch_ms", "steady_trigger_ms")


def bench_connect(spark: Any, args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    """The streamstate contenders from a classic session and from a Connect client session of a
    local Connect server (``LocalConnectServer``, the pyspark wheel's jars, the same settings as
    the classic session), alternating; the overhead is the ratio of the medians of the steady
    batches' ``batch_ms`` (after batch 0) and of the wall times (goal: steady <= 1.2x)."""
    from streamstate.devtools.local_connect import LocalConnectServer

    out: dict[str, Any] = {}
    server = LocalConnectServer(
        master="local[2]",
        conf={
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
            "spark.driver.memory": "4g",
        },
        log=os.path.join(tmp, "connect-server.log"),
    ).start()
    try:
        connect_spark = server.session()
        for n_keys in (int(k) for k in args.keys.split(",")):
            data = os.path.join(tmp, f"connect-in-{n_keys}")
            keys = write_input(data, args.events, n_keys, args.batches, seed=n_keys)
            print(f"\n[connect] {args.events:,} events, {n_keys:,} keys, {args.batches} batches")
            out[str(n_keys)] = {}
            for backend in ("heap", "rocksdb"):
                runs: dict[str, list[dict[str, Any]]] = {"classic": [], "connect": []}
                for r in range(args.repeat):
                    order = ["classic", "connect"] if r % 2 == 0 else ["connect", "classic"]
                    for kind in order:
                        work = tempfile.mkdtemp(dir=tmp)
                        session = spark if kind == "classic" else connect_spark
                        res = run_streamstate_session(session, data, backend, work)
                        check(f"streamstate-{backend}", res, keys)
                        res["steady_batch_ms"] = statistics.median(res["batch_ms"][1:])
                        res["steady_trigger_ms"] = statistics.median(res["trigger_ms"][1:])
                        runs[kind].append(res)
                        shutil.rmtree(work, ignore_errors=True)
                        print(
                            f"  {backend:<8}{kind:<8} wall {res['wall_s']:6.1f} s, first batch "
                            f"{res['batch_ms'][0]:7.0f} ms, median steady batch "
                            f"{res['steady_batch_ms']:6.0f} ms (Spark's trigger "
                            f"{res['steady_trigger_ms']:6.0f} ms)"
                        )
                med = {
                    kind: {
                        "wall_s": statistics.median(r["wall_s"] for r in rs),
                        "steady_batch_ms": statistics.median(r["steady_batch_ms"] for r in rs),
                        "steady_trigger_ms": statistics.median(r["steady_trigger_ms"] for r in rs),
                        "runs": [{k: r[k] for k in RUN_FIGURES} for r in rs],
                    }
                    for kind, rs in runs.items()
                }
                steady = med["connect"]["steady_batch_ms"] / med["classic"]["steady_batch_ms"]
                trig = med["connect"]["steady_trigger_ms"] / med["classic"]["steady_trigger_ms"]
                wall = med["connect"]["wall_s"] / med["classic"]["wall_s"]
                out[str(n_keys)][backend] = {
                    **med,
                    "steady_ratio": steady,
                    "steady_trigger_ratio": trig,
                    "wall_ratio": wall,
                }
                print(
                    f"  {backend:<8}Connect / classic: steady batches {steady:.2f}x, Spark's "
                    f"trigger {trig:.2f}x (goal <= 1.2), wall {wall:.2f}x"
                )
        connect_spark.stop()
    finally:
        server.stop()
    return out


# ---- output -------------------------------------------------------------------------------------


def plot(results: dict[str, Any], path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    pipeline = results["pipeline"]
    names = [c for c in CONTENDERS if any(c in v["contenders"] for v in pipeline.values())]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(pipeline)
    for i, (n_keys, v) in enumerate(pipeline.items()):
        xs = [j + i * width for j in range(len(names))]
        ys = [v["contenders"].get(n, {}).get("events_per_s", 0) for n in names]
        bars = ax.bar(xs, ys, width, label=f"{int(n_keys):,} keys")
        ax.bar_label(bars, labels=[f"{y:,.0f}" if y else "" for y in ys], fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("events per second (log scale)")
    ax.set_xticks([j + width * (len(pipeline) - 1) / 2 for j in range(len(names))])
    ax.set_xticklabels([n.replace("streamstate-", "streamstate\n") for n in names], fontsize=8)
    ax.set_title(
        f"Per-key count, {results['events']:,} events in {results['batches']} "
        "micro-batches, local[2]"
    )
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", default="10000,1000000")
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--slow-batches", type=int, default=1)
    parser.add_argument(
        "--no-warm-up",
        dest="warm_up",
        action="store_false",
        help="skip the untimed run of every contender before the first timed one",
    )
    parser.add_argument(
        "--warm-up-events",
        type=int,
        default=300_000,
        help="events of the warm-up input (the same for every contender), enough for the JVM "
        "to compile each contender's hot path before its first timed run",
    )
    parser.add_argument(
        "--warm-up-files",
        type=int,
        default=10,
        # measured: 300k events in 3 files left the first timed run compiling 2-4x the JIT time
        # of the later ones; the same events (or 100k) in 10 files did not
        help="Parquet files (micro-batches) of the warm-up input",
    )
    parser.add_argument(
        "--warm-up-rounds",
        type=int,
        default=1,
        help="times every contender runs over the warm-up input (all of them, in turn)",
    )
    parser.add_argument("--only", default="pipeline,hot")
    parser.add_argument("--hot-sizes", default="100000,1000000,10000000")
    parser.add_argument("--hot-backends", default="heap,rocksdb")
    parser.add_argument("--hot-batches", type=int, default=6)
    parser.add_argument("--hot-changed", type=int, default=10_000)
    parser.add_argument(
        "--connect",
        action="store_true",
        help="also run the streamstate contenders from a Spark Connect client of a local "
        "Connect server, alternating with classic ones (results['connect'])",
    )
    parser.add_argument("--out", default=os.path.join(HERE, "results", "spark_pipeline.json"))
    parser.add_argument(
        "--plot", default=os.path.join(HERE, "..", "docs", "img", "spark_pipeline.png")
    )
    args = parser.parse_args()

    spark = bench_session("streamstate-bench", driver_memory="4g")
    tmp = tempfile.mkdtemp(prefix="bench-spark-")
    results: dict[str, Any] = {
        "benchmark": "spark_pipeline",
        "command": "python " + " ".join(sys.argv),
        "events": args.events,
        "batches": args.batches,
        "repeat": args.repeat,
        "slow_batches_at_1M_keys": args.slow_batches,
        "python": platform.python_version(),
        "pyspark": spark.version,
        "cpus": os.cpu_count(),
    }
    if os.path.exists(args.out):  # keep the other question's figures of an earlier run
        with open(args.out) as f:
            previous = json.load(f)
        results = {**previous, **results}
    try:
        if "pipeline" in args.only:
            results.pop("pipeline_warm_up_s", None)  # the figure of older runs
            results["pipeline_warm_up"] = (
                warm_up(
                    spark,
                    args.contenders.split(","),
                    tmp,
                    args.warm_up_events,
                    args.warm_up_files,
                    int(args.keys.split(",")[0]),
                    args.warm_up_rounds,
                )
                if args.warm_up
                else None
            )
            results["pipeline"] = bench_pipeline(spark, args, tmp)
        if "hot" in args.only:
            # per backend: a run of one backend keeps the other's figures
            results["hot"] = {**results.get("hot", {}), **bench_hot(spark, args, tmp)}
        if args.connect:
            results["connect"] = bench_connect(spark, args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        spark.stop()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"\nwrote {args.out}")
    if "pipeline" in results and plot(results, args.plot):
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
