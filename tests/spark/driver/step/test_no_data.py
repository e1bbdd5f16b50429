"""No-data micro-batches without Spark: the rule (when one is due), and the driver's checkpoint
log over in-process subtasks (SubtaskRuntime) playing Spark's micro-batches: every window the
watermark closes is emitted, checkpoint ids stay consecutive and record their Spark
micro-batch, a replay delivers the latest step, rollback maps checkpoints to Spark's logs."""

from __future__ import annotations

import os
import random
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamstate.keygroups import assign_key_groups
from streamstate.spark.driver.step.commit import CheckpointLog, spark_batch_of
from streamstate.spark.driver.step.no_data import (
    DUE_EVENT_TIME,
    DUE_PROCESSING_TIME,
    TimeProgress,
    due,
    next_watermark,
    trigger_interval,
)
from streamstate.spark.job import JobSpec, arrow_schema_to_bytes
from streamstate.spark.offline.rollback import plan_rollback, rollback
from streamstate.spark.subtask import MIN_WATERMARK, SubtaskRuntime, job_storage
from streamstate.windows import TumblingEventTimeWindows, window
from support.spark_functions import RemindLater, WindowSize

SCHEMA = pa.schema([("user", pa.string()), ("v", pa.int64()), ("_kg", pa.int32())])
MAX_P = 128

# ---- the rule ----------------------------------------------------------------------------------

times = st.integers(-(10**6), 10**6)


@settings(max_examples=200, deadline=None)
@given(
    watermark=st.one_of(st.just(MIN_WATERMARK), times),
    max_ts=st.one_of(st.just(MIN_WATERMARK), times),
    delay=st.one_of(st.none(), st.integers(0, 10**5)),
    timers=st.lists(times, max_size=5),
)
def test_event_time_is_due_exactly_when_the_next_watermark_fires_a_timer(
    watermark: int, max_ts: int, delay: int | None, timers: list[int]
) -> None:
    # after a step every timer at or below its watermark has fired
    pending = [t for t in timers if t > watermark]
    progress = TimeProgress(watermark, max_ts, min(pending, default=None), None)
    upcoming = next_watermark(watermark, max_ts, delay)
    # the oracle: the watermark moves, and a timer fires at it (timestamp <= watermark)
    fires = upcoming > watermark and any(t <= upcoming for t in pending)
    assert (due(progress, delay, now=0) == DUE_EVENT_TIME) == fires
    assert upcoming >= watermark
    if delay is not None and max_ts != MIN_WATERMARK:
        assert upcoming == max(watermark, max_ts - delay - 1)
    else:
        assert upcoming == watermark


def test_a_watermark_that_does_not_move_fires_nothing_as_in_spark() -> None:
    # a timer registered at or below the watermark fires with the next advance, not at once
    stuck = TimeProgress(watermark=500, max_timestamp=1_000, event_timer=400)
    assert due(stuck, 500, now=0) is None  # next watermark 499 < 500: it does not move
    assert due(stuck, 0, now=0) == DUE_EVENT_TIME  # 999 moves it past the timer


def test_processing_time_is_due_at_its_timestamp_and_can_be_left_out() -> None:
    p = TimeProgress(processing_timer=1_000)
    assert due(p, None, now=999) is None
    assert due(p, None, now=1_000) == DUE_PROCESSING_TIME
    assert due(p, None, now=1_000, processing_time=False) is None
    # event time first when both are due
    both = TimeProgress(watermark=0, max_timestamp=100, event_timer=50, processing_timer=0)
    assert due(both, 10, now=5) == DUE_EVENT_TIME
    # a checkpoint from before timers were recorded: nothing is due
    assert TimeProgress.of({"watermark": 3, "max_timestamp": 9}) == TimeProgress(3, 9)
    assert due(TimeProgress.of({"watermark": 3, "max_timestamp": 9}), 0, now=10**12) is None


@pytest.mark.parametrize(
    ("trigger", "seconds"),
    [
        (None, 0.0),
        ({}, 0.0),
        ({"processingTime": "2 seconds"}, 2.0),
        ({"processingTime": "500 milliseconds"}, 0.5),
        ({"processingTime": "1 minute"}, 60.0),
        ({"processingTime": "INTERVAL 1 hour 30 mins"}, 5400.0),
        ({"processingTime": "0 seconds"}, 0.0),
        ({"availableNow": True}, None),
        ({"once": True}, None),
        ({"continuous": "1 second"}, None),
        ({"processingTime": "every now and then"}, 1.0),
    ],
)
def test_trigger_intervals(trigger: Any, seconds: float | None) -> None:
    assert trigger_interval(trigger) == seconds


