"""Keyed functions of the cluster tests (pickled by value: hosts do not import this)."""

from __future__ import annotations

import os
import time
from typing import Any

from streamstate import KeyedProcessFunction, ValueStateDescriptor


class Count(KeyedProcessFunction):
    """Emits ``(key, running count)`` per record."""

    def open(self, ctx: Any) -> None:
        self.n = ctx.get_state(ValueStateDescriptor("n", int, default=0))

    def process_element(self, value: Any, ctx: Any) -> Any:
        n = self.n.value() + 1
        self.n.update(n)
        yield ctx.get_current_key(), n


class CountPausingOnce(Count):
    """A count that, the first time it sees ``trigger`` as ``value.v``, writes ``marker`` (its
    pid and run directory) and sleeps ``seconds``: a batch kept in flight while a test kills a
    node. With ``go``, the sleep ends as soon as that file exists (the test did what it kept
    the batch in flight for), ``seconds`` at most."""

    def __init__(self, trigger: int, marker: str, seconds: float, go: str | None = None) -> None:
        self.trigger = trigger
        self.marker = marker
        self.seconds = seconds
        self.go = go

    def process_element(self, value: Any, ctx: Any) -> Any:
        if value.v == self.trigger and not os.path.exists(self.marker):
            with open(self.marker + ".tmp", "w") as f:
                f.write(f"{os.getpid()} {os.environ.get('STREAMSTATE_RUN_DIR', '')}")
            os.rename(self.marker + ".tmp", self.marker)
            if self.go is None:
                time.sleep(self.seconds)
            else:
                deadline = time.monotonic() + self.seconds
                while time.monotonic() < deadline and not os.path.exists(self.go):
                    time.sleep(0.05)
        yield from super().process_element(value, ctx)
