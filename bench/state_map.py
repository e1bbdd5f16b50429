"""What does the copy-on-write state map cost, and what does it buy? (SPEC §5.2)

Every figure is measured side by side with its baseline in the same process, interleaved and
repeated; the tables show medians and ratios.

1. ops       per-operation cost of get / put / update on 1M entries over 128 key-group maps:
             CopyOnWriteStateMap vs NestedStateMap vs a dict keyed by (key, namespace)
2. snapshot  synchronous stall of a snapshot of all maps vs pickling the same data
3. growth    worst single-operation latency while growing from 0 to 10M entries vs dict
4. writer    processing throughput while another thread writes a 1M-entry snapshot
5. memory    bytes per entry vs nested maps (tracemalloc, and RSS in fresh processes)

Usage: ``python bench/state_map.py [--quick] [--only ops,snapshot,...]``; writes
``bench/results/state_map.json``. ``--quick`` uses 2M instead of 10M entries for growth and skips
the 10M snapshot.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import platform
import random
import statistics
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from streamstate.backends.heap.copy_on_write import (
    CopyOnWriteStateMap,
    install_gc_policy,
    uninstall_gc_policy,
)
from streamstate.backends.heap.nested_maps import NestedStateMap
from streamstate.namespace import VOID_NAMESPACE
from streamstate.serializers import Int64Serializer, ListSerializer

GROUPS = 128
KEY_BASE = 1 << 40  # keys are real int objects (not the small-int cache), as in a job
NS = VOID_NAMESPACE
INT = Int64Serializer()
LIST = ListSerializer(Int64Serializer())


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def key_of(i: int) -> int:
    return KEY_BASE + i


class DictMaps:
    """128 plain dicts keyed by ``(key, namespace)``: the floor for a Python mapping."""

    def __init__(self) -> None:
        self.maps: list[dict[tuple[Any, Any], Any]] = [{} for _ in range(GROUPS)]


def build_maps(kind: str, n: int, state: Callable[[int], Any], ser: Any) -> Any:
    if kind == "dict":
        d = DictMaps()
        for i in range(n):
            k = key_of(i)
            d.maps[i % GROUPS][(k, NS)] = state(i)
        return d
    cls = CopyOnWriteStateMap if kind == "cow" else NestedStateMap
    maps = [cls(ser) for _ in range(GROUPS)]
    for i in range(n):
        maps[i % GROUPS].put(key_of(i), NS, state(i))
    return maps


# -- 1. per-operation cost -------------------------------------------------------------------------


def time_ops(kind: str, maps: Any, sample: list[int], op: str) -> float:
    """ns per operation over ``sample`` (indices of existing entries), loop included."""
    ks = [key_of(i) for i in sample]
    gs = [i % GROUPS for i in sample]
    ns = NS
    if kind == "dict":
        ds = maps.maps
        t = time.perf_counter()
        if op == "get":
            for k, g in zip(ks, gs, strict=True):
                ds[g].get((k, ns))
        elif op == "put":
            for k, g in zip(ks, gs, strict=True):
                ds[g][(k, ns)] = k
        else:
            for k, g in zip(ks, gs, strict=True):
                d = ds[g]
                d[(k, ns)] = d.get((k, ns)) + 1
        return (time.perf_counter() - t) / len(ks) * 1e9
    t = time.perf_counter()
    if op == "get":
        for k, g in zip(ks, gs, strict=True):
            maps[g].get(k, ns)
    elif op == "put":
        for k, g in zip(ks, gs, strict=True):
            maps[g].put(k, ns, k)
    else:
        for k, g in zip(ks, gs, strict=True):
            m = maps[g]
            m.put(k, ns, m.get(k, ns) + 1)
    return (time.perf_counter() - t) / len(ks) * 1e9


def loop_overhead(sample: list[int]) -> float:
    ks = [key_of(i) for i in sample]
    gs = [i % GROUPS for i in sample]
    lst = [None] * GROUPS
    t = time.perf_counter()
    for _k, g in zip(ks, gs, strict=True):
        lst[g]
    return (time.perf_counter() - t) / len(ks) * 1e9


def bench_ops(quick: bool) -> dict[str, Any]:
    n = 1_000_000
    reps = 5 if quick else 9
    kinds = ["cow", "nested", "dict"]
    built = {kind: build_maps(kind, n, key_of, INT) for kind in kinds}
    gc.freeze()  # the cost of collections is measured in `growth`, not here
    rng = random.Random(42)
    sample = [rng.randrange(n) for _ in range(200_000)]
    hot = [rng.randrange(3000) for _ in range(200_000)]  # a working set that stays in cache
    results: dict[str, dict[str, list[float]]] = {}
    for rep in range(reps):
        order = kinds[rep % 3 :] + kinds[: rep % 3]
        for workload, idx in (("1M random", sample), ("hot 3k keys", hot)):
            for op in ("get", "put", "update"):
                for kind in order:
                    results.setdefault(f"{workload} {op}", {}).setdefault(kind, []).append(
                        time_ops(kind, built[kind], idx, op)
                    )
        results.setdefault("loop", {}).setdefault("overhead", []).append(loop_overhead(sample))
    out: dict[str, Any] = {"entries": n, "maps": GROUPS, "reps": reps, "rows": {}}
    for name, per_kind in results.items():
        meds = {kind: median(v) for kind, v in per_kind.items()}
        row: dict[str, Any] = {"ns_per_op": meds}
        if "cow" in meds:
            row["cow_vs_nested"] = meds["cow"] / meds["nested"]
            row["cow_vs_dict"] = meds["cow"] / meds["dict"]
        out["rows"][name] = row
    del built
    gc.unfreeze()
    gc.collect()
    return out


# -- 2. snapshot stall -----------------------------------------------------------------------------


def bench_snapshot(quick: bool) -> dict[str, Any]:
    """The synchronous phase: one snapshot per key-group map, vs synchronous alternatives.

    Baselines: pickling the entries as ``(key, namespace, state)`` tuples (what writing the
    same data synchronously costs), pickling the nested maps' dicts (a tighter encoding), and,
    at 1M, the nested-maps deep copy. For reference: the literal §5.2 eager bucket array copy
    (``primary[:]`` per map), and the deferred copy it became, paid by the first insert into
    each map after the snapshot.
    """
    sizes = [1_000_000] if quick else [1_000_000, 10_000_000]
    out: dict[str, Any] = {}
    for n in sizes:
        cow = build_maps("cow", n, key_of, INT)
        nested = build_maps("nested", n, key_of, INT)
        entries = [(k, ns, s) for m in nested for k, ns, s in m]
        gc.freeze()
        rows: dict[str, list[float]] = {}
        reps = 7 if n <= 1_000_000 else 3
        extra = 1 << 50
        for rep in range(reps):
            t = time.perf_counter()
            snaps = [m.snapshot() for m in cow]
            rows.setdefault("cow_snapshot_ms", []).append((time.perf_counter() - t) * 1e3)
            # the deferred array copy: the first bucket write into each map pays it
            t = time.perf_counter()
            for g, m in enumerate(cow):
                m.put(extra + rep * GROUPS + g, NS, 0)
            rows.setdefault("first_inserts_after_ms", []).append((time.perf_counter() - t) * 1e3)
            for sn in snaps:
                sn.release()
            del snaps
            t = time.perf_counter()
            for g, m in enumerate(cow):
                m.remove(extra + rep * GROUPS + g, NS)
            rows.setdefault("same_ops_no_snapshot_ms", []).append((time.perf_counter() - t) * 1e3)
            t = time.perf_counter()
            arrays = [m._primary[:] for m in cow]
            rows.setdefault("eager_array_copy_ms", []).append((time.perf_counter() - t) * 1e3)
            del arrays
            if rep < 3:
                t = time.perf_counter()
                blob = pickle.dumps(entries, protocol=pickle.HIGHEST_PROTOCOL)
                rows.setdefault("pickle_entries_ms", []).append((time.perf_counter() - t) * 1e3)
                t = time.perf_counter()
                blob = pickle.dumps([m._maps for m in nested], protocol=pickle.HIGHEST_PROTOCOL)
                rows.setdefault("pickle_nested_ms", []).append((time.perf_counter() - t) * 1e3)
                del blob
            if n <= 1_000_000:
                t = time.perf_counter()
                nsnaps = [m.snapshot() for m in nested]
                rows.setdefault("nested_snapshot_ms", []).append((time.perf_counter() - t) * 1e3)
                del nsnaps
        row: dict[str, Any] = {"entries": n, "buckets": sum(m.capacity for m in cow)}
        row.update({k: median(v) for k, v in rows.items()})
        cow_ms = row["cow_snapshot_ms"]
        row["cow_snapshot_ms_per_million"] = cow_ms / (n / 1e6)
        row["pickle_entries_over_cow"] = row["pickle_entries_ms"] / cow_ms
        row["pickle_nested_over_cow"] = row["pickle_nested_ms"] / cow_ms
        row["eager_array_copy_ms_per_million"] = row["eager_array_copy_ms"] / (n / 1e6)
        out[f"{n // 1_000_000}M"] = row
        print(f"  snapshot {n:,}: {row}", flush=True)
        del cow, nested, entries
        gc.unfreeze()
        gc.collect()
    return out


# -- 3. growth latency -----------------------------------------------------------------------------


def grow(kind: str, n: int, groups: int) -> dict[str, Any]:
    """Insert ``n`` keys, timing every single operation in wall-clock and in thread CPU time.

    The machine is shared: wall-clock latency includes preemption by other processes, which
    thread CPU time excludes; both are reported.
    """
    if kind == "dict":
        ds: list[dict[int, int]] = [{} for _ in range(groups)]
        sets = [d.__setitem__ for d in ds]

        def op(k: int, g: int) -> None:
            sets[g](k, k)
    else:
        maps = [CopyOnWriteStateMap(INT) for _ in range(groups)]
        puts = [m.put for m in maps]
        ns = NS

        def op(k: int, g: int) -> None:
            puts[g](k, ns, k)

    pc = time.perf_counter_ns
    tt = time.thread_time_ns
    worst = worst_cpu = 0
    worst_at = worst_cpu_at = 0
    slow: list[tuple[int, int]] = []  # (wall ns, size) of operations over 1 ms
    slow_cpu = 0
    t_start = pc()
    for i in range(n):
        k = KEY_BASE + i
        g = i % groups
        c0 = tt()
        t0 = pc()
        op(k, g)
        dt = pc() - t0
        dc = tt() - c0
        if dt > worst:
            worst = dt
            worst_at = i
        if dc > worst_cpu:
            worst_cpu = dc
            worst_cpu_at = i
        if dt > 1_000_000:
            slow.append((dt, i))
        if dc > 1_000_000:
            slow_cpu += 1
    total = pc() - t_start
    slow.sort(reverse=True)
    return {
        "worst_op_ms": worst / 1e6,
        "worst_op_at_size": worst_at,
        "worst_op_cpu_ms": worst_cpu / 1e6,
        "worst_op_cpu_at_size": worst_cpu_at,
        "ops_over_1ms": len(slow),
        "ops_over_1ms_cpu": slow_cpu,
        "top5_ms_at_size": [(round(d / 1e6, 2), at) for d, at in slow[:5]],
        "mean_ns_per_insert_with_timers": total / n,
    }


def bench_growth(quick: bool) -> dict[str, Any]:
    n = 2_000_000 if quick else 10_000_000
    out: dict[str, Any] = {"entries": n}
    # every run in a fresh process: one run's garbage and heap layout must not feed the next
    runs = [
        ("dict, 1 map", "dict", 1, "policy"),
        ("cow, 1 map, GC policy", "cow", 1, "policy"),
        ("dict, 128 maps", "dict", GROUPS, "policy"),
        ("cow, 128 maps, GC policy", "cow", GROUPS, "policy"),
        ("cow, 1 map, default GC", "cow", 1, "default"),
    ]
    for label, kind, groups, gc_mode in runs:
        out[label] = run_child(["growth", kind, str(n), str(groups), gc_mode])
        print(f"  growth {label}: {out[label]}", flush=True)
    d1, c1 = out["dict, 1 map"], out["cow, 1 map, GC policy"]
    d128, c128 = out["dict, 128 maps"], out["cow, 128 maps, GC policy"]
    out["ratio_worst_op_1_map"] = c1["worst_op_ms"] / d1["worst_op_ms"]
    out["ratio_worst_op_128_maps_vs_dict_1_map"] = c128["worst_op_ms"] / d1["worst_op_ms"]
    out["ratio_worst_op_128_maps_vs_dict_128_maps"] = c128["worst_op_ms"] / d128["worst_op_ms"]
    out["ratio_worst_op_cpu_1_map"] = c1["worst_op_cpu_ms"] / d1["worst_op_cpu_ms"]
    out["ratio_worst_op_cpu_128_maps_vs_dict_1_map"] = (
        c128["worst_op_cpu_ms"] / d1["worst_op_cpu_ms"]
    )
    return out


# -- 4. throughput while a snapshot is written -----------------------------------------------------


#: entries the cooperative writer encodes between two yields of the GIL (about 0.5 ms of work)
WRITER_CHUNK = 512


def write_snapshot(snaps: list[Any], cooperative: bool, done: dict[str, float]) -> None:
    """The asynchronous phase: encode each key group's entries, release it, next."""
    t = time.perf_counter()
    encode = msgspec.msgpack.Encoder().encode
    written = 0
    for snap in snaps:
        if cooperative:
            for chunk in snap.chunks(WRITER_CHUNK):
                written += len(encode(chunk))
                time.sleep(0.0005)  # the processing thread gets a whole switch interval
        else:
            written += len(encode(list(snap)))
        snap.release()
    done["seconds"] = time.perf_counter() - t
    done["bytes"] = written