# ---- the checkpoint log over in-process subtasks -----------------------------------------------


class Driver:
    """Plays foreachBatch and the tasks of a ``parallelism``-subtask job in one process, with
    the streaming driver's loop: each Spark micro-batch's step, then no-data micro-batches while
    one is due (at most ``bound``)."""

    def __init__(
        self,
        tmp_path: Any,
        function_factory: Any,
        out: pa.Schema,
        *,
        parallelism: int = 2,
        delay: int | None = 0,
    ) -> None:
        self.job = JobSpec(
            operator="op",
            parallelism=parallelism,
            max_parallelism=MAX_P,
            key_columns=["user"],
            value_columns=["user", "v"],
            input_schema=arrow_schema_to_bytes(SCHEMA),
            output_schema=arrow_schema_to_bytes(out),
            checkpoint_url=str(tmp_path / "ck"),
            event_time="v",
        )
        self.storage = job_storage(self.job)
        self.factory = function_factory
        self.delay = delay
        self.log = self._log()
        self.runtimes = [
            SubtaskRuntime(self.job, i, function_factory, storage=self.storage)
            for i in range(parallelism)
        ]
        self.attempt = 0
        #: checkpoint id -> (spark batch, no_data, outputs) as delivered
        self.delivered: dict[int, tuple[int, bool, list[tuple[Any, ...]]]] = {}

    def _log(self) -> CheckpointLog:
        return CheckpointLog(
            self.storage, "op", self.job.parallelism, watermark_delay=self.delay, retained=10
        )

    def restart(self) -> None:
        """A new driver: a fresh checkpoint log (reads storage) and fresh subtasks (reload)."""
        self.log.close()
        for r in self.runtimes:
            r.close()
        self.log = self._log()
        self.runtimes = [
            SubtaskRuntime(self.job, i, self.factory, storage=self.storage)
            for i in range(self.job.parallelism)
        ]

    def step(self, plan: Any, rows: list[tuple[str, int]], *, deliver: bool = True) -> None:
        parts: list[list[tuple[str, int]]] = [[] for _ in range(self.job.parallelism)]
        if rows:
            kgs = assign_key_groups(pa.array([u for u, _ in rows]), MAX_P)
            for (user, v), kg in zip(rows, kgs, strict=True):
                parts[int(kg) * self.job.parallelism // MAX_P].append((user, v))
        results = []
        self.attempt += 1
        for i, runtime in enumerate(self.runtimes):
            runtime.prepare(plan.base, plan.lineage, plan.base_attempts.get(i))
            runtime.begin(plan.watermark, plan.processing_time)
            if parts[i]:
                users = [u for u, _ in parts[i]]
                runtime.process(
                    pa.record_batch(
                        [
                            pa.array(users),
                            pa.array([v for _, v in parts[i]], pa.int64()),
                            pa.array(assign_key_groups(pa.array(users), MAX_P), pa.int32()),
                        ],
                        schema=SCHEMA,
                    )
                )
            results.append(runtime.finish(plan.batch, self.attempt, plan.new_lineage))
        self.log.commit(plan, results)
        if deliver:
            self.deliver(self.log.delivery_of(self.log.latest()))

    def deliver(self, plan: Any) -> None:
        rows = []
        for staged in plan.outputs:
            with self.storage.open_read(staged.path) as f:
                rows += [tuple(r.values()) for r in pq.read_table(f).to_pylist()]
        self.delivered[plan.batch] = (plan.spark_batch, plan.no_data, sorted(rows))

    def micro_batch(self, b: int, rows: list[tuple[str, int]], bound: int = 10) -> list[int]:
        """foreachBatch of Spark micro-batch ``b``: the checkpoint ids it committed."""
        before = self.log.latest()
        plan = self.log.plan(b)
        if plan.replay:
            self.deliver(plan)
        else:
            if self.log.due(processing_time=False):
                while self.log.due(processing_time=False):
                    self.step(self.log.plan_no_data(b), [])
                plan = self.log.plan(b)
            self.step(plan, rows)
        for _ in range(bound):
            if not self.log.due():
                break
            self.step(self.log.plan_no_data(b), [])
        start = -1 if before is None else before.checkpoint_id
        return list(range(start + 1, self.log.latest().checkpoint_id + 1))

    def outputs(self) -> list[tuple[Any, ...]]:
        return sorted(r for _, _, rows in self.delivered.values() for r in rows)

    def close(self) -> None:
        for r in self.runtimes:
            r.close()
        self.log.close()


WINDOW_OUT = pa.schema([("user", pa.string()), ("start", pa.int64()), ("n", pa.int64())])


def _windows() -> Any:
    return window(TumblingEventTimeWindows.of(10)).process(WindowSize())


def _closed_windows(rows: list[tuple[str, int]], watermark: int) -> list[tuple[str, int, int]]:
    """The oracle: every (user, window start, count) whose window's last millisecond is at or
    below ``watermark``."""
    counts: dict[tuple[str, int], int] = {}
    for user, v in rows:
        start = v - v % 10
        counts[(user, start)] = counts.get((user, start), 0) + 1
    return sorted((u, s, n) for (u, s), n in counts.items() if s + 9 <= watermark)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_window_the_watermark_closes_is_emitted_once(tmp_path: Any, seed: int) -> None:
    rnd = random.Random(seed)
    delay = rnd.choice([0, 3, 15])
    batches = []
    t = 0
    for _ in range(rnd.randrange(3, 7)):
        rows = []
        for _ in range(rnd.randrange(0, 12)):
            t += rnd.randrange(0, 6)
            rows.append((f"u{rnd.randrange(4)}", max(0, t - rnd.randrange(0, delay + 1))))
        batches.append(rows)
    d = Driver(tmp_path, _windows, WINDOW_OUT, delay=delay)
    try:
        for b, rows in enumerate(batches):
            d.micro_batch(b, rows)
            seen = [r for rows in batches[: b + 1] for r in rows]
            # after each foreachBatch call, nothing the data seen so far can close is pending
            final = next_watermark(
                MIN_WATERMARK, max((v for _, v in seen), default=MIN_WATERMARK), delay
            )
            assert d.outputs() == _closed_windows(seen, final), b
            assert d.log.due() is None
        ids = sorted(d.delivered)
        assert ids == list(range(len(ids)))  # consecutive checkpoint ids
        data = [c for c in ids if not d.delivered[c][1]]
        assert [d.delivered[c][0] for c in data] == list(range(len(batches)))
        for c in ids:
            if d.delivered[c][1]:  # a no-data step follows the step of its Spark micro-batch
                assert d.delivered[c][0] == d.delivered[c - 1][0]
                assert d.delivered[c][2], "a no-data micro-batch ran that fired nothing"
    finally:
        d.close()


def test_metadata_of_a_no_data_step_and_a_replay_of_its_micro_batch(tmp_path: Any) -> None:
    d = Driver(tmp_path, _windows, WINDOW_OUT, delay=0)
    try:
        assert d.micro_batch(0, [("a", 1), ("b", 3), ("a", 12)]) == [0, 1]
        chk1 = d.storage.load(1).metadata.properties
        assert chk1["batch_id"] == 0 and chk1["no_data"] is True and chk1["during_batch"] == 0
        assert chk1["watermark"] == 11 and chk1["event_timer"] == 19
        assert chk1["processing_timer"] is None
        assert d.delivered[1][2] == [("a", 0, 1), ("b", 0, 1)]
        chk0 = d.storage.load(0).metadata.properties
        assert "no_data" not in chk0 and chk0["event_timer"] == 9
        # Spark replays micro-batch 0 (its commit was lost): its checkpoints are delivered again
        d.restart()
        plan = d.log.plan(0)
        assert plan.replay and plan.batch == 1 and plan.no_data and plan.spark_batch == 0
        again = d.log.deliveries(0)
        assert [(p.batch, p.no_data, p.replay) for p in again] == [
            (0, False, True),
            (1, True, True),
        ]
        assert [len(p.outputs) for p in again] == [0, 2]  # chk-1 fired a window per subtask
        # and micro-batch 1 builds on chk-1, as checkpoint 2
        plan = d.log.plan(1)
        assert (plan.batch, plan.base, plan.spark_batch, plan.watermark) == (2, 1, 1, 11)
        assert d.micro_batch(1, [("c", 25)]) == [2, 3]
        assert d.delivered[3][2] == [("a", 10, 1)]
        assert spark_batch_of(d.storage.load(3)) == 1
    finally:
        d.close()


def test_a_no_data_micro_batch_owed_before_the_input_runs_first(tmp_path: Any) -> None:
    """After a rollback to the data step before a no-data micro-batch, the next micro-batch
    runs the no-data one first: every checkpoint id holds the step it held before."""
    d = Driver(tmp_path, _windows, WINDOW_OUT, delay=0)
    try:
        d.micro_batch(0, [("a", 1), ("a", 12)])
        d.micro_batch(1, [("b", 30)])
        first = {c: d.delivered[c] for c in d.delivered}
        steps = [first[c][:2] for c in sorted(first)]
        assert steps == [(0, False), (0, True), (1, False), (1, True)]
        for c in (3, 2, 1):
            d.storage.delete(d.storage.checkpoint_directory(c))
        d.restart()
        d.delivered.clear()
        assert d.log.due(processing_time=False) == DUE_EVENT_TIME
        assert d.micro_batch(1, [("b", 30)]) == [1, 2, 3]
        assert d.delivered == {c: first[c] for c in (1, 2, 3)}
    finally:
        d.close()


def test_old_checkpoints_without_spark_batches_read_as_their_ids(tmp_path: Any) -> None:
    d = Driver(tmp_path, _windows, WINDOW_OUT, delay=None)  # no watermark: no no-data steps
    try:
        assert d.micro_batch(0, [("a", 1)]) == [0]
        assert d.micro_batch(1, [("a", 2)]) == [1]
        latest = d.log.latest()
        del latest.metadata.properties["batch_id"]  # as written before no-data micro-batches
        assert spark_batch_of(latest) == 1
        assert d.log.plan(1).replay and d.log.plan(2).batch == 2
        with pytest.raises(Exception, match=r"micro-batch 4 .* is chk-1"):
            d.log.plan(4)
    finally:
        d.close()


def test_processing_time_timers_make_a_no_data_micro_batch_due(tmp_path: Any) -> None:
    out = pa.schema([("user", pa.string()), ("what", pa.string()), ("n", pa.int64())])
    d = Driver(tmp_path, lambda: RemindLater(0), out, delay=None)
    try:
        # a timer at "now": due at once; the loop runs one no-data step that fires it
        assert d.micro_batch(0, [("a", 1), ("a", 2)]) == [0, 1]
        assert d.delivered[1] == (0, True, [("a", "reminder", 2)])
        assert d.storage.load(1).metadata.properties["processing_timer"] is None
    finally:
        d.close()
    d = Driver(tmp_path / "later", lambda: RemindLater(3_600_000), out, delay=None)
    try:
        assert d.micro_batch(0, [("a", 1)]) == [0]
        timer = d.storage.load(0).metadata.properties["processing_timer"]
        assert timer is not None and d.log.next_processing_timer() == timer
        assert d.log.due(timer - 1) is None and d.log.due(timer) == DUE_PROCESSING_TIME
    finally:
        d.close()


# ---- rollback: checkpoints are mapped to Spark's micro-batches ---------------------------------


def _spark_logs(root: str, offsets: int, commits: int) -> None:
    for name, last in (("offsets", offsets), ("commits", commits), ("sources/0", offsets)):
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for b in range(last + 1):
            with open(os.path.join(root, name, str(b)), "w") as f:
                f.write("v1\n")


def _left(root: str, name: str) -> list[int]:
    return sorted(int(n) for n in os.listdir(os.path.join(root, name)) if n.isdigit())


@pytest.mark.parametrize(("to", "spark_batch"), [(1, 0), (2, 1), (3, 1)])
def test_rollback_maps_the_checkpoint_to_its_spark_micro_batch(
    tmp_path: Any, to: int, spark_batch: int
) -> None:
    d = Driver(tmp_path, _windows, WINDOW_OUT, delay=0)
    try:
        d.micro_batch(0, [("a", 1), ("a", 12)])  # chk-0 (batch 0), chk-1 (no-data, batch 0)
        d.micro_batch(1, [("b", 30)])  # chk-2 (batch 1), chk-3 (no-data, batch 1)
        d.micro_batch(2, [("b", 31)])  # chk-4 (batch 2)
    finally:
        d.close()
    assert [spark_batch_of(d.storage.load(c)) for c in range(5)] == [0, 0, 1, 1, 2]
    spark = str(tmp_path / "spark")
    _spark_logs(spark, offsets=2, commits=2)
    plan = plan_rollback(d.storage, to, spark_checkpoint=spark)
    assert plan.spark_batch == spark_batch
    rollback(d.storage, to, spark_checkpoint=spark)
    assert _left(spark, "commits") == list(range(spark_batch + 1))
    assert _left(spark, "offsets") == list(range(spark_batch + 2))
    assert d.storage.checkpoint_ids() == list(range(to + 1))
