"""Batch execution on Spark (SPEC §13.3, issue 24): a keyed function over a static DataFrame
against Spark's own ``groupBy().agg``, in one ``local[2]`` session.

Input: ``spark.range(rows)`` with key ``k = id * 7919 % keys``, value ``v = id % 13`` and
(windowed job) event time ``ts = timestamp_millis(id * 37)``, cached before the first run.
Two jobs, each collected and checked against the JVM's result:

=============  ===================================================  =============================
job            streamstate (``keyed_process``, parallelism 2)       Spark (``collect()``)
=============  ===================================================  =============================
``sum``        a ValueState sum and an event-time timer that        ``groupBy("k").agg(sum("v"))``
               emits ``(k, total)`` when the key's input ends
``window``     ``window(TumblingEventTimeWindows.of(1 h))             ``groupBy("k", window("ts",
               .aggregate(Sum(), EmitWindow()))``                     "1 hour")).agg(sum("v"))``
=============  ===================================================  =============================

Contenders per job and size: ``jvm`` (the ``groupBy``), ``batch`` (``execution_mode="batch"``,
the default for a static DataFrame), ``floor`` (Spark's floor under batch execution: the same
placement, ``sortWithinPartitions(k[, ts])`` and a ``mapInArrow`` pass-through yielding one
row per Arrow batch: what Spark costs any Python job over sorted keyed rows, see
``spark_fixed_costs.spark_floor_ms``), and ``streaming`` (``execution_mode="streaming"``, the
streaming operator over the unsorted partition: every key's state in the heap backend until the
input ends) up to ``--streaming-up-to`` rows. Every contender runs once, untimed, on a small
input first; ``--repeat`` runs rotate the order, and each figure is the median over the repeats
(range in the JSON). Goals: ``batch`` within 1.2x of ``jvm`` at 100k rows, at most 1.0x at 4M
rows / 1M keys.

Peak memory of a subtask's Python process: the functions (the ``sum`` function, the window
function of ``window``) reset the process's peak RSS when a task opens them (``/proc/self/
clear_refs``) and record ``VmHWM`` when the task closes them, into files the benchmark reads
back; a contender's figure is the largest over its tasks (``peak_rss_mb``; the RSS when the task
began is ``start_rss_mb``). Spark reuses its Python workers, so memory a task freed but Python
kept is the next task's start: every ``batch`` run of every size runs before any ``streaming``
run (which keeps all keys) in a session; the floor's pass-through runs in the same workers too,
and what it leaves (pyspark's and Arrow's buffers for the size's input) can be a later batch
task's start and peak. So ``growth_mb`` (per run, ``batch_memory_runs``) is what a task added to
the RSS it started with: the memory of the task itself. Goal: the largest ``batch`` peak within
1.2x of the smallest from 100k to 10M keys.

``--profile ROWS:KEYS``: instead of the above, the ``sum`` job in batch execution once at that
size with py-spy (``pip install py-spy``) sampling every Python worker of the session; the
samples are summed by where they were taken (the function, the state backend, the batch runtime,
Arrow conversion, Spark's worker) and written to the JSON's ``profile`` (with the flame graph
input next to it, ``*.folded``): what bounds the Python side of a task.

``--in-process ROWS:KEYS``: no Spark: the task's side alone, the ``sum`` job through the batch
task runtime (``BatchSubtaskRuntime`` over Arrow batches sorted by key, as a task receives them)
and through the streaming one (``SubtaskRuntime``, heap backend, over the unsorted batches),
in this process, CPU time per record (minimum of ``--repeat`` interleaved runs, default 5 here),
beside the floor of any Python function over the same records (Arrow columns to Python rows and
a call per record), and the most a task added to the process's peak RSS (``growth_mb``: the
batch task holds one key, the streaming one every key); written to the JSON's ``in_process``.

``--savepoint-keys N`` (default: the largest size's keys; 0: none): the ``sum`` job also runs
in batch execution with ``savepoint=`` at that size; its wall time, peak RSS and the savepoint's
size are recorded (the savepoint is streamed key group by key group as keys finish; it is read back
with ``read_state`` and counted with ``--verify-savepoint``).

Writes ``bench/results/spark_batch.json`` (``--out``).

    python bench/spark_batch.py [--sizes 100000:10000,4000000:1000000,10000000:10000000]
        [--jobs sum,window] [--repeat 2] [--streaming-up-to 4000000]
        [--savepoint-keys 10000000] [--verify-savepoint] [--driver-memory 4g]
    python bench/spark_batch.py --profile 4000000:1000000
    python bench/spark_batch.py --in-process 2000000:500000
"""

