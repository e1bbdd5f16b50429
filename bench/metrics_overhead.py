"""What does state latency tracking cost per operation? (SPEC §8, docs/benchmarks.md)

Two heap keyed backends live in one process: the baseline without tracking and the contender
with latency tracking on at Flink's defaults (sampling interval 100, histogram history 128).
Each state operation runs in timed batches on both, interleaved batch by batch (AB BA AB ...),
so that CPU frequency and cache effects hit both alike; we report medians of the per-operation
times and the ratio contender / baseline. Batches are timed in CPU time of this process
(``time.process_time``), so that other processes on a shared machine do not inflate them.
A second measurement does the same per record through the keyed process operator (a function
doing ``value()`` + ``update()`` per record), which is the overhead a job sees.

Run:  python bench/metrics_overhead.py [--quick]
Writes bench/results/metrics_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from streamstate import (
    AggregateFunction,
    AggregatingStateDescriptor,
    HeapStateBackend,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from streamstate.backends.heap.backend import HeapKeyedStateBackend
from streamstate.keygroups import KeyGroupRange
from streamstate.metrics import MetricGroup
from streamstate.namespace import VOID_NAMESPACE
from streamstate.runtime.operator import KeyedProcessOperator
from streamstate.serializers import StrSerializer

MAX_P = 128
KEYS = [f"user-{i}" for i in range(1000)]


class Sum(AggregateFunction):
    def create_accumulator(self):
        return 0

    def add(self, value, accumulator):
        return accumulator + value

    def get_result(self, accumulator):
        return accumulator

    def merge(self, acc_a, acc_b):
        return acc_a + acc_b


def make_backend(tracking: bool) -> HeapKeyedStateBackend:
    return HeapKeyedStateBackend(
        StrSerializer(),
        MAX_P,
        KeyGroupRange(0, MAX_P - 1),
        latency_tracking=tracking,
        metric_group=MetricGroup("state"),
    )


def prepared(tracking: bool, descriptor: Any, fill: Any) -> tuple[Any, Any]:
    b = make_backend(tracking)
    b.set_current_key(KEYS[0])
    s = b.get_partitioned_state(VOID_NAMESPACE, None, descriptor)
    for k in KEYS:
        b.set_current_key(k)
        fill(s)
    b.set_current_key(KEYS[7])
    return b, s


# name -> (descriptor factory, fill(state), op(state) run in the timed loop)
OPERATIONS: dict[str, tuple[Any, Any, Any]] = {
    "value_state_get": (lambda: ValueStateDescriptor("v", int), lambda s: s.update(1), "value"),
    "value_state_update": (
        lambda: ValueStateDescriptor("v", int),
        lambda s: s.update(1),
        "update",
    ),
    "list_state_get": (lambda: ListStateDescriptor("l", int), lambda s: s.add(1), "get"),
    "list_state_add": (lambda: ListStateDescriptor("l", int), lambda s: s.add(1), "add"),
    "map_state_get": (
        lambda: MapStateDescriptor("m", str, int),
        lambda s: s.put("a", 1),
        "map_get",
    ),
    "map_state_put": (
        lambda: MapStateDescriptor("m", str, int),
        lambda s: s.put("a", 1),
        "map_put",
    ),
    "reducing_state_add": (
        lambda: ReducingStateDescriptor("r", lambda a, b: a + b, int),
        lambda s: s.add(1),
        "add",
    ),
    "aggregating_state_add": (
        lambda: AggregatingStateDescriptor("g", Sum(), int),
        lambda s: s.add(1),
        "add",
    ),
}


CPU = time.process_time


def timed_batch(state: Any, op: str, n: int) -> float:
    """CPU seconds for ``n`` calls of one operation (loop overhead included on both sides)."""
    rng = range(n)
    if op == "value":
        f = state.value
        t0 = CPU()
        for _ in rng:
            f()
    elif op == "get":
        f = state.get
        t0 = CPU()
        for _ in rng:
            f()
    elif op == "update":
        f = state.update
        t0 = CPU()
        for _ in rng:
            f(1)
    elif op == "add":
        f = state.add
        t0 = CPU()
        for _ in rng:
            f(1)
    elif op == "map_get":
        f = state.get
        t0 = CPU()
        for _ in rng:
            f("a")
    elif op == "map_put":
        f = state.put
        t0 = CPU()
        for _ in rng:
            f("a", 1)
    else:
        raise ValueError(op)
    return CPU() - t0


def bench_operations(rounds: int, batch: int) -> list[dict[str, Any]]:
    results = []
    for name, (make_descriptor, fill, op) in OPERATIONS.items():
        _, base = prepared(False, make_descriptor(), fill)
        _, tracked = prepared(True, make_descriptor(), fill)
        base_ns: list[float] = []
        tracked_ns: list[float] = []
        pairs = [(base, base_ns), (tracked, tracked_ns)]
        for r in range(rounds):
            for state, out in pairs if r % 2 == 0 else pairs[::-1]:
                if name == "list_state_add":
                    state.clear()  # keep the list short; outside the timed region
                out.append(timed_batch(state, op, batch) / batch * 1e9)
        b, t = statistics.median(base_ns), statistics.median(tracked_ns)
        results.append(
            {
                "operation": name,
                "baseline_ns": round(b, 1),
                "tracked_ns": round(t, 1),
                "ratio": round(t / b, 4),
                "overhead_pct": round((t / b - 1) * 100, 1),
                "added_ns": round(t - b, 1),
            }
        )
        print(
            f"{name:24s} off {b:8.1f} ns   on {t:8.1f} ns   ratio {t / b:5.3f}  "
            f"(+{(t / b - 1) * 100:5.1f}%, +{t - b:5.1f} ns)"
        )
    return results


class ValueCounter(KeyedProcessFunction):
    """Per record: one value() and one update() of a counter (a typical keyed function)."""

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", int, default=0))

    def process_element(self, value, ctx):
        self.count.update(self.count.value() + 1)
        return None


def bench_records(rounds: int, batch: int) -> dict[str, Any]:
    ops = {}
    for tracking in (False, True):
        op = KeyedProcessOperator(
            ValueCounter(),
            StrSerializer(),
            max_parallelism=MAX_P,
            state_backend=HeapStateBackend(latency_tracking=tracking),
        )
        op.open()
        ops[tracking] = op
    records = [KEYS[i % len(KEYS)] for i in range(batch)]
    times: dict[bool, list[float]] = {False: [], True: []}
    for r in range(rounds):
        for tracking in (False, True) if r % 2 == 0 else (True, False):
            process = ops[tracking].process_element
            t0 = CPU()
            for key in records:
                process(key, key)
            times[tracking].append((CPU() - t0) / batch * 1e9)
    b, t = statistics.median(times[False]), statistics.median(times[True])
    print(
        f"{'per record (get+update)':24s} off {b:8.1f} ns   on {t:8.1f} ns   ratio {t / b:5.3f}  "
        f"(+{(t / b - 1) * 100:5.1f}%)"
    )
    return {
        "workload": "KeyedProcessOperator.process_element, value() + update() per record, "
        f"{len(KEYS)} keys",
        "baseline_ns": round(b, 1),
        "tracked_ns": round(t, 1),
        "ratio": round(t / b, 4),
        "overhead_pct": round((t / b - 1) * 100, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (smoke run)")
    parser.add_argument(
        "--out", default=str(Path(__file__).resolve().parent / "results" / "metrics_overhead.json")
    )
    args = parser.parse_args()
    rounds, batch = (6, 10_000) if args.quick else (200, 10_000)
    b = make_backend(False)
    b.set_current_key(KEYS[0])
    state = b.get_partitioned_state(VOID_NAMESPACE, None, ValueStateDescriptor("v", int))
    map_class = type(state.table.maps[0]).__name__
    print(f"heap state map: {map_class}; {rounds} interleaved rounds of {batch} calls\n")
    operations = bench_operations(rounds, batch)
    records = bench_records(rounds, batch // 2)
    result = {
        "benchmark": "metrics_overhead",
        "question": "cost of latency tracking (sampling interval 100, history 128) vs off",
        "config": {
            "rounds": rounds,
            "batch": batch,
            "keys": len(KEYS),
            "max_parallelism": MAX_P,
            "state_map": map_class,
            "sample_interval": 100,
            "history_size": 128,
            "timer": "time.process_time (CPU time of the process)",
        },
        "machine": {
            "python": sys.version.split()[0],
            "implementation": platform.python_implementation(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        },
        "operations": operations,
        "per_record": records,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
