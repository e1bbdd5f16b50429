"""Format ``streamstate`` beyond plain keyed state: window namespaces, time-to-live (expired
entries left out or kept with their last access), operator list, union list and broadcast
state, pickled values (their bytes, never unpickled), and format ``streamstate-metadata``;
heap and RocksDB. The reads run the reader Spark runs, without Spark (``offline_reads``)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
from offline_reads import metadata_rows, plain, read_rows

from streamstate import (
    AggregateFunction,
    CheckpointedFunction,
    KeyedProcessFunction,
    ListStateDescriptor,
    LocalRunner,
    MapStateDescriptor,
    StateTtlConfig,
    Time,
    TumblingEventTimeWindows,
    ValueStateDescriptor,
    window,
)
from streamstate.backends.base import Clock
from streamstate.errors import CheckpointError
from streamstate.serializers import PickleSerializer

TTL_MS = 10_000
BACKENDS = ["heap", "rocksdb"]


class ManualClock(Clock):
    def __init__(self) -> None:
        self.t = 0

    def now(self) -> int:
        return self.t


class Visits(KeyedProcessFunction, CheckpointedFunction):
    """Per user: the last page (TTL value), the pages (TTL list), visits per page (TTL map), a
    count, and a pickled set of pages; per subtask: the users seen (operator list), the
    subtask's record count (union list) and the last page per user (broadcast)."""

    def initialize_state(self, context: Any) -> None:
        store = context.get_operator_state_store()
        self.seen = store.get_list_state(ListStateDescriptor("seen", str))
        self.records = store.get_union_list_state(ListStateDescriptor("records", int))
        self.latest = store.get_broadcast_state(MapStateDescriptor("latest", str, str))
        self.count_here = 0

    def snapshot_state(self, context: Any) -> None:
        self.records.update([self.count_here])

    def open(self, ctx: Any) -> None:
        ttl = StateTtlConfig.new_builder(Time.milliseconds(TTL_MS)).build()
        self.last = ctx.get_state(ValueStateDescriptor("last", str).enable_time_to_live(ttl))
        self.pages = ctx.get_list_state(ListStateDescriptor("pages", str).enable_time_to_live(ttl))
        self.per_page = ctx.get_map_state(
            MapStateDescriptor("per-page", str, int).enable_time_to_live(ttl)
        )
        self.count = ctx.get_state(ValueStateDescriptor("count", int, default=0))
        self.page_set = ctx.get_state(ValueStateDescriptor("page-set", PickleSerializer()))

    def process_element(self, value: Any, ctx: Any) -> Any:
        user, page, _ = value
        self.last.update(page)
        self.pages.add(page)
        self.per_page.put(page, (self.per_page.get(page) or 0) + 1)
        self.count.update(self.count.value() + 1)
        self.page_set.update((self.page_set.value() or frozenset()) | {page})
        if self.count.value() == 1:
            self.seen.add(user)
        self.count_here += 1
        self.latest.put(user, page)
        return None


def _visits(tmp_path: Path, backend: str) -> str:
    """Two subtasks: ann and bob wrote at t=0, ann again and cy at t=5000."""
    clock = ManualClock()
    runner = LocalRunner(
        Visits(),
        key_selector=lambda r: r[0],
        parallelism=2,
        timestamp_assigner=lambda r: r[2],
        watermark_delay=0,
        clock=clock,
        state_backend=backend,
        checkpoint_storage=str(tmp_path / "ck"),
    )
    runner.run([("ann", "/home", 100), ("bob", "/cart", 200)], final_watermark=False)
    clock.t = 5_000
    runner.run([("ann", "/pay", 300), ("cy", "/home", 400)], final_watermark=False)
    runner.checkpoint()
    runner.close()
    return str(tmp_path / "ck" / "job")


@pytest.fixture(params=BACKENDS, scope="module")
def visits(request: Any, tmp_path_factory: Any) -> str:
    return _visits(tmp_path_factory.mktemp(request.param), request.param)


def _values(path: str, state: str, **options: Any) -> list[tuple[Any, ...]]:
    rows = read_rows(path, state=state, **options)
    return sorted(tuple(plain(v) for k, v in r.items() if k != "namespace") for r in rows)


def test_ttl_states_come_back_typed_without_what_expired(visits: str) -> None:
    # at t=12000 what was written at t=0 has expired (0 + 10000 <= 12000), t=5000 has not
    assert _values(visits, "last", now=12_000) == [("ann", "/pay"), ("cy", "/home")]
    assert _values(visits, "pages", now=12_000) == [("ann", ["/pay"]), ("cy", ["/home"])]
    assert _values(visits, "per-page", now=12_000) == [
        ("ann", {"/pay": 1}),
        ("cy", {"/home": 1}),
    ]
    assert _values(visits, "pages", now=9_999) == [
        ("ann", ["/home", "/pay"]),
        ("bob", ["/cart"]),
        ("cy", ["/home"]),
    ]
    assert _values(visits, "per-page", now=10**9) == []
    assert _values(visits, "count", now=10**9) == [("ann", 2), ("bob", 1), ("cy", 1)]