from __future__ import annotations

import argparse
import glob
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
sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from pyspark import cloudpickle as spark_cloudpickle

import spark_fixed_costs
from spark_fixed_costs import spark_floor_ms
from spark_pipeline import bench_session

# the floor's pass-through travels to the Python workers by value (they cannot import bench/)
spark_cloudpickle.register_pickle_by_value(spark_fixed_costs)

from streamstate import AggregateFunction, KeyedProcessFunction, ValueStateDescriptor
from streamstate.windows import ProcessWindowFunction, TumblingEventTimeWindows, window

HERE = os.path.dirname(os.path.abspath(__file__))
HOUR = 3_600_000
#: the end-of-input timer of the sum job (any time: a key's timers fire when its input ends)
END = 1 << 62


# ---- peak memory of the task's Python process ----------------------------------------------------


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _in_spark_task() -> bool:
    from pyspark import TaskContext

    return TaskContext.get() is not None


class TaskMemory:
    """Resets the process's peak RSS when a task starts and records it when the task ends
    (one JSON file per task in ``directory``)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._start = 0

    def start(self) -> None:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset the peak RSS (VmHWM) to the current RSS
        except OSError:
            pass
        self._start = _status_kb("VmRSS")

    def end(self, subtask: int) -> None:
        if not self.directory or not _in_spark_task():
            # keyed_process opens and closes a copy of the function on the driver to check its
            # states: the driver's RSS (which holds collected results) is no task's memory
            return
        report = {
            "pid": os.getpid(),
            "subtask": subtask,
            "start_rss_kb": self._start,
            "peak_rss_kb": _status_kb("VmHWM"),
        }
        path = os.path.join(self.directory, f"{os.getpid()}-{time.time_ns()}.json")
        with open(path, "w") as f:
            json.dump(report, f)


class SumAtEnd(KeyedProcessFunction):
    """The issue's job: a ValueState sum and an event-time timer, registered with the key's
    first record, that emits ``(key, total)`` when the key's input ends."""

    def __init__(self, memory_dir: str = "") -> None:
        self.memory = TaskMemory(memory_dir)

    def open(self, ctx: Any) -> None:
        self.memory.start()
        self.subtask = ctx.get_index_of_this_subtask()
        self.total = ctx.get_state(ValueStateDescriptor("total", int))

    def process_element(self, value: Any, ctx: Any) -> Any:
        total = self.total.value()
        if total is None:
            ctx.timer_service().register_event_time_timer(END)
            total = 0
        self.total.update(total + value.v)
        return None

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        yield ctx.get_current_key(), self.total.value()

    def close(self) -> None:
        self.memory.end(self.subtask)


class Sum(AggregateFunction):
    def create_accumulator(self) -> int:
        return 0

    def add(self, value: Any, accumulator: int) -> int:
        return accumulator + value[1]  # (k, v, ts)

    def get_result(self, accumulator: int) -> int:
        return accumulator

    def merge(self, a: int, b: int) -> int:
        return a + b


class EmitWindow(ProcessWindowFunction):
    """``(key, window start, sum)``; records the task's peak memory like :class:`SumAtEnd`."""

    def __init__(self, memory_dir: str = "") -> None:
        self.memory = TaskMemory(memory_dir)

    def open(self, ctx: Any) -> None:
        self.memory.start()
        self.subtask = ctx.get_index_of_this_subtask()

    def process(self, key: Any, context: Any, sums: Any) -> Any:
        yield key, context.window().start, sums[0]

    def close(self) -> None:
        self.memory.end(self.subtask)


