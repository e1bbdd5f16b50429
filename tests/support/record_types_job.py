"""A job script whose record types are defined in the script itself, run as ``__main__`` by
``tests/spark/test_record_types.py`` (as a user runs ``python job.py``): nothing can import
these classes in a Spark worker, a state host or a Spark Connect server, so they travel by
value.

usage: python record_types_job.py <base directory> classic <driver JVM options>
       python record_types_job.py <base directory> connect <Spark Connect URL>

Writes two input files into ``<base>/in`` and runs, on a classic local session (or as a client
of the Connect server), a per-record job whose states hold the script's records — a
``msgspec.Struct`` value, a map from a frozen Struct to a dataclass, a list of dataclasses, an
enum and a named tuple — and whose outputs are dataclasses, once per backend; and a window
aggregate whose accumulator is a dataclass, in batch mode (folded before the shuffle in Spark's
Python workers) and streaming. Prints one JSON line: each run's outputs and the oracle's.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import sys
import typing
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from streamstate import (
    AggregateFunction,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from streamstate.spark import keyed_process
from streamstate.windows import ProcessWindowFunction, TumblingEventTimeWindows, window


class Stats(msgspec.Struct):
    n: int = 0
    total: int = 0


class Place(msgspec.Struct, frozen=True):
    name: str


@dataclasses.dataclass
class Visit:
    v: int
    at: Place


class Level(enum.Enum):
    LOW = 1
    HIGH = 2


class Pair(typing.NamedTuple):
    first: int
    last: int


@dataclasses.dataclass
class Alert:
    user: str
    n: int
    total: int
    places: int
    recent: int
    level: str
    first: int


@dataclasses.dataclass
class Acc:
    n: int
    total: int


@dataclasses.dataclass
class WindowTotal:
    user: str
    start: int
    n: int
    total: int


class Tracker(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.stats = ctx.get_state(ValueStateDescriptor("stats", Stats))
        self.places = ctx.get_map_state(MapStateDescriptor("places", Place, Visit))
        self.recent = ctx.get_list_state(ListStateDescriptor("recent", Visit))
        self.level = ctx.get_state(ValueStateDescriptor("level", Level))
        self.pair = ctx.get_state(ValueStateDescriptor("pair", Pair))

    def process_element(self, value: Any, ctx: Any) -> Any:
        user, v = value[0], value[1]
        old = self.stats.value() or Stats()
        stats = Stats(old.n + 1, old.total + v)
        self.stats.update(stats)
        place = Place(f"p{v % 3}")
        self.places.put(place, Visit(v, place))
        recent = [*self.recent.get(), Visit(v, place)][-3:]
        self.recent.update(recent)
        self.level.update(Level.HIGH if stats.total > 500 else Level.LOW)
        pair = self.pair.value()
        self.pair.update(Pair(v if pair is None else pair.first, v))
        yield Alert(
            user,
            stats.n,
            stats.total,
            len(list(self.places.keys())),
            len(recent),
            self.level.value().name,
            self.pair.value().first,
        )


class Totals(AggregateFunction):
    def create_accumulator(self) -> Acc:
        return Acc(0, 0)

    def add(self, value: Any, accumulator: Acc) -> Acc:
        return Acc(accumulator.n + 1, accumulator.total + value[1])

    def get_result(self, accumulator: Acc) -> Acc:
        return accumulator

    def merge(self, a: Acc, b: Acc) -> Acc:
        return Acc(a.n + b.n, a.total + b.total)


class Emit(ProcessWindowFunction):
    def process(self, key: Any, context: Any, elements: Any) -> Any:
        acc = next(iter(elements))
        yield WindowTotal(key, context.window().start, acc.n, acc.total)


SIZE = 100
USERS = ["ann", "bob", "cy", "dee"]
#: two micro-batches of (user, v, ts); the last record moves the watermark past every window
BATCHES = [
    [(USERS[i % 4], i * 7 % 50, i * 10) for i in range(40)],
    [*[(USERS[i % 3], i * 11 % 60, 400 + i * 10) for i in range(30)], ("ann", 1, 10_000)],
]


def oracle() -> dict[str, Any]:
    alerts, windows = [], {}
    stats: dict[str, list[Any]] = {}
    for user, v, ts in (r for rows in BATCHES for r in rows):
        s = stats.setdefault(user, [0, 0, set(), [], None])
        s[0], s[1] = s[0] + 1, s[1] + v
        s[2].add(v % 3)
        s[3] = [*s[3], v][-3:]
        s[4] = v if s[4] is None else s[4]
        level = "HIGH" if s[1] > 500 else "LOW"
        alerts.append([user, s[0], s[1], len(s[2]), len(s[3]), level, s[4]])
        if ts < 10_000:
            w = windows.setdefault((user, ts - ts % SIZE), [0, 0])
            w[0], w[1] = w[0] + 1, w[1] + v
    return {
        "alerts": sorted(alerts),
        "windows": sorted([u, s, n, t] for (u, s), (n, t) in windows.items()),
    }


def rows(frame: Any) -> list[list[Any]]:
    return sorted([list(r.values()) if isinstance(r, dict) else list(r) for r in frame])


def main() -> None:
    base = sys.argv[1]
    inputs = os.path.join(base, "in")
    os.makedirs(inputs)
    for i, batch in enumerate(BATCHES):
        path = os.path.join(inputs, f"part-{i}.parquet")
        users, vs, ts = zip(*batch, strict=True)
        pq.write_table(pa.table({"user": users, "v": pa.array(vs, pa.int64()), "ts": ts}), path)
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
    connect = sys.argv[2] == "connect"
    if connect:
        from streamstate.devtools.local_connect import connect_session

        spark = connect_session(sys.argv[3])
        backends = ["rocksdb"]
    else:
        from pyspark.sql import SparkSession

        spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.driver.extraJavaOptions", sys.argv[3])
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        backends = ["heap", "rocksdb"]

    def stream() -> Any:
        return (
            spark.readStream.schema("user string, v long, ts long")
            .option("maxFilesPerTrigger", 1)
            .parquet(inputs)
        )

    out: dict[str, Any] = {"oracle": oracle()}
    alert_schema = (
        "user string, n long, total long, places long, recent long, level string, first long"
    )
    for backend in backends:
        query = keyed_process(
            stream(),
            key="user",
            function=Tracker(),
            output_schema=alert_schema,
            checkpoint=os.path.join(base, f"ck-{backend}"),
            state_backend=backend,
        ).write_stream("memory", trigger={"availableNow": True})
        query.await_termination()
        out[f"alerts-{backend}"] = rows(query.sink.rows())
    window_schema = "user string, start long, n long, total long"
    windowed = window(TumblingEventTimeWindows.of(SIZE)).aggregate(Totals(), Emit())
    if not connect:  # the same Python workers run the fold through Connect
        static = spark.read.parquet(inputs).where("ts < 10000")
        batch = keyed_process(
            static, key="user", function=windowed, output_schema=window_schema, event_time="ts"
        )
        out["windows-batch"] = rows(batch.collect())
    query = keyed_process(
        stream(),
        key="user",
        function=windowed,
        output_schema=window_schema,
        event_time="ts",
        watermark_delay=0,
        checkpoint=os.path.join(base, "ck-windows"),
        state_backend=backends[-1],
    ).write_stream("memory", trigger={"availableNow": True})
    query.await_termination()
    out["windows-streaming"] = rows(query.sink.rows())
    print(json.dumps(out), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