def process(maps: list[Any], n: int, rng: random.Random, stop: Callable[[], bool]) -> int:
    """Processing: update (get, then put a new value) random existing keys until ``stop()``."""
    ops = 0
    ns = NS
    while not stop():
        for _ in range(1000):
            i = rng.randrange(n)
            m = maps[i % GROUPS]
            k = KEY_BASE + i
            s = m.get(k, ns)
            if type(s) is list:
                s.append(1)
                m.put(k, ns, s)
            else:
                m.put(k, ns, s + 1)
        ops += 1000
    return ops


def bench_writer(quick: bool) -> dict[str, Any]:
    n = 1_000_000
    reps = 3 if quick else 5
    out: dict[str, Any] = {
        "entries": n,
        "switch_interval_s": sys.getswitchinterval(),
        "writer_chunk": WRITER_CHUNK,
    }
    for states, ser, make in (("int", INT, key_of), ("list", LIST, lambda i: [i])):
        maps = build_maps("cow", n, make, ser)
        gc.freeze()
        rng = random.Random(1)
        rows: dict[str, list[float]] = {}
        for _rep in range(reps):
            for mode in ("cooperative", "naive"):
                snaps = [m.snapshot() for m in maps]
                done: dict[str, float] = {}
                writer = threading.Thread(
                    target=write_snapshot, args=(snaps, mode == "cooperative", done)
                )
                t = time.perf_counter()
                writer.start()
                ops = process(maps, n, rng, lambda w=writer: not w.is_alive())  # type: ignore[misc]
                elapsed = time.perf_counter() - t
                writer.join()
                # the baseline: the same processing for the same wall time, no snapshot
                t0 = time.perf_counter()
                deadline = t0 + elapsed
                base_ops = process(maps, n, rng, lambda d=deadline: time.perf_counter() >= d)  # type: ignore[misc]
                base_elapsed = time.perf_counter() - t0
                ratio = (ops / elapsed) / (base_ops / base_elapsed)
                rows.setdefault(f"{mode} ratio", []).append(ratio)
                rows.setdefault(f"{mode} writer_s", []).append(done["seconds"])
                rows.setdefault(f"{mode} ops_per_s", []).append(ops / elapsed)
                rows.setdefault(f"{mode} baseline_ops_per_s", []).append(base_ops / base_elapsed)
        out[f"{states} states"] = {k: median(v) for k, v in rows.items()}
        print(f"  writer {states}: {out[f'{states} states']}", flush=True)
        del maps
        gc.unfreeze()
        gc.collect()
    return out


