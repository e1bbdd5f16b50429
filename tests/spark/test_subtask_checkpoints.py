"""A Spark subtask's checkpoints as its keyed backend sees them (no Spark, no state host): a
checkpoint this runtime wrote but cannot know committed with its own files is aborted."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from streamstate.keygroups import assign_key_groups
from streamstate.spark.job import JobSpec, arrow_schema_to_bytes
from streamstate.spark.subtask import SubtaskRuntime
from support.spark_functions import Count

SCHEMA = pa.schema([("user", pa.string()), ("v", pa.int64()), ("_kg", pa.int32())])
OUT = pa.schema([("user", pa.string()), ("n", pa.int64())])


def _runtime(tmp_path: Any) -> SubtaskRuntime:
    job = JobSpec(
        operator="op",
        parallelism=1,
        max_parallelism=128,
        key_columns=["user"],
        value_columns=["user", "v"],
        input_schema=arrow_schema_to_bytes(SCHEMA),
        output_schema=arrow_schema_to_bytes(OUT),
        checkpoint_url=str(tmp_path / "ck"),
    )
    return SubtaskRuntime(job, 0, Count)


def _batch(users: list[str]) -> pa.RecordBatch:
    return pa.record_batch(
        [
            pa.array(users),
            pa.array(range(len(users)), pa.int64()),
            pa.array(assign_key_groups(pa.array(users), 128), pa.int32()),
        ],
        schema=SCHEMA,
    )


def _run(runtime: SubtaskRuntime, batch_id: int, attempt: int, lineage: str) -> None:
    runtime.begin(None, None)
    runtime.process(_batch(["a", "b"]))
    list(runtime.output_batches())
    runtime.finish(batch_id, attempt, lineage)


@pytest.mark.parametrize(("base_attempt", "expected"), [(1, "complete"), (None, "aborted")])
def test_a_hot_version_confirms_or_aborts_its_checkpoint(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, base_attempt: int | None, expected: str
) -> None:
    runtime = _runtime(tmp_path)
    try:
        assert runtime.prepare(-1, "L0") == "empty"
        _run(runtime, 0, 1, "L1")
        calls: list[tuple[str, int]] = []
        op = runtime.op
        monkeypatch.setattr(
            op, "notify_checkpoint_complete", lambda c: calls.append(("complete", c))
        )
        monkeypatch.setattr(op, "notify_checkpoint_aborted", lambda c: calls.append(("aborted", c)))
        # the next batch finds version 0 hot; without the attempt the driver committed, this
        # runtime cannot know chk-0 lists its own files: it must not build on its uploads
        assert runtime.prepare(0, "L1", base_attempt) == "hot"
        assert calls == [(expected, 0)]
    finally:
        runtime.close()
