"""Key group placement 2 on Spark: a key column of type INT, SMALLINT or TINYINT is hashed as a
long, as the Python runtime hashes every int. A checkpoint of placement 1 with such a key (every
key in one key group) is refused before the query starts, naming the key and the remedy; the
data source reads it without narrowing a key filter to key groups; the remedy (``streamstate
checkpoints regroup``) writes a savepoint the job continues from. Without Spark:
tests/checkpoint/test_key_group_placement.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamstate import KeyGroupPlacementError
from streamstate.checkpoint.rewrite import regroup_savepoint
from streamstate.keygroups import (
    PLACEMENT_VERSION,
    assign_to_key_group,
    placement_version,
)
from streamstate.spark import FileSink, keyed_process, read_state
from support.checkpoint import strip_key_group_placement
from support.spark_functions import Count

pytestmark = pytest.mark.spark

KEYS = [0, 1, -1, 5, -5, 127, -128, 77, -100, 3]


def _records(rounds: int, offset: int = 0) -> list[tuple[int, int]]:
    return [(k, offset + i) for i in range(rounds) for k in KEYS]


def test_an_int_keyed_checkpoint_of_the_older_placement_is_refused_then_regrouped(
    spark: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    from streamstate.spark.driver.plan import placement

    current = placement.key_group_sql_steps

    def old_steps(column: str, max_parallelism: int) -> list[str]:
        # before placement 2: Long.hashCode at the column's own width (0 for a 32-bit column)
        k = f"`{column}`"
        return [
            f"(({k} ^ shiftrightunsigned({k}, 32)) & {0xFFFFFFFF})",
            *current(column, max_parallelism)[1:],
        ]

    history = _records(3)
    df = spark.createDataFrame(history, "k int, v long")
    placed = placement.with_key_group(df, ["k"], 128)
    kgs = {r.k: r[placement.KEY_GROUP_COLUMN] for r in placed.collect()}
    assert kgs == {k: assign_to_key_group(k, 128) for k in KEYS}
    # batch execution with the older placement writes the savepoint of a job of that version
    monkeypatch.setattr(placement, "key_group_sql_steps", old_steps)
    one = assign_to_key_group(0, 128)
    old_kgs = {
        r[placement.KEY_GROUP_COLUMN] for r in placement.with_key_group(df, ["k"], 128).collect()
    }
    assert old_kgs == {one}
    old = tmp_path / "old"
    out = keyed_process(
        df,
        key="k",
        function=Count(),
        output_schema="k int, n long",
        parallelism=2,
        savepoint=str(old),
    ).collect()
    monkeypatch.undo()
    assert sorted((r.k, r.n) for r in out if r.n == 3) == sorted((k, 3) for k in KEYS)
    strip_key_group_placement(old)
    # the data source does not narrow a key filter to the key's group here: the key is found
    for k in (5, -100):
        got = (
            spark.read.format("streamstate")
            .option("state", "n")
            .load(str(old))
            .filter(f"key = {k}")
            .collect()
        )
        assert [(r.key, r.value) for r in got] == [(k, 3)], (k, one)
    assert {r.key: r.value for r in read_state(spark, str(old), state="n").collect()} == {
        k: 3 for k in KEYS
    }
    # a streaming job with the INT key column refuses it, naming the column and the remedy
    later = tmp_path / "in"
    later.mkdir()
    table = pa.table(
        {
            "k": pa.array([k for k, _ in _records(2, 10)], pa.int32()),
            "v": pa.array([v for _, v in _records(2, 10)], pa.int64()),
        }
    )
    pq.write_table(table, later / "part-0000.parquet")
    stream = spark.readStream.schema("k int, v long").parquet(str(later))

    def start(initial_state: Path, checkpoint: str) -> Any:
        return keyed_process(
            stream,
            key="k",
            function=Count(),
            output_schema="k int, n long",
            checkpoint=str(tmp_path / checkpoint),
            parallelism=2,
            initial_state=str(initial_state),
        )

    with pytest.raises(KeyGroupPlacementError) as refused:
        start(old, "ck-refused")
    message = str(refused.value)
    assert "where this job (key 'k') looks" in message and f"key group {one} (key" in message
    assert f"streamstate checkpoints regroup {old}" in message.replace("file://", "")
    assert not os.path.exists(tmp_path / "ck-refused" / "chk-0")
    # a job that reads the key as a BIGINT now would miss the keys just the same
    wide = spark.readStream.schema("k long, v long").parquet(str(later))
    with pytest.raises(KeyGroupPlacementError):
        keyed_process(
            wide,
            key="k",
            function=Count(),
            output_schema="k long, n long",
            checkpoint=str(tmp_path / "ck-wide"),
            initial_state=str(old),
        )
    # the remedy: a savepoint with each key in its key group, which the job continues from
    new = regroup_savepoint(str(old), str(tmp_path / "new"))
    assert placement_version(new.metadata.properties) == PLACEMENT_VERSION
    query = start(tmp_path / "new", "ck").write_stream(
        "parquet", path=str(tmp_path / "out"), trigger={"availableNow": True}
    )
    query.await_termination()
    rows = FileSink(str(tmp_path / "out")).read_arrow().to_pylist()
    assert sorted((r["k"], r["n"]) for r in rows) == sorted((k, n) for k in KEYS for n in (4, 5))
