"""A query's fixed costs: the per-phase figures, hosts started ahead of the first micro-batch,
the timestamp conversion of the batch path."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from streamstate.spark import keyed_process
from streamstate.spark.columns import column_values
from support.spark_data import make_batches, write_batches
from support.spark_functions import Count


def _source(spark: Any, directory: str) -> Any:
    return (
        spark.readStream.schema("user string, v long")
        .option("maxFilesPerTrigger", 1)
        .parquet(directory)
    )


def _run(spark: Any, tmp_path: Any) -> Any:
    write_batches(str(tmp_path / "in"), make_batches(2, 50, users=10))
    query = keyed_process(
        _source(spark, str(tmp_path / "in")),
        key="user",
        function=Count(),
        output_schema="user string, n long",
        checkpoint=str(tmp_path / "ck"),
        parallelism=2,
    ).write_stream("memory", trigger={"availableNow": True})
    query.await_termination()
    query.stop()
    return query


@pytest.mark.spark
def test_hosts_start_ahead_of_the_first_micro_batch(spark: Any, tmp_path: Any) -> None:
    query = _run(spark, tmp_path)
    timings = query.timings
    for phase in ("ship_ms", "epoch_ms", "spark_start_ms", "init_ms", "first_batch_at_ms"):
        assert timings[phase] >= 0, phase
    assert timings["spawn_ms"] > 0  # the driver started both hosts (local master)
    assert timings["shutdown_ms"] >= 0 and timings["stop_ms"] >= 0
    first = query.batches[0]
    for phase in ("plan_ms", "place_ms", "job_ms", "commit_ms", "sink_ms", "batch_ms"):
        assert first[phase] >= 0, phase
    # so no task had to start one: each found its host running
    assert [s["spawn_ms"] for s in first["subtasks"]] == [None, None]
    assert all(s["connect_ms"] >= 0 and s["stream_ms"] >= 0 for s in first["subtasks"])


@pytest.mark.spark
def test_without_the_head_start_the_tasks_start_the_hosts(
    spark: Any, tmp_path: Any, monkeypatch: Any
) -> None:
    monkeypatch.setenv("STREAMSTATE_PRESPAWN", "0")
    query = _run(spark, tmp_path)
    assert "spawn_ms" not in query.timings
    assert all(s["spawn_ms"] > 0 for s in query.batches[0]["subtasks"])


@pytest.mark.parametrize("tz", [None, "UTC", "Etc/UTC", "+00:00", "GMT", "America/New_York"])
@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
def test_timestamp_columns_convert_like_pyarrow(tz: str | None, unit: str) -> None:
    scale = {"s": 10**-6, "ms": 10**-3, "us": 1, "ns": 10**3}[unit]
    values = [0, None, int(1_700_000_000_123_456 * scale), -5, int(-1_000_000_000_000_000 * scale)]
    column = pa.array(values, pa.timestamp(unit, tz=tz))
    got = column_values(column)
    assert got == column.to_pylist()
    assert [type(v.tzinfo) for v in got if v] == [type(v.tzinfo) for v in column.to_pylist() if v]


def test_timestamp_columns_out_of_datetime_range_raise_as_pyarrow_does() -> None:
    column = pa.array(np.array([0, 300_000_000_000_000_000], np.int64), pa.timestamp("us"))
    with pytest.raises(OverflowError):
        column.to_pylist()
    with pytest.raises(OverflowError):
        column_values(column)


def test_all_null_and_other_columns_are_unchanged() -> None:
    assert column_values(pa.array([None, None], pa.timestamp("us", tz="UTC"))) == [None, None]
    assert column_values(pa.array([1, None, 3])) == [1, None, 3]
    assert column_values(pa.array([], pa.timestamp("ms"))) == []


@pytest.mark.spark
def test_integer_key_groups_in_one_select_equal_the_runtimes(spark: Any) -> None:
    from streamstate.keygroups import assign_key_groups_for_columns
    from streamstate.spark.driver.plan.placement import KEY_GROUP_COLUMN, with_key_group

    ks = [0, 1, -1, 7, 42, 2**31 - 1, -(2**31), 2**31, 2**63 - 1, -(2**63), 123456789012345]
    ks += list(range(-500, 500, 7))
    df = spark.createDataFrame([(k, k % 3) for k in ks], "k long, v long")
    for max_p in (128, 1000, 32768):
        placed = with_key_group(df, ["k"], max_p)
        # the input's columns and the key group, no intermediate step
        assert placed.columns == ["k", "v", KEY_GROUP_COLUMN]
        got = {r.k: r[KEY_GROUP_COLUMN] for r in placed.collect()}
        expected = assign_key_groups_for_columns([pa.array(ks, pa.int64())], max_p)
        assert [got[k] for k in ks] == list(expected), max_p
    # a column named like the step (or the old `_h`) does not change the result
    clash = df.withColumnRenamed("v", "_h")
    got = {r.k: r[KEY_GROUP_COLUMN] for r in with_key_group(clash, ["k"], 128).collect()}
    assert [got[k] for k in ks] == list(assign_key_groups_for_columns([pa.array(ks)], 128))


@pytest.mark.spark
@pytest.mark.parametrize(
    ("dtype", "bits"), [("long", 64), ("int", 32), ("smallint", 16), ("tinyint", 8)]
)
def test_integer_key_groups_use_sparks_murmur_and_fall_back_to_sql_steps(
    spark: Any, monkeypatch: Any, dtype: str, bits: int
) -> None:
    """Every integer column is hashed as a long (``Long.hashCode``), as the runtime hashes a
    Python int: a narrower column's values too (key group placement 2)."""
    from streamstate.keygroups import assign_key_groups_for_columns
    from streamstate.spark.driver.plan import placement

    def analyzed(df: Any) -> str:
        return str(df._jdf.queryExecution().analyzed().toString())

    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    ks = [0, 1, -1, 2**31, -(2**31), 2**31 - 1, 2**63 - 1, -(2**63), 127, -128, 32767]
    ks = [k for k in [*ks, *range(-300, 300, 11)] if low <= k <= high]
    df = spark.createDataFrame([(k,) for k in ks], f"k {dtype}")
    expected = list(assign_key_groups_for_columns([pa.array(ks, pa.int64())], 128))
    placed = placement.with_key_group(df, ["k"], 128)
    # Spark's Murmur3 through reflect: one short projection, not 13 chained steps
    assert placement.MURMUR3_CLASS in analyzed(placed) and "__streamstate_kg_step1" not in (
        analyzed(placed)
    )
    got = {r.k: r[placement.KEY_GROUP_COLUMN] for r in placed.collect()}
    assert [got[k] for k in ks] == expected
    # place() of a classic DataFrame: Spark's Murmur3Hash expression (seed 0), code-generated
    # and deterministic, no reflect; the same key groups, partition i holds subtask i's rows,
    # a null key has none
    nulls = spark.createDataFrame([(k,) for k in ks] + [(None,)], f"k {dtype}")
    placed = placement.place(nulls, ["k"], 3, 128)
    plan = analyzed(placed)
    assert "hash(" in plan and "reflect" not in plan and placement.MURMUR3_CLASS not in plan
    assert placed._jdf.queryExecution().optimizedPlan().deterministic()

    def check(placed: Any) -> None:
        parts = placed.rdd.glom().collect()
        assert len(parts) == 3
        for i, rows in enumerate(parts):
            for r in rows:
                if r.k is None:
                    assert r[placement.KEY_GROUP_COLUMN] is None
                else:
                    assert r[placement.KEY_GROUP_COLUMN] == expected[ks.index(r.k)]
                    assert r[placement.KEY_GROUP_COLUMN] * 3 // 128 == i

    check(placed)
    # a Spark whose Murmur3Hash cannot be built with a seed: reflect, same key groups
    monkeypatch.setattr(placement, "MURMUR3_EXPRESSION", "org.example.NoSuchExpression")
    placed = placement.place(nulls, ["k"], 3, 128)
    assert placement.MURMUR3_CLASS in analyzed(placed)
    check(placed)
    # and a Spark without that class either: the pure-SQL steps, same key groups
    monkeypatch.setattr(placement, "MURMUR3_CLASS", "org.example.NoSuchMurmur")
    placed = placement.with_key_group(df, ["k"], 128)
    assert "__streamstate_kg_step1" in analyzed(placed)
    got = {r.k: r[placement.KEY_GROUP_COLUMN] for r in placed.collect()}
    assert [got[k] for k in ks] == expected
    placed = placement.place(nulls, ["k"], 3, 128)
    assert "__streamstate_kg_step1" in analyzed(placed)
    check(placed)
