"""The state figures a Spark subtask reports with each checkpoint (no Spark, no state host), on
both backends, against a model of the state: entries, entries written and removed, timers
pending and fired, checkpoint bytes; and how the driver adds up a micro-batch's steps."""

from __future__ import annotations

import random
from typing import Any

import msgspec
import pyarrow as pa
import pytest

from streamstate import KeyedProcessFunction, ValueStateDescriptor
from streamstate.keygroups import assign_key_groups
from streamstate.spark.driver.monitor.figures import FIGURES, micro_batch_figures, state_figures
from streamstate.spark.job import JobSpec, arrow_schema_to_bytes
from streamstate.spark.subtask import SubtaskRuntime
from streamstate.spark.wire.results import BatchResult

SCHEMA = pa.schema([("user", pa.string()), ("v", pa.int64()), ("_kg", pa.int32())])
OUT = pa.schema([("user", pa.string()), ("n", pa.int64())])
#: an event-time timer fires this long after the record that registered it
TIMER_MS = 100


class CountOrForget(KeyedProcessFunction):
    """Counts a key's records; a negative ``v`` forgets the key. Every record registers an
    event-time timer at ``v + TIMER_MS`` (the event time is ``v``)."""

    def open(self, ctx: Any) -> None:
        self.n = ctx.get_state(ValueStateDescriptor("n", int))

    def process_element(self, value: Any, ctx: Any) -> Any:
        if value.v < 0:
            self.n.clear()
            return
        n = (self.n.value() or 0) + 1
        self.n.update(n)
        ctx.timer_service().register_event_time_timer(value.v + TIMER_MS)
        yield ctx.get_current_key(), n

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        return None


def _runtime(tmp_path: Any, backend: str) -> SubtaskRuntime:
    job = JobSpec(
        operator="op",
        parallelism=1,
        max_parallelism=128,
        key_columns=["user"],
        value_columns=["user", "v"],
        input_schema=arrow_schema_to_bytes(SCHEMA),
        output_schema=arrow_schema_to_bytes(OUT),
        checkpoint_url=str(tmp_path / "ck"),
        event_time="v",
        state_backend=backend,
    )
    return SubtaskRuntime(job, 0, CountOrForget, local_dir=str(tmp_path / "local"))


def _batch(rows: list[tuple[str, int]]) -> pa.RecordBatch:
    users = [u for u, _ in rows]
    return pa.record_batch(
        [
            pa.array(users, pa.string()),
            pa.array([v for _, v in rows], pa.int64()),
            pa.array(assign_key_groups(pa.array(users, pa.string()), 128), pa.int32()),
        ],
        schema=SCHEMA,
    )


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_figures_follow_a_model_of_the_state(tmp_path: Any, backend: str) -> None:
    rnd = random.Random(5)
    runtime = _runtime(tmp_path, backend)
    model: dict[str, int] = {}
    timers: set[tuple[str, int]] = set()
    watermark = -(1 << 63)
    try:
        runtime.prepare(-1, "L0")
        for b in range(5):
            rows = []
            for i in range(300):
                v = b * 1000 + i
                rows.append((f"u{rnd.randrange(80)}", -1 if rnd.random() < 0.15 else v))
            runtime.begin(watermark, None)
            fired = {t for t in timers if t[1] <= watermark}
            timers -= fired
            touched: dict[str, bool] = {}
            for user, v in rows:
                if v < 0:
                    model.pop(user, None)
                    touched[user] = False
                else:
                    model[user] = model.get(user, 0) + 1
                    timers.add((user, v + TIMER_MS))
                    touched[user] = True
            runtime.process(_batch(rows))
            list(runtime.output_batches())
            result = runtime.finish(b, 1, "L1")
            state = result.state
            assert state is not None
            assert result.timers == len(timers)
            assert result.timers_fired == len(fired)
            assert result.rows == len(rows)
            # written and removed: each entry the batch touched, once, by how it ended
            assert state.rows_updated == sum(touched.values())
            assert state.rows_removed == sum(not t for t in touched.values())
            # entries, counted as streamstate.format.entries does, exactly on both backends
            assert state.rows == len(model) and not state.rows_estimated
            if backend == "heap":
                assert state.state_bytes is None
            else:
                assert state.state_bytes and state.state_bytes > 0
                assert state.memory_bytes and state.memory_bytes > 0
            assert 0 < result.checkpoint_bytes <= result.checkpoint_full_bytes
            assert result.memory_bytes and result.memory_bytes > 0
            # the acknowledgement carries them to the driver
            decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(result), type=BatchResult)
            assert decoded.state == state
            runtime.prepare(b, "L1", 1)
            watermark = b * 1000 + 150  # fires the timers of the batch's first records
    finally:
        runtime.close()


