"""Checkpoint costs: full write and restore, incremental deltas, restore after rescale, and the
hot-path cost of change tracking. Contenders and baselines run in the same process, interleaved;
medians of ``--repeat`` runs and their ratios are printed and written to
``bench/results/checkpoint.json``.

    python bench/checkpoint.py [--sizes 1000000,10000000] [--repeat 3] [--dir /tmp/...]

* full: one subtask (max_parallelism 128) holding N keys of a ``ValueState[int]``; a full
  checkpoint to a local directory (synchronous phase, asynchronous write, commit) and a restore
  into a fresh subtask. Baseline: ``pickle.dump`` of the same ``{key: value}`` dict to a file and
  ``pickle.load`` of it.
* incremental: the same state with change tracking; the base (full) checkpoint, then 1% of the
  keys updated, then the delta checkpoint. Goal: the delta costs at most 5% of the full one's
  bytes and time.
* rescale: 1M keys checkpointed at parallelism 4 (and 2), restored at 2 (and 4), against a
  restore at the same parallelism (total over all new subtasks).
* tracking: ``value()``/``update()`` and ``ListState.add`` per key with change tracking on vs off.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

import numpy as np

from streamstate import (
    HeapStateBackend,
    KeyedProcessFunction,
    ListStateDescriptor,
    ValueStateDescriptor,
)
from streamstate.backends.heap.snapshot_strategy import HeapSnapshotStrategy
from streamstate.checkpoint.coordinator import CheckpointCoordinator
from streamstate.checkpoint.restore import restore_subtask
from streamstate.checkpoint.storage import FileSystemCheckpointStorage
from streamstate.checkpoint.writer import IncrementalPolicy, SubtaskCheckpointer
from streamstate.keygroups import assign_key_groups
from streamstate.namespace import VOID_NAMESPACE
from streamstate.runtime.operator import KeyedProcessOperator
from streamstate.serializers import Int64Serializer

MAX_P = 128
VALUE = ValueStateDescriptor("v", int)


class Noop(KeyedProcessFunction):
    def process_element(self, value: Any, ctx: Any) -> None:
        return None


TABLE_KIND = "copy_on_write"


def _operator(p: int, i: int, incremental: bool) -> KeyedProcessOperator:
    return KeyedProcessOperator(
        Noop(),
        Int64Serializer(),
        operator_name="bench",
        subtask_index=i,
        parallelism=p,
        max_parallelism=MAX_P,
        state_backend=HeapStateBackend(
            table_kind=TABLE_KIND,
            incremental=incremental,
            gc_freeze=TABLE_KIND == "copy_on_write",  # the map's documented GC configuration
        ),
    )


def _populate(ops: list[KeyedProcessOperator], keys: np.ndarray, kgs: np.ndarray) -> None:
    """Fill the subtasks' value state directly through their key-group maps."""
    p = len(ops)
    for op in ops:
        op.keyed_backend.get_partitioned_state(VOID_NAMESPACE, None, VALUE)
    tables = [op.keyed_backend.state_table("v") for op in ops]
    owner = (kgs.astype(np.int64) * p) // MAX_P
    for kg in range(MAX_P):
        sel = keys[kgs == kg]
        table = tables[int(owner[kgs == kg][0])] if len(sel) else None
        if table is None:
            continue
        m = table.map_for_key_group(kg)
        put = m.put
        for k in sel.tolist():
            put(k, VOID_NAMESPACE, k * 3)
    for op in ops:
        if op.keyed_backend.incremental:
            op.keyed_backend.reset_change_tracking()


def _checkpoint(
    storage: FileSystemCheckpointStorage, cps: list[SubtaskCheckpointer], cid: int
) -> dict[str, float]:
    gc.collect()
    t0 = time.perf_counter()
    futures = [c.checkpoint(cid) for c in cps]
    t1 = time.perf_counter()
    handles = [f.result() for f in futures]
    t2 = time.perf_counter()
    coordinator = CheckpointCoordinator(storage)
    cp = coordinator.commit(cid, handles)
    t3 = time.perf_counter()
    coordinator.close()  # retention (background) finishes outside the measured time
    files = [f for h in handles for f in h.keyed if f.checkpoint_id == cid]
    return {
        "sync_s": t1 - t0,
        "async_s": t2 - t1,
        "commit_s": t3 - t2,
        "total_s": t3 - t0,
        "bytes": float(sum(f.size for f in files)),
        "entries": float(sum(f.total_entries for f in files)),
        "checkpoint": cp,  # type: ignore[dict-item]
    }


