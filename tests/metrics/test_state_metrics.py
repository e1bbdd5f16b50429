"""Latency and size tracking decorators (SPEC §8) and the metrics report."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from streamstate import (
    AggregateFunction,
    AggregatingStateDescriptor,
    HeapStateBackend,
    KeyedProcessFunction,
    ListStateDescriptor,
    LocalRunner,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)
from streamstate.backends.decorators import metrics as metrics_module
from streamstate.backends.decorators.metrics import (
    MetricsTrackingValueState,
    TrackedOperation,
    wrap_with_metrics,
)
from streamstate.backends.decorators.ttl import TtlValueState
from streamstate.backends.heap.backend import HeapKeyedStateBackend
from streamstate.keygroups import KeyGroupRange
from streamstate.metrics import Histogram, MetricGroup, format_report, report_rows
from streamstate.serializers import StrSerializer

COUNTDOWNS = [pytest.param(None, id="python-countdown")]
if metrics_module.Sampled is not None:
    COUNTDOWNS.append(pytest.param(metrics_module.Sampled, id="compiled-countdown"))


@pytest.fixture(autouse=True, params=COUNTDOWNS)
def countdown(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> object:
    """Every test runs with the generated Python methods and with the compiled countdown
    (``_sampling.c``), which must count, sample and record exactly the same."""
    monkeypatch.setattr(metrics_module, "Sampled", request.param)
    return request.param


class Sum(AggregateFunction):
    def create_accumulator(self):
        return 0

    def add(self, value, accumulator):
        return accumulator + value

    def get_result(self, accumulator):
        return accumulator

    def merge(self, acc_a, acc_b):
        return acc_a + acc_b


def backend(latency=True, size=False, group=None):
    return HeapKeyedStateBackend(
        StrSerializer(),
        8,
        KeyGroupRange(0, 7),
        table_kind="nested_maps",
        latency_tracking=latency,
        size_tracking=size,
        metric_group=group if group is not None else MetricGroup("state"),
    )


def state(b, descriptor, key="k", ns="ns"):
    b.set_current_key(key)
    return b.get_partitioned_state(ns, None, descriptor)


def hist(group, name) -> Histogram:
    m = group.metrics()[name]
    assert isinstance(m, Histogram)
    return m


def test_tracking_is_off_by_default():
    b = HeapKeyedStateBackend(StrSerializer(), 8, KeyGroupRange(0, 7))
    s = state(b, ValueStateDescriptor("v", int))
    assert not isinstance(s, MetricsTrackingValueState)
    assert HeapStateBackend().latency_tracking is False
    assert HeapStateBackend().size_tracking is False


def test_sampling_interval_is_100_first_call_included():
    g = MetricGroup("state")
    s = state(backend(group=g), ValueStateDescriptor("v", int))
    calls = 0
    for target in (1, 2, 100, 101, 102, 250, 1000):
        while calls < target:
            s.update(calls)
            calls += 1
        assert hist(g, "state.v.value_state_update_latency").count == math.ceil(target / 100)
    assert hist(g, "state.v.value_state_get_latency").count == 0  # per operation
    s.value()
    assert hist(g, "state.v.value_state_get_latency").count == 1


def test_tracked_operation_countdown():
    op = TrackedOperation(3, Histogram(4))
    sampled = []
    for i in range(10):
        left = op.left - 1
        if left:
            op.left = left
        else:
            op.left = op.interval
            sampled.append(i)
    assert sampled == [0, 3, 6, 9]


def test_histogram_keeps_the_last_128_samples():
    g = MetricGroup("state")
    s = state(backend(group=g), ValueStateDescriptor("v", int))
    for _ in range(100 * 200):
        s.value()
    h = hist(g, "state.v.value_state_get_latency")
    assert h.count == 200 and h.size == 128 and len(h._samples) == 128
    assert h.statistics()["min"] > 0


def test_metric_names_per_kind():
    g = MetricGroup("state")
    b = backend(latency=True, size=True, group=g)
    v = state(b, ValueStateDescriptor("v", int))
    v.update(1), v.value(), v.clear()
    lst = state(b, ListStateDescriptor("l", str))
    lst.add("a"), lst.add_all(["b"]), lst.update(["c", "d"]), lst.get()
    lst.merge_namespaces("ns", ["other"]), lst.clear()
    m = state(b, MapStateDescriptor("m", str, int))
    m.put("a", 1), m.put_all({"b": 2}), m.get("a"), m.contains("a"), m.remove("b")
    list(m.items()), list(m.keys()), list(m.values()), m.is_empty(), m.clear()
    r = state(b, ReducingStateDescriptor("r", lambda x, y: x + y, int))
    r.add(1), r.get(), r.merge_namespaces("ns", ["o"]), r.clear()
    a = state(b, AggregatingStateDescriptor("a", Sum(), int))
    a.add(1), a.get(), a.merge_namespaces("ns", ["o"]), a.clear()

    names = set(g.metrics())
    expected_latency = {
        "v": ["value_state_get", "value_state_update", "value_state_clear"],
        "l": [f"list_state_{op}" for op in ("get", "add", "add_all", "update", "clear")]
        + ["list_state_merge_namespaces"],
        "m": [
            f"map_state_{op}"
            for op in (
                "get", "put", "put_all", "remove", "contains", "entries_init", "keys_init",
                "values_init", "is_empty", "clear",
            )
        ],
        "r": [f"reducing_state_{op}" for op in ("get", "add", "merge_namespaces", "clear")],
        "a": [f"aggregating_state_{op}" for op in ("get", "add", "merge_namespaces", "clear")],
    }  # fmt: skip
    for st_name, ops in expected_latency.items():
        for op in ops:
            name = f"state.{st_name}.{op}_latency"
            assert name in names, name
            assert hist(g, name).count == 1, name
    sizes = {
        "state.v.value_state_get_value_size": 8,
        "state.v.value_state_update_value_size": 8,
        "state.l.list_state_add_value_size": 1,
        "state.m.map_state_get_value_size": 8,
        "state.m.map_state_put_key_size": 1,
        "state.m.map_state_get_key_size": 1,
        "state.r.reducing_state_add_value_size": 8,
    }
    for name, size in sizes.items():
        assert hist(g, name).statistics()["max"] == size, name


def test_decorated_states_behave_like_plain_ones():
    g = MetricGroup("state")
    tracked, plain = backend(True, True, g), backend(False, False)
    for b in (tracked, plain):
        m = state(b, MapStateDescriptor("m", str, int))
        for i in range(300):
            m.put(str(i % 7), i)
            if i % 5 == 0:
                m.remove(str(i % 3))
    assert sorted(state(tracked, MapStateDescriptor("m", str, int)).items()) == sorted(
        state(plain, MapStateDescriptor("m", str, int)).items()
    )


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["add", "get", "clear", "update", "merge"]), st.integers(0, 9)),
        max_size=60,
    )
)
def test_tracked_list_state_equals_untracked(ops):
    results = []
    for b in (backend(True, True), backend(False, False)):
        s = state(b, ListStateDescriptor("l", int))
        out = []
        for op, x in ops:
            s.set_current_namespace(f"ns{x % 3}")
            if op == "add":
                s.add(x)
            elif op == "get":
                out.append(list(s.get()))
            elif op == "clear":
                s.clear()
            elif op == "update":
                s.update([x, x])
            else:
                s.merge_namespaces("ns0", ["ns1", "ns2"])
        results.append((out, b.num_entries()))
    assert results[0] == results[1]


def test_order_is_raw_then_ttl_then_metrics():
    s = state(
        backend(), ValueStateDescriptor("v", int).enable_time_to_live(StateTtlConfig(ttl=1000))
    )
    assert isinstance(s, MetricsTrackingValueState)
    assert isinstance(s.original, TtlValueState)
    s.update(5)
    assert s.value() == 5


def test_wrap_with_metrics_without_group_or_tracking():
    plain = object()
    d = ValueStateDescriptor("v", int)
    assert wrap_with_metrics(plain, d, None) is plain
    b = backend(latency=False)
    raw = state(b, d)
    wrapped = wrap_with_metrics(raw, d, None, latency=True)
    wrapped.update(1)
    assert wrapped.metric_group.name == "v"  # the state's own group
    assert wrapped.metric_group.metrics()["v.value_state_update_latency"].count == 1


class CountingFunction(KeyedProcessFunction):
    def open(self, ctx):
        self.group = ctx.get_metrics_group()
        self.n = ctx.get_state(ValueStateDescriptor("n", int, default=0))

    def process_element(self, value, ctx):
        self.n.update(self.n.value() + 1)
        return None


def test_metrics_are_readable_through_the_runtime_context():
    runner = LocalRunner(
        CountingFunction(),
        key_selector=lambda r: r,
        state_backend=HeapStateBackend(latency_tracking=True, size_tracking=True),
    )
    runner.run([f"k{i % 10}" for i in range(500)])
    group = runner.subtasks[0].function.group
    names = group.metrics()
    get = names["keyed-process.0.state.n.value_state_get_latency"]
    assert get.count == 5  # 500 calls: the 1st, 101st, ..., 401st
    assert names["keyed-process.0.state.n.value_state_update_value_size"].statistics()["max"] == 8

    rows = report_rows(group)
    assert any(r["name"].endswith("value_state_update_latency") for r in rows)
    console = Console(width=160, record=True)
    with console.capture() as cap:
        console.print(format_report(group))
    text = cap.get()
    assert "keyed-process.0.state.n.value_state_get_latency" in text
    assert " ns" in text and " B" in text


def test_every_operation_of_every_kind_samples_calls_1_101_201():
    g = MetricGroup("state")
    b = backend(latency=True, size=True, group=g)
    for i in range(205):
        v = state(b, ValueStateDescriptor("v", int))
        v.update(i), v.value(), v.clear()
        lst = state(b, ListStateDescriptor("l", int))
        lst.add(i), lst.add_all([i]), lst.update([i, i]), lst.get()
        lst.merge_namespaces("ns", ["other"]), lst.clear()
        m = state(b, MapStateDescriptor("m", str, int))
        m.put("a", i), m.put_all({"b": i}), m.get("a"), m.contains("a"), m.remove("b")
        list(m.items()), list(m.keys()), list(m.values()), m.is_empty(), m.clear()
        r = state(b, ReducingStateDescriptor("r", lambda x, y: x + y, int))
        r.add(i), r.get(), r.merge_namespaces("ns", ["o"]), r.clear()
        a = state(b, AggregatingStateDescriptor("a", Sum(), int))
        a.add(i), a.get(), a.merge_namespaces("ns", ["o"]), a.clear()
    metrics = g.metrics()
    assert len(metrics) == 42  # 29 latencies, 13 sizes
    for name in metrics:
        assert hist(g, name).count == 3, name  # calls 1, 101 and 201 of each operation
    # the sizes are those of the sampled calls' arguments and results (i = 0, 100, 200)
    assert hist(g, "state.l.list_state_update_value_size").statistics()["max"] == 5
    assert hist(g, "state.m.map_state_put_all_value_size").statistics()["max"] == 5
