"""The change feed, by property: for random workloads over several checkpoints, on the heap (full
and incremental checkpoints) and RocksDB, and every state kind (value, list, map, a TTL state
whose reads refresh its timestamp, timers):

* the state read at ``a - 1`` with the feed of ``[a, b]`` applied in order is the state read at
  ``b``;
* the feed of each checkpoint ``c`` is exactly the difference of the reads of ``c - 1`` and
  ``c``: no update of an unchanged value (a value only read, or written again as it was), no
  delete of an entry that was not there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from offline_reads import plain, read_rows

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
from streamstate.checkpoint.storage import FileSystemCheckpointStorage
from streamstate.errors import CheckpointError
from streamstate.keygroups import KeyGroupRange

STATES = ["value", "list", "map", "touched", "_timers.user.event"]
TTL_MS = 2_500


class SteppedClock(Clock):
    def __init__(self) -> None:
        self.t = 0

    def now(self) -> int:
        return self.t


class Ops(KeyedProcessFunction):
    """Runs records ``(key, op, arg)``: set/clear a value, append to a list, put/remove a map
    entry, rewrite the value as it is, read everything, register/delete a timer; ``touched`` is
    a TTL value whose every read refreshes its last access."""

    def open(self, ctx: Any) -> None:
        self.value = ctx.get_state(ValueStateDescriptor("value", int))
        self.list = ctx.get_list_state(ListStateDescriptor("list", int))
        self.map = ctx.get_map_state(MapStateDescriptor("map", int, str))
        ttl = StateTtlConfig.new_builder(Time.milliseconds(TTL_MS)).update_ttl_on_read_and_write()
        self.touched = ctx.get_state(
            ValueStateDescriptor("touched", str).enable_time_to_live(ttl.build())
        )

    def process_element(self, record: Any, ctx: Any) -> Any:
        _, op, arg = record
        timers = ctx.timer_service()
        if op == "set":
            self.value.update(arg)
            self.touched.update(f"t{arg % 2}")
        elif op == "clear":
            self.value.clear()
        elif op == "same":
            if self.value.value() is not None:
                self.value.update(self.value.value())
        elif op == "add":
            self.list.add(arg)
        elif op == "put":
            self.map.put(arg % 3, f"v{arg}")
        elif op == "remove":
            self.map.remove(arg % 3)
        elif op == "read":
            self.value.value()
            self.list.get()
            list(self.map.items())
            self.touched.value()
        elif op == "timer":
            timers.register_event_time_timer(1_000 + arg)
        elif op == "untimer":
            timers.delete_event_time_timer(1_000 + arg)
        return None


OPS = ["set", "clear", "same", "add", "put", "remove", "read", "timer", "untimer"]
_record = st.tuples(st.sampled_from("abcd"), st.sampled_from(OPS), st.integers(0, 5))
workloads = st.lists(st.lists(_record, max_size=10), min_size=2, max_size=5)


def _run(root: Path, backend: str, incremental: bool, batches: list[list[Any]]) -> tuple[str, int]:
    clock = SteppedClock()
    runner = LocalRunner(
        Ops(),
        key_selector=lambda r: r[0],
        parallelism=2,
        max_parallelism=8,
        key_type=str,
        clock=clock,
        state_backend=backend,
        incremental_checkpoints=incremental,
        checkpoint_storage=FileSystemCheckpointStorage(str(root), retained_checkpoints=100),
    )
    for batch in batches:
        clock.t += 1_000
        runner.run(batch, final_watermark=False)
        runner.checkpoint()
    runner.close()
    return str(root / "job"), clock.t


def _entry(state: str, row: dict[str, Any]) -> tuple[Any, ...]:
    """A row's identity: ``(key, namespace)``, plus the timestamp of a timer."""
    if state.startswith("_timers."):
        return (row["key"], row["namespace"], row["timestamp"])
    return (row["key"], row["namespace"])


def _state(job: str, state: str, checkpoint: int, now: int) -> dict[tuple[Any, ...], Any]:
    if checkpoint == 0:
        return {}
    rows = read_rows(job, state=state, checkpointId=checkpoint, now=now)
    values = {k: v for k, v in rows[0].items() if k not in ("key", "namespace")} if rows else {}
    assert values is not None
    return {
        _entry(state, r): plain({k: v for k, v in r.items() if k not in ("key", "namespace")})
        for r in rows
    }


def _feed(job: str, state: str, start: int, end: int, now: int) -> list[dict[str, Any]]:
    return read_rows(
        job,
        state=state,
        readChangeFeed="true",
        changeStartCheckpointId=start,
        changeEndCheckpointId=end,
        now=now,
    )


