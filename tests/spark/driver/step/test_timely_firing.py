"""No-data micro-batches on Spark (SPEC §13.1): a running query whose input stops closes its last
window without more input, a processing-time timer fires while the input is idle, a driver
killed inside a no-data micro-batch loses and duplicates nothing, and a rollback to a no-data
checkpoint or to the one before it re-runs exactly once. (The ``availableNow`` oracle test and
the option turned off: ``test_streaming.py``; the rule itself: ``test_no_data.py``.)"""

from __future__ import annotations

import os
import time
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from streamstate.checkpoint.storage import FileSystemCheckpointStorage
from streamstate.cli import app
from streamstate.spark import FileSink, keyed_process
from streamstate.windows import TumblingEventTimeWindows, window
from support.killed_driver import processes_naming, run_until_killed, start_driver
from support.spark_functions import (
    Boom,
    FailingReminder,
    RemindLater,
    WindowSize,
    WindowSizeWithSleep,
)
from support.stream_query import restart

pytestmark = pytest.mark.spark

W = 10  # window size (ms of event time)
USERS = ("a", "b", "c")


def _window_files(directory: str, first: int, last: int) -> list[tuple[str, int]]:
    """Files ``first..last``: file ``i`` holds event times ``i*W .. (i+1)*W`` (the last one
    belongs to the next window, so with watermark delay 0 the watermark after file ``i``
    closes window ``i``). Returns every event written."""
    os.makedirs(directory, exist_ok=True)
    events = []
    for i in range(first, last + 1):
        rows = [(USERS[t % 3], t) for t in range(i * W, (i + 1) * W + 1)]
        events += rows
        path = os.path.join(directory, f"part-{i:04d}.parquet")
        pq.write_table(
            pa.table({"user": [u for u, _ in rows], "v": pa.array([t for _, t in rows])}), path
        )
        os.utime(path, (1_700_000_000 + 10 * i, 1_700_000_000 + 10 * i))
    return events


def _closed(events: list[tuple[str, int]]) -> list[tuple[str, int, int]]:
    """The oracle: (user, window start, count) of every window the watermark after ``events``
    closes (delay 0: the watermark is the largest event time - 1)."""
    watermark = max(t for _, t in events) - 1
    counts: dict[tuple[str, int], int] = {}
    for user, t in events:
        counts[(user, t - t % W)] = counts.get((user, t - t % W), 0) + 1
    return sorted((u, s, n) for (u, s), n in counts.items() if s + W - 1 <= watermark)


def _windows_query(
    spark: Any, tmp_path: Any, sink: Any = "memory", retained: int = 3, **write: Any
) -> Any:
    return keyed_process(
        spark.readStream.schema("user string, v long")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(tmp_path / "in")),
        key="user",
        function=window(TumblingEventTimeWindows.of(W)).process(WindowSize()),
        output_schema="user string, start long, n long",
        event_time="v",
        watermark_delay=0,
        checkpoint=str(tmp_path / "ck"),
        parallelism=2,
        retained_checkpoints=retained,
    ).write_stream(sink, **write)


def test_a_running_query_closes_the_last_window_when_its_input_stops(
    spark: Any, tmp_path: Any
) -> None:
    events = _window_files(str(tmp_path / "in"), 0, 2)
    query = _windows_query(spark, tmp_path, trigger={"processingTime": "1 second"})
    try:
        query.process_all_available()  # three input files, then no more input
        got = sorted((r["user"], r["start"], r["n"]) for r in query.sink.rows())
        assert got == _closed(events)  # window 2 too, which only the last watermark closes
        assert {s for _, s, _ in got} == {0, 10, 20}
        steps = [(b["batch"], b["checkpoint"], b["no_data"]) for b in query.batches]
        assert steps == [
            (0, 0, False), (0, 1, True), (1, 2, False), (1, 3, True), (2, 4, False), (2, 5, True),
        ]  # fmt: skip
        # each no-data micro-batch ran in the foreachBatch call of the micro-batch it follows,
        # right after its step: before Spark's next trigger, without waiting for input
        last = query.batches[-1]
        assert (last["due"], last["idle"], last["rows"]) == ("event time", False, 0)
        assert last["restore"] == ["hot"]
    finally:
        query.stop()


def _reminders(
    spark: Any, tmp_path: Any, function: Any, interval: float, sink: Any = "memory", **write: Any
) -> Any:
    directory = tmp_path / "in"
    if not directory.exists():
        os.makedirs(directory)
        table = pa.table({"user": ["a", "b", "a"], "v": pa.array([1, 2, 3])})
        pq.write_table(table, directory / "0.parquet")
    return keyed_process(
        spark.readStream.schema("user string, v long").parquet(str(directory)),
        key="user",
        function=function,
        output_schema="user string, what string, n long",
        checkpoint=str(tmp_path / "ck"),
        parallelism=2,
    ).write_stream(sink, trigger={"processingTime": f"{interval} seconds"}, **write)


