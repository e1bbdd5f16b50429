"""One hot micro-batch through a state host: the Unix socket (task on the host's node) against
TCP over loopback (task on another node, :mod:`streamstate.spark.task.host_client` routing), and
this tree's sealed channel against another tree's (the plaintext channel of protocol 2).

A 1-subtask job holds ``--keys`` keys; each measured batch sends ``--rows`` records (Arrow
batches of ``--batch-rows``, Spark's ``maxRecordsPerBatch`` default) to the same host, which
finds its state hot and runs a per-key count, writes the incremental checkpoint and stages the
outputs. Unix and TCP batches alternate; the medians of the whole batch (connect, handshake,
stream, checkpoint, ack) and of the streaming part are printed and written to
``bench/results/host_transport.json``. Two simulated nodes are two run directories.

With ``--baseline-src DIR`` (a streamstate ``src`` directory, e.g. ``git archive main src``
unpacked) the benchmark runs ``--rounds`` rounds, each one child process of this tree and one of
the baseline's, alternating, and reports the ratio of their median TCP batch (the question of
issue 26: the sealed channel's cost, goal <= 1.10x).

    python bench/host_transport.py [--rows 200000] [--keys 50000] [--repeat 5]
    python bench/host_transport.py --baseline-src /tmp/main-src --rounds 3 --repeat 4
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
if "--src" in sys.argv:  # a child measuring another tree: import that streamstate
    _SRC = sys.argv[sys.argv.index("--src") + 1]
sys.path.insert(0, _SRC)

import msgspec
import pyarrow as pa

from streamstate import KeyedProcessFunction, ValueStateDescriptor
from streamstate.keygroups import assign_key_groups
from streamstate.spark.driver.step.commit import CheckpointLog
from streamstate.spark.job import JobSpec, arrow_schema_to_bytes, pickle_function
from streamstate.spark.subtask import job_storage
from streamstate.spark.task.host_client import run_batch, shutdown
from streamstate.spark.wire.hosts import HostSettings
from streamstate.spark.wire.security import new_secret

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


def measure(args: Any) -> dict[str, list[dict[str, Any]]]:
    """Per route, the figures of each measured batch."""
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
        name: HostSettings(
            job=job.checkpoint_url,
            operator="op",
            parallelism=1,
            run="bench",
            run_dir=d,
            bind="127.0.0.1",
        ).spec(0)
        for name, d in nodes.items()
    }
    location: dict[str, Any] | None = None
    attempt = 0
    figures: dict[str, list[dict[str, Any]]] = {"unix": [], "tcp": []}
    routes = [("node-a", "unix"), ("node-b", "tcp")]
    if args.only:
        routes = [r for r in routes if r[1] == args.only]

    def batch(b: int, on: str) -> dict[str, Any]:
        nonlocal location, attempt
        attempt += 1
        plan = log.plan(b)
        step = plan.task(msgspec.msgpack.encode(job))
        data = _batches(args.rows, args.keys, args.batch_rows, seed=b)
        t0 = time.perf_counter()
        ack = run_batch(specs[on], step, attempt, data, secret=secret, location=location)
        total = time.perf_counter() - t0
        result = ack.result
        assert result is not None
        log.commit(plan, [result])
        location = ack.location
        return {
            "total_ms": total * 1e3,
            **msgspec.structs.asdict(ack.timings),
            "restore": result.restore,
            "host_ms": result.stats["host_ms"],
        }

    try:
        batch(0, "node-a")  # the host starts on node A and loads every key
        b = 1
        for _ in range(args.repeat):
            for on, route in routes:
                got = batch(b, on)
                b += 1
                assert got["route"] == route and got["restore"] == "hot", got
                figures[route].append(got)
    finally:
        for spec in specs.values():
            shutdown(spec, "bench done", secret)
        log.close()
    return figures


def channel_cost(args: Any, repeat: int = 20) -> dict[str, float]:
    """The channel alone: one batch's DATA messages (``--rows`` rows in ``--batch-rows``
    Arrow batches) and their OK answers through a socket pair, sealed (this tree's
    :class:`~streamstate.spark.wire.protocol.Connection`) against protocol 2's plaintext framing
    (length prefix, msgpack header, body), medians of ``repeat`` in ms."""
    import socket
    import struct
    import threading

    from streamstate.spark.wire.messages import Data, Ok
    from streamstate.spark.wire.protocol import CLIENT_RECEIVES, HOST_RECEIVES, Connection
    from streamstate.spark.wire.security import new_secret, session_keys

    bodies = [b.serialize() for b in _batches(args.rows, args.keys, args.batch_rows, seed=0)]
    head = msgspec.msgpack.encode({"t": "DATA"})
    ok = msgspec.msgpack.encode({"t": "OK"})
    prefix = struct.Struct("<II")

    def plain_read(sock: socket.socket, n: int) -> bytearray:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            got += sock.recv_into(view[got:], n - got)
        return buf

    def plain_recv(sock: socket.socket) -> bytearray:
        h, b = prefix.unpack(plain_read(sock, prefix.size))
        plain_read(sock, h)
        return plain_read(sock, b) if b else bytearray()

    def plain_send(sock: socket.socket, h: bytes, body: Any = None) -> None:
        sock.sendall(prefix.pack(len(h), 0 if body is None else body.size) + h)
        if body is not None:
            sock.sendall(body)

    def run(sealed: bool) -> float:
        a, b = socket.socketpair()
        secret, hn, cn = new_secret(), os.urandom(32), os.urandom(32)
        client = Connection(a, session_keys(secret, "h", hn, cn, client=True), CLIENT_RECEIVES)
        host = Connection(b, session_keys(secret, "h", hn, cn, client=False), HOST_RECEIVES)

        def serve() -> None:
            for _ in bodies:
                if sealed:
                    host.recv()
                    host.send(Ok())
                else:
                    plain_recv(b)
                    plain_send(b, ok)

        t = threading.Thread(target=serve)
        t0 = time.perf_counter()
        t.start()
        for body in bodies:
            if sealed:
                client.send(Data(), body)
                client.recv()
            else:
                plain_send(a, head, body)
                plain_recv(a)
        t.join()
        took = time.perf_counter() - t0
        a.close()
        b.close()
        return took * 1e3

    sealed, plain = [], []
    for _ in range(repeat):
        sealed.append(run(True))
        plain.append(run(False))
    return {
        "channel_bytes": float(sum(body.size for body in bodies)),
        "channel_sealed_ms": statistics.median(sealed),
        "channel_plain_ms": statistics.median(plain),
    }


def _child(args: Any, src: str | None) -> dict[str, list[dict[str, Any]]]:
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        "--only",
        "tcp",
        *("--rows", str(args.rows), "--keys", str(args.keys)),
        *("--batch-rows", str(args.batch_rows), "--repeat", str(args.repeat)),
    ]
    if src:
        cmd += ["--src", src]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--keys", type=int, default=50_000)
    ap.add_argument("--batch-rows", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--only", choices=["unix", "tcp"])
    ap.add_argument("--baseline-src", help="a streamstate src directory to compare against")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--src", help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args)))
        return

    def med(figures: dict[str, list[dict[str, Any]]], route: str, key: str) -> float:
        return statistics.median(f[key] for f in figures[route])

    out = os.path.join(os.path.dirname(__file__), "results", "host_transport.json")
    try:
        with open(out) as f:
            result: dict[str, Any] = json.load(f)
    except (OSError, ValueError):
        result = {}
    result.update(
        {
            "bench": "host_transport",
            "rows": args.rows,
            "keys": args.keys,
            "batch_rows": args.batch_rows,
            "repeat": args.repeat,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        }
    )
    if args.baseline_src:
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {
            "sealed": {"tcp": []},
            "baseline": {"tcp": []},
        }
        for _ in range(args.rounds):
            for name, src in (("sealed", None), ("baseline", args.baseline_src)):
                runs[name]["tcp"] += _child(args, src)["tcp"]
        compare = {
            f"{name}_tcp_{key}": med(figures, "tcp", key)
            for name, figures in runs.items()
            for key in ("total_ms", "stream_ms")
        }
        compare["sealed_over_baseline_total"] = (
            compare["sealed_tcp_total_ms"] / compare["baseline_tcp_total_ms"]
        )
        compare["sealed_over_baseline_stream"] = (
            compare["sealed_tcp_stream_ms"] / compare["baseline_tcp_stream_ms"]
        )
        compare["rounds"] = args.rounds
        compare["batches_each"] = len(runs["sealed"]["tcp"])
        result["sealed_vs_baseline"] = compare
    else:
        result.update(channel_cost(args))
        result["channel_extra_ms"] = result["channel_sealed_ms"] - result["channel_plain_ms"]
        figures = measure(args)
        routes = [args.only] if args.only else ["unix", "tcp"]
        result.update(
            {
                f"{route}_{key}": med(figures, route, key)
                for route in routes
                for key in ("total_ms", "connect_ms", "stream_ms")
            }
        )
        if not args.only:
            result["tcp_over_unix_total"] = result["tcp_total_ms"] / result["unix_total_ms"]
            result["tcp_over_unix_stream"] = result["tcp_stream_ms"] / result["unix_stream_ms"]
    print(json.dumps(result, indent=2))
    with open(out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
