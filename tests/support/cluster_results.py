"""Input files, a brute-force oracle and readers of results for the tests of streaming queries
on a standalone cluster (``tests/spark_cluster/``)."""

from __future__ import annotations

import os
import random
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from streamstate.spark import FileSink

__all__ = ["Rows", "make_batches", "oracle", "restores", "routes", "sink_rows", "write_batches"]

Rows = list[tuple[str, int]]


def make_batches(
    n_batches: int, per_batch: int, users: int, seed: int, prefix: str = "u"
) -> list[Rows]:
    rnd = random.Random(seed)
    return [
        [(f"{prefix}{rnd.randrange(users)}", b * per_batch + i) for i in range(per_batch)]
        for b in range(n_batches)
    ]


def write_batches(directory: str, batches: list[Rows], start: int = 0) -> None:
    """One Parquet file per micro-batch, with increasing modification times (the file
    source's order)."""
    os.makedirs(directory, exist_ok=True)
    for i, rows in enumerate(batches, start):
        path = os.path.join(directory, f"part-{i:04d}.parquet")
        pq.write_table(
            pa.table({"user": [u for u, _ in rows], "v": pa.array([v for _, v in rows])}), path
        )
        os.utime(path, (1_700_000_000 + 10 * i,) * 2)


def oracle(batches: list[Rows]) -> list[tuple[str, int, int]]:
    """Every record's running count and its micro-batch, by brute force with pandas."""
    events = pd.DataFrame(
        [(u, b) for b, rows in enumerate(batches) for u, _ in rows], columns=["user", "batch"]
    )
    events["n"] = events.groupby("user").cumcount() + 1
    return sorted(zip(events.user, events.n, events.batch, strict=True))


def sink_rows(path: str) -> list[tuple[str, int, int]]:
    table = FileSink(path).read_arrow()
    return sorted(
        zip(
            table["user"].to_pylist(),
            table["n"].to_pylist(),
            table["batch"].to_pylist(),
            strict=True,
        )
    )


def restores(result: dict[str, Any]) -> list[list[str]]:
    """Per micro-batch, the restore kind of each subtask (in subtask order)."""
    return [[s["restore"] for s in b["subtasks"]] for b in result["batches"]]


def routes(result: dict[str, Any]) -> list[list[tuple[str, str]]]:
    """Per micro-batch, (restore, route) of each subtask: for assertion messages."""
    return [[(s["restore"], s.get("route")) for s in b["subtasks"]] for b in result["batches"]]
