"""Fixtures of the TTL tests: a fake processing-time clock and heap backends over it."""

from __future__ import annotations

import pytest

from streamstate.backends.base import Clock
from streamstate.backends.heap.backend import HeapKeyedStateBackend
from streamstate.keygroups import KeyGroupRange
from streamstate.serializers import StrSerializer


class FakeClock(Clock):
    """A processing-time clock tests move by hand."""

    def __init__(self, now: int = 1_000) -> None:
        self.t = now

    def now(self) -> int:
        return self.t

    def advance(self, ms: int) -> None:
        self.t += ms


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_backend(clock):
    created = []

    def make(table_kind: str = "nested_maps", max_p: int = 8) -> HeapKeyedStateBackend:
        b = HeapKeyedStateBackend(
            StrSerializer(), max_p, KeyGroupRange(0, max_p - 1), table_kind=table_kind, clock=clock
        )
        created.append(b)
        return b

    yield make
    for b in created:
        b.dispose()


@pytest.fixture(params=["nested_maps", "copy_on_write"])
def backend(request, make_backend):
    return make_backend(request.param)
