"""Streaming mode: micro-batches over a file source, exactly-once state and sinks, rescale."""

from __future__ import annotations

import os
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamstate.checkpoint.storage import FileSystemCheckpointStorage
from streamstate.demo import HOUR_MS, generate_events, page_views_per_hour
from streamstate.spark import FileSink, keyed_process, read_state
from streamstate.windows import TumblingEventTimeWindows, window
from support.spark_data import final_counts, make_batches, running_counts, write_batches
from support.spark_functions import Count, CountWithRecordLog, WindowSize

pytestmark = pytest.mark.spark


def _source(spark: Any, directory: str) -> Any:
    return (
        spark.readStream.schema("user string, v long")
        .option("maxFilesPerTrigger", 1)
        .parquet(directory)
    )


# both backends on the classic session; the Spark Connect client runs the same query and the
# same state hosts whichever the backend: once, on RocksDB (its incremental files, checked
# below, show that the backend chosen on the client is the one the hosts ran; the Connect
# client's heap queries are the rescaling and rollback tests')
@pytest.mark.parametrize(
    ("session", "state_backend"),
    [("spark", "heap"), ("spark", "rocksdb"), ("connect_spark", "rocksdb")],
)
def test_streaming_query_equals_a_pandas_oracle(
    request: Any, tmp_path: Any, session: str, state_backend: str
) -> None:
    spark = request.getfixturevalue(session)  # a classic session or a Spark Connect client
    batches = make_batches(4, 400, users=60)
    write_batches(str(tmp_path / "in"), batches)
    query = keyed_process(
        _source(spark, str(tmp_path / "in")),
        key="user",
        function=Count(),
        output_schema="user string, n long",
        checkpoint=str(tmp_path / "ck"),
        parallelism=2,
        state_backend=state_backend,
    ).write_stream("parquet", path=str(tmp_path / "out"), trigger={"availableNow": True})
    query.await_termination()
    assert [b["batch"] for b in query.batches] == [0, 1, 2, 3]
    assert [b["restore"] for b in query.batches] == [["empty"], ["hot"], ["hot"], ["hot"]]
    out = spark.read.parquet(str(tmp_path / "out")).toPandas()
    # the oracle: every record's running count, computed by brute force with pandas
    events = pd.DataFrame([r for rows in batches for r in rows], columns=["user", "v"])
    events["n"] = events.groupby("user").cumcount() + 1
    assert sorted(zip(out.user, out.n, strict=True)) == sorted(
        zip(events.user, events.n, strict=True)
    )
    assert sorted(out.batch.unique()) == [0, 1, 2, 3]
    state = read_state(spark, str(tmp_path / "ck"), state="n").collect()
    assert {r.key: r.value for r in state} == final_counts(batches)
    if state_backend == "rocksdb":
        # chk-1 uploaded only its batch's SST files and references chk-0's: the state hosts
        # were told that chk-0 was committed before batch 1 checkpointed
        storage = FileSystemCheckpointStorage(str(tmp_path / "ck"), "")
        chk1 = storage.load(1)
        subtasks = chk1.metadata.operators["keyed-process"].subtasks
        for sub in subtasks:
            written_by = {f.checkpoint_id for f in sub.keyed if f.kind == "rocksdb-sst"}
            assert written_by == {0, 1}, sub.keyed
        assert storage.problems(chk1, deep=True) == []


# each backend rescales its own state (heap entries, RocksDB's files): both, on the classic
# session; a Spark Connect client restarts the query the same way on either backend: once
@pytest.mark.parametrize(
    ("session", "state_backend"),
    [("spark", "heap"), ("spark", "rocksdb"), ("connect_spark", "heap")],
)
def test_restart_with_another_parallelism_rescales_state(
    request: Any, tmp_path: Any, session: str, state_backend: str
) -> None:
    spark = request.getfixturevalue(session)  # a classic session or a Spark Connect client
    batches = make_batches(6, 300, users=40, seed=7)
    sink = str(tmp_path / "out")
    for phase, parallelism in enumerate((2, 3, 1)):
        write_batches(str(tmp_path / "in"), batches[2 * phase : 2 * phase + 2], start=2 * phase)
        query = keyed_process(
            _source(spark, str(tmp_path / "in")),
            key="user",
            function=CountWithRecordLog(),
            output_schema="user string, n long, seen long",
            checkpoint=str(tmp_path / "ck"),
            parallelism=parallelism,
            state_backend=state_backend,
        ).write_stream("parquet", path=sink, trigger={"availableNow": True})
        query.await_termination()
        restores = [b["restore"] for b in query.batches]
        assert restores[0] == (["empty"] if phase == 0 else ["reload"]), restores
    out = FileSink(sink).read_arrow().to_pylist()
    assert sorted((r["user"], r["n"]) for r in out) == running_counts(batches)
    assert sorted({r["batch"] for r in out}) == list(range(6))
    # operator state (records seen per subtask) was redistributed 2 -> 3 -> 1: in the last phase
    # the single subtask holds every earlier subtask's count
    assert max(r["seen"] for r in out if r["batch"] == 5) == sum(len(b) for b in batches)
    state = read_state(spark, str(tmp_path / "ck"), state="n").collect()
    assert {r.key: r.value for r in state} == final_counts(batches)