def _applied(
    state: str, before: dict[tuple[Any, ...], Any], feed: list[dict[str, Any]]
) -> dict[tuple[Any, ...], Any]:
    out = dict(before)
    for row in sorted(feed, key=lambda r: r["checkpoint_id"]):
        values = {
            k: v
            for k, v in row.items()
            if k not in ("key", "namespace", "checkpoint_id", "change_type")
        }
        if row["change_type"] == "update":
            out[_entry(state, row)] = plain(values)
        else:
            assert row["change_type"] == "delete"
            out.pop(_entry(state, row))
    return out


def _check(job: str, checkpoints: int, now: int, start: int, end: int) -> None:
    for state in STATES:
        reads = [_state(job, state, c, now) for c in range(checkpoints + 1)]
        feed = _feed(job, state, start, end, now)
        assert _applied(state, reads[start - 1], feed) == reads[end], state
        for c in range(start, end + 1):
            step = [r for r in feed if r["checkpoint_id"] == c]
            before, after = reads[c - 1], reads[c]
            updates = {_entry(state, r) for r in step if r["change_type"] == "update"}
            deletes = {_entry(state, r) for r in step if r["change_type"] == "delete"}
            assert len(updates) + len(deletes) == len(step), (state, c)  # each entry once
            assert updates == {e for e, v in after.items() if before.get(e) != v}, (state, c)
            assert deletes == set(before) - set(after), (state, c)


BACKENDS = [("heap", False, 6), ("heap", True, 8), ("rocksdb", True, 3)]


@pytest.mark.parametrize(
    ("backend", "incremental", "examples"), BACKENDS, ids=["heap", "heap-incremental", "rocksdb"]
)
def test_state_before_plus_feed_is_state_after(
    tmp_path_factory: Any, backend: str, incremental: bool, examples: int
) -> None:
    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(batches=workloads, window=st.tuples(st.integers(1, 5), st.integers(0, 4)))
    # a TTL value written again as it was (only its timestamp changed); a value cleared (a
    # delta block holding a removal and no entry)
    @example(batches=[[], [("a", "set", 0)], [("a", "set", 0)]], window=(1, 2))
    @example(batches=[[("a", "set", 0)], [("a", "clear", 0)]], window=(1, 1))
    def check(batches: list[list[Any]], window: tuple[int, int]) -> None:
        job, now = _run(tmp_path_factory.mktemp(backend), backend, incremental, batches)
        n = len(batches)
        start = min(window[0], n)
        end = min(start + window[1], n)
        _check(job, n, now, start, end)

    check()


def test_a_feed_needs_the_checkpoint_before_its_start(tmp_path: Path) -> None:
    clock = SteppedClock()
    runner = LocalRunner(
        Ops(),
        key_selector=lambda r: r[0],
        clock=clock,
        checkpoint_storage=FileSystemCheckpointStorage(str(tmp_path), retained_checkpoints=2),
    )
    for i in range(4):  # checkpoints 1-4, of which 3 and 4 are kept
        runner.run([("a", "set", i)], final_watermark=False)
        runner.checkpoint()
    runner.close()
    job = str(tmp_path / "job")
    assert [r["value"] for r in _feed(job, "value", 4, 4, 0)] == [3]
    with pytest.raises(CheckpointError, match="needs checkpoint 2, which .* no longer holds"):
        _feed(job, "value", 3, 4, 0)
    with pytest.raises(ValueError, match="job's checkpoint directory, not the checkpoint"):
        _feed(job + "/chk-4", "value", 4, 4, 0)


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_a_feed_reads_only_what_the_incremental_files_say_changed(
    tmp_path: Path, backend: str
) -> None:
    """Checkpoint 2 changes one key: its feed reads one subtask's partition and, on the heap,
    only the key group of the key (the delta file's); checkpoint 3 changes nothing: no
    partition at all."""
    from offline_reads import state_reader

    from streamstate.keygroups import assign_to_key_group
    from streamstate.spark.offline.plan import ReadPartition

    batches = [[(k, "set", 1) for k in "abcd"], [("a", "set", 5)], []]
    job, now = _run(tmp_path, backend, True, batches)
    reader = state_reader(
        job, state="value", readChangeFeed="true", changeStartCheckpointId=2, now=now
    )
    parts = [msgspec.msgpack.decode(p.value, type=ReadPartition) for p in reader.partitions()]
    assert [(p.step.checkpoint.checkpoint_id if p.step else None) for p in parts] == [2]
    group = assign_to_key_group("a", 8)
    assert KeyGroupRange(*parts[0].key_groups).contains(group)
    if backend == "heap":
        assert parts[0].only == [group]
    assert [(r["checkpoint_id"], r["key"], r["value"]) for r in _feed(job, "value", 2, 3, now)] == [
        (2, "a", 5)
    ]