# -- 5. memory -------------------------------------------------------------------------------------


def bench_memory(quick: bool) -> dict[str, Any]:
    n = 1_000_000
    out: dict[str, Any] = {"entries": n, "maps": GROUPS}
    for states in ("int", "list"):
        row: dict[str, Any] = {}
        for kind in ("data", "cow", "nested"):
            row[f"{kind}_tracemalloc_B"] = run_child(["memory", kind, str(n), states, "trace"])
            row[f"{kind}_rss_B"] = run_child(["memory", kind, str(n), states, "rss"])
        for how in ("tracemalloc", "rss"):
            data, cow, nested = (row[f"{k}_{how}_B"] for k in ("data", "cow", "nested"))
            row[f"{how}_ratio_total"] = cow / nested
            row[f"{how}_ratio_structure_only"] = (cow - data) / (nested - data)
        out[f"{states} states"] = row
        print(f"  memory {states}: {row}", flush=True)
    return out


def memory_child(kind: str, n: int, states: str, how: str) -> float:
    """Bytes per entry of building ``kind`` with ``n`` entries (keys and states included)."""
    make: Callable[[int], Any] = key_of if states == "int" else (lambda i: [key_of(i)])
    ser = INT if states == "int" else LIST
    gc.collect()
    if how == "trace":
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
    else:
        before = rss_bytes()
    if kind == "data":  # the keys and states alone, held by two exactly sized lists
        keys: list[Any] = [None] * n
        values: list[Any] = [None] * n
        overhead = 2 * (8 * n + 56)
        for i in range(n):
            keys[i] = key_of(i)
            values[i] = make(i)
        keep: Any = (keys, values)
    else:
        keep = build_maps(kind, n, make, ser)
        overhead = 0
    after = tracemalloc.get_traced_memory()[0] if how == "trace" else rss_bytes()
    del keep
    return (after - before - overhead) / n


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_child(args: list[str]) -> Any:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", *args]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def child(args: list[str]) -> None:
    what = args[0]
    if what == "growth":
        kind, n, groups, gc_mode = args[1], int(args[2]), int(args[3]), args[4]
        if gc_mode == "policy":
            install_gc_policy()
        print(json.dumps(grow(kind, n, groups)))
    elif what == "memory":
        print(json.dumps(memory_child(args[1], int(args[2]), args[3], args[4])))
    else:
        raise SystemExit(f"unknown child {what}")