@pytest.mark.parametrize(
    ("session", "no_data_batches"),
    [("spark", True), ("connect_spark", True), ("spark", False)],
)
def test_event_time_windows_fire_as_the_watermark_crosses_batches(
    request: Any, tmp_path: Any, session: str, no_data_batches: bool
) -> None:
    """With no-data micro-batches (the default) an ``availableNow`` run emits every window the
    watermark of the input it read closes (as Spark SQL's window aggregation in append mode
    does); without them, only those that the watermark of its last micro-batch with input
    closed, and the others at the next input."""
    spark = request.getfixturevalue(session)  # a classic session or a Spark Connect client
    # 8 files of 30 minutes each, read 4 per run; with a 45-minute delay the watermark of each
    # run's input (75 and 195 minutes) closes one hour more than its last micro-batch's did
    # (45 and 165 minutes)
    events = list(generate_events(4_000, apps=3, hours=4, disorder_ms=30_000))
    events.sort(key=lambda e: e[1])
    chunks = [events[i : i + 500] for i in range(0, len(events), 500)]
    directory = str(tmp_path / "in")
    os.makedirs(directory)
    results = []
    for half in (0, 1):  # stop after 4 files and restart: the watermark resumes from the checkpoint
        for i in range(4 * half, 4 * half + 4):
            chunk = chunks[i]
            path = os.path.join(directory, f"part-{i:04d}.parquet")
            pq.write_table(
                pa.table({"app": [a for a, _ in chunk], "ts": pa.array([t for _, t in chunk])}),
                path,
            )
            # Spark's file source orders files by modification time: equal stamps would
            # let a later file overtake an earlier one and close its hour too soon.
            os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
        src = (
            spark.readStream.schema("app string, ts long")
            .option("maxFilesPerTrigger", 1)
            .parquet(directory)
        )
        query = keyed_process(
            src,
            key="app",
            function=page_views_per_hour(),
            output_schema="app string, hour long, views long",
            event_time="ts",
            watermark_delay=2_700_000,
            checkpoint=str(tmp_path / "ck"),
            parallelism=2,
        ).write_stream("memory", trigger={"availableNow": True}, no_data_batches=no_data_batches)
        query.await_termination()
        assert [b["batch"] for b in query.batches if not b["no_data"]] == list(
            range(4 * half, 4 * half + 4)
        )
        results += [(r["app"], r["hour"], r["views"]) for r in query.sink.rows()]
        seen = [ts for _, ts in events[: 2000 * (half + 1)]]
        if no_data_batches:  # the run ended on the watermark of everything it read
            assert query.batches[-1]["no_data"]
            assert query.batches[-1]["watermark"] == max(seen) - 2_700_000 - 1
        else:
            assert not any(b["no_data"] for b in query.batches)
    watermark = query.batches[-1]["watermark"]
    expected: dict[tuple[str, int], int] = {}
    for app, ts in events:
        expected[(app, ts // HOUR_MS)] = expected.get((app, ts // HOUR_MS), 0) + 1
    fired = {k: v for k, v in expected.items() if (k[1] + 1) * HOUR_MS - 1 <= watermark}
    assert fired and len(fired) < len(expected)  # some hours closed, the last one is open
    assert sorted(results) == sorted((a, h, v) for (a, h), v in fired.items())


@pytest.mark.parametrize("state_backend", ["heap", "rocksdb"])
def test_windows_fire_after_a_restart_on_a_batch_that_only_advances_the_watermark(
    spark: Any, tmp_path: Any, state_backend: str
) -> None:
    # no element_type: the restarted query's state hosts reload the window contents and must
    # get their element serializer from the checkpoint, as the watermark fires them first
    directory = str(tmp_path / "in")
    results = []
    for phase, batches in enumerate(([[("a", 1), ("b", 2), ("a", 5)], [("a", 30)]], [[("c", 31)]])):
        write_batches(directory, batches, start=2 * phase)
        query = keyed_process(
            _source(spark, directory),
            key="user",
            function=window(TumblingEventTimeWindows.of(10)).process(WindowSize()),
            output_schema="user string, start long, n long",
            event_time="v",
            watermark_delay=0,
            checkpoint=str(tmp_path / "ck"),
            parallelism=2,
            state_backend=state_backend,
        ).write_stream(
            # with no-data micro-batches the watermark of phase 0 would fire the windows at
            # once: the restart's path is the one without them
            "memory",
            trigger={"availableNow": True},
            no_data_batches=False,
        )
        query.await_termination()
        results.append(sorted((r["user"], r["start"], r["n"]) for r in query.sink.rows()))
        if phase == 1:
            assert [b["restore"] for b in query.batches] == [["reload"]]
    assert results == [[], [("a", 0, 2), ("b", 0, 1)]]
