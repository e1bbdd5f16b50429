"""``read_state`` for every kind of state: TTL states typed, expired entries left out (or kept
with their last access), timers as rows, on both backends, against checkpoints whose contents
are known (written by the LocalRunner with a manual clock).

The reads run without Spark first (the task's side, :func:`_read_subtask`, over every
checkpointed subtask); one Spark test per backend checks the DataFrame ``read_state`` returns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from streamstate import (
    KeyedProcessFunction,
    ListStateDescriptor,
    LocalRunner,
    MapStateDescriptor,
    StateTtlConfig,
    Time,
    ValueStateDescriptor,
)
from streamstate.backends.base import Clock
from streamstate.errors import CheckpointError
from streamstate.spark.offline.reader import _plan, _read_subtask

TTL_MS = 10_000


class ManualClock(Clock):
    def __init__(self) -> None:
        self.t = 0

    def now(self) -> int:
        return self.t


class Visits(KeyedProcessFunction):
    """Per user: the last page (TTL value), the pages (TTL list), visits per page (TTL map), a
    count (no TTL), an event-time timer 1 s after each record and a processing-time timer a
    minute after it."""

    def open(self, ctx: Any) -> None:
        ttl = StateTtlConfig.new_builder(Time.milliseconds(TTL_MS)).build()
        self.last = ctx.get_state(ValueStateDescriptor("last", str).enable_time_to_live(ttl))
        self.pages = ctx.get_list_state(ListStateDescriptor("pages", str).enable_time_to_live(ttl))
        self.per_page = ctx.get_map_state(
            MapStateDescriptor("per-page", str, int).enable_time_to_live(ttl)
        )
        self.count = ctx.get_state(ValueStateDescriptor("count", int, default=0))

    def process_element(self, value: Any, ctx: Any) -> Any:
        _, page, ts = value
        self.last.update(page)
        self.pages.add(page)
        self.per_page.put(page, (self.per_page.get(page) or 0) + 1)
        self.count.update(self.count.value() + 1)
        timers = ctx.timer_service()
        timers.register_event_time_timer(ts + 1_000)
        timers.register_processing_time_timer(timers.current_processing_time() + 60_000)
        return None


def _checkpoint(tmp_path: Path, backend: str) -> str:
    """A checkpoint of two subtasks: ann and bob wrote at t=0, ann again and cy at t=5000."""
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


def _rows(path: str, state: str, **kwargs: Any) -> list[dict[str, Any]]:
    plan = _plan(
        path, state, "keyed-process", None, kwargs.get("include_expired", False), kwargs.get("now")
    )
    rows = [
        row
        for i in range(plan.subtasks)
        for row in _read_subtask(plan.url, plan.directory, "keyed-process", i, plan.layout, {})
    ]
    return sorted(rows, key=lambda r: (r["key"], r.get("timestamp", 0)))


@pytest.fixture(params=["heap", "rocksdb"], scope="module")
def checkpoint(request: Any, tmp_path_factory: Any) -> str:
    return _checkpoint(tmp_path_factory.mktemp(request.param), request.param)


def test_ttl_states_come_back_typed_without_what_expired(checkpoint: str) -> None:
    # at t=12000 what was written at t=0 has expired (0 + 10000 <= 12000), t=5000 has not
    last = _rows(checkpoint, "last", now=12_000)
    assert [(r["key"], r["value"]) for r in last] == [("ann", "/pay"), ("cy", "/home")]
    assert all(r["namespace"] is None and set(r) == {"key", "namespace", "value"} for r in last)
    pages = _rows(checkpoint, "pages", now=12_000)
    assert [(r["key"], r["value"]) for r in pages] == [("ann", ["/pay"]), ("cy", ["/home"])]
    per_page = _rows(checkpoint, "per-page", now=12_000)
    assert [(r["key"], r["value"]) for r in per_page] == [
        ("ann", {"/pay": 1}),
        ("cy", {"/home": 1}),
    ]
    # before anything expired: everything, typed (a str, a list of str, a map str -> int)
    assert [(r["key"], r["value"]) for r in _rows(checkpoint, "last", now=9_999)] == [
        ("ann", "/pay"),
        ("bob", "/cart"),
        ("cy", "/home"),
    ]
    assert [r["value"] for r in _rows(checkpoint, "pages", now=9_999)] == [
        ["/home", "/pay"],
        ["/cart"],
        ["/home"],
    ]
    # long after: nothing
    assert _rows(checkpoint, "per-page", now=10**9) == []


def test_expired_entries_on_request_with_their_last_access(checkpoint: str) -> None:
    last = _rows(checkpoint, "last", now=10**9, include_expired=True)
    assert [(r["key"], r["value"], r["last_access"]) for r in last] == [
        ("ann", "/pay", 5_000),
        ("bob", "/cart", 0),
        ("cy", "/home", 5_000),
    ]
    pages = _rows(checkpoint, "pages", now=10**9, include_expired=True)
    assert (pages[0]["value"], pages[0]["last_access"]) == (["/home", "/pay"], [0, 5_000])
    per_page = _rows(checkpoint, "per-page", now=10**9, include_expired=True)
    assert (per_page[0]["value"], per_page[0]["last_access"]) == (
        {"/home": 1, "/pay": 1},
        {"/home": 0, "/pay": 5_000},
    )


def test_a_state_without_ttl_is_unchanged(checkpoint: str) -> None:
    count = _rows(checkpoint, "count", now=10**9)
    assert [(r["key"], r["value"]) for r in count] == [("ann", 2), ("bob", 1), ("cy", 1)]


def test_timers_are_rows_with_key_namespace_timestamp_and_domain(checkpoint: str) -> None:
    # the watermark after the last record is 399: every event-time timer (ts + 1000) pends
    event = _rows(checkpoint, "_timers.user.event")
    assert [(r["key"], r["timestamp"]) for r in event] == [
        ("ann", 1_100),
        ("ann", 1_300),
        ("bob", 1_200),
        ("cy", 1_400),
    ]
    assert {r["time_domain"] for r in event} == {"event_time"}
    assert {r["namespace"] for r in event} == {None}
    processing = _rows(checkpoint, "_timers.user.processing")
    assert [(r["key"], r["timestamp"], r["time_domain"]) for r in processing] == [
        ("ann", 60_000, "processing_time"),
        ("ann", 65_000, "processing_time"),
        ("bob", 60_000, "processing_time"),
        ("cy", 65_000, "processing_time"),
    ]


def test_an_unknown_state_lists_every_readable_name(checkpoint: str) -> None:
    with pytest.raises(CheckpointError) as e:
        _plan(checkpoint, "lst", "keyed-process", None, False, None)
    message = str(e.value)
    for name in ("'count'", "'last'", "'pages'", "'per-page'"):
        assert name in message
    assert "'_timers.user.event'" in message and "'_timers.user.processing'" in message


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_read_state_returns_typed_ttl_values_and_timers(
    spark: Any, tmp_path: Path, backend: str
) -> None:
    from streamstate.spark import read_state

    path = _checkpoint(tmp_path, backend)
    pages = read_state(spark, path, state="pages", now=12_000)
    assert pages.schema.simpleString() == "struct<key:string,namespace:string,value:array<string>>"
    assert sorted((r.key, list(r.value)) for r in pages.collect()) == [
        ("ann", ["/pay"]),
        ("cy", ["/home"]),
    ]
    kept = read_state(spark, path, state="per-page", now=12_000, include_expired=True)
    assert "last_access:map<string,bigint>" in kept.schema.simpleString()
    ann = next(r for r in kept.collect() if r.key == "ann")
    assert (ann.value, ann.last_access) == ({"/home": 1, "/pay": 1}, {"/home": 0, "/pay": 5_000})
    timers = read_state(spark, path, state="_timers.user.event")
    assert sorted((r.key, r.timestamp, r.time_domain) for r in timers.collect()) == [
        ("ann", 1_100, "event_time"),
        ("ann", 1_300, "event_time"),
        ("bob", 1_200, "event_time"),
        ("cy", 1_400, "event_time"),
    ]


def test_ttl_values_of_types_that_are_not_built_in_become_json_without_their_timestamp() -> None:
    """A record type is decoded generically: the stored pair is a msgpack array."""
    from streamstate.namespace import VOID_NAMESPACE
    from streamstate.spark.offline.state_rows import StateLayout

    meta = {
        "name": "order",
        "kind": "value",
        "ttl": {"ttl": 100},
        "state_serializer": {"type": "ttl_value", "inner": {"type": "struct", "class": "a:B"}},
    }
    layout = StateLayout.of(meta, {"type": "str"}, now=1_000)
    assert layout.schema() == "key string, namespace string, value string"
    entries = [("a", VOID_NAMESPACE, [950, {"id": 1}]), ("b", VOID_NAMESPACE, [900, {"id": 2}])]
    assert list(layout.rows(entries)) == [{"key": "a", "namespace": None, "value": '{"id":1}'}]
