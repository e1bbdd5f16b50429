"""Per-operation cost of keyed state through the heap backend vs a plain dict (same run).

For N keys (default 1M) and each operation, the contender does the work through the backend
(``set_current_key`` with the key group precomputed, as the Spark runtime does, then the state
call) and the baseline does the same logical work on a plain ``dict`` keyed by the key. Runs are
interleaved and repeated; the medians and their ratio are printed and written to
``bench/results/state_access.json``.

    python bench/state_access.py [--keys 1000000] [--repeat 3]
                                 [--tables copy_on_write+gc_policy,copy_on_write,nested_maps]

``copy_on_write+gc_policy`` runs the copy-on-write table with the GC policy that
``HeapStateBackend(gc_freeze=True)`` installs (the Spark runtime's default for this table);
plain ``copy_on_write`` leaves CPython's collector as it is, whose full collections walk every
entry object (first touches of 1M keys trigger several).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

import numpy as np

from streamstate import (
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from streamstate.backends.heap.backend import HeapKeyedStateBackend
from streamstate.backends.heap.copy_on_write import install_gc_policy, uninstall_gc_policy
from streamstate.keygroups import KeyGroupRange, assign_key_groups
from streamstate.namespace import VOID_NAMESPACE
from streamstate.serializers import Int64Serializer

MAX_P = 128


def _timed(fn: Callable[[], None], gc_policy: bool = False) -> float:
    gc.collect()
    if gc_policy:
        install_gc_policy()
    try:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    finally:
        if gc_policy:
            uninstall_gc_policy()
            gc.unfreeze()


def contender(table: str, op: str, keys: list[int], kgs: list[int]) -> Callable[[], None]:
    table_kind = table.removesuffix("+gc_policy")
    backend = HeapKeyedStateBackend(
        Int64Serializer(),
        MAX_P,
        KeyGroupRange(0, MAX_P - 1),
        table_kind=table_kind,  # type: ignore[arg-type]
    )
    set_key = backend.set_current_key
    pairs = list(zip(keys, kgs, strict=True))
    if op == "value_get_update":
        s = backend.get_partitioned_state(VOID_NAMESPACE, None, ValueStateDescriptor("v", int))

        def run() -> None:
            value, update = s.value, s.update
            for k, kg in pairs:
                set_key(k, kg)
                v = value()
                update(1 if v is None else v + 1)

    elif op == "list_add":
        s = backend.get_partitioned_state(VOID_NAMESPACE, None, ListStateDescriptor("l", int))

        def run() -> None:
            add = s.add
            for k, kg in pairs:
                set_key(k, kg)
                add(k)

    elif op == "map_put":
        s = backend.get_partitioned_state(VOID_NAMESPACE, None, MapStateDescriptor("m", int, int))

        def run() -> None:
            put = s.put
            for k, kg in pairs:
                set_key(k, kg)
                put(k & 7, k)

    elif op == "map_get":
        s = backend.get_partitioned_state(VOID_NAMESPACE, None, MapStateDescriptor("m", int, int))
        for k, kg in pairs:
            set_key(k, kg)
            s.put(k & 7, k)

        def run() -> None:
            get = s.get
            for k, kg in pairs:
                set_key(k, kg)
                get(k & 7)

    else:
        raise ValueError(op)
    return run


def baseline(op: str, keys: list[int]) -> Callable[[], None]:
    d: dict[int, Any] = {}
    if op == "value_get_update":

        def run() -> None:
            get = d.get
            for k in keys:
                v = get(k)
                d[k] = 1 if v is None else v + 1

    elif op == "list_add":

        def run() -> None:
            get = d.get
            for k in keys:
                lst = get(k)
                if lst is None:
                    d[k] = [k]
                else:
                    lst.append(k)

    elif op == "map_put":

        def run() -> None:
            get = d.get
            for k in keys:
                m = get(k)
                if m is None:
                    d[k] = {k & 7: k}
                else:
                    m[k & 7] = k

    elif op == "map_get":
        for k in keys:
            d[k] = {k & 7: k}

        def run() -> None:
            get = d.get
            for k in keys:
                m = get(k)
                if m is not None:
                    m.get(k & 7)

    else:
        raise ValueError(op)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tables", default="copy_on_write+gc_policy,copy_on_write,nested_maps")
    parser.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "state_access.json")
    )
    args = parser.parse_args()

    rng = np.random.default_rng(1)
    keys_np = rng.permutation(args.keys).astype(np.int64)
    kgs = assign_key_groups(keys_np, MAX_P).tolist()
    keys = keys_np.tolist()
    ops = ["value_get_update", "list_add", "map_put", "map_get"]
    tables = args.tables.split(",")
    results: dict[str, Any] = {
        "benchmark": "state_access",
        "keys": args.keys,
        "repeat": args.repeat,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "ops": {},
    }
    print(f"{args.keys:,} keys, {args.repeat} interleaved runs, medians in ns per operation")
    print(f"{'operation':<18}{'dict':>10}" + "".join(f"{t:>24}{'ratio':>8}" for t in tables))
    for op in ops:
        samples: dict[str, list[float]] = {"dict": [], **{t: [] for t in tables}}
        for _ in range(args.repeat):
            # fresh structures per run so every run does the same work (first touch of each key)
            samples["dict"].append(_timed(baseline(op, keys)))
            for t in tables:
                run = contender(t, op, keys, kgs)
                samples[t].append(_timed(run, gc_policy=t.endswith("+gc_policy")))
                del run
        med = {name: statistics.median(v) / args.keys * 1e9 for name, v in samples.items()}
        row = {name: {"ns_per_op": med[name], "runs_s": samples[name]} for name in samples}
        for t in tables:
            row[t]["ratio_vs_dict"] = med[t] / med["dict"]
        results["ops"][op] = row
        print(
            f"{op:<18}{med['dict']:>10.0f}"
            + "".join(f"{med[t]:>24.0f}{med[t] / med['dict']:>7.1f}x" for t in tables)
        )
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
