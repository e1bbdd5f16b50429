"""Input files and brute-force oracles for the streaming tests."""

from __future__ import annotations

import os
import random
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


def write_batches(directory: str, batches: list[list[tuple[str, int]]], start: int = 0) -> None:
    """One Parquet file per micro-batch (``maxFilesPerTrigger=1``): columns user, v.

    A file source takes files in modification-time order: the files get increasing times.
    """
    os.makedirs(directory, exist_ok=True)
    for i, rows in enumerate(batches, start):
        table = pa.table(
            {"user": [u for u, _ in rows], "v": pa.array([v for _, v in rows], pa.int64())}
        )
        path = os.path.join(directory, f"part-{i:04d}.parquet")
        pq.write_table(table, path)
        stamp = 1_700_000_000 + 10 * i
        os.utime(path, (stamp, stamp))


def make_batches(n_batches: int, per_batch: int, users: int, seed: int = 1) -> list[list[Any]]:
    rnd = random.Random(seed)
    return [
        [(f"u{rnd.randrange(users)}", b * per_batch + i) for i in range(per_batch)]
        for b in range(n_batches)
    ]


def running_counts(batches: list[list[tuple[str, int]]]) -> list[tuple[str, int]]:
    """What a per-record running count emits, in any order (the oracle)."""
    seen: Counter[str] = Counter()
    out = []
    for rows in batches:
        for user, _ in rows:
            seen[user] += 1
            out.append((user, seen[user]))
    return sorted(out)


def final_counts(batches: list[list[tuple[str, int]]]) -> dict[str, int]:
    return dict(Counter(u for rows in batches for u, _ in rows))
