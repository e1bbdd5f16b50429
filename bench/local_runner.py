"""Per-record cost of the in-process path: a LocalRunner value-state count vs the floor.

The contender is ``LocalRunner(Count(), key_selector=...).run(events)``: per record, the key
selector, the key group (cached per distinct key), routing to the subtask, the current key, the
function's ``process_element`` generator, ``value()`` and ``update()`` on a value state, and the
output collected, at parallelism 1 and 2. The baseline is the interpreter's floor for any
per-record Python API: a loop that selects the key and calls a generator per record, which reads
and writes a ``dict`` and yields ``(key, count)``; the outputs are collected the same way. A plain
dict loop (no generator) is shown too. Runs are interleaved and repeated; the medians and their
ratios to the floor (and RocksDB's to the heap's) are printed and written to
``bench/results/local_runner.json``. Two more rows compare the key group of every record
computed with ``assign_to_key_group`` (compiled, unless ``STREAMSTATE_PURE_PYTHON``) with its
lookup in a dict of the keys seen (what the pure-Python reference path does).

    python bench/local_runner.py [--events 300000] [--keys 10000] [--repeat 5]
                                 [--backends heap,rocksdb] [--parallelism 1,2] [--reference]

``--reference`` adds each runner on the pure-Python reference path (``STREAMSTATE_PURE_PYTHON``'s
record loop and value state, switched in this process: ``streamstate.runtime.record_path``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

import numpy as np

from streamstate import KeyedProcessFunction, LocalRunner, ValueStateDescriptor
from streamstate.backends.rocksdb.factory import RocksDBStateBackend
from streamstate.keygroups import assign_to_key_group
from streamstate.runtime.record_path import COMPILED_PATH_AVAILABLE, record_path


class Count(KeyedProcessFunction):
    def open(self, runtime_context: Any) -> None:
        self.n = runtime_context.get_state(ValueStateDescriptor("n", int, default=0))

    def process_element(self, value: Any, ctx: Any) -> Any:
        n = self.n.value() + 1
        self.n.update(n)
        yield value["user"], n


def _select(event: dict[str, Any]) -> Any:
    return event["user"]


def dict_loop(events: list[dict[str, Any]]) -> list[Any]:
    counts: dict[Any, int] = {}
    out: list[Any] = []
    for event in events:
        key = _select(event)
        n = counts.get(key, 0) + 1
        counts[key] = n
        out.append((key, n))
    return out


def _floor_count(counts: dict[Any, int], value: dict[str, Any]) -> Any:
    key = value["user"]
    n = counts.get(key, 0) + 1
    counts[key] = n
    yield key, n


def floor_loop(events: list[dict[str, Any]]) -> list[Any]:
    """The floor: per record the key selected and a generator called that reads and writes a
    dict and yields ``(key, count)``, its outputs collected."""
    counts: dict[Any, int] = {}
    out: list[Any] = []
    extend = out.extend
    select = _select
    count = _floor_count
    for event in events:
        select(event)
        extend(count(counts, event))
    return out


def runner_count(
    backend: str,
    events: list[dict[str, Any]],
    tmp: str,
    parallelism: int = 2,
    compiled: bool = True,
) -> list[Any]:
    state_backend: Any = backend
    if backend == "rocksdb":
        state_backend = RocksDBStateBackend(working_dir=tempfile.mkdtemp(dir=tmp))
    with record_path(compiled):
        runner = LocalRunner(
            Count(), key_selector=_select, parallelism=parallelism, state_backend=state_backend
        )
        try:
            return runner.run(events)
        finally:
            runner.close()


def key_groups_computed(events: list[dict[str, Any]]) -> None:
    for event in events:
        assign_to_key_group(_select(event), 128)


def key_groups_cached(events: list[dict[str, Any]]) -> None:
    cache: dict[Any, int] = {}
    for event in events:
        key = _select(event)
        kg = cache.get(key)
        if kg is None:
            kg = cache[key] = assign_to_key_group(key, 128)


def _timed(fn: Callable[[], Any]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of one call."""
    gc.collect()
    c0 = time.process_time()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--backends", default="heap,rocksdb")
    parser.add_argument("--parallelism", default="1,2")
    parser.add_argument(
        "--reference",
        action="store_true",
        help="also run each runner on the pure-Python reference path (same process)",
    )
    parser.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "local_runner.json")
    )
    args = parser.parse_args()

    rng = np.random.default_rng(1)
    events = [{"user": f"user-{k}"} for k in rng.integers(0, args.keys, args.events).tolist()]
    expected = dict_loop(events)
    backends = args.backends.split(",")
    parallelisms = [int(p) for p in args.parallelism.split(",")]
    paths = [True, False] if args.reference and COMPILED_PATH_AVAILABLE else [True]
    runners = {
        f"local_runner[{b},p={p}{'' if c else ',reference'}]": (b, p, c)
        for c in paths
        for b in backends
        for p in parallelisms
    }
    contenders: dict[str, Callable[[str], Any]] = {
        "floor": lambda tmp: floor_loop(events),
        "dict": lambda tmp: dict_loop(events),
        **{
            name: (lambda tmp, b=b, p=p, c=c: runner_count(b, events, tmp, p, c))
            for name, (b, p, c) in runners.items()
        },
        "key_group_per_record": lambda tmp: key_groups_computed(events),
        "key_group_cached": lambda tmp: key_groups_cached(events),
    }
    with tempfile.TemporaryDirectory() as tmp:
        if floor_loop(events) != expected:
            raise SystemExit("the floor's outputs differ from the dict loop's")
        for name, (b, p, c) in runners.items():  # the outputs are the dict loop's, in order
            if runner_count(b, events, tmp, p, c) != expected:
                raise SystemExit(f"{name} outputs differ from the dict loop")
        samples: dict[str, list[float]] = {name: [] for name in contenders}
        cpu_samples: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(args.repeat):
            for name, fn in contenders.items():
                wall, cpu = _timed(lambda fn=fn: fn(tmp))
                samples[name].append(wall)
                cpu_samples[name].append(cpu)
    us = {name: statistics.median(v) / args.events * 1e6 for name, v in samples.items()}
    # CPU time is steadier than wall time on a shared machine (a descheduled process does not
    # count); it includes RocksDB's background threads
    cpu_us = {name: statistics.median(v) / args.events * 1e6 for name, v in cpu_samples.items()}
    results: dict[str, Any] = {
        "benchmark": "local_runner",
        "events": args.events,
        "keys": args.keys,
        "repeat": args.repeat,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "us_per_record": us,
        "runs_s": samples,
        "ratio_vs_floor": {name: us[name] / us["floor"] for name in us},
        "ratio_vs_dict": {name: us[name] / us["dict"] for name in us},
        "cpu_us_per_record": cpu_us,
        "cpu_runs_s": cpu_samples,
        "cpu_ratio_vs_floor": {name: cpu_us[name] / cpu_us["floor"] for name in cpu_us},
        "cpu_ratio_vs_dict": {name: cpu_us[name] / cpu_us["dict"] for name in cpu_us},
        # per invocation of this script, the paired ratio of each run (contender / the floor of
        # the same round) is steadier than a ratio of medians on a shared machine
        "paired_ratio_vs_floor": {
            name: statistics.median(
                c / f for c, f in zip(cpu_samples[name], cpu_samples["floor"], strict=True)
            )
            for name in cpu_samples
        },
        "rocksdb_vs_heap": {
            f"p={p}": cpu_us[f"local_runner[rocksdb,p={p}]"] / cpu_us[f"local_runner[heap,p={p}]"]
            for p in parallelisms
            if "rocksdb" in backends and "heap" in backends
        },
        "compiled": COMPILED_PATH_AVAILABLE,
    }
    print(
        f"{args.events:,} events over {args.keys:,} keys, {args.repeat} interleaved runs, "
        "medians in µs per record (wall, then CPU time of the process)"
    )
    for name in contenders:
        print(
            f"{name:<28}{us[name] * 1000:>8.0f} ns{us[name] / us['floor']:>7.2f}x the floor"
            f"{cpu_us[name] * 1000:>10.0f} ns CPU{cpu_us[name] / cpu_us['floor']:>7.2f}x"
            f"  (paired {results['paired_ratio_vs_floor'][name]:.2f}x)"
        )
    for p, ratio in results["rocksdb_vs_heap"].items():
        print(f"RocksDB / heap at {p}: {ratio:.2f}x (CPU)")
    print(
        "path:",
        "compiled" if COMPILED_PATH_AVAILABLE else "pure Python (STREAMSTATE_PURE_PYTHON=1)",
    )
    print(
        "a key group computed per record costs "
        f"{us['key_group_per_record'] / us['key_group_cached']:.2f}x its lookup in a cache per "
        "key (the compiled record loop computes it; the reference looks it up)"
    )
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