def windowed(memory_dir: str = "") -> Any:
    return window(TumblingEventTimeWindows.of(HOUR)).aggregate(
        Sum(), EmitWindow(memory_dir), accumulator_type=int
    )


# ---- the contenders -----------------------------------------------------------------------------


def make_input(spark: Any, rows: int, keys: int, job: str) -> Any:
    cols = [f"id * 7919 % {keys} as k", "id % 13 as v"]
    if job == "window":
        cols.append("timestamp_millis(id * 37) as ts")
    df = spark.range(rows).selectExpr(*cols).cache()
    df.count()
    return df


def run_jvm(df: Any, job: str) -> tuple[float, list[Any]]:
    from pyspark.sql import functions as sf

    t0 = time.perf_counter()
    if job == "sum":
        rows = df.groupBy("k").agg(sf.sum("v").alias("total")).collect()
        got = [(r.k, r.total) for r in rows]
    else:
        rows = (
            df.groupBy("k", sf.window("ts", "1 hour").alias("w"))
            .agg(sf.sum("v").alias("total"))
            .select("k", (sf.unix_millis(sf.col("w.start"))).alias("start"), "total")
            .collect()
        )
        got = [(r.k, r.start, r.total) for r in rows]
    return time.perf_counter() - t0, got


def run_streamstate(
    df: Any, job: str, mode: str, memory_dir: str, savepoint: str | None = None
) -> tuple[float, list[Any]]:
    from streamstate.spark import keyed_process

    if job == "sum":
        function: Any = SumAtEnd(memory_dir)
        schema, event_time = "k long, total long", None
    else:
        function, schema, event_time = windowed(memory_dir), "k long, start long, total long", "ts"
    # a new DataFrame object over the same cached data: keyed_process keeps the placed input
    # per DataFrame, and a benchmark that reused one would time only the first run's placement
    df = df.select("*")
    t0 = time.perf_counter()
    out = keyed_process(
        df,
        key="k",
        function=function,
        output_schema=schema,
        parallelism=2,
        event_time=event_time,
        execution_mode=mode,
        savepoint=savepoint,
    )
    got = [tuple(r) for r in out.collect()]
    return time.perf_counter() - t0, got


def run_floor(df: Any, job: str, rows: int) -> float:
    from streamstate.spark.driver.query.batch import sort_columns

    sort = sort_columns(["k"], "ts" if job == "window" else None, exact=True)
    return spark_floor_ms(df, rows, sort=sort) / 1e3


def read_memory(directory: str) -> dict[str, Any]:
    reports = []
    for path in glob.glob(os.path.join(directory, "*.json")):
        with open(path) as f:
            reports.append(json.load(f))
        os.remove(path)
    if not reports:
        return {}
    return {
        "peak_rss_mb": max(r["peak_rss_kb"] for r in reports) / 1024,
        "start_rss_mb": max(r["start_rss_kb"] for r in reports) / 1024,
        # what a task added to its worker's RSS: Spark reuses workers, so a task's start is
        # what earlier tasks left (freed but kept by Python and Arrow), and its peak may be too
        "growth_mb": max(r["peak_rss_kb"] - r["start_rss_kb"] for r in reports) / 1024,
        "tasks": len(reports),
    }


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def bench_size(
    spark: Any, job: str, rows: int, keys: int, args: argparse.Namespace, memory_dir: str
) -> dict[str, Any]:
    df = make_input(spark, rows, keys, job)
    runs: dict[str, list[float]] = {"jvm": [], "batch": [], "floor": []}
    memory: dict[str, list[dict[str, Any]]] = {"batch": []}
    expected: list[Any] | None = None
    order = ["jvm", "batch", "floor"]
    for r in range(args.repeat):
        for name in order[r % 3 :] + order[: r % 3]:
            if name == "jvm":
                took, got = run_jvm(df, job)
                expected = sorted(got)
            elif name == "batch":
                took, got = run_streamstate(df, job, "batch", memory_dir)
                memory["batch"].append(read_memory(memory_dir))
                if expected is not None:
                    assert sorted(got) == expected, f"{job} {rows}: batch results differ"
            else:
                took = run_floor(df, job, rows)
            runs[name].append(took)
            print(f"  [{job} {rows:,}/{keys:,} #{r}] {name:<9} {took * 1e3:9.0f} ms", flush=True)
    df.unpersist()
    med = {name: _median(v) for name, v in runs.items()}
    result: dict[str, Any] = {
        "job": job,
        "rows": rows,
        "keys": keys,
        "runs_s": runs,
        "median_s": med,
        "ratio": med["batch"] / med["jvm"],
        "floor_ratio": med["floor"] / med["jvm"],
        "ratio_over_floor": med["batch"] / med["floor"],
        "batch_memory": max(memory["batch"], key=lambda m: m.get("peak_rss_mb", 0)),
        "batch_memory_runs": memory["batch"],
    }
    print(
        f"[{job} {rows:,} rows / {keys:,} keys] jvm {med['jvm']:.2f} s, batch {med['batch']:.2f} s"
        f" ({result['ratio']:.2f}x), floor {med['floor']:.2f} s ({result['floor_ratio']:.2f}x; "
        f"batch = floor x {result['ratio_over_floor']:.2f}); batch peak RSS "
        f"{result['batch_memory'].get('peak_rss_mb', 0):.0f} MB (a task added at most "
        f"{max(m.get('growth_mb', 0) for m in memory['batch']):.0f} MB)",
        flush=True,
    )
    return result


