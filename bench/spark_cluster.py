"""streamstate on a Spark standalone cluster of local nodes: does the state stay hot?

A master and ``--workers`` workers (default 3, one core each) started from pyspark's own
``spark-class`` on 127.0.0.1 (``streamstate.devtools.local_cluster``); every worker has its own
``STREAMSTATE_RUN_DIR``, so its executor's state hosts are a separate node's. The driver is this
process.

Question 1, ``fraction``: a streaming per-key count, ``parallelism=4``, ``--batches`` (12)
micro-batches of ``--rows`` (20,000) rows over ``--keys`` (5,000) keys, file source, parquet sink,
heap and RocksDB. Measured: the fraction of subtask-batches after the first whose restore was
``hot`` (goal >= 95%); the results are checked against the generated counts. ``--src DIR``
runs the same against another streamstate source tree (e.g. ``git archive main src``), to put
the figures before and after networked state hosts in one table (``--label`` names the run).

Question 2, ``hot``: ``bench/spark_pipeline.py``'s hot-state figure on the cluster: median
micro-batch time with ``--hot-changed`` (10k) changed keys while the state holds
``--hot-sizes`` (100k, 1M, 10M) keys, heap and RocksDB, ``parallelism`` = workers; goal: the
largest within 1.5x of the smallest. Every batch after the first must be hot (checked).

Question 3, ``loss``: a query over ``--loss-keys`` (1M) keys of state, ``parallelism=4``,
10k changed keys per micro-batch; after batch ``--loss-after`` (3) the node holding the most
subtasks' hosts is SIGKILLed (worker, executor, Python workers, hosts). Reported: the batch
after the loss (its lost subtasks reload) against the hot batches before and after it.

Writes ``bench/results/spark_cluster.json`` (a run keeps the other questions' and labels'
figures) and ``docs/img/spark_cluster.png``.

    python bench/spark_cluster.py [--quick] [--only fraction,hot,loss] [--repeat 2]
        [--src DIR --label main] [--hot-sizes 100000,1000000,10000000] [--hot-repeat 2]
        [--append] [--loss-keys 1000000]

``--quick``: 2 repeats of question 1 and question 2 at 100k and 1M keys only.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.abspath(os.path.join(HERE, "..", "src"))


def _load_local_cluster() -> Any:
    """This checkout's ``local_cluster`` by file path: it imports nothing from streamstate, so
    it also runs a cluster for an older source tree (``--src``) that lacks it."""
    path = os.path.join(SRC, "streamstate", "spark", "local_cluster.py")
    spec = importlib.util.spec_from_file_location("_bench_local_cluster", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


# ---- question 1 ---------------------------------------------------------------------------------


def write_input(directory: str, batches: int, rows: int, keys: int, seed: int) -> list[Any]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(directory)
    rng = np.random.default_rng(seed)
    out = []
    for i in range(batches):
        ks = rng.integers(0, keys, rows).astype(np.int64)
        path = os.path.join(directory, f"part-{i:04d}.parquet")
        pq.write_table(pa.table({"k": ks, "ts": ks.astype("datetime64[ms]")}), path)
        os.utime(path, (1_700_000_000 + 10 * i,) * 2)  # the file source's order
        out.append(ks)
    return out


def run_fraction(spark: Any, args: argparse.Namespace, backend: str, work: str) -> dict[str, Any]:
    from streamstate import KeyedProcessFunction, ValueStateDescriptor
    from streamstate.spark import FileSink, keyed_process

    class CountPerKey(KeyedProcessFunction):
        def open(self, ctx: Any) -> None:
            self.n = ctx.get_state(ValueStateDescriptor("n", int, default=0))

        def process_element(self, value: Any, ctx: Any) -> Iterator[tuple[Any, int]]:
            n = self.n.value() + 1
            self.n.update(n)
            yield ctx.get_current_key(), n

    data = os.path.join(work, "in")
    keys = write_input(data, args.batches, args.rows, args.keys, seed=len(os.listdir(work)))
    src = (
        spark.readStream.schema("k long, ts timestamp")
        .option("maxFilesPerTrigger", 1)
        .parquet(data)
    )
    t0 = time.perf_counter()
    query = keyed_process(
        src,
        key="k",
        function=CountPerKey(),
        output_schema="k long, n long",
        checkpoint=os.path.join(work, "ck"),
        parallelism=args.parallelism,
        state_backend=backend,
    ).write_stream("parquet", path=os.path.join(work, "out"), trigger={"availableNow": True})
    query.await_termination()
    wall = time.perf_counter() - t0
    query.stop()
    table = FileSink(os.path.join(work, "out")).read_arrow()
    got: dict[int, int] = {}
    for k, n in zip(table["k"].to_pylist(), table["n"].to_pylist(), strict=True):
        got[k] = max(n, got.get(k, 0))
    expected = Counter(k for ks in keys for k in ks.tolist())
    if got != dict(expected) or table.num_rows != args.batches * args.rows:
        raise AssertionError(f"{backend}: wrong counts ({table.num_rows} rows)")
    batches = query.batches
    kinds = [[s["restore"] for s in b["subtasks"]] for b in batches]
    after = [k for ks in kinds[1:] for k in ks]
    routes = Counter(s.get("route") or "-" for b in batches[1:] for s in b["subtasks"])
    return {
        "wall_s": wall,
        "subtask_batches_after_first": len(after),
        "hot": after.count("hot"),
        "reload": after.count("reload"),
        "hot_fraction": after.count("hot") / len(after),
        "routes_after_first": dict(routes),
        "median_batch_ms_after_first": statistics.median(b["batch_ms"] for b in batches[1:]),
        "restores": kinds,
    }


def bench_fraction(spark: Any, args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for backend in args.backends.split(","):
        runs = []
        for r in range(args.repeat):
            work = tempfile.mkdtemp(dir=tmp)
            res = run_fraction(spark, args, backend, work)
            shutil.rmtree(work, ignore_errors=True)
            runs.append(res)
            print(
                f"  [fraction] {args.label:<12}{backend:<8} run {r}: hot {res['hot']}/"
                f"{res['subtask_batches_after_first']} = {res['hot_fraction']:.0%}, reload "
                f"{res['reload']}, routes {res['routes_after_first']}, median batch "
                f"{res['median_batch_ms_after_first']:.0f} ms, wall {res['wall_s']:.0f} s",
                flush=True,
            )
        fractions = [r["hot_fraction"] for r in runs]
        out[backend] = {
            "hot_fraction": statistics.median(fractions),
            "hot_fraction_range": [min(fractions), max(fractions)],
            "median_batch_ms": statistics.median(r["median_batch_ms_after_first"] for r in runs),
            "runs": runs,
        }
    return out


# ---- question 2 ---------------------------------------------------------------------------------


def bench_hot(spark: Any, args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    sys.path.insert(0, HERE)
    import spark_pipeline

    ns = argparse.Namespace(
        hot_backends=args.backends,
        hot_sizes=args.hot_sizes,
        hot_batches=args.hot_batches,
        hot_changed=args.hot_changed,
        hot_parallelism=args.workers,
    )
    runs = [spark_pipeline.bench_hot(spark, ns, tmp) for _ in range(args.hot_repeat)]
    out: dict[str, Any] = {}
    for backend in args.backends.split(","):
        sizes = [s for s in runs[0][backend] if s.isdigit()]
        per_size = {}
        for size in sizes:
            medians = [r[backend][size]["median_hot_batch_ms"] for r in runs]
            per_size[size] = {
                "median_hot_batch_ms": statistics.median(medians),
                "range_ms": [min(medians), max(medians)],
                "runs": [r[backend][size] for r in runs],
            }
        first, last = per_size[sizes[0]], per_size[sizes[-1]]
        out[backend] = {
            **per_size,
            "largest_over_smallest": last["median_hot_batch_ms"] / first["median_hot_batch_ms"],
        }
    return out


# ---- question 3 ---------------------------------------------------------------------------------


def bench_loss(spark: Any, args: argparse.Namespace, tmp: str, cluster: Any) -> dict[str, Any]:
    """A node lost between two micro-batches of a query over ``--loss-keys`` keys of state:
    the batch after the loss against the hot batches before it."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    sys.path.insert(0, HERE)
    from spark_pipeline import CountPerKey
    from streamstate.spark import FileSink, keyed_process

    out: dict[str, Any] = {}
    for backend in args.backends.split(","):
        # every backend starts on --workers nodes: replace the node the previous one lost
        while len(cluster.alive_nodes) < args.workers:
            cluster.add_worker()
        wait_for = _load_local_cluster().wait_for_executors
        wait_for(spark, args.workers)
        work = tempfile.mkdtemp(dir=tmp)
        savepoint = os.path.join(work, "savepoint")
        keyed_process(
            spark.range(args.loss_keys).selectExpr("id as k", "timestamp_millis(0) as ts"),
            key="k",
            function=CountPerKey(emit=False),
            output_schema="k long, n long",
            parallelism=args.parallelism,
            state_backend=backend,
            savepoint=savepoint,
        ).count()
        data = os.path.join(work, "in")
        os.makedirs(data)
        rng = np.random.default_rng(7)
        for i in range(args.loss_batches):
            ks = rng.choice(args.loss_keys, args.hot_changed, replace=False).astype(np.int64)
            path = os.path.join(data, f"part-{i:04d}.parquet")
            pq.write_table(pa.table({"k": ks, "ts": ks.astype("datetime64[ms]")}), path)
            os.utime(path, (1_700_000_000 + 10 * i,) * 2)
        lost: dict[str, Any] = {}

        class LosingSink(FileSink):
            """After delivering batch ``--loss-after``, SIGKILL the node that holds the most
            subtasks' hosts (worker, executor, Python workers, hosts)."""

            query: Any = None
            lost: dict[str, Any]

            def write(self, batch: Any) -> None:
                super().write(batch)
                if batch.batch_id != args.loss_after or self.query is None:
                    return
                held = Counter(w.get("node") for w in self.query.host_locations.values())
                ids = {}
                for node in cluster.alive_nodes:
                    with open(os.path.join(node.run_dir, "node-id")) as f:
                        ids[f.read().strip()] = node
                node_id, subtasks = max(
                    ((i, n) for i, n in held.items() if i in ids), key=lambda it: it[1]
                )
                t = time.perf_counter()
                cluster.kill_node(ids[node_id])
                self.lost.update(node=ids[node_id].name, subtasks=subtasks)
                self.lost["kill_ms"] = (time.perf_counter() - t) * 1e3

        sink = LosingSink(os.path.join(work, "out"))
        sink.lost = lost
        query = keyed_process(
            spark.readStream.schema("k long, ts timestamp")
            .option("maxFilesPerTrigger", 1)
            .parquet(data),
            key="k",
            function=CountPerKey(),
            output_schema="k long, n long",
            checkpoint=os.path.join(work, "ck"),
            parallelism=args.parallelism,
            state_backend=backend,
            initial_state=savepoint,
        ).write_stream(sink, trigger={"availableNow": True})
        sink.query = query
        query.await_termination()
        query.stop()
        batches = query.batches
        shutil.rmtree(work, ignore_errors=True)
        k = args.loss_after
        before = [b["batch_ms"] for b in batches[1 : k + 1]]
        res = {
            "keys": args.loss_keys,
            "lost": lost,
            "median_batch_ms_before": statistics.median(before),
            "batch_after_loss_ms": batches[k + 1]["batch_ms"],
            "batches_later_ms": [b["batch_ms"] for b in batches[k + 2 :]],
            "batch_ms": [b["batch_ms"] for b in batches],
            "restores": [[s["restore"] for s in b["subtasks"]] for b in batches],
            "routes": [[s.get("route") for s in b["subtasks"]] for b in batches],
            "restore_ms": [[s.get("restore_ms") for s in b["subtasks"]] for b in batches],
        }
        out[backend] = res
        print(
            f"  [loss] {backend:<8}{args.loss_keys:,} keys: lost {lost.get('node')} holding "
            f"{lost.get('subtasks')} subtasks; hot batches {res['median_batch_ms_before']:.0f} "
            f"ms, the batch after the loss {res['batch_after_loss_ms']:.0f} ms "
            f"({res['restores'][k + 1]}), later {[round(x) for x in res['batches_later_ms']]}",
            flush=True,
        )
    return out


