"""One hot micro-batch through a state host: the Unix socket (task on the host's node) against
TCP over loopback (task on another node, :mod:`streamstate.spark.host_client` routing).

A 1-subtask job holds ``--keys`` keys; each measured batch sends ``--rows`` records (Arrow
batches of ``--batch-rows``, Spark's ``maxRecordsPerBatch`` default) to the same host, which
finds its state hot and runs a per-key count, writes the incremental checkpoint and stages the
outputs. Unix and TCP batches alternate; the medians of the whole batch (connect, handshake,
stream, checkpoint, ack) and of the streaming part are printed and written to
``bench/results/host_transport.json``. Two simulated nodes are two run directories.

    python bench/host_transport.py [--rows 200000] [--keys 50000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

import msgspec
import pyarrow as pa

from streamstate import KeyedProcessFunction, ValueStateDescriptor
from streamstate.keygroups import assign_key_groups
from streamstate.spark.commit import CheckpointLog
from streamstate.spark.host_client import host_spec, run_batch, shutdown
from streamstate.spark.job import JobSpec, arrow_schema_to_bytes, pickle_function
from streamstate.spark.security import new_secret
from streamstate.spark.subtask import BatchResult, job_storage

SCHEMA = pa.schema([("user", pa.int64()), ("v", pa.int64()), ("_kg", pa.int32())])
OUT = pa.schema([("user", pa.int64()), ("n", pa.int64())])


class Count(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.n = ctx.get_state(ValueStateDescriptor("n", int, default=0))

    def process_element(self, value: Any, ctx: Any) -> Any:
        n = self.n.value() + 1
        self.n.update(n)
        if n == 1:
            yield ctx.get_current_key(), n


def _batches(rows: int, keys: int, per: int, seed: int) -> list[Any]:
    import numpy as np

    rng = np.random.default_rng(seed)
    users = rng.integers(0, keys, rows)
    kgs = assign_key_groups(pa.array(users), 128)
    table = pa.table(
        {
            "user": pa.array(users, pa.int64()),
            "v": pa.array(range(rows), pa.int64()),
            "_kg": pa.array(kgs, pa.int32()),
        },
        schema=SCHEMA,
    )
    return table.to_batches(max_chunksize=per)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--keys", type=int, default=50_000)
    ap.add_argument("--batch-rows", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="host-transport-")
    blob = pickle_function(Count())
    sha = hashlib.sha256(blob).hexdigest()
    job = JobSpec(
        operator="op",
        parallelism=1,
        max_parallelism=128,
        key_columns=["user"],
        value_columns=["user", "v"],
        input_schema=arrow_schema_to_bytes(SCHEMA),
        output_schema=arrow_schema_to_bytes(OUT),
        checkpoint_url=f"{root}/ck",
        function_path=f"functions/{sha}.pkl",
        function_sha=sha,
    )
    storage = job_storage(job)
    storage.put_atomic(job.function_path, blob)
    log = CheckpointLog(storage, "op", 1, retained=2)
    secret = new_secret()
    nodes = {name: f"{root}/{name}" for name in ("node-a", "node-b")}
    specs = {
        name: host_spec(job.checkpoint_url, "op", 0, 1, directory=d, run="bench", bind="127.0.0.1")
        for name, d in nodes.items()
    }
    location: dict[str, Any] | None = None
    attempt = 0
    figures: dict[str, list[dict[str, float]]] = {"unix": [], "tcp": []}

    def batch(b: int, on: str) -> dict[str, Any]:
        nonlocal location, attempt
        attempt += 1
        plan = log.plan(b)
        begin = {
            "job": msgspec.msgpack.encode(job),
            "batch": b,
            "base": plan.base,
            "lineage": plan.lineage,
            "new_lineage": plan.new_lineage,
            "base_attempt": plan.base_attempts.get(0),
            "attempt": attempt,
            "watermark": plan.watermark,
            "processing_time": plan.processing_time,
        }
        data = _batches(args.rows, args.keys, args.batch_rows, seed=b)
        t0 = time.perf_counter()
        raw, timings = run_batch(specs[on], begin, data, secret=secret, location=location)
        total = time.perf_counter() - t0
        result = msgspec.msgpack.decode(raw, type=BatchResult)
        log.commit(plan, [result])
        location = timings["location"]
        return {"total_ms": total * 1e3, **timings, "host_ms": result.stats["host_ms"]}

    try:
        batch(0, "node-a")  # the host starts on node A and loads every key
        b = 1
        for _ in range(args.repeat):
            for on, route in (("node-a", "unix"), ("node-b", "tcp")):
                got = batch(b, on)
                b += 1
                assert got["route"] == route and got["restore"] == "hot", got
                figures[route].append(got)
    finally:
        for spec in specs.values():
            shutdown(spec, "bench done", secret)
        log.close()

    def med(route: str, key: str) -> float:
        return statistics.median(f[key] for f in figures[route])

    result = {
        "bench": "host_transport",
        "rows": args.rows,
        "keys": args.keys,
        "batch_rows": args.batch_rows,
        "repeat": args.repeat,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        **{
            f"{route}_{key}": med(route, key)
            for route in ("unix", "tcp")
            for key in ("total_ms", "connect_ms", "stream_ms")
        },
    }
    result["tcp_over_unix_total"] = result["tcp_total_ms"] / result["unix_total_ms"]
    result["tcp_over_unix_stream"] = result["tcp_stream_ms"] / result["unix_stream_ms"]
    print(json.dumps(result, indent=2))
    out = os.path.join(os.path.dirname(__file__), "results", "host_transport.json")
    with open(out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