@pytest.mark.parametrize("session", ["spark", "connect_spark"])
def test_a_processing_time_timer_fires_while_the_input_is_idle(
    request: Any, tmp_path: Any, session: str
) -> None:
    """Spark calls foreachBatch only with input: the idle ticker (under Spark Connect, in the
    server's foreachBatch process) runs the no-data micro-batch that fires the timers."""
    spark = request.getfixturevalue(session)
    interval = 1.0
    query = _reminders(spark, tmp_path, RemindLater(1_500), interval)
    try:
        deadline = time.monotonic() + 90
        while not any(r["what"] == "reminder" for r in query.sink.rows()):
            assert time.monotonic() < deadline, query.batches
            query.await_termination(0.3)  # Spark Connect: loads what the server delivered
        time.sleep(2 * interval)  # nothing more is due: no other no-data micro-batch runs
        query.await_termination(0.1)
        rows = sorted(tuple(r.values()) for r in query.sink.rows())
        assert rows == [
            ("a", "reminder", 2),
            ("a", "seen", 1),
            ("a", "seen", 2),
            ("b", "reminder", 1),
            ("b", "seen", 1),
        ]
        idle = [b for b in query.batches if b["no_data"]]
        assert len(idle) == 1, query.batches
        assert (idle[0]["idle"], idle[0]["due"], idle[0]["batch"]) == (True, "processing time", 0)
        storage = FileSystemCheckpointStorage(str(tmp_path / "ck"), "")
        before = storage.load(idle[0]["checkpoint"] - 1).metadata
        after = storage.load(idle[0]["checkpoint"]).metadata.properties
        assert after["no_data"] and "during_batch" not in after and after["batch_id"] == 0
        # it ran once the timers were due and the micro-batch before it had ended (committed),
        # within a trigger interval (plus a loaded machine's slack)
        due_at = max(before.properties["processing_timer"], before.timestamp)
        late_ms = after["processing_time"] - due_at
        assert 0 <= late_ms <= interval * 1000 + 3000, late_ms
        assert after["processing_timer"] is None
    finally:
        query.stop()
    assert storage.checkpoint_ids()[-1] == idle[0]["checkpoint"]


@pytest.mark.parametrize("session", ["spark", "connect_spark"])
def test_a_timer_that_fails_in_an_idle_micro_batch_fails_the_query(
    request: Any, tmp_path: Any, session: str
) -> None:
    """The function's error, with its notes, stops the query (a Spark Connect server's ticker
    cannot stop it: the client does when it waits on the query)."""
    spark = request.getfixturevalue(session)
    query = _reminders(spark, tmp_path, FailingReminder(500), 0.5)
    with pytest.raises(Boom, match="reminder of '[ab]' failed") as info:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            query.await_termination(0.5)
    assert any("on_timer of key" in n for n in getattr(info.value, "__notes__", ()))
    assert not query.is_active
    assert [b["no_data"] for b in query.batches] == [False]  # the failed one is not committed
    storage = FileSystemCheckpointStorage(str(tmp_path / "ck"), "")
    assert storage.latest_checkpoint().checkpoint_id == 0


class FailsOnNoData(FileSink):
    """A parquet sink that fails to deliver a no-data micro-batch (the driver went down)."""

    def write(self, batch: Any) -> None:
        if batch.no_data:
            raise ConnectionError(f"delivery of checkpoint {batch.batch_id} failed")
        super().write(batch)


def test_an_idle_micro_batch_whose_delivery_failed_is_delivered_by_the_next_run(
    spark: Any, tmp_path: Any
) -> None:
    """The idle ticker's micro-batch is not covered by Spark's commit of the micro-batch it
    follows: when its delivery did not happen, the next run delivers it at its first look,
    with no input, once."""
    out = str(tmp_path / "out")
    first = _reminders(spark, tmp_path, RemindLater(500), 0.5, FailsOnNoData(out))
    with pytest.raises(ConnectionError, match=r"delivery of checkpoint 1 failed"):
        first.await_termination(90)
    storage = FileSystemCheckpointStorage(str(tmp_path / "ck"), "")
    assert storage.latest_checkpoint().metadata.properties["no_data"] is True  # committed
    sink = FileSink(out)
    assert sink.committed_batches() == [0]
    second = _reminders(spark, tmp_path, RemindLater(500), 0.5, "parquet", path=out)
    try:
        deadline = time.monotonic() + 60
        while sink.committed_batches() != [0, 1]:
            assert time.monotonic() < deadline, second.batches
            time.sleep(0.2)
    finally:
        second.stop()
    assert [(b["checkpoint"], b["no_data"], b["replayed"]) for b in second.batches] == [
        (1, True, True)
    ]
    rows = sorted((r["user"], r["what"], r["n"], r["batch"]) for r in sink.read_arrow().to_pylist())
    assert rows == [
        ("a", "reminder", 2, 1),
        ("a", "seen", 1, 0),
        ("a", "seen", 2, 0),
        ("b", "reminder", 1, 1),
        ("b", "seen", 1, 0),
    ]


