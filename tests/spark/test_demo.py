"""The main job on Spark (``streamstate demo``): two runs, the second resumes from the first's
checkpoint; the closed hours equal a brute-force count over every generated view."""

from __future__ import annotations

import io
import os
import shutil
from collections import Counter
from typing import Any

import pyarrow.parquet as pq
import pytest
from rich.console import Console

from streamstate.demo import HOUR_MS, run_streaming

pytestmark = pytest.mark.spark


def _brute_force(directory: str) -> Counter[tuple[str, int]]:
    table = pq.read_table(os.path.join(directory, "input"))
    return Counter(
        (app, ts // HOUR_MS)
        for app, ts in zip(table["app"].to_pylist(), table["ts"].to_pylist(), strict=True)
    )


def test_demo_resumes_from_its_checkpoint_and_counts_every_view(
    spark: Any, tmp_path: Any, caplog: Any
) -> None:
    """The second run resumes the heap backend's checkpoint on the heap, and from the same
    first run (its directory put back) on RocksDB, and says so once (the backend's own warning
    does not reach the terminal's log as well)."""
    directory = str(tmp_path / "demo")
    out = io.StringIO()
    # 5 micro-batches of 20 minutes of event time per run, watermark delay 5 minutes: the first
    # run closes hour 0 (in the no-data micro-batch after micro-batch 3, whose input moved the
    # watermark past it) and ends inside hour 1, which the second run closes from its restored
    # state (after micro-batch 6); the watermark of its input (195 minutes) closes hour 2 too
    first = run_streaming(
        directory, events=1_000, batches=5, spark=spark, console=Console(file=out, width=160)
    )
    assert first.resumed_from is None and first.checkpoint_id == 5
    assert [b["restore"] for b in first.batches] == [["empty"]] + [["hot"]] * 5
    assert [b["batch"] for b in first.batches if b["no_data"]] == [3]
    first_input = _brute_force(directory)
    # a copy of the first run's directory for the run on RocksDB: it goes back to the same
    # path (Spark's logs in the checkpoint name the input files); copy2 keeps the files' times
    shutil.copytree(directory, tmp_path / "first-run", symlinks=True)
    for second_backend in ("heap", "rocksdb"):
        if second_backend == "rocksdb":
            shutil.rmtree(directory)
            os.rename(tmp_path / "first-run", directory)
            caplog.clear()  # the first run's records were checked with the heap run's
        _second_run(spark, directory, first, first_input, out.getvalue(), second_backend, caplog)


def _second_run(
    spark: Any,
    directory: str,
    first: Any,
    first_input: Counter[tuple[str, int]],
    first_output: str,
    second_backend: str,
    caplog: Any,
) -> None:
    """The second run on ``second_backend``, checked on what the first run and it printed."""
    out = io.StringIO(first_output)
    out.seek(0, io.SEEK_END)
    second = run_streaming(
        directory,
        events=1_000,
        batches=5,
        spark=spark,
        console=Console(file=out, width=160),
        state_backend=second_backend,
    )
    assert "resuming from checkpoint 5" in out.getvalue()
    switched = "switching backends: the heap backend's checkpoint is restored into the rocksdb"
    assert out.getvalue().count(switched) == (second_backend == "rocksdb")
    assert not [r for r in caplog.records if "was checkpointed by the" in r.getMessage()]
    assert "generated 1,000 page views of 5 apps in 5 input files" in out.getvalue()
    assert second.resumed_from == 5 and second.checkpoint_id == 12
    steps = [(b["batch"], b["checkpoint"], b["no_data"]) for b in second.batches]
    assert steps == [
        (5, 6, False), (6, 7, False), (6, 8, True), (7, 9, False), (8, 10, False), (9, 11, False),
        (9, 12, True),
    ]  # fmt: skip
    assert second.batches[0]["restore"] == ["reload"]  # a new query: hosts load checkpoint 4
    assert second.processed == 1_000 and second.state_backend == second_backend

    views = _brute_force(directory)
    closed = {k: n for k, n in views.items() if (k[1] + 1) * HOUR_MS - 1 <= second.watermark}
    assert sorted(second.results) == sorted((app, hour, n) for (app, hour), n in closed.items())
    assert set(first.results) < set(second.results)
    hours = sorted({h for _, h, _ in second.results})
    assert len(hours) == 3 and len(closed) < len(views)  # the last hour is still open
    # hour 1 was counted across both runs: part of it came from the first run's state
    second_hour = hours[1]
    assert all(first_input[(a, second_hour)] > 0 for a, h, _ in second.results if h == hours[1])
    assert {(a, h) for a, h, _ in second.results if h == second_hour} <= second.new
    assert "new (resumed from checkpoint 5)" in out.getvalue()
