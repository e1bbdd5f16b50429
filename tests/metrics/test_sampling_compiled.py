"""The compiled countdown of the metrics decorators (``_sampling.c``).

test_state_metrics.py runs every metrics test with it and with the generated Python methods;
this file checks the type itself: that it is built (the README's setup compiles it; a silent
fallback would go unnoticed, so its absence fails here) and used, which calls it samples, that
it passes arguments and errors through unchanged, and that a decorator holding it is collected.
"""

from __future__ import annotations

import gc
import os

import pytest
from streamstate.backends.decorators._sampling import Sampled

from streamstate import ValueStateDescriptor
from streamstate.backends.decorators import metrics
from streamstate.backends.heap.backend import HeapKeyedStateBackend
from streamstate.keygroups import KeyGroupRange
from streamstate.metrics import MetricGroup
from streamstate.serializers import StrSerializer


@pytest.mark.skipif(
    os.environ.get("STREAMSTATE_PURE_PYTHON", "") not in ("", "0"),
    reason="STREAMSTATE_PURE_PYTHON selects the reference",
)
def test_the_decorators_use_it() -> None:
    assert metrics.Sampled is Sampled
    group = MetricGroup("state")
    b = HeapKeyedStateBackend(
        StrSerializer(), 8, KeyGroupRange(0, 7), latency_tracking=True, metric_group=group
    )
    b.set_current_key("k")
    state = b.get_partitioned_state("ns", None, ValueStateDescriptor("n", int))
    assert type(state.value) is Sampled and type(state.update) is Sampled


def test_samples_the_first_call_then_every_interval() -> None:
    seen: list[str] = []
    s = Sampled(lambda i: seen.append(f"fast {i}"), lambda i: seen.append(f"sampled {i}"), 100)
    for i in range(1, 302):
        s(i)
    assert [x for x in seen if x.startswith("sampled")] == [
        "sampled 1",
        "sampled 101",
        "sampled 201",
        "sampled 301",
    ]
    assert len(seen) == 301
    assert (s.interval, s.left) == (100, 100)


def test_arguments_results_and_errors_pass_through() -> None:
    s = Sampled(lambda *a, **k: ("fast", a, k), lambda *a, **k: ("sampled", a, k), 2)
    assert s(1, x=2) == ("sampled", (1,), {"x": 2})
    assert s(3) == ("fast", (3,), {})

    def boom(*_: object) -> None:
        raise KeyError("k")

    failing = Sampled(boom, boom, 3)
    for _ in range(4):  # an error does not stop the countdown (as in the Python methods)
        with pytest.raises(KeyError):
            failing()
    assert failing.left == 3  # calls 1 and 4 were the sampled ones


@pytest.mark.parametrize("interval", [0, -1])
def test_interval_must_be_positive(interval: int) -> None:
    with pytest.raises(ValueError, match="sample_interval must be >= 1"):
        Sampled(print, print, interval)


def _alive(cls: type) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is cls)


def test_a_decorator_and_its_countdowns_are_collected() -> None:
    b = HeapKeyedStateBackend(StrSerializer(), 8, KeyGroupRange(0, 7), latency_tracking=True)
    b.set_current_key("k")
    original = b.get_partitioned_state("ns", None, ValueStateDescriptor("n", int))
    before = (_alive(metrics.MetricsTrackingValueState), _alive(Sampled))
    wrapped = metrics.wrap_with_metrics(
        original.original, original.descriptor, MetricGroup("state"), latency=True
    )
    wrapped.value()
    assert _alive(metrics.MetricsTrackingValueState) == before[0] + 1
    del wrapped  # the decorator -> its Sampled -> its bound sampled method -> the decorator
    assert (_alive(metrics.MetricsTrackingValueState), _alive(Sampled)) == before
