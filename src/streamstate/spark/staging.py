"""A step's outputs staged as Parquet files beside the checkpoint.

A subtask writes each step's outputs (and each side output's) under ``outputs/batch-<b>/`` of
the job directory (a savepoint's under ``<savepoint>/outputs/``); the driver hands the files of
a committed step to the sinks and deletes them when no replay can ask for them
(:mod:`streamstate.spark.driver.step.outputs`). A file's name carries the subtask, the Spark
task attempt and a random token, so that attempts of one step never overwrite each other.
"""

from __future__ import annotations

from typing import Any

from streamstate.spark.wire.results import StagedOutput

__all__ = ["side_output_directory", "write_staged"]


def write_staged(
    storage: Any, batches: list[Any], schema: Any, directory: str, subtask: int, attempt: int
) -> StagedOutput | None:
    """Write ``batches`` (Arrow, of ``schema``) as one Parquet file in ``directory`` of
    ``storage``; None when they hold no row."""
    import uuid

    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = sum(b.num_rows for b in batches)
    if not rows:
        return None
    token = uuid.uuid4().hex[:6]
    path = f"{directory}/part-{subtask:05d}-{attempt}-{token}.parquet"
    with storage.open_write(path) as f:
        pq.write_table(pa.Table.from_batches(batches, schema=schema), f)
    return StagedOutput(path=path, size=storage.size(path) or 0, rows=rows)


def side_output_directory(base: str, tag: str) -> str:
    """The directory of side output ``tag`` below a step's outputs directory ``base``: the tag
    id as a file-name part (other characters become ``_`` plus a short digest, so that two tags
    never share a directory)."""
    import hashlib
    import re

    clean = re.sub(r"[^A-Za-z0-9_.-]", "_", tag)
    if clean != tag:
        clean = f"{clean}-{hashlib.sha1(tag.encode()).hexdigest()[:8]}"
    return f"{base}/side-{clean}"