def _join_runs(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    runs = old["runs"] + new["runs"]
    medians = [r["median_hot_batch_ms"] for r in runs]
    return {
        "median_hot_batch_ms": statistics.median(medians),
        "range_ms": [min(medians), max(medians)],
        "runs": runs,
    }


# ---- output -------------------------------------------------------------------------------------


def plot(results: dict[str, Any], path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fraction, hot = results.get("fraction", {}), results.get("hot", {})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    ax = axes[0]
    labels = list(fraction)
    backends = sorted({b for v in fraction.values() for b in v})
    width = 0.8 / max(1, len(labels))
    for i, label in enumerate(labels):
        xs = [j + i * width for j in range(len(backends))]
        ys = [100 * fraction[label].get(b, {}).get("hot_fraction", 0) for b in backends]
        bars = ax.bar(xs, ys, width, label=label)
        ax.bar_label(bars, labels=[f"{y:.0f}%" for y in ys], fontsize=8)
    ax.axhline(95, color="grey", linestyle="--", linewidth=1)
    ax.set_xticks([j + width * (len(labels) - 1) / 2 for j in range(len(backends))])
    ax.set_xticklabels(backends)
    ax.set_ylim(0, 110)
    ax.set_ylabel("hot subtask-batches after the first (%)")
    ax.set_title(f"{results.get('workers', 3)} local workers, parallelism 4", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax = axes[1]
    for backend, v in hot.items():
        sizes = [s for s in v if s.isdigit()]
        xs = [int(s) for s in sizes]
        ys = [v[s]["median_hot_batch_ms"] for s in sizes]
        lo = [y - v[s]["range_ms"][0] for s, y in zip(sizes, ys, strict=True)]
        hi = [v[s]["range_ms"][1] - y for s, y in zip(sizes, ys, strict=True)]
        ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=backend)
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("keys of state")
    ax.set_ylabel("median micro-batch ms (10k changed keys)")
    ax.set_title("hot state on the cluster", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="fraction,hot")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--backends", default="heap,rocksdb")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=5_000)
    parser.add_argument("--parallelism", type=int, default=4)
    parser.add_argument("--hot-sizes", default="100000,1000000,10000000")
    parser.add_argument("--hot-batches", type=int, default=6)
    parser.add_argument("--hot-changed", type=int, default=10_000)
    parser.add_argument("--hot-repeat", type=int, default=2)
    parser.add_argument("--loss-keys", type=int, default=1_000_000)
    parser.add_argument("--loss-batches", type=int, default=7)
    parser.add_argument("--loss-after", type=int, default=3)
    parser.add_argument(
        "--append", action="store_true", help="hot: add these runs to the stored figures"
    )
    parser.add_argument("--src", default=SRC, help="the streamstate source tree to measure")
    parser.add_argument("--label", default="networked hosts")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "spark_cluster.json"))
    parser.add_argument(
        "--plot", default=os.path.join(HERE, "..", "docs", "img", "spark_cluster.png")
    )
    args = parser.parse_args()
    if args.quick:
        args.hot_sizes = "100000,1000000"
    src = os.path.abspath(args.src)
    if src != SRC and args.only != "fraction":
        parser.error("--src measures question 1 only (--only fraction)")
    sys.path.insert(0, src)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

    local_cluster = _load_local_cluster()
    results: dict[str, Any] = {}
    if os.path.exists(args.out):  # keep the other questions' and labels' figures
        with open(args.out) as f:
            results = json.load(f)
    tmp = tempfile.mkdtemp(prefix="bench-spark-cluster-")
    t0 = time.perf_counter()
    with local_cluster.LocalCluster(
        workers=args.workers, memory="2g", directory=os.path.join(tmp, "cluster")
    ) as cluster:
        spark = cluster.session_builder(
            "streamstate-bench-cluster",
            **{
                "spark.driver.memory": "2g",
                "spark.sql.shuffle.partitions": str(args.parallelism),
                "spark.default.parallelism": str(args.workers),
            },
        ).getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        local_cluster.wait_for_executors(spark, args.workers)
        print(f"cluster of {args.workers} workers up in {time.perf_counter() - t0:.0f} s")
        try:
            if "fraction" in args.only:
                results.setdefault("fraction", {})[args.label] = bench_fraction(spark, args, tmp)
            if "hot" in args.only:
                # per backend and size: a run of other sizes keeps these figures
                hot = results.setdefault("hot", {})
                for backend, sizes in bench_hot(spark, args, tmp).items():
                    old = hot.get(backend, {})
                    if args.append:  # these runs join the stored ones of the same size
                        sizes = {
                            s: _join_runs(old[s], v) if s.isdigit() and s in old else v
                            for s, v in sizes.items()
                        }
                    merged = {**old, **sizes}
                    keys = sorted((s for s in merged if s.isdigit()), key=int)
                    merged = {s: merged[s] for s in keys}
                    merged["largest_over_smallest"] = (
                        merged[keys[-1]]["median_hot_batch_ms"]
                        / merged[keys[0]]["median_hot_batch_ms"]
                    )
                    hot[backend] = merged
            if "loss" in args.only:
                results["loss"] = bench_loss(spark, args, tmp, cluster)
        finally:
            spark.stop()
            shutil.rmtree(tmp, ignore_errors=True)
    import pyspark

    results.update(
        {
            "benchmark": "spark_cluster",
            "workers": args.workers,
            "python": platform.python_version(),
            "pyspark": pyspark.__version__,
            "cpus": os.cpu_count(),
        }
    )
    results.setdefault("commands", {})[
        ",".join(sorted(args.only.split(","))) + f" [{args.label}]"
    ] = "python " + " ".join(sys.argv)
    print()
    for label, v in results.get("fraction", {}).items():
        for backend, f in v.items():
            print(
                f"  hot fraction {label:<12}{backend:<8}{f['hot_fraction']:6.0%} "
                f"(runs {f['hot_fraction_range'][0]:.0%}-{f['hot_fraction_range'][1]:.0%}; "
                "goal >= 95%)"
            )
    for backend, v in results.get("hot", {}).items():
        print(
            f"  hot state {backend:<8} largest / smallest = {v['largest_over_smallest']:.2f}x "
            "(goal <= 1.5): "
            + ", ".join(
                f"{int(s):,} keys {v[s]['median_hot_batch_ms']:.0f} ms" for s in v if s.isdigit()
            )
        )
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"\nwrote {args.out}")
    if plot(results, args.plot):
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