def bench_streaming(
    spark: Any, job: str, rows: int, keys: int, args: argparse.Namespace, memory_dir: str
) -> dict[str, Any]:
    """Today's path (streaming execution over the static DataFrame), for comparison."""
    df = make_input(spark, rows, keys, job)
    times = []
    mems = []
    for _ in range(args.repeat):
        took, _got = run_streamstate(df, job, "streaming", memory_dir)
        times.append(took)
        mems.append(read_memory(memory_dir))
    df.unpersist()
    mem = max(mems, key=lambda m: m.get("peak_rss_mb", 0))
    print(
        f"[{job} {rows:,} rows / {keys:,} keys] streaming execution {_median(times):.2f} s, "
        f"peak RSS {mem.get('peak_rss_mb', 0):.0f} MB",
        flush=True,
    )
    return {"job": job, "rows": rows, "keys": keys, "runs_s": times, "median_s": _median(times),
            "memory": mem}  # fmt: skip


def bench_savepoint(
    spark: Any, rows: int, keys: int, args: argparse.Namespace, memory_dir: str, work: str
) -> dict[str, Any]:
    df = make_input(spark, rows, keys, "sum")
    path = os.path.join(work, f"savepoint-{keys}")
    took, got = run_streamstate(df, "sum", "batch", memory_dir, savepoint=path)
    df.unpersist()
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)
    result: dict[str, Any] = {
        "rows": rows,
        "keys": keys,
        "wall_s": took,
        "outputs": len(got),
        "bytes": size,
        "memory": read_memory(memory_dir),
    }
    if args.verify_savepoint:
        from streamstate.spark import read_state

        result["entries_read_back"] = read_state(spark, path, state="total").count()
        assert result["entries_read_back"] == min(rows, keys)
    print(
        f"[savepoint {keys:,} keys] {took:.2f} s, {size / 1e6:.0f} MB, peak RSS "
        f"{result['memory'].get('peak_rss_mb', 0):.0f} MB",
        flush=True,
    )
    shutil.rmtree(path, ignore_errors=True)
    return result


