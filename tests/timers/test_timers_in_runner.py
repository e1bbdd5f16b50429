"""Timers end to end: KeyedProcessFunction.on_timer through the LocalRunner and the operator."""

from __future__ import annotations

import pytest

from streamstate import (
    KeyedProcessFunction,
    LocalRunner,
    TimeDomain,
    ValueStateDescriptor,
)
from streamstate.backends.base import Clock
from streamstate.backends.timer_queues import TimerRestore
from streamstate.format.meta import StateMetaInfo
from streamstate.keygroups import assign_to_key_group
from streamstate.runtime.operator import KeyedProcessOperator
from streamstate.serializers import Int64Serializer, StrSerializer


class FakeClock(Clock):
    def __init__(self, now: int = 0) -> None:
        self.t = now

    def now(self) -> int:
        return self.t


class SessionTimeout(KeyedProcessFunction):
    """Emits (key, count, timer timestamp) once a key has been quiet for 10 ms of event time."""

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", int, default=0))
        self.deadline = ctx.get_state(ValueStateDescriptor("deadline", int))

    def process_element(self, value, ctx):
        self.count.update(self.count.value() + 1)
        old = self.deadline.value()
        if old is not None:
            ctx.timer_service().delete_event_time_timer(old)
        new = ctx.timestamp() + 10
        ctx.timer_service().register_event_time_timer(new)
        ctx.timer_service().register_event_time_timer(new)  # duplicate: still one timer
        self.deadline.update(new)
        return None

    def on_timer(self, timestamp, ctx):
        assert ctx.time_domain() == TimeDomain.EVENT_TIME
        assert ctx.timestamp() == timestamp
        yield (ctx.get_current_key(), self.count.value(), timestamp)
        self.count.clear()
        self.deadline.clear()


@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_event_time_timers_fire_through_on_timer(parallelism):
    records = [("a", 1), ("b", 2), ("a", 5), ("c", 30), ("b", 31), ("a", 40), ("d", 100)]
    runner = LocalRunner(
        SessionTimeout(),
        key_selector=lambda r: r[0],
        parallelism=parallelism,
        timestamp_assigner=lambda r: r[1],
        watermark_delay=0,
    )
    out = runner.run(records)
    # a: 1,5 -> timer 15 (fires at watermark 29 after c@30); b: 2 -> 12; ...
    assert sorted(out) == sorted(
        [("a", 2, 15), ("b", 1, 12), ("c", 1, 40), ("b", 1, 41), ("a", 1, 50), ("d", 1, 110)]
    )
    assert out.index(("b", 1, 12)) < out.index(("c", 1, 40))  # fired by an earlier watermark
    for op in runner.subtasks:
        assert op.num_timers() == 0
        assert op.keyed_backend.num_entries() == 0


class ProcessingTimeoutFn(KeyedProcessFunction):
    def process_element(self, value, ctx):
        now = ctx.timer_service().current_processing_time()
        ctx.timer_service().register_processing_time_timer(now + 100)
        return None

    def on_timer(self, timestamp, ctx):
        assert ctx.time_domain() == TimeDomain.PROCESSING_TIME
        assert ctx.timestamp() is None
        return [(ctx.get_current_key(), timestamp)]


def test_processing_time_timers_through_the_runner():
    clock = FakeClock(1_000)
    runner = LocalRunner(ProcessingTimeoutFn(), key_selector=lambda r: r, clock=clock)
    assert runner.run(["x", "y"]) == []
    clock.t = 1_050
    runner.process("x")  # registers 1150 (the clock, not yet advanced manually)
    assert runner.advance_processing_time(1_100) == [("x", 1_100), ("y", 1_100)]
    assert runner.advance_processing_time(1_149) == []
    assert runner.advance_processing_time(1_150) == [("x", 1_150)]


class Recorder:
    def __init__(self):
        self.fired = []

    def on_event_time(self, ts, key, ns):
        self.fired.append(("event", ts, key, ns))

    def on_processing_time(self, ts, key, ns):
        self.fired.append(("proc", ts, key, ns))


class Noop(KeyedProcessFunction):
    def process_element(self, value, ctx):
        return None


def test_operator_internal_timer_services_share_time_and_snapshots():
    op = KeyedProcessOperator(Noop(), StrSerializer(), max_parallelism=8)
    op.open()
    op.advance_watermark(50)
    op.advance_processing_time(70)
    rec = Recorder()
    svc = op.get_internal_timer_service("windows", Int64Serializer(), rec)
    assert op.get_internal_timer_service("windows", Int64Serializer(), rec) is svc
    with pytest.raises(Exception, match="another callback"):
        op.get_internal_timer_service("windows", Int64Serializer(), Recorder())
    assert svc.current_watermark == 50 and svc.current_processing_time() == 70  # inherited
    op.keyed_backend.set_current_key("k")
    svc.register_event_time_timer(3, 60)
    svc.register_processing_time_timer(4, 80)
    assert op.num_timers() == 2
    snap = op.keyed_backend.snapshot(1)
    assert {m.name for m in snap.states} >= {"_timers.windows.event", "_timers.user.event"}
    snap.release()
    assert op.advance_watermark(60) == 1
    assert op.advance_processing_time(80) == 1
    assert rec.fired == [("event", 60, "k", 3), ("proc", 80, "k", 4)]
    assert op.num_timers() == 0


def test_a_late_timer_service_inherits_time_and_pending_timers():
    op = KeyedProcessOperator(Noop(), StrSerializer(), max_parallelism=8)
    op.timer_service.current_watermark = 77  # as a restore sets it before open()
    # a restore brought back a timer of "late" before the service exists: the backend holds it
    backend = op.keyed_backend
    restore = TimerRestore(backend.timer_queues, backend.key_serializer)
    meta = StateMetaInfo("_timers.late.event", "timer", Int64Serializer(), Int64Serializer())
    restore.add_timers(meta, assign_to_key_group("k", 8), [("k", 3, 90)])
    restore.install()
    svc = op.get_internal_timer_service("late", Int64Serializer(), Recorder())
    assert svc.current_watermark == 77
    assert sorted(svc.event_time_timers) == [(90, "k", 3, assign_to_key_group("k", 8))]