def test_a_driver_killed_inside_a_no_data_micro_batch_loses_and_duplicates_nothing(
    spark: Any, tmp_path: Any
) -> None:
    """The driver is SIGKILLed while a state host fires a window inside a no-data micro-batch
    (after its micro-batch's step was committed and delivered, before Spark's commit); the
    restarted query replays that micro-batch and runs the no-data one again from the committed
    step. (A kill after a commit, before Spark's: test_failures.py; the same replay delivers
    every checkpoint of the micro-batch: test_no_data.py.)"""
    # 4 files: micro-batch i is checkpoint 2i (its input) and 2i + 1 (no-data: window i)
    events = _window_files(str(tmp_path / "in"), 0, 3)
    checkpoint = str(tmp_path / "ck")
    marker = str(tmp_path / "inside")
    cfg = {
        "input": str(tmp_path / "in"),
        "checkpoint": checkpoint,
        "sink": str(tmp_path / "out"),
        "parallelism": 2,
        "window": W,
        "fault_marker": marker,
        "sleep_at_window": W,  # window 1: fired by checkpoint 3, micro-batch 1's no-data one
    }
    start = str(tmp_path / "start-0")
    first = start_driver(cfg, str(tmp_path / "cfg-0.json"), start)
    try:
        # killed while a host fires window 1 inside the no-data micro-batch (checkpoint 3)
        lines = run_until_killed(first, start, lambda ls: os.path.exists(marker), checkpoint)
        assert "BATCH 2" in lines and "BATCH 3" not in lines
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    # restart (in this process's session: a second driver process only adds a JVM start) and
    # run to the end
    delivered = restart(
        spark,
        cfg,
        window(TumblingEventTimeWindows.of(W)).process(WindowSizeWithSleep(W, marker)),
        output_schema="user string, start long, n long",
        event_time="v",
        watermark_delay=0,
    )
    # Spark replayed micro-batch 1: its step (checkpoint 2) was delivered again (the sink kept
    # the first copy), its no-data micro-batch ran again from it, then micro-batches 2 and 3
    assert delivered == list(range(2, 8))
    sink = FileSink(cfg["sink"])
    assert sink.committed_batches() == list(range(8))
    out = sink.read_arrow().to_pylist()
    assert sorted((r["user"], r["start"], r["n"]) for r in out) == _closed(events)  # once each
    assert sorted({r["batch"] for r in out}) == [1, 3, 5, 7]  # windows fire in no-data ones
    storage = FileSystemCheckpointStorage(checkpoint, "")
    latest = storage.latest_checkpoint(deep=True)
    assert latest.checkpoint_id == 7 and latest.metadata.properties["no_data"] is True
    left = processes_naming(checkpoint)
    assert not left, left


def test_rollback_to_a_no_data_checkpoint_and_to_the_one_before_it(
    spark: Any, tmp_path: Any
) -> None:
    ck = tmp_path / "ck"
    out = str(tmp_path / "out")
    once = {"path": out, "trigger": {"availableNow": True}, "retained": 6}
    events = _window_files(str(tmp_path / "in"), 0, 1)
    _windows_query(spark, tmp_path, "parquet", **once).await_termination()
    events += _window_files(str(tmp_path / "in"), 2, 2)
    _windows_query(spark, tmp_path, "parquet", **once).await_termination()
    storage = FileSystemCheckpointStorage(str(ck), "")
    assert [storage.load(c).metadata.properties.get("no_data", False) for c in range(2, 6)] == [
        False,
        True,
        False,
        True,
    ]

    def run_after_rollback(to: int, *, with_sink: bool) -> list[tuple[int, int, bool]]:
        args = ["checkpoints", "rollback", str(ck), "--to", str(to), "--yes"]
        if with_sink:
            args += ["--sink", out]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        assert "re-run micro-batch 2" in " ".join(result.output.split())
        query = _windows_query(spark, tmp_path, "parquet", **once)
        query.await_termination()
        sink = FileSink(out)
        got = sorted((r["user"], r["start"], r["n"]) for r in sink.read_arrow().to_pylist())
        assert got == _closed(events)  # once each
        assert sink.committed_batches() == list(range(6))
        return [(b["batch"], b["checkpoint"], b["no_data"]) for b in query.batches]

    # chk-3 is micro-batch 1's no-data checkpoint: Spark re-runs micro-batch 2 from it
    assert run_after_rollback(3, with_sink=True) == [(2, 4, False), (2, 5, True)]
    # chk-2 is micro-batch 1's own step; the no-data micro-batch it owes runs first, as
    # checkpoint 3 again: without --sink, the sink's first deliveries stay and are the same
    assert run_after_rollback(2, with_sink=False) == [(1, 3, True), (2, 4, False), (2, 5, True)]
