"""Batch mode: keyed_process over a static DataFrame."""

from __future__ import annotations

from typing import Any

import pytest
from functions import BadOutput, Count, Sum

from streamstate import LocalRunner
from streamstate.demo import generate_events, page_views_per_hour
from streamstate.spark import keyed_process, read_state

pytestmark = pytest.mark.spark


def test_batch_mode_equals_the_local_runner(any_spark: Any) -> None:
    spark = any_spark
    records = [(f"u{(i * 7) % 13}", i) for i in range(300)]
    df = spark.createDataFrame(records, "user string, v long")
    out = keyed_process(
        df, key="user", function=Count(), output_schema="user string, n long", parallelism=3
    )
    got = sorted(tuple(r) for r in out.collect())
    expected = sorted(LocalRunner(Count(), key_selector=lambda r: r[0], parallelism=3).run(records))
    assert got == expected

    ints = spark.createDataFrame([(i % 17, i) for i in range(200)], "k long, v long")
    sums = keyed_process(ints, key="k", function=Sum(), output_schema="k long, total long")
    by_key = {}
    for r in sums.collect():
        by_key[r.k] = max(by_key.get(r.k, 0), r.total)
    assert by_key == {k: sum(i for i in range(200) if i % 17 == k) for k in range(17)}


def test_windows_in_batch_mode_equal_the_local_runner(any_spark: Any) -> None:
    spark = any_spark
    events = list(generate_events(3_000, apps=3, hours=4))
    df = spark.createDataFrame(events, "app string, ts long")
    out = keyed_process(
        df,
        key="app",
        function=page_views_per_hour(),
        output_schema="app string, hour long, views long",
        event_time="ts",
        parallelism=2,
    )
    runner = LocalRunner(
        page_views_per_hour(),
        key_selector=lambda e: e[0],
        parallelism=2,
        timestamp_assigner=lambda e: e[1],
        watermark_delay=120_000,
    )
    assert sorted(tuple(r) for r in out.collect()) == sorted(runner.run(events))


def test_output_schema_mismatch_names_the_column(any_spark: Any) -> None:
    spark = any_spark
    df = spark.createDataFrame([("a", 1)], "user string, v long")
    out = keyed_process(df, key="user", function=BadOutput(), output_schema="user string, n long")
    with pytest.raises(Exception, match=r"output column 'n' is declared int64 .*'not a number'"):
        out.collect()


def test_savepoint_bootstraps_state_that_read_state_returns(any_spark: Any, tmp_path: Any) -> None:
    spark = any_spark
    df = spark.createDataFrame([(f"u{i % 5}", i) for i in range(50)], "user string, v long")
    savepoint = str(tmp_path / "sp")
    out = keyed_process(
        df,
        key="user",
        function=Count(),
        output_schema="user string, n long",
        parallelism=2,
        savepoint=savepoint,
    )
    assert out.count() == 50
    state = read_state(spark, savepoint, state="n")
    assert sorted((r.key, r.namespace, r.value) for r in state.collect()) == [
        (f"u{i}", None, 10) for i in range(5)
    ]