def _restore(cp: Any, p: int, incremental: bool = False) -> float:
    ops = [_operator(p, i, incremental) for i in range(p)]
    gc.collect()
    t0 = time.perf_counter()
    for op in ops:
        restore_subtask(op, cp)
    elapsed = time.perf_counter() - t0
    n = sum(op.keyed_backend.num_entries() for op in ops)
    for op in ops:
        op.dispose()
    assert n > 0
    return elapsed


def _med(xs: list[float]) -> float:
    return statistics.median(xs)


def bench_full(n: int, repeat: int, root: str) -> dict[str, Any]:
    keys = np.arange(n, dtype=np.int64)
    kgs = assign_key_groups(keys, MAX_P)
    op = _operator(1, 0, False)
    _populate([op], keys, kgs)
    map_name = type(op.keyed_backend.state_table("v").maps[0]).__name__
    storage = FileSystemCheckpointStorage(root, f"full-{n}", retained_checkpoints=1)
    cp_ = SubtaskCheckpointer(storage, op)
    baseline_dict = {k: k * 3 for k in keys.tolist()}
    runs: dict[str, list[float]] = {k: [] for k in ("sync", "async", "total", "restore")}
    runs |= {"pickle_write": [], "pickle_restore": []}
    size = entries = 0.0
    for r in range(repeat):
        res = _checkpoint(storage, [cp_], r + 1)
        runs["sync"].append(res["sync_s"])
        runs["async"].append(res["async_s"])
        runs["total"].append(res["total_s"])
        size, entries = res["bytes"], res["entries"]
        runs["restore"].append(_restore(res["checkpoint"], 1))
        path = os.path.join(root, f"pickle-{n}.bin")
        gc.collect()
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            pickle.dump(baseline_dict, f, protocol=pickle.HIGHEST_PROTOCOL)
            f.flush()
            os.fsync(f.fileno())
        runs["pickle_write"].append(time.perf_counter() - t0)
        gc.collect()
        t0 = time.perf_counter()
        with open(path, "rb") as f:
            pickle.load(f)
        runs["pickle_restore"].append(time.perf_counter() - t0)
    cp_.close()
    op.dispose()
    med = {k: _med(v) for k, v in runs.items()}
    return {
        "keys": n,
        "map": map_name,
        "file_bytes": size,
        "entries": entries,
        "median_s": med,
        "runs_s": runs,
        "write_mb_per_s": size / med["total"] / 1e6,
        "write_entries_per_s": entries / med["total"],
        "restore_entries_per_s": entries / med["restore"],
        "write_ratio_vs_pickle": med["total"] / med["pickle_write"],
        "restore_ratio_vs_pickle": med["restore"] / med["pickle_restore"],
    }


