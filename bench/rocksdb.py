"""The RocksDB keyed backend against the heap backend, in the same process (SPEC §10).

Questions, each answered with medians of interleaved runs and a ratio against its baseline:

1. ``ops``: per-operation cost of value, list and map state on ``--keys`` keys (default 1M) that
   already hold state, visited in random order (RocksDB vs heap; Flink's heap is 2-17x faster
   than its RocksDB; our goal: RocksDB at most 6x heap on ValueState get+update). A skewed
   variant (90% of accesses to 10% of the keys) shows the write-back cache at work. Two more
   rows of value get+update: a write-back cache holding every key, and RocksDB's row cache
   (``row_cache_size``) sized to hold the working set (``--row-cache-bytes-per-key``).
2. ``list_encoding``: ListState as one value per list appended in the cache (read-modify-write
   on a miss; what the backend does) vs one RocksDB key per element with a sequence suffix
   (blind puts, prefix scan on read; a prototype here).
3. ``big``: ``--big-keys`` keys (default 50M) written through the backend while the resident
   set size is sampled; the goal is to stay under 1.5 GiB. Skipped with ``--quick``.
4. ``incremental``: bytes uploaded by a checkpoint after touching 1% of the keys vs the first
   (full) checkpoint (goal: at most 5%).
5. ``rescale``: restoring 4 -> 2 and 2 -> 4 subtasks, RocksDB (incremental snapshots: download,
   base + delete_range + copy) vs heap (loading the canonical entries of in-memory snapshots
   into state tables: the heap's restore without reading and decoding files, i.e. a lower bound
   for the heap).

Writes ``bench/results/rocksdb.json``.

    python bench/rocksdb.py [--keys 1000000] [--repeat 3] [--quick] [--big-keys 50000000]
                            [--only ops,list_encoding,big,incremental,rescale]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

import numpy as np

from streamstate import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from streamstate.backends.base import RestoreInput, RestoreMode
from streamstate.backends.heap.backend import HeapKeyedStateBackend
from streamstate.backends.rocksdb.backend import RocksDBKeyedStateBackend
from streamstate.backends.rocksdb.instance import RocksDBConfig
from streamstate.backends.rocksdb.restore import NativeRestoreFile
from streamstate.backends.rocksdb.storage import CheckpointStorageFileStore
from streamstate.checkpoint.storage import FileSystemCheckpointStorage
from streamstate.keygroups import (
    KeyGroupRange,
    assign_key_groups,
    compute_key_group_range_for_operator_index,
    compute_operator_index_for_key_group,
)
from streamstate.namespace import VOID_NAMESPACE
from streamstate.serializers import Int64Serializer

MAX_P = 128
V = ValueStateDescriptor("v", int)
L = ListStateDescriptor("l", int)
M = MapStateDescriptor("m", int, int)
TMP = os.environ.get("STREAMSTATE_BENCH_TMP") or tempfile.gettempdir()


def _timed(fn: Callable[[], Any]) -> tuple[float, float]:
    """``(wall seconds, CPU seconds of the whole process)`` of ``fn()``.

    The machine is shared: wall time includes waiting for a core, CPU time does not (it does
    include RocksDB's background threads, which is work done for the operations).
    """
    gc.collect()
    c0 = time.process_time()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def _medians(samples: list[tuple[float, float]], n: int) -> tuple[float, float]:
    """Median wall and CPU nanoseconds per operation."""
    return (
        statistics.median(s[0] for s in samples) / n * 1e9,
        statistics.median(s[1] for s in samples) / n * 1e9,
    )


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _dir_size(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(root, name))
    return total


class Workdir:
    """Temporary directories for RocksDB instances and checkpoint storage."""

    def __init__(self) -> None:
        self.root = tempfile.mkdtemp(prefix="bench-rocksdb-", dir=TMP)
        self.n = 0

    def path(self, name: str) -> str:
        self.n += 1
        return os.path.join(self.root, f"{name}-{self.n}")

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def rocks(
    wd: Workdir, key_groups: KeyGroupRange | None = None, **config: Any
) -> RocksDBKeyedStateBackend:
    return RocksDBKeyedStateBackend(
        Int64Serializer(),
        MAX_P,
        key_groups or KeyGroupRange(0, MAX_P - 1),
        options=RocksDBConfig(**config),
        path=wd.path("rocks"),
    )


def heap(key_groups: KeyGroupRange | None = None) -> HeapKeyedStateBackend:
    return HeapKeyedStateBackend(
        Int64Serializer(), MAX_P, key_groups or KeyGroupRange(0, MAX_P - 1)
    )


def _state(b: Any, d: Any) -> Any:
    return b.get_partitioned_state(VOID_NAMESPACE, None, d)


# ---- 1. per-operation cost ------------------------------------------------------------------


def _populate(b: Any, pairs: list[tuple[int, int]]) -> None:
    set_key = b.set_current_key
    v, lst, m = _state(b, V), _state(b, L), _state(b, M)
    for k, kg in pairs:
        set_key(k, kg)
        v.update(k)
        lst.add(k)
        m.put(k & 7, k)
    flush = getattr(b, "flush", None)
    if flush is not None:
        flush()


def _op_runner(b: Any, op: str, pairs: list[tuple[int, int]]) -> Callable[[], None]:
    set_key = b.set_current_key
    if op == "value_get_update":
        s = _state(b, V)

        def run() -> None:
            value, update = s.value, s.update
            for k, kg in pairs:
                set_key(k, kg)
                update(value() + 1)

    elif op == "value_get":
        s = _state(b, V)

        def run() -> None:
            value = s.value
            for k, kg in pairs:
                set_key(k, kg)
                value()

    elif op == "list_add":
        s = _state(b, L)

        def run() -> None:
            add = s.add
            for k, kg in pairs:
                set_key(k, kg)
                add(k)

    elif op == "list_get":
        s = _state(b, L)

        def run() -> None:
            get = s.get
            for k, kg in pairs:
                set_key(k, kg)
                get()

    elif op == "map_put":
        s = _state(b, M)

        def run() -> None:
            put = s.put
            for k, kg in pairs:
                set_key(k, kg)
                put((k >> 3) & 7, k)

    elif op == "map_get":
        s = _state(b, M)

        def run() -> None:
            get = s.get
            for k, kg in pairs:
                set_key(k, kg)
                get(k & 7)

    else:
        raise ValueError(op)

    def run_and_flush() -> None:
        run()
        flush = getattr(b, "flush", None)
        if flush is not None:
            flush()  # the cache's pending writes are part of the cost

    return run_and_flush


def _point_read_floor(b: RocksDBKeyedStateBackend, pairs: list[tuple[int, int]], n: int) -> float:
    """Median ns of one ``Rdict.get`` of the value state's RocksDB keys (cache flushed)."""
    b.cache.flush()
    reg = b._registered[V.name]
    raw = [reg.layout.key_prefix(kg, k) for k, kg in pairs]
    get = reg.cf.get_function()
    runs = []
    for _ in range(n):
        t = time.perf_counter()
        for k in raw:
            get(k)
        runs.append((time.perf_counter() - t) / len(raw) * 1e9)
    return statistics.median(runs)


def bench_ops(args: argparse.Namespace, wd: Workdir) -> dict[str, Any]:
    rng = np.random.default_rng(1)
    n = args.keys
    keys_np = rng.permutation(n).astype(np.int64)
    pairs = list(zip(keys_np.tolist(), assign_key_groups(keys_np, MAX_P).tolist(), strict=True))
    # skewed: 90% of the accesses go to 10% of the keys
    hot = keys_np[: n // 10]
    pick = np.where(rng.random(n) < 0.9, rng.choice(hot, n), rng.choice(keys_np, n))
    skewed = list(zip(pick.tolist(), assign_key_groups(pick, MAX_P).tolist(), strict=True))
    print(f"\n[ops] {n:,} keys with state, random order; {args.repeat} interleaved runs")
    h, r = heap(), rocks(wd)
    t0 = time.perf_counter()
    _populate(h, pairs)
    t1 = time.perf_counter()
    _populate(r, pairs)
    t2 = time.perf_counter()
    print(f"  populate: heap {t1 - t0:.1f}s, rocksdb {t2 - t1:.1f}s")
    # Both backends live in this process. Without this, every full collection triggered by the
    # objects one backend allocates (RocksDB cache misses allocate lists, dicts, map views)
    # would rescan the millions of objects the other holds (the heap's 1M lists and dicts).
    gc.freeze()
    out: dict[str, Any] = {"keys": n, "populate_s": {"heap": t1 - t0, "rocksdb": t2 - t1}}
    print(
        f"  {'operation':<26}{'heap ns':>9}{'rocksdb ns':>12}{'ratio':>7}"
        f"{'heap cpu':>10}{'rocksdb cpu':>13}{'ratio':>7}"
    )
    ops = ("value_get_update", "value_get", "list_add", "list_get", "map_put", "map_get")
    cases = [(op, pairs) for op in ops]
    cases.append(("value_get_update_skewed", skewed))
    for name, seq in cases:
        op = name.removesuffix("_skewed")
        samples: dict[str, list[tuple[float, float]]] = {"heap": [], "rocksdb": []}
        for _ in range(args.repeat):
            samples["heap"].append(_timed(_op_runner(h, op, seq)))
            samples["rocksdb"].append(_timed(_op_runner(r, op, seq)))
        hw, hc = _medians(samples["heap"], len(seq))
        rw, rc = _medians(samples["rocksdb"], len(seq))
        out[name] = {
            "heap_ns": hw,
            "rocksdb_ns": rw,
            "ratio": rw / hw,
            "heap_cpu_ns": hc,
            "rocksdb_cpu_ns": rc,
            "cpu_ratio": rc / hc,
            "runs_wall_cpu_s": samples,
        }
        print(
            f"  {name:<26}{hw:>9.0f}{rw:>12.0f}{rw / hw:>6.1f}x{hc:>10.0f}{rc:>13.0f}"
            f"{rc / hc:>6.1f}x"
        )
    # the floor: rocksdict's point read alone of the same keys in the same order, no state API
    floor = _point_read_floor(r, pairs, args.repeat)
    out["rocksdb_point_read"] = {
        "ns": floor,
        "vs_heap_value_get_update": floor / out["value_get_update"]["heap_ns"],
    }
    print(
        f"  {'rocksdb point read alone':<26}{'':>9}{floor:>12.0f}"
        f"{floor / out['value_get_update']['heap_ns']:>6.1f}x  (of the heap's get+update)"
    )
    out["rocksdb_cache"] = {
        "entries": r.config.cache_entries,
        "flushes": r.cache.flushes,
        "evictions": r.cache.evictions,
    }
    r.dispose()
    # the same operation with a cache that holds every key: what the cache buys when it fits
    big = rocks(wd, cache_entries=4 * n)
    _populate(big, pairs)
    gc.freeze()
    samples: dict[str, list[tuple[float, float]]] = {"heap": [], "rocksdb": []}
    for _ in range(args.repeat):
        samples["heap"].append(_timed(_op_runner(h, "value_get_update", pairs)))
        samples["rocksdb"].append(_timed(_op_runner(big, "value_get_update", pairs)))
    hw, hc = _medians(samples["heap"], n)
    rw, rc = _medians(samples["rocksdb"], n)
    out["value_get_update_cache_holds_all"] = {
        "cache_entries": 4 * n,
        "heap_ns": hw,
        "rocksdb_ns": rw,
        "ratio": rw / hw,
        "heap_cpu_ns": hc,
        "rocksdb_cpu_ns": rc,
        "cpu_ratio": rc / hc,
        "runs_wall_cpu_s": samples,
    }
    name = "value_get_update_cache_all"
    print(
        f"  {name:<26}{hw:>9.0f}{rw:>12.0f}{rw / hw:>6.1f}x{hc:>10.0f}{rc:>13.0f}{rc / hc:>6.1f}x"
    )
    big.dispose()
    out.update(_bench_row_cache(args, wd, h, pairs))
    h.dispose()
    gc.unfreeze()
    return out


def _bench_row_cache(
    args: argparse.Namespace, wd: Workdir, h: HeapKeyedStateBackend, pairs: list[tuple[int, int]]
) -> dict[str, Any]:
    """value get+update with RocksDB's row cache sized for the working set (default write-back
    cache in front), and rocksdict's point read with it, against the heap of the same run."""
    n = len(pairs)
    size = args.row_cache_bytes_per_key * n
    rc = rocks(wd, row_cache_size=size)
    _populate(rc, pairs)
    # the row cache caches lookups in SST files only: start from the flushed state, as a
    # long-running job whose state outgrew its memtables
    for name in rc.instance.column_family_names():
        rc.instance.column_family(name).cf.flush()  # type: ignore[union-attr]
    gc.freeze()
    out: dict[str, Any] = {}
    # reads first (the state is all in SST files), then get+update (every key rewritten per run)
    for op in ("value_get", "value_get_update"):
        samples: dict[str, list[tuple[float, float]]] = {"heap": [], "rocksdb": []}
        for _ in range(args.repeat):
            samples["heap"].append(_timed(_op_runner(h, op, pairs)))
            samples["rocksdb"].append(_timed(_op_runner(rc, op, pairs)))
        hw, hc = _medians(samples["heap"], n)
        rw, rcpu = _medians(samples["rocksdb"], n)
        name = f"{op}_row_cache"
        print(
            f"  {name:<26}{hw:>9.0f}{rw:>12.0f}{rw / hw:>6.1f}x{hc:>10.0f}{rcpu:>13.0f}"
            f"{rcpu / hc:>6.1f}x"
        )
        out[name] = {
            "row_cache_size": size,
            "heap_ns": hw,
            "rocksdb_ns": rw,
            "ratio": rw / hw,
            "heap_cpu_ns": hc,
            "rocksdb_cpu_ns": rcpu,
            "cpu_ratio": rcpu / hc,
            "runs_wall_cpu_s": samples,
            # what the row cache holds after the op (after reads: one entry per key)
            "row_cache_usage": rc.instance.row_cache_usage(),
        }
    floor = _point_read_floor(rc, pairs, args.repeat)
    usage = rc.instance.row_cache_usage()
    hw = out["value_get_update_row_cache"]["heap_ns"]
    reads = out["value_get_row_cache"]["row_cache_usage"]
    print(
        f"  {'point read, row cache':<26}{'':>9}{floor:>12.0f}{floor / hw:>6.1f}x"
        f"  (row cache {size / 2**20:.0f} MiB: {reads / 2**20:.0f} MiB used after the reads,"
        f" {usage / 2**20:.0f} MiB at the end)"
    )
    rc.dispose()
    out["rocksdb_point_read_row_cache"] = {"ns": floor, "vs_heap_value_get_update": floor / hw}
    return out


# ---- 2. list encoding -----------------------------------------------------------------------


class ElementListPrototype:
    """ListState as one RocksDB key per element: ``[kg][key][seq: 8 bytes]`` (blind puts)."""

    def __init__(self, backend: RocksDBKeyedStateBackend, name: str) -> None:
        self.cf = backend.instance.column_family(name)
        self.db = self.cf.cf
        self.current = backend.current
        self.ctx = backend.ctx
        self.seq = 0
        self.ser = Int64Serializer()

    def _prefix(self) -> bytes:
        return self.current.prefix("elements")

    def add(self, value: int) -> None:
        self.seq += 1
        self.db.put(self._prefix() + self.seq.to_bytes(8, "big"), self.ser.serialize(value))

    def get(self) -> list[int]:
        des = self.ser.deserialize
        return [des(v) for _, v in self.cf.scan_prefix(self._prefix())]


def bench_list_encoding(args: argparse.Namespace, wd: Workdir) -> dict[str, Any]:
    out: dict[str, Any] = {}
    print("\n[list_encoding] one value per list (RMW in the cache) vs one key per element")
    print(f"  {'case (CPU ns per operation)':<34}{'value':>10}{'elements':>13}{'ratio':>8}")
    rng = np.random.default_rng(2)
    for n_keys, per_key in ((args.keys // 10, 10), (args.keys, 1), (1000, 200)):
        keys = np.repeat(np.arange(n_keys, dtype=np.int64), per_key)
        rng.shuffle(keys)
        adds = list(zip(keys.tolist(), assign_key_groups(keys, MAX_P).tolist(), strict=True))
        uniq = np.arange(n_keys, dtype=np.int64)
        gets = list(zip(uniq.tolist(), assign_key_groups(uniq, MAX_P).tolist(), strict=True))
        samples: dict[str, dict[str, list[tuple[float, float]]]] = {
            "add": {"value": [], "elements": []},
            "get": {"value": [], "elements": []},
        }
        for _ in range(args.repeat):
            a = rocks(wd)
            b = rocks(wd)
            lst = _state(a, L)
            proto = ElementListPrototype(b, "l")

            def add_value(a: Any = a, lst: Any = lst, adds: Any = adds) -> None:
                set_key, add = a.set_current_key, lst.add
                for k, kg in adds:
                    set_key(k, kg)
                    add(k)
                a.flush()

            def add_elements(b: Any = b, proto: Any = proto, adds: Any = adds) -> None:
                set_key, add = b.set_current_key, proto.add
                for k, kg in adds:
                    set_key(k, kg)
                    add(k)

            def get_value(a: Any = a, lst: Any = lst, gets: Any = gets) -> None:
                a.cache.clear()  # cold reads: both designs read from RocksDB
                set_key, get = a.set_current_key, lst.get
                for k, kg in gets:
                    set_key(k, kg)
                    get()

            def get_elements(b: Any = b, proto: Any = proto, gets: Any = gets) -> None:
                set_key, get = b.set_current_key, proto.get
                for k, kg in gets:
                    set_key(k, kg)
                    get()

            samples["add"]["value"].append(_timed(add_value))
            samples["add"]["elements"].append(_timed(add_elements))
            samples["get"]["value"].append(_timed(get_value))
            samples["get"]["elements"].append(_timed(get_elements))
            a.dispose()
            b.dispose()
        case = f"{n_keys}_keys_x_{per_key}"
        out[case] = {}
        for what, n_ops in (("add", len(adds)), ("get", len(gets))):
            vw, vc = _medians(samples[what]["value"], n_ops)
            ew, ec = _medians(samples[what]["elements"], n_ops)
            out[case][what] = {
                "value_ns": vw,
                "elements_ns": ew,
                "value_cpu_ns": vc,
                "elements_cpu_ns": ec,
                "runs_wall_cpu_s": samples[what],
            }
            label = f"{what} ({n_keys:,} keys x {per_key})"
            print(f"  {label:<34}{vc:>10.0f}{ec:>13.0f}{ec / vc:>7.2f}x")
    return out


# ---- 3. larger than memory ------------------------------------------------------------------


def bench_big(args: argparse.Namespace, wd: Workdir) -> dict[str, Any]:
    n = args.big_keys
    chunk = 1_000_000
    print(f"\n[big] {n:,} keys written through the backend (value state), RSS sampled")
    b = rocks(wd)
    v = _state(b, V)
    set_key, update = b.set_current_key, v.update
    stride = 1_000_003  # a prime: (i * stride) % n visits every key once, in scattered order
    samples = []
    rss_start = _rss_mib()
    t0 = time.perf_counter()
    for start in range(0, n, chunk):
        idx = np.arange(start, min(start + chunk, n), dtype=np.int64)
        keys = (idx * stride) % n
        kgs = assign_key_groups(keys, MAX_P).tolist()
        for k, kg in zip(keys.tolist(), kgs, strict=True):
            set_key(k, kg)
            update(k)
        rss = _rss_mib()
        samples.append((start + len(idx), round(time.perf_counter() - t0, 1), round(rss, 1)))
        if (start // chunk) % 5 == 0:
            print(f"  {start + len(idx):>12,} keys  {samples[-1][1]:>7.1f}s  RSS {rss:7.1f} MiB")
    b.flush()
    write_s = time.perf_counter() - t0
    # read back a sample
    rng = np.random.default_rng(3)
    probe = rng.integers(0, n, 100_000, dtype=np.int64)
    t1 = time.perf_counter()
    bad = 0
    for k, kg in zip(probe.tolist(), assign_key_groups(probe, MAX_P).tolist(), strict=True):
        set_key(k, kg)
        bad += v.value() != k
    read_ns = (time.perf_counter() - t1) / len(probe) * 1e9
    disk = _dir_size(b.instance.db_path)
    peak = max(s[2] for s in samples)
    out = {
        "keys": n,
        "write_s": write_s,
        "write_ns_per_key": write_s / n * 1e9,
        "random_read_ns": read_ns,
        "read_errors": bad,
        "rss_start_mib": rss_start,
        "rss_peak_sampled_mib": peak,
        "rss_end_mib": _rss_mib(),
        "ru_maxrss_mib": _peak_rss_mib(),
        "db_bytes_on_disk": disk,
        "rss_samples": samples,
        "goal_mib": 1536,
        "goal_met": peak < 1536,
    }
    print(
        f"  wrote {n:,} keys in {write_s:.0f}s ({write_s / n * 1e9:.0f} ns/key), random read "
        f"{read_ns:.0f} ns, RSS peak {peak:.0f} MiB (goal < 1536), DB {disk / 2**30:.2f} GiB"
    )
    b.dispose()
    return out


def _store(path: str) -> CheckpointStorageFileStore:
    """The checkpoint storage at ``path`` as the RocksDB backend uploads to it (the runtimes')."""
    return CheckpointStorageFileStore(FileSystemCheckpointStorage(path, job_id=""))


# ---- 4. incremental checkpoints -------------------------------------------------------------


def bench_incremental(args: argparse.Namespace, wd: Workdir) -> dict[str, Any]:
    n = args.keys
    print(f"\n[incremental] {n:,} keys (value + map state), then 1% of them touched")
    store = _store(wd.path("checkpoints"))
    b = rocks(wd)
    keys_np = np.random.default_rng(4).permutation(n).astype(np.int64)
    pairs = list(zip(keys_np.tolist(), assign_key_groups(keys_np, MAX_P).tolist(), strict=True))
    v, m = _state(b, V), _state(b, M)
    for k, kg in pairs:
        b.set_current_key(k, kg)
        v.update(k)
        m.put(k & 3, k)
    t0 = time.perf_counter()
    snap = b.snapshot(1)
    t1 = time.perf_counter()
    h1 = snap.write_incremental(store, "chk-1/op/0-0.state")
    t2 = time.perf_counter()
    b.notify_checkpoint_complete(1)
    touched = pairs[: n // 100]
    for k, kg in touched:
        b.set_current_key(k, kg)
        v.update(-k)
    t3 = time.perf_counter()
    snap = b.snapshot(2)
    t4 = time.perf_counter()
    h2 = snap.write_incremental(store, "chk-2/op/0-0.state")
    t5 = time.perf_counter()
    ratio = h2.uploaded_bytes / h1.uploaded_bytes
    out = {
        "keys": n,
        "touched": len(touched),
        "full_bytes": h1.uploaded_bytes,
        "incremental_bytes": h2.uploaded_bytes,
        "incremental_reused_bytes": h2.reused_bytes,
        "ratio": ratio,
        "goal_ratio": 0.05,
        "goal_met": ratio <= 0.05,
        "full_sync_s": t1 - t0,
        "full_async_s": t2 - t1,
        "incremental_sync_s": t4 - t3,
        "incremental_async_s": t5 - t4,
        "sst_files": {
            "full": len(h1.shared),
            "incremental_new": len(h2.shared)
            - sum(1 for f in h2.shared if f.path in set(h1.shared_paths)),
        },
    }
    print(
        f"  full checkpoint {h1.uploaded_bytes / 2**20:.1f} MiB (sync {t1 - t0:.2f}s, async "
        f"{t2 - t1:.2f}s); after touching {len(touched):,} keys: {h2.uploaded_bytes / 2**20:.2f} "
        f"MiB uploaded = {ratio:.1%} of full (goal <= 5%), {h2.reused_bytes / 2**20:.1f} MiB "
        f"reused (sync {t4 - t3:.2f}s, async {t5 - t4:.2f}s)"
    )
    b.dispose()
    return out


# ---- 5. rescaling ---------------------------------------------------------------------------


def _fill_all(backends: list[Any], pairs: list[tuple[int, int]]) -> None:
    p = len(backends)
    for k, kg in pairs:
        b = backends[compute_operator_index_for_key_group(MAX_P, p, kg)]
        b.set_current_key(k, kg)
        _state(b, V).update(k)
        _state(b, L).add(k)
        _state(b, M).put(k & 3, k)


def _load_heap(target: HeapKeyedStateBackend, snaps: list[Any]) -> int:
    """The heap's restore minus file reading and decoding (a lower bound)."""
    start = target.key_group_range.start
    n = 0
    for snap in snaps:
        for kg in snap.key_group_range.intersection(target.key_group_range):
            for index, entries in snap.key_group_entries(kg):
                meta = snap.states[index]
                table = target.register_state_table(
                    meta.name, meta.kind, meta.namespace_serializer, meta.state_serializer
                )
                m = table.maps[kg - start]
                for key, ns, state in entries:
                    m.put(key, ns, state)
                    n += 1
    return n


def bench_rescale(args: argparse.Namespace, wd: Workdir) -> dict[str, Any]:
    n = args.keys
    keys_np = np.random.default_rng(5).permutation(n).astype(np.int64)
    pairs = list(zip(keys_np.tolist(), assign_key_groups(keys_np, MAX_P).tolist(), strict=True))
    out: dict[str, Any] = {"keys": n}
    print(f"\n[rescale] {n:,} keys (value + list + map state); restore of every new subtask")
    for p_old, p_new in ((4, 2), (2, 4)):

        def ranges(p: int) -> list[KeyGroupRange]:
            return [compute_key_group_range_for_operator_index(MAX_P, p, i) for i in range(p)]

        store = _store(wd.path("checkpoints"))
        old_r = [rocks(wd, kgr) for kgr in ranges(p_old)]
        _fill_all(old_r, pairs)
        handles = [
            b.snapshot(1).write_incremental(store, f"chk-1/op/{i}-0.state")
            for i, b in enumerate(old_r)
        ]
        for b in old_r:
            b.dispose()
        old_h = [heap(kgr) for kgr in ranges(p_old)]
        _fill_all(old_h, pairs)
        samples: dict[str, list[tuple[float, float]]] = {"heap": [], "rocksdb": []}
        for _ in range(args.repeat):
            snaps = [h.snapshot(1) for h in old_h]
            new_h = [heap(kgr) for kgr in ranges(p_new)]

            def restore_heap(new_h: Any = new_h, snaps: Any = snaps) -> None:
                for target in new_h:
                    _load_heap(target, snaps)

            samples["heap"].append(_timed(restore_heap))
            for s in snaps:
                s.release()
            for h in new_h:
                h.dispose()
            new_r = [rocks(wd, kgr) for kgr in ranges(p_new)]

            def restore_rocks(new_r: Any = new_r, store: Any = store, hs: Any = handles) -> None:
                files = tuple(NativeRestoreFile(store, h) for h in hs)
                for target in new_r:
                    target.restore(RestoreInput(files, RestoreMode.CLAIM))

            samples["rocksdb"].append(_timed(restore_rocks))
            for t in new_r:
                t.dispose()
        hw, hc = _medians(samples["heap"], 1)
        rw, rc = _medians(samples["rocksdb"], 1)
        key = f"{p_old}_to_{p_new}"
        out[key] = {
            "heap_s": hw / 1e9,
            "rocksdb_s": rw / 1e9,
            "ratio": rw / hw,
            "heap_cpu_s": hc / 1e9,
            "rocksdb_cpu_s": rc / 1e9,
            "cpu_ratio": rc / hc,
            "checkpoint_bytes": sum(h.full_size for h in handles),
            "runs_wall_cpu_s": samples,
        }
        print(
            f"  {p_old} -> {p_new}: heap {hw / 1e9:.2f}s (cpu {hc / 1e9:.2f}s), rocksdb "
            f"{rw / 1e9:.2f}s (cpu {rc / 1e9:.2f}s): {rw / hw:.2f}x heap wall, {rc / hc:.2f}x cpu"
        )
        for h in old_h:
            h.dispose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--big-keys", type=int, default=50_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="skip the larger-than-memory run")
    parser.add_argument(
        "--row-cache-bytes-per-key",
        type=int,
        default=256,
        help="row_cache_size of the row-cache case, per key (default: holds every key)",
    )
    parser.add_argument("--only", default="ops,list_encoding,big,incremental,rescale")
    parser.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "rocksdb.json")
    )
    args = parser.parse_args()
    sections = args.only.split(",")
    if args.quick and "big" in sections:
        sections.remove("big")
    results: dict[str, Any] = {
        "benchmark": "rocksdb",
        "command": "python " + " ".join(sys.argv),
        "keys": args.keys,
        "repeat": args.repeat,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "heap_table": "copy_on_write (the heap default; populated objects frozen before timing)",
    }
    runners = {
        "ops": bench_ops,
        "list_encoding": bench_list_encoding,
        "big": bench_big,
        "incremental": bench_incremental,
        "rescale": bench_rescale,
    }
    for name in sections:
        wd = Workdir()
        try:
            results[name] = runners[name](args, wd)
        finally:
            wd.cleanup()
    results["peak_rss_mib"] = _peak_rss_mib()
    if os.path.exists(args.out) and set(sections) != set(runners):
        with open(args.out) as f:
            previous = json.load(f)
        previous.update(results)
        results = previous
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
