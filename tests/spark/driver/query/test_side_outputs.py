"""Side outputs on Spark: a window's late data goes to a second exactly-once sink, dropped late
elements are counted per micro-batch, and a replayed batch delivers its side output again (with
the no-data micro-batches between the input's, which deliver none)."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamstate import OutputTag
from streamstate.spark import FileSink, MemorySink, keyed_process
from streamstate.spark.driver.session import is_connect
from streamstate.windows import ProcessWindowFunction, TumblingEventTimeWindows, window

pytestmark = pytest.mark.spark

LATE = OutputTag("late")
SIZE, LATENESS = 10, 5

# micro-batch b's watermark is the largest event time of the batches before it, minus 1
BATCHES = [
    [("a", 1), ("b", 3), ("a", 12), ("b", 30)],
    [("a", 4), ("a", 25), ("b", 31), ("a", 60)],  # watermark 29: a@4 is late ([0,10) + 5 <= 29)
    [("b", 2), ("a", 49), ("b", 44), ("a", 61), ("b", 90)],  # watermark 59: b@2, a@49, b@44 late
    [("a", 85), ("b", 89), ("a", 50)],  # watermark 89: a@50 late; a@85 and b@89 are not
]


class Summary(ProcessWindowFunction):
    def process(self, key, context, elements):
        w = context.window()
        yield key, w.start, len(list(elements))


def _write(directory: str) -> None:
    os.makedirs(directory)
    for i, rows in enumerate(BATCHES):
        path = os.path.join(directory, f"part-{i:04d}.parquet")
        table = pa.table({"k": [k for k, _ in rows], "ts": pa.array([t for _, t in rows])})
        pq.write_table(table, path)
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))  # the source orders by mtime


def _oracle() -> tuple[list[list[tuple[str, int]]], Counter]:
    """Per batch the late records (every window of the record is past its cleanup time when
    the batch starts), and the windows' final contents (windows fire again on late-but-allowed
    records; the last firing has the count)."""
    watermark, top = -(1 << 63), -(1 << 63)
    late, counts = [], Counter()
    for rows in BATCHES:
        watermark = max(watermark, top - 1)
        batch_late = []
        for k, t in rows:
            start = t - t % SIZE
            if start + SIZE - 1 + LATENESS <= watermark:
                batch_late.append((k, t))
            else:
                counts[(k, start)] += 1
        late.append(batch_late)
        top = max(top, *(t for _, t in rows))
    return late, counts


def _windows(with_late_tag: bool) -> Any:
    spec = window(TumblingEventTimeWindows.of(SIZE)).allowed_lateness(LATENESS)
    if with_late_tag:
        spec = spec.side_output_late_data(LATE)
    return spec.process(Summary(), element_type=tuple[str, int])


def _source(spark: Any, directory: str) -> Any:
    return (
        spark.readStream.schema("k string, ts long")
        .option("maxFilesPerTrigger", 1)
        .parquet(directory)
    )


class Recording(MemorySink):
    """Records every delivery (a replay delivers a batch again)."""

    def __init__(self) -> None:
        super().__init__()
        self.deliveries: list[tuple[int, int]] = []

    def write(self, batch: Any) -> None:
        super().write(batch)
        self.deliveries.append((batch.batch_id, batch.rows))


def test_late_data_goes_to_a_side_sink_exactly_once(any_spark: Any, tmp_path: Any) -> None:
    spark = any_spark
    _write(str(tmp_path / "in"))
    late, counts = _oracle()
    late_path = str(tmp_path / "late")

    def start(side_sink: Any) -> Any:
        query = keyed_process(
            _source(spark, str(tmp_path / "in")),
            key="k",
            function=_windows(with_late_tag=True),
            output_schema="k string, start long, n long",
            checkpoint=str(tmp_path / "ck"),
            event_time="ts",
            watermark_delay=0,
            parallelism=2,
            side_outputs={LATE: "k string, ts long"},
        ).write_stream(
            "parquet",
            path=str(tmp_path / "out"),
            trigger={"availableNow": True},
            side_sinks={LATE: side_sink},
        )
        query.await_termination()
        return query

    query = start(("parquet", late_path))
    # the watermark after micro-batches 0, 1 and 2 closes windows: a no-data micro-batch each
    steps = [(b["batch"], b["checkpoint"], b["no_data"]) for b in query.batches]
    assert steps == [
        (0, 0, False), (0, 1, True), (1, 2, False), (1, 3, True), (2, 4, False), (2, 5, True),
        (3, 6, False),
    ]  # fmt: skip
    checkpoint_of = {b: c for b, c, no_data in steps if not no_data}
    assert [b["side_output_rows"] for b in query.batches] == [
        {"late": 0 if no_data else len(late[b])} for b, _, no_data in steps
    ]
    assert [b["late_records_dropped"] for b in query.batches] == [0] * len(steps)
    got = FileSink(late_path).read_arrow().to_pylist()  # its batches are checkpoint ids
    assert sorted((r["batch"], r["k"], r["ts"]) for r in got) == sorted(
        (checkpoint_of[b], k, t) for b, rows in enumerate(late) for k, t in rows
    )
    assert sum(map(len, late)) == 5  # the data does have late records
    out = FileSink(str(tmp_path / "out")).read_arrow().to_pylist()
    final = {}
    for r in sorted(out, key=lambda r: r["batch"]):
        final[(r["k"], r["start"])] = r["n"]
    fired = {kw: n for kw, n in counts.items() if kw[1] + SIZE - 1 <= 89}  # closed by then
    assert {kw: n for kw, n in final.items() if kw in fired} == fired

    # Spark replays the last batch (its commit is lost): the state is not recomputed and the
    # side sink gets the same staged late data again
    commits = tmp_path / "ck" / "spark" / "commits"
    for name in ("3", ".3.crc"):  # Hadoop's checksum file too, or Spark sees a concurrent writer
        if (commits / name).exists():
            os.remove(commits / name)
    replay_sink = Recording()
    again = start(replay_sink)
    assert [b["replayed"] for b in again.batches] == [True]
    assert [b["side_output_rows"] for b in again.batches] == [{"late": len(late[3])}]
    if not is_connect(spark):  # a Connect query's sinks deliver in the server's process
        assert replay_sink.deliveries == [(checkpoint_of[3], len(late[3]))]
    assert [(r["k"], r["ts"]) for r in replay_sink.rows()] == late[3]


def test_dropped_late_records_are_counted_per_batch(spark: Any, tmp_path: Any) -> None:
    _write(str(tmp_path / "in"))
    late, _ = _oracle()
    query = keyed_process(
        _source(spark, str(tmp_path / "in")),
        key="k",
        function=_windows(with_late_tag=False),
        output_schema="k string, start long, n long",
        checkpoint=str(tmp_path / "ck"),
        event_time="ts",
        watermark_delay=0,
        parallelism=2,
        state_backend="rocksdb",
    ).write_stream("memory", trigger={"availableNow": True})
    query.await_termination()
    data = [b for b in query.batches if not b["no_data"]]
    assert [b["late_records_dropped"] for b in data] == [len(x) for x in late]
    assert [b["late_records_dropped"] for b in query.batches if b["no_data"]] == [0, 0, 0]
    assert [b["side_outputs_dropped"] for b in query.batches] == [0] * 7


def test_side_output_declarations_are_checked(spark: Any, tmp_path: Any) -> None:
    df = spark.createDataFrame([("a", 1)], "k string, ts long")
    with pytest.raises(ValueError, match="side_outputs= is for streaming"):
        keyed_process(
            df,
            key="k",
            function=_windows(True),
            output_schema="k string, start long, n long",
            side_outputs={LATE: "k string, ts long"},
        )
    _write(str(tmp_path / "in"))
    stream = keyed_process(
        _source(spark, str(tmp_path / "in")),
        key="k",
        function=_windows(True),
        output_schema="k string, start long, n long",
        checkpoint=str(tmp_path / "ck"),
        side_outputs={LATE: "k string, ts long"},
    )
    with pytest.raises(ValueError, match=r"side outputs \['late'\] .* have no sink"):
        stream.write_stream("memory")
    with pytest.raises(ValueError, match="'other', which keyed_process"):
        stream.write_stream("memory", side_sinks={LATE: "memory", OutputTag("other"): "memory"})