# -- report ----------------------------------------------------------------------------------------


def report(results: dict[str, Any]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover
        print(json.dumps(results, indent=2))
        return
    console = Console()
    if "ops" in results:
        t = Table(title="ns per operation (median; loop included)")
        for col in ("workload", "cow", "nested", "dict", "cow/nested", "cow/dict"):
            t.add_column(col, justify="right")
        for name, row in results["ops"]["rows"].items():
            if "cow" not in row["ns_per_op"]:
                continue
            m = row["ns_per_op"]
            t.add_row(
                name,
                f"{m['cow']:.0f}",
                f"{m['nested']:.0f}",
                f"{m['dict']:.0f}",
                f"{row['cow_vs_nested']:.2f}",
                f"{row['cow_vs_dict']:.2f}",
            )
        console.print(t)
    if "snapshot" in results:
        t = Table(title="synchronous snapshot stall (ms, medians)")
        cols = ("entries", "cow", "cow/M", "pickle entries", "ratio", "pickle dicts", "ratio")
        for col in (*cols, "eager copy", "deferred copy"):
            t.add_column(col, justify="right")
        for name, row in results["snapshot"].items():
            t.add_row(
                name,
                f"{row['cow_snapshot_ms']:.2f}",
                f"{row['cow_snapshot_ms_per_million']:.2f}",
                f"{row['pickle_entries_ms']:.0f}",
                f"{row['pickle_entries_over_cow']:.0f}x",
                f"{row['pickle_nested_ms']:.0f}",
                f"{row['pickle_nested_over_cow']:.0f}x",
                f"{row['eager_array_copy_ms']:.1f}",
                f"{row['first_inserts_after_ms'] - row['same_ops_no_snapshot_ms']:.1f}",
            )
        console.print(t)
    if "growth" in results:
        t = Table(title=f"growth to {results['growth']['entries']:,} entries: worst single insert")
        cols = ("run", "wall ms", "at size", "> 1 ms", "CPU ms", "at size", "> 1 ms CPU")
        for col in (*cols, "ns/insert"):
            t.add_column(col, justify="right")
        for name, row in results["growth"].items():
            if isinstance(row, dict):
                t.add_row(
                    name,
                    f"{row['worst_op_ms']:.2f}",
                    f"{row['worst_op_at_size']:,}",
                    str(row["ops_over_1ms"]),
                    f"{row['worst_op_cpu_ms']:.2f}",
                    f"{row['worst_op_cpu_at_size']:,}",
                    str(row["ops_over_1ms_cpu"]),
                    f"{row['mean_ns_per_insert_with_timers']:.0f}",
                )
        console.print(t)
    if "writer" in results:
        t = Table(title="processing throughput while a 1M-entry snapshot is written")
        for col in ("states", "writer", "ratio", "writer s", "ops/s", "baseline ops/s"):
            t.add_column(col, justify="right")
        for states in ("int states", "list states"):
            row = results["writer"].get(states)
            if not row:
                continue
            for mode in ("cooperative", "naive"):
                t.add_row(
                    states,
                    mode,
                    f"{row[f'{mode} ratio']:.2f}",
                    f"{row[f'{mode} writer_s']:.2f}",
                    f"{row[f'{mode} ops_per_s']:.0f}",
                    f"{row[f'{mode} baseline_ops_per_s']:.0f}",
                )
        console.print(t)
    if "memory" in results:
        t = Table(title="bytes per entry (keys and states included)")
        for col in (
            "states",
            "how",
            "keys+states",
            "cow",
            "nested",
            "cow/nested",
            "structure only",
        ):
            t.add_column(col, justify="right")
        for states in ("int states", "list states"):
            row = results["memory"][states]
            for how, key in (("tracemalloc", "tracemalloc"), ("RSS", "rss")):
                t.add_row(
                    states,
                    how,
                    f"{row[f'data_{key}_B']:.0f}",
                    f"{row[f'cow_{key}_B']:.0f}",
                    f"{row[f'nested_{key}_B']:.0f}",
                    f"{row[f'{key}_ratio_total']:.2f}",
                    f"{row[f'{key}_ratio_structure_only']:.2f}",
                )
        console.print(t)


def markdown(results: dict[str, Any]) -> str:
    """The result tables as Markdown, for docs/benchmarks.md."""
    lines: list[str] = []

    def table(header: list[str], rows: list[list[str]]) -> None:
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "|".join("---:" if i else "---" for i in range(len(header))) + "|")
        lines.extend("| " + " | ".join(r) + " |" for r in rows)
        lines.append("")

    if "ops" in results:
        ops = results["ops"]
        lines.append(
            f"Per operation, {ops['entries']:,} entries over {ops['maps']} key-group maps, int "
            f"states, median of {ops['reps']} interleaved runs of 200,000 operations (ns, loop "
            f"included: {ops['rows']['loop']['ns_per_op']['overhead']:.0f} ns of it):"
        )
        lines.append("")
        rows = []
        for name, row in ops["rows"].items():
            m = row["ns_per_op"]
            if "cow" in m:
                rows.append(
                    [
                        name,
                        f"{m['cow']:.0f}",
                        f"{m['nested']:.0f}",
                        f"{m['dict']:.0f}",
                        f"**{row['cow_vs_nested']:.2f}x**",
                        f"{row['cow_vs_dict']:.2f}x",
                    ]
                )
        table(
            [
                "workload",
                "copy-on-write",
                "nested maps",
                "dict[(k, ns)]",
                "cow / nested",
                "cow / dict",
            ],
            rows,
        )
    if "snapshot" in results:
        rows = []
        for name, r in results["snapshot"].items():
            rows.append(
                [
                    name,
                    f"{r['cow_snapshot_ms']:.2f}",
                    f"**{r['cow_snapshot_ms_per_million']:.3f}**",
                    f"{r['pickle_entries_ms']:,.0f}",
                    f"**{r['pickle_entries_over_cow']:,.0f}x**",
                    f"{r['pickle_nested_ms']:,.0f}",
                    f"{r['pickle_nested_over_cow']:,.0f}x",
                    f"{r['nested_snapshot_ms']:,.0f}" if "nested_snapshot_ms" in r else "-",
                    f"{r['eager_array_copy_ms']:,.1f}",
                    f"{r['first_inserts_after_ms'] - r['same_ops_no_snapshot_ms']:,.1f}",
                ]
            )
        table(
            [
                "entries",
                "snapshot ms",
                "ms per M",
                "pickle entries ms",
                "ratio",
                "pickle dicts ms",
                "ratio",
                "nested deep copy ms",
                "eager array copy ms",
                "deferred copy ms (128 first writes)",
            ],
            rows,
        )
    if "growth" in results:
        g = results["growth"]
        rows = []
        for name, r in g.items():
            if isinstance(r, dict):
                rows.append(
                    [
                        name,
                        f"{r['worst_op_ms']:.2f}",
                        f"{r['worst_op_at_size']:,}",
                        str(r["ops_over_1ms"]),
                        f"{r['worst_op_cpu_ms']:.2f}",
                        f"{r['worst_op_cpu_at_size']:,}",
                        str(r["ops_over_1ms_cpu"]),
                        f"{r['mean_ns_per_insert_with_timers']:,.0f}",
                    ]
                )
        table(
            [
                "run",
                "worst wall ms",
                "at size",
                "ops > 1 ms wall",
                "worst CPU ms",
                "at size",
                "ops > 1 ms CPU",
                "ns per insert (timers included)",
            ],
            rows,
        )
    if "writer" in results:
        w = results["writer"]
        rows = []
        for states in ("int states", "list states"):
            r = w.get(states)
            for mode in ("cooperative", "naive") if r else ():
                rows.append(
                    [
                        states,
                        mode,
                        f"**{r[f'{mode} ratio']:.2f}**",
                        f"{r[f'{mode} ops_per_s']:,.0f}",
                        f"{r[f'{mode} baseline_ops_per_s']:,.0f}",
                        f"{r[f'{mode} writer_s']:.1f}",
                    ]
                )
        table(
            [
                "states",
                "writer",
                "throughput ratio",
                "ops/s while writing",
                "ops/s without snapshot",
                "writer seconds",
            ],
            rows,
        )
    if "memory" in results:
        rows = []
        for states in ("int states", "list states"):
            r = results["memory"][states]
            for how, key in (("tracemalloc", "tracemalloc"), ("RSS", "rss")):
                rows.append(
                    [
                        states,
                        how,
                        f"{r[f'data_{key}_B']:.0f}",
                        f"{r[f'cow_{key}_B']:.0f}",
                        f"{r[f'nested_{key}_B']:.0f}",
                        f"**{r[f'{key}_ratio_total']:.2f}x**",
                        f"{r[f'{key}_ratio_structure_only']:.2f}x",
                    ]
                )
        table(
            [
                "states",
                "measured by",
                "keys + states alone",
                "copy-on-write",
                "nested maps",
                "cow / nested",
                "structure only",
            ],
            rows,
        )
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2M growth, no 10M snapshot")
    parser.add_argument("--only", default="ops,snapshot,growth,writer,memory")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "state_map.json"))
    parser.add_argument(
        "--markdown", action="store_true", help="print the tables of --out as Markdown, run nothing"
    )
    args = parser.parse_args()
    if args.markdown:
        print(markdown(json.loads(Path(args.out).read_text())))
        return
    sections = args.only.split(",")
    benches = {
        "ops": bench_ops,
        "snapshot": bench_snapshot,
        "growth": bench_growth,
        "writer": bench_writer,
        "memory": bench_memory,
    }
    install_gc_policy()  # the module's documented configuration, for every contender alike
    results: dict[str, Any] = {
        "command": " ".join(["python", "bench/state_map.py", *sys.argv[1:]]),
        "python": sys.version.split()[0],
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
    }
    for name in sections:
        print(f"[{name}]", flush=True)
        t = time.perf_counter()
        results[name] = benches[name](args.quick)
        print(f"[{name}] {time.perf_counter() - t:.0f} s", flush=True)
    uninstall_gc_policy()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():  # keep sections not rerun this time
        try:
            previous = json.loads(out.read_text())
            results = {**previous, **results}
        except ValueError:
            pass
    out.write_text(json.dumps(results, indent=2) + "\n")
    report(results)


if __name__ == "__main__":
    main()
