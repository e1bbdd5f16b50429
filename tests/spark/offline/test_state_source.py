"""Format ``streamstate`` against a model of the state: every kind of keyed state, records as
structs, tuples, timers, window namespaces, on the heap (full and incremental checkpoints) and
RocksDB, read without the job's classes (their module is gone when the checkpoint is read).

The reads run the reader Spark runs (``offline_reads``), without Spark; tests/spark/
test_read_state.py runs the same format in Spark and through ``read_state``.
"""

from __future__ import annotations

import dataclasses
import random
import sys
import types
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from offline_reads import plain, read_rows

from streamstate import (
    AggregateFunction,
    AggregatingStateDescriptor,
    KeyedProcessFunction,
    ListStateDescriptor,
    LocalRunner,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from streamstate.checkpoint.storage import FileSystemCheckpointStorage
from streamstate.errors import CheckpointError

BACKENDS = [("heap", False), ("heap", True), ("rocksdb", True)]
MODULE = "offline_job_types"


def _job_types() -> types.ModuleType:
    """A module of record types the job declares (imported while the job runs, gone when the
    checkpoint is read)."""
    module = types.ModuleType(MODULE)

    @dataclasses.dataclass
    class Visit:
        page: str
        n: int
        tags: list[str] = dataclasses.field(default_factory=list)

    class Mean(msgspec.Struct):
        total: float = 0.0
        count: int = 0

    class Point(msgspec.Struct, array_like=True):
        x: int
        y: float | None = None

    for cls in (Visit, Mean, Point):
        cls.__module__ = MODULE
        cls.__qualname__ = cls.__name__
        setattr(module, cls.__name__, cls)
    return module


class MeanOf(AggregateFunction):
    def __init__(self, mean: Any) -> None:
        self.mean = mean

    def create_accumulator(self) -> Any:
        return self.mean()

    def add(self, value: Any, acc: Any) -> Any:
        return self.mean(acc.total + value, acc.count + 1)

    def get_result(self, acc: Any) -> Any:
        return acc.total / acc.count

    def merge(self, a: Any, b: Any) -> Any:
        return self.mean(a.total + b.total, a.count + b.count)


class AllKinds(KeyedProcessFunction):
    """Per user, for a record ``(user, page, ts)``: the last visit (a record), the pages (a
    list), visits per page (a map), the sum of page lengths (reducing), their mean (aggregating,
    a record accumulator), points (a list of array-like records), a tuple, and an event-time
    timer at ``ts + 100``."""

    def __init__(self, job: types.ModuleType) -> None:
        # the classes, not the module (each subtask gets a deep copy of the function)
        self.job = types.SimpleNamespace(Visit=job.Visit, Mean=job.Mean, Point=job.Point)

    def open(self, ctx: Any) -> None:
        job = self.job
        self.last = ctx.get_state(ValueStateDescriptor("last", job.Visit))
        self.pages = ctx.get_list_state(ListStateDescriptor("pages", str))
        self.per_page = ctx.get_map_state(MapStateDescriptor("per-page", str, int))
        self.total = ctx.get_reducing_state(
            ReducingStateDescriptor("total", lambda a, b: a + b, int)
        )
        self.mean = ctx.get_aggregating_state(
            AggregatingStateDescriptor("mean", MeanOf(job.Mean), job.Mean)
        )
        self.points = ctx.get_list_state(ListStateDescriptor("points", job.Point))
        self.pair = ctx.get_state(ValueStateDescriptor("pair", tuple[str, int]))

    def process_element(self, value: Any, ctx: Any) -> Any:
        _, page, ts = value
        last = self.last.value()
        n = 1 if last is None else last.n + 1
        self.last.update(self.job.Visit(page, n, [page[:2]] * (n % 3)))
        self.pages.add(page)
        self.per_page.put(page, (self.per_page.get(page) or 0) + 1)
        self.total.add(len(page))
        self.mean.add(len(page))
        self.points.add(self.job.Point(ts, None if ts % 2 else ts / 2))
        self.pair.update((page, ts))
        ctx.timer_service().register_event_time_timer(ts + 100)
        return None


def _records(n: int, seed: int) -> list[tuple[str, str, int]]:
    rng = random.Random(seed)
    return [(f"u{rng.randrange(12)}", f"/p{rng.randrange(5)}", i * 10) for i in range(n)]


def _model(records: list[tuple[str, str, int]]) -> dict[str, dict[str, Any]]:
    """What every state holds after ``records``, per state and user (the rows' values)."""
    out: dict[str, dict[str, Any]] = defaultdict(dict)
    per_page: dict[str, Counter[str]] = defaultdict(Counter)
    for user, page, ts in records:
        n = out["last"].get(user, {"n": 0})["n"] + 1
        out["last"][user] = {"page": page, "n": n, "tags": [page[:2]] * (n % 3)}
        out["pages"].setdefault(user, []).append(page)
        per_page[user][page] += 1
        out["per-page"][user] = dict(per_page[user])
        out["total"][user] = out["total"].get(user, 0) + len(page)
        mean = out["mean"].get(user, {"total": 0.0, "count": 0})
        out["mean"][user] = {"total": mean["total"] + len(page), "count": mean["count"] + 1}
        point = {"x": ts, "y": None if ts % 2 else ts / 2}
        out["points"].setdefault(user, []).append(point)
        out["pair"][user] = {"_1": page, "_2": ts}
    return out


def _timers_model(records: list[tuple[str, str, int]], watermark: int) -> list[tuple[str, int]]:
    """The timers still pending at ``watermark`` (one per user and timestamp)."""
    return sorted({(u, ts + 100) for u, _, ts in records if ts + 100 > watermark})


@pytest.fixture(scope="module", params=BACKENDS, ids=lambda b: f"{b[0]}{'-inc' if b[1] else ''}")
def job(request: Any, tmp_path_factory: Any) -> Iterator[tuple[str, list[Any]]]:
    """A job directory of two checkpoints (the second incremental where the backend is), and
    the records; the job's record types are not importable any more."""
    backend, incremental = request.param
    root = tmp_path_factory.mktemp("job")
    records = _records(300, seed=7)
    job_types = _job_types()
    sys.modules[MODULE] = job_types
    try:
        runner = LocalRunner(
            AllKinds(job_types),
            key_selector=lambda r: r[0],
            parallelism=3,
            timestamp_assigner=lambda r: r[2],
            watermark_delay=0,
            state_backend=backend,
            incremental_checkpoints=incremental,
            checkpoint_storage=FileSystemCheckpointStorage(str(root)),
        )
        runner.run(records[:200], final_watermark=False)
        runner.checkpoint()
        runner.run(records[200:], final_watermark=False)
        runner.checkpoint()
        runner.close()
    finally:
        del sys.modules[MODULE]
    yield str(root / "job"), records


@pytest.mark.parametrize("state", ["last", "pages", "per-page", "total", "mean", "points", "pair"])
def test_every_state_kind_reads_as_the_model_says(job: tuple[str, list[Any]], state: str) -> None:
    path, records = job
    assert MODULE not in sys.modules
    rows = read_rows(path, state=state)
    assert all(r["namespace"] is None for r in rows)
    got = {r["key"]: plain(r["value"]) for r in rows}
    assert len(got) == len(rows)
    assert got == _model(records)[state]


def test_records_and_tuples_are_structs_of_their_fields(job: tuple[str, list[Any]]) -> None:
    from streamstate.spark.offline.options import read_options
    from streamstate.spark.offline.plan import plan_read
    from streamstate.spark.offline.source import output_struct

    path, _ = job

    def schema(state: str) -> str:
        plan = plan_read(read_options({"path": path, "state": state}))
        return str(output_struct(plan)["value"].dataType.simpleString())

    assert schema("last") == "struct<page:string,n:bigint,tags:array<string>>"
    assert schema("mean") == "struct<total:double,count:bigint>"
    assert schema("points") == "array<struct<x:bigint,y:double>>"
    assert schema("pair") == "struct<_1:string,_2:bigint>"
    assert schema("per-page") == "map<string,bigint>"


def test_timers_are_rows_of_key_timestamp_and_domain(job: tuple[str, list[Any]]) -> None:
    path, records = job
    rows = read_rows(path, state="_timers.user.event")
    assert {r["time_domain"] for r in rows} == {"event_time"}
    storage = FileSystemCheckpointStorage(path, "")
    watermark = storage.load().metadata.properties["watermark"]
    assert watermark == max(ts for _, _, ts in records) - 1
    assert sorted((r["key"], r["timestamp"]) for r in rows) == _timers_model(records, watermark)


def test_an_earlier_checkpoint_is_read_by_its_id(job: tuple[str, list[Any]]) -> None:
    path, records = job
    first = {r["key"]: r["value"] for r in read_rows(path, state="total", checkpointId=1)}
    assert first == _model(records[:200])["total"]
    chk = {r["key"]: r["value"] for r in read_rows(f"{path}/chk-1", state="total")}
    assert chk == first
    with pytest.raises(CheckpointError, match="checkpoint 1, not 2"):
        read_rows(f"{path}/chk-1", state="total", checkpointId=2)


def test_an_unknown_state_lists_every_readable_name(job: tuple[str, list[Any]]) -> None:
    path, _ = job
    with pytest.raises(CheckpointError) as e:
        read_rows(path, state="lst")
    message = str(e.value)
    for name in ("'last'", "'pages'", "'per-page'", "'_timers.user.event'"):
        assert name in message


def test_a_path_that_holds_no_checkpoint_says_how_it_was_resolved(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError, match="for a LocalRunner give <checkpoint_storage>/job$"):
        read_rows(str(tmp_path / "ck"), state="total")
    # a relative path is resolved where the read is planned: the message says so
    with pytest.raises(CheckpointError, match=r"'ck' is relative: .* give an absolute path"):
        read_rows("ck", state="total")
