"""Keyed functions used by the Spark runtime tests (pickled by value: hosts do not import this)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from streamstate import (
    CheckpointedFunction,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from streamstate.windows import ProcessWindowFunction


class Count(KeyedProcessFunction):
    """Emits ``(key, running count)`` per record."""

    def open(self, ctx: Any) -> None:
        self.n = ctx.get_state(ValueStateDescriptor("n", int, default=0))

    def process_element(self, value: Any, ctx: Any) -> Any:
        n = self.n.value() + 1
        self.n.update(n)
        yield ctx.get_current_key(), n


class CountWithFaults(Count):
    """A count that, the first time it sees ``trigger`` as ``value.v``, either kills its own
    process (the state host) or raises; a marker file makes the fault happen only once."""

    def __init__(self, trigger: int, marker: str, mode: str = "kill") -> None:
        self.trigger = trigger
        self.marker = marker
        self.mode = mode

    def process_element(self, value: Any, ctx: Any) -> Any:
        if value.v == self.trigger and not os.path.exists(self.marker):
            with open(self.marker, "w") as f:
                f.write(str(os.getpid()))
            if self.mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.mode == "sleep":
                time.sleep(600)
            raise ValueError(f"injected failure at v={value.v}")
        yield from super().process_element(value, ctx)


class CountWithRecordLog(Count, CheckpointedFunction):
    """A count that also keeps operator state: how many records this subtask has seen."""

    def initialize_state(self, context: Any) -> None:
        self.seen = context.get_operator_state_store().get_list_state(
            ListStateDescriptor("seen", int)
        )
        restored = list(self.seen.get())
        self.total = sum(restored)

    def snapshot_state(self, context: Any) -> None:
        self.seen.update([self.total])

    def process_element(self, value: Any, ctx: Any) -> Any:
        self.total += 1
        n = self.n.value() + 1
        self.n.update(n)
        yield {"user": ctx.get_current_key(), "n": n, "seen": self.total}


class Sum(KeyedProcessFunction):
    """Emits ``(key, running sum of v)``; output as a dict to exercise matching by name."""

    def open(self, ctx: Any) -> None:
        self.total = ctx.get_state(ValueStateDescriptor("total", int, default=0))

    def process_element(self, value: Any, ctx: Any) -> Any:
        t = self.total.value() + value["v"]
        self.total.update(t)
        yield {"total": t, "k": ctx.get_current_key()}


class BadOutput(KeyedProcessFunction):
    """Emits a string where the schema declares a long."""

    def process_element(self, value: Any, ctx: Any) -> Any:
        yield ctx.get_current_key(), "not a number"


class WindowSize(ProcessWindowFunction):
    """``(key, window start, number of elements)`` per firing."""

    def process(self, key: Any, context: Any, elements: Any) -> Any:
        yield key, context.window().start, len(list(elements))


class HalfCount(KeyedProcessFunction):
    """Emits ``(key, v / 2)``: a float with a fraction for odd ``v``, declared ``long``."""

    def process_element(self, value: Any, ctx: Any) -> Any:
        yield ctx.get_current_key(), value.v / 2


class SlowCount(Count):
    """A count that sleeps ``delay`` seconds per record; when it sees ``value.v == marker_at``
    it creates ``marker`` (a batch is in flight) and, with ``go``, waits until that file
    exists (at most two minutes)."""

    def __init__(
        self, delay: float, marker: str | None = None, marker_at: int = -1, go: str | None = None
    ) -> None:
        self.delay = delay
        self.marker = marker
        self.marker_at = marker_at
        self.go = go

    def process_element(self, value: Any, ctx: Any) -> Any:
        if self.marker and value.v == self.marker_at:
            with open(self.marker, "a") as f:
                f.write(f"{os.getpid()}\n")
            deadline = time.monotonic() + 120
            while self.go and not os.path.exists(self.go) and time.monotonic() < deadline:
                time.sleep(0.05)
        time.sleep(self.delay)
        yield from super().process_element(value, ctx)


class Boom(Exception):
    """A user's own exception class (of a module a Spark Connect server never imports)."""


class FailOnKey(Count):
    """A count that raises :class:`Boom` on the records of ``key``."""

    def __init__(self, key: str) -> None:
        self.key = key

    def process_element(self, value: Any, ctx: Any) -> Any:
        if ctx.get_current_key() == self.key:
            raise Boom(f"cannot count {value.v}")
        yield from super().process_element(value, ctx)


class RemindLater(KeyedProcessFunction):
    """Emits ``(key, "seen", n)`` per record and registers a processing-time timer
    ``after_ms`` later; the timer emits ``(key, "reminder", n)`` (records seen so far)."""

    def __init__(self, after_ms: int) -> None:
        self.after_ms = after_ms

    def open(self, ctx: Any) -> None:
        self.n = ctx.get_state(ValueStateDescriptor("n", int, default=0))

    def process_element(self, value: Any, ctx: Any) -> Any:
        n = self.n.value() + 1
        self.n.update(n)
        timers = ctx.timer_service()
        timers.register_processing_time_timer(timers.current_processing_time() + self.after_ms)
        yield ctx.get_current_key(), "seen", n

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        yield ctx.get_current_key(), "reminder", self.n.value()


class WindowSizeWithSleep(ProcessWindowFunction):
    """:class:`WindowSize` that, the first time it fires the window starting at ``sleep_at``,
    creates ``marker`` and sleeps until killed (a driver is killed inside that micro-batch)."""

    def __init__(self, sleep_at: int, marker: str) -> None:
        self.sleep_at = sleep_at
        self.marker = marker

    def process(self, key: Any, context: Any, elements: Any) -> Any:
        start = context.window().start
        if start == self.sleep_at and not os.path.exists(self.marker):
            with open(self.marker, "w") as f:
                f.write(str(os.getpid()))
            time.sleep(600)
        yield key, start, len(list(elements))


class FailingReminder(RemindLater):
    """:class:`RemindLater` whose timer raises :class:`Boom`."""

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        raise Boom(f"reminder of {ctx.get_current_key()!r} failed")


class Visits(KeyedProcessFunction):
    """Counts a user's records (value state), keeps their last three values (list state) and
    the last value per ``v % 4`` (map state); registers a timer per record."""

    def open(self, ctx: Any) -> None:
        self.n = ctx.get_state(ValueStateDescriptor("n", int, default=0))
        self.recent = ctx.get_list_state(ListStateDescriptor("recent", int))
        self.by_rest = ctx.get_map_state(MapStateDescriptor("by_rest", int, int))

    def process_element(self, value: Any, ctx: Any) -> Any:
        self.n.update(self.n.value() + 1)
        self.recent.update([*self.recent.get(), value.v][-3:])
        self.by_rest.put(value.v % 4, value.v)
        ctx.timer_service().register_processing_time_timer(1 << 50)
        yield ctx.get_current_key(), self.n.value()