#: where a py-spy sample was taken, by its frames from the innermost out: the first rule whose
#: text appears in a frame names the sample's bucket
PROFILE_BUCKETS = [
    ("function (the job's process_element, on_timer)", "spark_batch.py"),
    ("state backend (backends/batch)", "backends/batch/"),
    ("TTL / metrics decorators", "backends/decorators/"),
    ("batch timer service (runtime/batch.py)", "runtime/batch.py"),
    ("operator loop (runtime/operator.py)", "runtime/operator.py"),
    ("outputs to Arrow (spark/records.py)", "spark/records.py"),
    (
        "run starts, Arrow to Python rows (batch_subtask.py, subtask.py)",
        "spark/task/batch_subtask.py",
    ),
    ("Arrow to Python (subtask.py)", "spark/subtask.py"),
    ("timer services (timers.py)", "streamstate/timers.py"),
    ("Spark's Python worker (reading and writing Arrow)", "pyspark"),
    ("pyarrow", "pyarrow"),
]


def _bucket(stack: str) -> str:
    frames = stack.split(";")
    for frame in reversed(frames):
        for name, needle in PROFILE_BUCKETS:
            if needle in frame:
                return name
    return "other"


def profile_batch(
    spark: Any, rows: int, keys: int, memory_dir: str, work: str, out: str
) -> dict[str, Any]:
    """The ``sum`` job in batch execution with py-spy on every Python worker (docstring)."""
    import signal
    import subprocess

    from spark_pipeline import _proc_stats, jvm_pid

    pyspy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    jvm = jvm_pid(spark)
    df = make_input(spark, rows, keys, "sum")
    run_streamstate(df, "sum", "batch", memory_dir)  # workers up, imports done
    read_memory(memory_dir)
    stats = _proc_stats()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    workers, todo = [], list(children.get(jvm or -1, []))
    while todo:
        pid = todo.pop()
        workers.append(pid)
        todo.extend(children.get(pid, []))
    recorders = []
    for pid in workers:
        path = os.path.join(work, f"profile-{pid}.folded")
        recorders.append(
            (
                path,
                subprocess.Popen(
                    [pyspy, "record", "--pid", str(pid), "--rate", "200", "--format", "raw",
                     "--output", path, "--nonblocking"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                ),
            )
        )  # fmt: skip
    time.sleep(1.0)  # py-spy attached
    took, got = run_streamstate(df, "sum", "batch", memory_dir)
    for _, proc in recorders:
        proc.send_signal(signal.SIGINT)
    buckets: dict[str, int] = {}
    functions: dict[str, int] = {}
    total = 0
    stacks: list[str] = []
    for path, proc in recorders:
        proc.wait(timeout=60)
        if not os.path.exists(path):
            continue
        with open(path) as f:
            for line in f:
                stack, _, count = line.rstrip("\n").rpartition(" ")
                n = int(count)
                if "spark_batch.py" not in stack and "streamstate" not in stack:
                    continue  # an idle worker, or the worker between tasks
                total += n
                buckets[_bucket(stack)] = buckets.get(_bucket(stack), 0) + n
                leaf = stack.split(";")[-1]
                functions[leaf] = functions.get(leaf, 0) + n
                stacks.append(line)
    df.unpersist()
    read_memory(memory_dir)
    with open(out.replace(".json", ".folded"), "w") as f:
        f.writelines(stacks)
    share = {k: round(100 * v / total, 1) for k, v in sorted(buckets.items(), key=lambda x: -x[1])}
    top = sorted(functions.items(), key=lambda x: -x[1])[:25]
    print(f"[profile sum {rows:,} rows / {keys:,} keys] {took:.2f} s, {total} samples in tasks")
    for name, pct in share.items():
        print(f"  {pct:5.1f}%  {name}")
    return {
        "rows": rows,
        "keys": keys,
        "wall_s": took,
        "outputs": len(got),
        "samples": total,
        "buckets_pct": share,
        "top_leaf_functions_pct": [(name, round(100 * n / total, 1)) for name, n in top],
    }


def in_process(rows: int, keys: int, repeat: int) -> dict[str, Any]:
    """The task's side without Spark (see the module docstring): ns of CPU per record."""
    from itertools import repeat as forever

    import numpy as np
    import pyarrow as pa

    from streamstate.keygroups import assign_key_groups_for_columns
    from streamstate.spark.job import JobSpec, arrow_schema_to_bytes
    from streamstate.spark.records import row_class
    from streamstate.spark.subtask import SubtaskRuntime
    from streamstate.spark.task.batch_subtask import BatchSubtaskRuntime

    schema = pa.schema([("k", pa.int64()), ("v", pa.int64()), ("_kg", pa.int32())])
    out = pa.schema([("k", pa.int64()), ("total", pa.int64())])
    job = JobSpec(
        operator="op",
        parallelism=1,
        max_parallelism=128,
        key_columns=["k"],
        value_columns=["k", "v"],
        input_schema=arrow_schema_to_bytes(schema),
        output_schema=arrow_schema_to_bytes(out),
    )
    ids = np.arange(rows)
    k = ids * 7919 % keys
    v = ids % 13
    kg = np.asarray(assign_key_groups_for_columns([pa.array(k)], 128), dtype=np.int32)

    def batches(order: Any) -> list[Any]:
        return [
            pa.RecordBatch.from_arrays(
                [pa.array(k[i]), pa.array(v[i]), pa.array(kg[i])], schema=schema
            )
            for i in (order[s : s + 10_000] for s in range(0, rows, 10_000))
        ]

    by_key = batches(np.argsort(k, kind="stable"))
    as_they_come = batches(ids)

    growth: dict[str, float] = {}

    def task(runtime: Any, input_batches: list[Any], name: str) -> float:
        runtime.prepare(-1, "empty")
        runtime.begin(None, 0)
        memory = TaskMemory("")
        memory.start()
        t0 = time.process_time()
        got = 0
        for batch in input_batches:
            runtime.process(batch)
            got += sum(b.num_rows for b in runtime.output_batches())
        runtime.end_of_input()
        got += sum(b.num_rows for b in runtime.output_batches())
        took = time.process_time() - t0
        added = (_status_kb("VmHWM") - memory._start) / 1024
        growth[name] = max(growth.get(name, 0.0), added)
        runtime.close()
        assert got == min(keys, rows)
        return took

    def floor() -> float:
        """Arrow columns to rows and one call per record, of a function that does nothing."""
        row = row_class(["k", "v"])

        def function(value: Any, ctx: Any) -> None:
            return None

        t0 = time.process_time()
        for batch in by_key:
            columns = [batch.column(c).to_pylist() for c in ("k", "v")]
            for value in map(tuple.__new__, forever(row), zip(*columns, strict=True)):
                function(value, None)
        return time.process_time() - t0

    from streamstate.runtime.record_path import COMPILED_PATH_AVAILABLE, record_path

    # each runtime also on the pure-Python reference path (record loop, value state), same
    # process, interleaved: what the compiled path changes
    paths = {"": True, "_reference": False} if COMPILED_PATH_AVAILABLE else {"": True}
    runs: dict[str, list[float]] = {"floor": []}
    for _ in range(repeat):
        for suffix, compiled in paths.items():
            with record_path(compiled):
                runs.setdefault(f"batch{suffix}", []).append(
                    task(BatchSubtaskRuntime(job, 0, SumAtEnd), by_key, "batch")
                )
                runs.setdefault(f"streaming{suffix}", []).append(
                    task(
                        SubtaskRuntime(job, 0, SumAtEnd, incremental=False),
                        as_they_come,
                        "streaming",
                    )
                )
        runs["floor"].append(floor())
    ns = {name: min(t) / rows * 1e9 for name, t in runs.items()}
    batch, streaming, lowest = ns["batch"], ns["streaming"], ns["floor"]
    print(
        f"[in process, {rows:,} rows / {keys:,} keys] ns of CPU per record: batch {batch:.0f}, "
        f"streaming {streaming:.0f}, floor {lowest:.0f}; batch / streaming "
        f"{batch / streaming:.2f}x, batch / floor {batch / lowest:.2f}x; peak RSS added by a "
        f"task: batch {growth['batch']:.1f} MB, streaming {growth['streaming']:.1f} MB"
    )
    if "batch_reference" in ns:
        print(
            f"  the pure-Python reference path: batch {ns['batch_reference']:.0f}, streaming "
            f"{ns['streaming_reference']:.0f} (compiled / reference: batch "
            f"{batch / ns['batch_reference']:.2f}x, streaming "
            f"{streaming / ns['streaming_reference']:.2f}x)"
        )
    return {"rows": rows, "keys": keys, "ns_per_record": ns, "runs_s": runs, "growth_mb": growth}


def warm_up(spark: Any, memory_dir: str) -> None:
    for job in ("sum", "window"):
        df = make_input(spark, 20_000, 1_000, job)
        run_jvm(df, job)
        for mode in ("batch", "streaming"):
            run_streamstate(df, job, mode, memory_dir)
        run_floor(df, job, 20_000)
        df.unpersist()
    read_memory(memory_dir)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="100000:10000,4000000:1000000,10000000:10000000")
    parser.add_argument("--jobs", default="sum,window")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--streaming-up-to", type=int, default=4_000_000)
    parser.add_argument("--savepoint-keys", type=int, default=None)
    parser.add_argument("--verify-savepoint", action="store_true")
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--profile", default=None, metavar="ROWS:KEYS")
    parser.add_argument("--in-process", default=None, metavar="ROWS:KEYS")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "spark_batch.json"))
    args = parser.parse_args()
    sizes = [tuple(int(x) for x in s.split(":")) for s in args.sizes.split(",")]
    jobs = args.jobs.split(",")
    if args.in_process:
        rows, keys = (int(x) for x in args.in_process.split(":"))
        repeat = args.repeat if "--repeat" in sys.argv else 5
        return _write(
            {
                "benchmark": "spark_batch",
                "command": "python " + " ".join(sys.argv),
                "load_average": os.getloadavg(),
                "in_process": in_process(rows, keys, repeat),
            },
            args.out,
        )

    work = tempfile.mkdtemp(prefix="bench-batch-")
    memory_dir = os.path.join(work, "memory")
    os.makedirs(memory_dir)
    spark = bench_session("streamstate-bench-batch", driver_memory=args.driver_memory)
    results: dict[str, Any] = {
        "benchmark": "spark_batch",
        "command": "python " + " ".join(sys.argv),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_average": os.getloadavg(),
        "sizes": [],
        "streaming": [],
    }
    try:
        warm_up(spark, memory_dir)
        if args.profile:
            rows, keys = (int(x) for x in args.profile.split(":"))
            results["profile"] = profile_batch(spark, rows, keys, memory_dir, work, args.out)
            return _write(results, args.out)
        # every batch-execution run before any streaming-execution one (see the docstring)
        for job in jobs:
            for rows, keys in sizes:
                results["sizes"].append(bench_size(spark, job, rows, keys, args, memory_dir))
        sp_keys = max(k for _, k in sizes) if args.savepoint_keys is None else args.savepoint_keys
        if sp_keys:
            sp_rows = next((r for r, k in sizes if k == sp_keys), sp_keys)
            results["savepoint"] = bench_savepoint(spark, sp_rows, sp_keys, args, memory_dir, work)
        for job in jobs:
            for rows, keys in sizes:
                if rows <= args.streaming_up_to:
                    results["streaming"].append(
                        bench_streaming(spark, job, rows, keys, args, memory_dir)
                    )
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    peaks = [s["batch_memory"].get("peak_rss_mb", 0) for s in results["sizes"]]
    results["batch_peak_rss_spread"] = max(peaks) / min(peaks) if peaks and min(peaks) else None
    results["batch_growth_mb"] = {
        f"{s['job']} {s['rows']}:{s['keys']}": max(m.get("growth_mb", 0) for m in
                                                   s["batch_memory_runs"])
        for s in results["sizes"]
    }  # fmt: skip
    print(f"batch: the most a task added to its worker's RSS, per job and size: "
          f"{results['batch_growth_mb']}")  # fmt: skip
    print(f"batch peak RSS, largest / smallest over every size and job: "
          f"{results['batch_peak_rss_spread']:.2f}x (goal <= 1.2)")  # fmt: skip
    _write(results, args.out)


def _write(results: dict[str, Any], path: str) -> None:
    results["load_average_end"] = os.getloadavg()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(results, f, indent=2, default=str)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