def _result(subtask: int, **kw: Any) -> BatchResult:
    from streamstate.backends.figures import StateFigures
    from streamstate.checkpoint.metadata import SubtaskStateHandle

    return BatchResult(
        subtask=subtask,
        batch=0,
        version=0,
        attempt=1,
        handle=SubtaskStateHandle(
            operator="op",
            subtask_index=subtask,
            parallelism=2,
            max_parallelism=128,
            key_group_range=(64 * subtask, 64 * subtask + 63),
        ),
        state=StateFigures(**kw.pop("state")),
        **kw,
    )


def test_a_micro_batch_adds_up_its_steps_totals_and_keeps_the_last_levels() -> None:
    a = [
        _result(0, rows=5, restore="hot", timers=2, checkpoint_bytes=10, checkpoint_full_bytes=50,
                memory_bytes=100, stats={"stage_ms": 3.0, "checkpoint_wait_ms": 1.0},
                state={"rows": 7, "rows_updated": 3, "rows_removed": 1}),
        _result(1, rows=4, restore="reload", timers=1, late_records_dropped=2,
                checkpoint_bytes=20, checkpoint_full_bytes=60, memory_bytes=200,
                stats={"stage_ms": 9.0}, state={"rows": 4, "rows_updated": 2, "rows_removed": 0}),
    ]  # fmt: skip
    first = state_figures(a, 7, 1000, output_rows=9)
    assert first["numInputRows"] == 9 and first["numRowsTotal"] == 11
    assert (first["numRowsUpdated"], first["numRowsRemoved"]) == (5, 1)
    assert (first["numHotSubtasks"], first["numReloadedSubtasks"]) == (1, 1)
    assert first["checkpointDurationMs"] == 9  # the slowest subtask
    assert (first["memoryUsedBytes"], first["checkpointFullBytes"]) == (300, 110)
    assert first["numRowsDroppedByWatermark"] == 2 and first["watermarkMs"] == 1000
    # a no-data step after it, on a backend that tracks no changes
    b = [_result(0, restore="hot", timers=0, timers_fired=3, checkpoint_bytes=5,
                 checkpoint_full_bytes=55, state={"rows": 6})]  # fmt: skip
    second = state_figures(b, 8, 2000, output_rows=3)
    both = micro_batch_figures([first, second])
    assert both is not None and set(both) == set(FIGURES)
    assert both["checkpointId"] == 8 and both["numSteps"] == 2
    assert both["numRowsTotal"] == 6 and both["watermarkMs"] == 2000  # levels: the last step's
    assert both["numTimersPending"] == 0 and both["numTimersFired"] == 3
    assert both["numOutputRows"] == 12 and both["checkpointBytes"] == 35
    assert both["numRowsUpdated"] is None  # unknown in one step: unknown for the micro-batch
    assert both["memoryUsedBytes"] is None
    assert micro_batch_figures([]) is None
    assert state_figures(b, 9, -(1 << 63), 0)["watermarkMs"] is None


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_the_metrics_decorators_report_with_each_checkpoint(tmp_path: Any, backend: str) -> None:
    runtime = _runtime(tmp_path, backend)
    runtime.job = msgspec.structs.replace(
        runtime.job, state_backend_options={"latency_tracking": True, "size_tracking": True}
    )
    try:
        runtime.prepare(-1, "L0")
        runtime.begin(None, None)
        runtime.process(_batch([(f"u{i % 7}", i) for i in range(250)]))
        result = runtime.finish(0, 1, "L1")
    finally:
        runtime.close()
    rows = {r["name"].split(".state.", 1)[1]: r for r in result.state_metrics}
    # sampled: the 1st, 101st and 201st call of each operation of state "n"
    assert rows["n.value_state_get_latency"]["count"] == 3
    assert rows["n.value_state_update_latency"]["count"] == 3
    assert rows["n.value_state_update_value_size"]["max"] > 0
    # off by default: nothing to report
    plain = _runtime(tmp_path / "plain", backend)
    try:
        plain.prepare(-1, "L0")
        plain.begin(None, None)
        plain.process(_batch([("a", 1)]))
        assert plain.finish(0, 1, "L1").state_metrics == []
    finally:
        plain.close()
