"""What does restoring state that migrates cost, against restoring it unchanged? (SPEC §14.1,
docs/benchmarks.md)

One subtask's checkpoint holds ``--entries`` entries of one value state written by the old
code. The baseline restores it into a fresh backend and registers the state as it was declared;
the contender restores the same checkpoint and registers the state with the new declaration, so
that every value migrates (once, at the registration) before the state is used:

* ``record gains a field``: a dataclass ``Visit{page, clicks}`` becomes ``Visit{page, clicks,
  referrer = ""}``;
* ``int -> float``: a value state of ``int`` becomes one of ``float``.

Backends: heap (full checkpoint: one canonical file), RocksDB from its native incremental
checkpoint (download, open), and RocksDB from a savepoint (canonical file: every entry decoded
and written). Each run restores into a new backend and reads one key back (so that the state is
registered and usable); baseline and contender alternate (AB BA ...), timed in wall-clock time
(RocksDB writes and compacts in threads of its own). Medians and their ratio are printed and
written to ``bench/results/migration.json``. Goal: a migrating restore at most 2x an unchanged
one.

Run:  python bench/migration.py [--entries 1000000] [--repeat 5] [--only heap,rocksdb]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from streamstate import KeyedProcessFunction, ValueStateDescriptor
from streamstate.backends.base import RestoreInput, RestoreMode
from streamstate.backends.heap.backend import HeapKeyedStateBackend
from streamstate.backends.rocksdb.backend import RocksDBKeyedStateBackend
from streamstate.checkpoint.coordinator import CheckpointCoordinator
from streamstate.checkpoint.restore import keyed_restore_files
from streamstate.checkpoint.storage import FileSystemCheckpointStorage
from streamstate.checkpoint.writer import SubtaskCheckpointer
from streamstate.keygroups import KeyGroupRange
from streamstate.namespace import VOID_NAMESPACE
from streamstate.runtime.operator import KeyedProcessOperator
from streamstate.serializers import Int64Serializer

MAX_P = 128
RANGE = KeyGroupRange(0, MAX_P - 1)


@dataclasses.dataclass
class Visit:
    page: str
    clicks: int


@dataclasses.dataclass
class VisitV2:
    page: str
    clicks: int
    referrer: str = ""


CASES: dict[str, tuple[Any, Any, Callable[[int], Any]]] = {
    "record gains a field": (Visit, VisitV2, lambda k: Visit(f"/p{k % 1000}", k)),
    "int -> float": (int, float, lambda k: k),
}


def _backend(kind: str, workdir: str) -> Any:
    if kind == "heap":
        return HeapKeyedStateBackend(Int64Serializer(), MAX_P, RANGE)
    return RocksDBKeyedStateBackend(
        Int64Serializer(), MAX_P, RANGE, path=tempfile.mkdtemp(dir=workdir)
    )


def write_checkpoint(kind: str, old: Any, make: Callable[[int], Any], n: int, root: str) -> Any:
    """A checkpoint (or, ``rocksdb-savepoint``, a savepoint) of ``n`` entries of ``old``."""
    backend_kind = "heap" if kind == "heap" else "rocksdb"
    storage = FileSystemCheckpointStorage(tempfile.mkdtemp(prefix=f"{kind}-", dir=root))
    op = KeyedProcessOperator(
        _Nothing(),
        Int64Serializer(),
        operator_name="op",
        subtask_index=0,
        parallelism=1,
        max_parallelism=MAX_P,
        state_backend=backend_kind,
    )
    op.open()
    backend = op.keyed_backend
    state = backend.get_partitioned_state(VOID_NAMESPACE, None, ValueStateDescriptor("v", old))
    for k in range(n):
        backend.set_current_key(k)
        state.update(make(k))
    checkpointer = SubtaskCheckpointer(storage, op)
    coordinator = CheckpointCoordinator(storage)
    try:
        if kind == "rocksdb-savepoint":
            handle = checkpointer.savepoint(storage.savepoint_directory(1), 1).result()
            done = coordinator.commit(
                1, [handle], expected={"op": 1}, savepoint_directory=storage.savepoint_directory(1)
            )
        else:
            handle = checkpointer.checkpoint(1).result()
            done = coordinator.commit(1, [handle], expected={"op": 1})
    finally:
        checkpointer.close()
        coordinator.close()
        op.dispose()
    return done


class _Nothing(KeyedProcessFunction):
    """A function that does nothing (the benchmark writes the state itself)."""

    def process_element(self, value: Any, ctx: Any) -> None:
        return None


def restore_once(kind: str, checkpoint: Any, declared: Any, workdir: str) -> float:
    """Seconds to restore ``checkpoint`` into a fresh backend and register the state as
    ``declared`` (reading one key back)."""
    backend = _backend("heap" if kind == "heap" else "rocksdb", workdir)
    gc.collect()
    try:
        t0 = time.perf_counter()
        files = keyed_restore_files(checkpoint, "op", RANGE, MAX_P)
        try:
            backend.restore(RestoreInput(files, RestoreMode.NO_CLAIM))
        finally:
            for f in files:
                f.close()
        state = backend.get_partitioned_state(
            VOID_NAMESPACE, None, ValueStateDescriptor("v", declared)
        )
        backend.set_current_key(7)
        state.value()
        return time.perf_counter() - t0
    finally:
        backend.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only", default="heap,rocksdb,rocksdb-savepoint")
    args = parser.parse_args()
    kinds = args.only.split(",")
    rows = []
    print(f"{'backend':<18} {'change':<22} {'unchanged s':>12} {'migrating s':>12} {'ratio':>6}")
    root = tempfile.mkdtemp(prefix="streamstate-bench-migration-")
    try:
        for kind in kinds:
            for case, (old, new, make) in CASES.items():
                checkpoint = write_checkpoint(kind, old, make, args.entries, root)
                times: dict[str, list[float]] = {"unchanged": [], "migrating": []}
                for r in range(args.repeat):
                    order = ("unchanged", "migrating") if r % 2 == 0 else ("migrating", "unchanged")
                    for which in order:
                        declared = old if which == "unchanged" else new
                        times[which].append(restore_once(kind, checkpoint, declared, root))
                base = statistics.median(times["unchanged"])
                cont = statistics.median(times["migrating"])
                rows.append(
                    {
                        "backend": kind,
                        "change": case,
                        "unchanged_s": base,
                        "migrating_s": cont,
                        "ratio": cont / base,
                        "unchanged_runs": times["unchanged"],
                        "migrating_runs": times["migrating"],
                    }
                )
                print(f"{kind:<18} {case:<22} {base:>12.3f} {cont:>12.3f} {cont / base:>5.2f}x")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out = Path(__file__).resolve().parent / "results" / "migration.json"
    out.write_text(
        json.dumps(
            {
                "command": " ".join(["python", "bench/migration.py", *sys.argv[1:]]),
                "entries": args.entries,
                "repeat": args.repeat,
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "load_average": os.getloadavg(),
                "rows": rows,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