def bench_incremental(n: int, repeat: int, root: str) -> dict[str, Any]:
    keys = np.arange(n, dtype=np.int64)
    kgs = assign_key_groups(keys, MAX_P)
    op = _operator(1, 0, True)
    _populate([op], keys, kgs)
    storage = FileSystemCheckpointStorage(root, f"incr-{n}", retained_checkpoints=2)
    policy = IncrementalPolicy(max_deltas=1_000, max_delta_ratio=1e9)
    cp_ = SubtaskCheckpointer(storage, op, incremental=policy)
    backend = op.keyed_backend
    state = backend.get_partitioned_state(VOID_NAMESPACE, None, VALUE)
    rng = np.random.default_rng(7)
    cid = 0
    fulls: list[dict[str, float]] = []
    deltas: list[dict[str, float]] = []
    for _ in range(repeat):
        cid += 1
        strategy = cp_.strategy
        assert isinstance(strategy, HeapSnapshotStrategy)
        strategy.start_new_chain()  # force a new base: a full checkpoint of the same state
        fulls.append(_checkpoint(storage, [cp_], cid))
        touched = rng.choice(n, size=max(1, n // 100), replace=False).astype(np.int64)
        tkgs = assign_key_groups(touched, MAX_P).tolist()
        for k, kg in zip(touched.tolist(), tkgs, strict=True):
            backend.set_current_key(k, kg)
            state.update(-k)
        cid += 1
        deltas.append(_checkpoint(storage, [cp_], cid))
    cp_.close()
    op.dispose()

    def med(rows: list[dict[str, float]], k: str) -> float:
        return _med([r[k] for r in rows])

    out: dict[str, Any] = {"keys": n, "touched": max(1, n // 100)}
    for name, rows in (("full", fulls), ("delta", deltas)):
        out[name] = {
            k: med(rows, k)
            for k in ("sync_s", "async_s", "commit_s", "total_s", "bytes", "entries")
        }
        out[name]["runs_total_s"] = [r["total_s"] for r in rows]
    out["bytes_ratio"] = out["delta"]["bytes"] / out["full"]["bytes"]
    out["time_ratio"] = out["delta"]["total_s"] / out["full"]["total_s"]
    # against the full checkpoint's write phase only: what a full costs once the synchronous
    # phase is O(buckets) (copy-on-write map) instead of a deep copy (nested maps)
    out["time_ratio_vs_full_write_phase"] = out["delta"]["total_s"] / (
        out["full"]["async_s"] + out["full"]["commit_s"]
    )
    return out


def bench_rescale(n: int, repeat: int, root: str) -> dict[str, Any]:
    keys = np.arange(n, dtype=np.int64)
    kgs = assign_key_groups(keys, MAX_P)
    out: dict[str, Any] = {"keys": n}
    for old, new in ((4, 2), (2, 4)):
        ops = [_operator(old, i, False) for i in range(old)]
        _populate(ops, keys, kgs)
        storage = FileSystemCheckpointStorage(root, f"rescale-{old}", retained_checkpoints=1)
        cps = [SubtaskCheckpointer(storage, op) for op in ops]
        cp = _checkpoint(storage, cps, 1)["checkpoint"]
        for c in cps:
            c.close()
        for op in ops:
            op.dispose()
        same: list[float] = []
        rescaled: list[float] = []
        for _ in range(repeat):
            same.append(_restore(cp, old))
            rescaled.append(_restore(cp, new))
        out[f"{old}->{new}"] = {
            "same_parallelism_s": _med(same),
            "rescaled_s": _med(rescaled),
            "ratio": _med(rescaled) / _med(same),
            "runs_same_s": same,
            "runs_rescaled_s": rescaled,
        }
    return out


def bench_tracking(n: int, repeat: int) -> dict[str, Any]:
    rng = np.random.default_rng(1)
    keys_np = rng.permutation(n).astype(np.int64)
    kgs = assign_key_groups(keys_np, MAX_P).tolist()
    pairs = list(zip(keys_np.tolist(), kgs, strict=True))

    def run(incremental: bool, op: str) -> float:
        backend = _operator(1, 0, incremental).keyed_backend
        set_key = backend.set_current_key
        if op == "value_get_update":
            s = backend.get_partitioned_state(VOID_NAMESPACE, None, ValueStateDescriptor("v", int))

            def body() -> None:
                value, update = s.value, s.update
                for k, kg in pairs:
                    set_key(k, kg)
                    v = value()
                    update(1 if v is None else v + 1)

        else:
            s = backend.get_partitioned_state(VOID_NAMESPACE, None, ListStateDescriptor("l", int))

            def body() -> None:
                add = s.add
                for k, kg in pairs:
                    set_key(k, kg)
                    add(k)

        body()  # first touch creates the entries; the timed run updates them
        gc.collect()
        t0 = time.perf_counter()
        body()
        elapsed = time.perf_counter() - t0
        backend.dispose()
        return elapsed / n * 1e9

    out: dict[str, Any] = {"keys": n}
    for op in ("value_get_update", "list_add"):
        off: list[float] = []
        on: list[float] = []
        for _ in range(repeat):
            off.append(run(False, op))
            on.append(run(True, op))
        out[op] = {
            "untracked_ns": _med(off),
            "tracked_ns": _med(on),
            "ratio": _med(on) / _med(off),
            "runs_untracked_ns": off,
            "runs_tracked_ns": on,
        }
    return out


def _timed_section(name: str, fn: Callable[[], Any]) -> Any:
    t0 = time.perf_counter()
    out = fn()
    print(f"  ({name}: {time.perf_counter() - t0:.0f} s)", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="1000000,10000000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rescale-keys", type=int, default=1_000_000)
    parser.add_argument("--tracking-keys", type=int, default=1_000_000)
    parser.add_argument("--dir", default=None, help="local directory for checkpoints")
    parser.add_argument(
        "--table", default="copy_on_write", choices=["copy_on_write", "nested_maps"]
    )
    parser.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "checkpoint.json")
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    global TABLE_KIND
    TABLE_KIND = args.table
    root = args.dir or tempfile.mkdtemp(prefix="streamstate-bench-")
    results: dict[str, Any] = {
        "benchmark": "checkpoint",
        "command": "python " + " ".join(sys.argv),
        "repeat": args.repeat,
        "table": args.table,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "full": [],
        "incremental": [],
    }
    try:
        for n in sizes:
            print(f"full checkpoint, {n:,} keys", flush=True)
            results["full"].append(
                _timed_section("full", lambda n=n: bench_full(n, args.repeat, root))
            )
            print(f"incremental checkpoint, {n:,} keys", flush=True)
            results["incremental"].append(
                _timed_section("incremental", lambda n=n: bench_incremental(n, args.repeat, root))
            )
        print(f"restore after rescale, {args.rescale_keys:,} keys", flush=True)
        results["rescale"] = bench_rescale(args.rescale_keys, args.repeat, root)
        print(f"change tracking on the hot path, {args.tracking_keys:,} keys", flush=True)
        results["tracking"] = bench_tracking(args.tracking_keys, args.repeat)
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    _print(results)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {args.out}")


def _print(r: dict[str, Any]) -> None:
    print(f"\nmedians of {r['repeat']} runs, heap table {r['table']}")
    print(
        f"{'full checkpoint':<22}{'keys':>12}{'MB':>8}{'sync s':>9}{'async s':>9}{'total s':>9}"
        f"{'MB/s':>8}{'entries/s':>12}{'restore s':>11}{'pickle w/r s':>15}{'ratio w/r':>12}"
    )
    for f in r["full"]:
        m = f["median_s"]
        print(
            f"{'':<22}{f['keys']:>12,}{f['file_bytes'] / 1e6:>8.1f}{m['sync']:>9.2f}"
            f"{m['async']:>9.2f}{m['total']:>9.2f}{f['write_mb_per_s']:>8.1f}"
            f"{f['write_entries_per_s']:>12,.0f}{m['restore']:>11.2f}"
            f"{m['pickle_write']:>7.2f}/{m['pickle_restore']:<7.2f}"
            f"{f['write_ratio_vs_pickle']:>6.1f}/{f['restore_ratio_vs_pickle']:<5.1f}"
        )
    print(
        f"{'incremental (1% keys)':<22}{'keys':>12}{'full MB':>9}{'delta MB':>10}{'bytes %':>9}"
        f"{'full s':>8}{'(write)':>9}{'delta s':>9}{'time %':>8}{'(vs write)':>11}{'goal':>7}"
    )
    for i in r["incremental"]:
        ok = i["bytes_ratio"] <= 0.05 and i["time_ratio"] <= 0.05
        write = i["full"]["async_s"] + i["full"]["commit_s"]
        print(
            f"{'':<22}{i['keys']:>12,}{i['full']['bytes'] / 1e6:>9.1f}"
            f"{i['delta']['bytes'] / 1e6:>10.2f}{i['bytes_ratio'] * 100:>8.2f}%"
            f"{i['full']['total_s']:>8.2f}{write:>9.2f}{i['delta']['total_s']:>9.3f}"
            f"{i['time_ratio'] * 100:>7.2f}%{i['time_ratio_vs_full_write_phase'] * 100:>10.1f}%"
            f"{'met' if ok else 'MISSED':>7}"
        )
    resc = r["rescale"]
    print(
        f"{'restore after rescale':<22}{'keys':>12}{'same p s':>10}{'rescaled s':>12}{'ratio':>8}"
    )
    for case in ("4->2", "2->4"):
        c = resc[case]
        print(
            f"{case:<22}{resc['keys']:>12,}{c['same_parallelism_s']:>10.2f}"
            f"{c['rescaled_s']:>12.2f}{c['ratio']:>7.2f}x"
        )
    t = r["tracking"]
    print(f"{'change tracking':<22}{'keys':>12}{'off ns':>10}{'on ns':>10}{'ratio':>8}")
    for op in ("value_get_update", "list_add"):
        c = t[op]
        print(
            f"{op:<22}{t['keys']:>12,}{c['untracked_ns']:>10.0f}{c['tracked_ns']:>10.0f}"
            f"{c['ratio']:>7.2f}x"
        )


if __name__ == "__main__":
    main()