def test_expired_entries_on_request_with_their_last_access(visits: str) -> None:
    kept = {"now": 10**9, "includeExpired": "true"}
    assert _values(visits, "last", **kept) == [
        ("ann", "/pay", 5_000),
        ("bob", "/cart", 0),
        ("cy", "/home", 5_000),
    ]
    assert _values(visits, "pages", **kept)[0] == ("ann", ["/home", "/pay"], [0, 5_000])
    assert _values(visits, "per-page", **kept)[0] == (
        "ann",
        {"/home": 1, "/pay": 1},
        {"/home": 0, "/pay": 5_000},
    )


def test_pickled_values_are_their_pickle_bytes_never_unpickled(visits: str) -> None:
    rows = {r["key"]: r["value"] for r in read_rows(visits, state="page-set")}
    assert isinstance(rows["ann"], bytes)
    assert pickle.loads(rows["ann"]) == frozenset({"/home", "/pay"})  # the test unpickles


def test_operator_states_by_subtask(visits: str) -> None:
    seen = read_rows(visits, operatorState="seen")
    assert sorted(r["value"] for r in seen) == ["ann", "bob", "cy"]
    assert {r["subtask"] for r in seen} <= {0, 1}
    by_subtask: dict[int, list[str]] = {}
    for r in sorted(seen, key=lambda r: (r["subtask"], r["index"])):
        by_subtask.setdefault(r["subtask"], []).append(r["value"])
    assert all(r["index"] == by_subtask[r["subtask"]].index(r["value"]) for r in seen)
    records = read_rows(visits, operatorState="records")
    assert sorted(r["value"] for r in records) != [] and sum(r["value"] for r in records) == 4
    latest = read_rows(visits, operatorState="latest")
    # each subtask's copy holds the users it processed
    assert sorted((r["key"], r["value"]) for r in latest) == [
        ("ann", "/pay"),
        ("bob", "/cart"),
        ("cy", "/home"),
    ]
    with pytest.raises(CheckpointError, match="no operator state 'nope'.*'latest', 'records'"):
        read_rows(visits, operatorState="nope")


def test_metadata_lists_every_state_with_its_types(visits: str) -> None:
    rows = {r["state"]: r for r in metadata_rows(visits)}
    kinds = {name: r["kind"] for name, r in rows.items()}
    assert kinds == {
        "last": "value",
        "pages": "list",
        "per-page": "map",
        "count": "value",
        "page-set": "value",
        "_timers.user.event": "timers",
        "_timers.user.processing": "timers",
        "seen": "operator_list",
        "records": "union_list",
        "latest": "broadcast",
    }
    assert rows["per-page"]["value_type"] == "map<string,bigint>"
    assert rows["per-page"]["ttl_ms"] == TTL_MS and rows["count"]["ttl_ms"] is None
    assert rows["page-set"]["value_type"] == "binary"
    assert rows["latest"]["key_type"] == "string" and rows["seen"]["key_type"] is None
    assert {(r["checkpoint_id"], r["operator"], r["parallelism"]) for r in rows.values()} == {
        (1, "keyed-process", 2)
    }
    assert {r["max_parallelism"] for r in rows.values()} == {128}
    assert all(r["namespace_type"] is None for r in rows.values())


class Sum(AggregateFunction):
    def create_accumulator(self) -> int:
        return 0

    def add(self, value: Any, acc: int) -> int:
        return acc + value[1]

    def get_result(self, acc: int) -> int:
        return acc

    def merge(self, a: int, b: int) -> int:
        return a + b


@pytest.mark.parametrize("backend", BACKENDS)
def test_window_namespaces_are_structs_of_start_and_end(tmp_path: Path, backend: str) -> None:
    records = [("a", 1, 5), ("a", 2, 7), ("b", 3, 1), ("a", 4, 12), ("b", 5, 14)]
    runner = LocalRunner(
        window(TumblingEventTimeWindows.of(10)).aggregate(Sum()),
        key_selector=lambda r: r[0],
        timestamp_assigner=lambda r: r[2],
        watermark_delay=100,  # no window closes
        state_backend=backend,
        checkpoint_storage=str(tmp_path),
    )
    runner.run(records, final_watermark=False)
    runner.checkpoint()
    runner.close()
    path = str(tmp_path / "job")
    windowed = [r for r in metadata_rows(path) if r["namespace_type"] is not None]
    assert {r["namespace_type"] for r in windowed} == {"struct<start:bigint,end:bigint>"}
    state = next(r["state"] for r in windowed if r["kind"] == "aggregating")
    rows = read_rows(path, state=state)
    assert sorted(
        (r["key"], r["namespace"]["start"], r["namespace"]["end"], r["value"]) for r in rows
    ) == [
        ("a", 0, 10, 3),
        ("a", 10, 20, 4),
        ("b", 0, 10, 3),
        ("b", 10, 20, 5),
    ]
    timers = read_rows(path, state="_timers.window-timers.event")
    assert sorted((r["key"], r["namespace"]["start"], r["timestamp"]) for r in timers) == [
        ("a", 0, 9),
        ("a", 10, 19),
        ("b", 0, 9),
        ("b", 10, 19),
    ]


def test_options_that_do_not_fit_are_refused(visits: str) -> None:
    with pytest.raises(ValueError, match="give option state .* or option operatorState"):
        read_rows(visits)
    with pytest.raises(ValueError, match="no option 'stat'"):
        read_rows(visits, stat="count")
    with pytest.raises(ValueError, match="'checkpointId' must be an integer"):
        read_rows(visits, state="count", checkpointId="latest")
    with pytest.raises(ValueError, match="add option readChangeFeed"):
        read_rows(visits, state="count", changeStartCheckpointId=1)
    with pytest.raises(ValueError, match="not operator state"):
        read_rows(visits, operatorState="seen", readChangeFeed="true", changeStartCheckpointId=1)
    with pytest.raises(ValueError, match="no option state"):
        metadata_rows(visits, state="count")


class LateState(KeyedProcessFunction):
    """Registers state ``late`` only when a record asks for it (after the first checkpoint)."""

    def open(self, ctx: Any) -> None:
        self.ctx = ctx
        self.n = ctx.get_state(ValueStateDescriptor("n", int, default=0))

    def process_element(self, value: Any, ctx: Any) -> Any:
        self.n.update(self.n.value() + 1)
        if value[1]:
            self.ctx.get_state(ValueStateDescriptor("late", str)).update(value[1])
        return None


def test_a_state_first_written_in_a_delta_file_is_read(tmp_path: Path) -> None:
    runner = LocalRunner(
        LateState(),
        key_selector=lambda r: r[0],
        incremental_checkpoints=True,
        checkpoint_storage=str(tmp_path),
    )
    runner.run([("a", None), ("b", None)], final_watermark=False)
    runner.checkpoint()  # a full file without 'late'
    runner.run([("a", "x")], final_watermark=False)
    runner.checkpoint()  # a delta file holds it
    runner.close()
    job = str(tmp_path / "job")
    assert [(r["key"], r["value"]) for r in read_rows(job, state="late")] == [("a", "x")]
    assert "late" in {r["state"] for r in metadata_rows(job)}


def test_metadata_entries_are_the_one_count_of_inspect_and_of_the_state_read(visits: str) -> None:
    """The ``entries`` of format ``streamstate-metadata`` are ``streamstate checkpoints
    inspect``'s per-state figures, and the state read back with every stored entry kept
    (``includeExpired``), counted by the one definition (``streamstate.format.entries``: a
    value per key and namespace, a list's elements, a map's mappings), gives them too."""
    import json

    from typer.testing import CliRunner

    from streamstate.cli import app
    from streamstate.format.entries import count_entries

    rows = {r["state"]: r for r in metadata_rows(visits)}
    result = CliRunner().invoke(app, ["checkpoints", "inspect", "--json", f"{visits}/chk-1"])
    assert result.exit_code == 0, result.output
    (doc,) = json.loads(result.output)["checkpoints"]
    inspected: dict[str, int] = {}
    for sub in doc["operators"]["keyed-process"]["subtasks"]:
        for state, n in sub["state_entries"].items():
            inspected[state] = inspected.get(state, 0) + n
    keyed = {s: r for s, r in rows.items() if r["kind"] in ("value", "list", "map")}
    assert {s: r["entries"] for s, r in keyed.items()} == inspected
    for state, row in keyed.items():
        read = read_rows(visits, state=state, includeExpired="true", now=10**9)
        assert row["entries"] == count_entries(row["kind"], (plain(r["value"]) for r in read))
    assert sum(inspected.values()) == doc["operators"]["keyed-process"]["entries"] > 0
    # timers and operator states are not counted as entries
    assert {s for s, r in rows.items() if r["entries"] is None} == {
        "_timers.user.event",
        "_timers.user.processing",
        "seen",
        "records",
        "latest",
    }
