"""The built-in aggregates (``streamstate.api.aggregates``) as ordinary AggregateFunctions:
Spark SQL's semantics against a plain-Python oracle, any split of the elements merged gives the
same result (what pre-aggregation relies on), their accumulators survive a checkpoint, and they
run per record in the LocalRunner."""

from __future__ import annotations

import math
from collections import namedtuple
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamstate import LocalRunner
from streamstate.api import aggregates as agg
from streamstate.windows import TumblingEventTimeWindows, window
from streamstate.windows.contents import infer_serializer

values = st.one_of(
    st.none(),
    st.integers(-(10**6), 10**6),
    st.floats(-1e6, 1e6, allow_nan=False),
    st.just(float("nan")),
)


def _fold(fn: Any, rows: list[Any]) -> Any:
    acc = fn.create_accumulator()
    for r in rows:
        acc = fn.add(r, acc)
    return acc


def _is_nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _oracle(kind: str, vs: list[Any]) -> Any:
    present = [v for v in vs if v is not None]
    if kind == "count":
        return len(vs)
    if kind == "count_v":
        return len(present)
    if not present:
        return None
    if kind == "sum":
        return math.fsum(present) if any(isinstance(v, float) for v in present) else sum(present)
    if kind == "avg":
        return math.fsum(float(v) for v in present) / len(present)
    numbers = [v for v in present if not _is_nan(v)]
    if kind == "max":  # NaN is larger than every number (Spark SQL)
        return float("nan") if len(numbers) < len(present) else max(numbers)
    return min(numbers) if numbers else float("nan")


BUILT = {
    "count": agg.count(),
    "count_v": agg.count("v"),
    "sum": agg.sum("v"),
    "min": agg.min("v"),
    "max": agg.max("v"),
    "avg": agg.avg("v"),
}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return False
        return (_is_nan(a) and _is_nan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)
    return a == b and type(a) is type(b)


@settings(max_examples=200, deadline=None)
@given(vs=st.lists(values, max_size=30), cut=st.integers(0, 30), kind=st.sampled_from(list(BUILT)))
def test_built_ins_follow_spark_sql_and_merge_any_split(vs: list[Any], cut: int, kind: str) -> None:
    fn = BUILT[kind]
    rows = [{"v": v} for v in vs]
    whole = fn.get_result(_fold(fn, rows))
    assert _same(whole, _oracle(kind, vs))
    merged = fn.merge(_fold(fn, rows[:cut]), _fold(fn, rows[cut:]))
    assert _same(fn.get_result(merged), whole)
    # an immutable accumulator that a checkpoint keeps as it is
    serializer = infer_serializer(fn.create_accumulator())
    assert serializer.immutable
    assert _same(fn.get_result(serializer.deserialize(serializer.serialize(merged))), whole)


def test_columns_of_records_dicts_named_tuples_and_objects() -> None:
    Point = namedtuple("Point", "k v")
    rows = [{"v": 2}, Point("a", 5), type("R", (), {"v": 1})()]
    assert agg.sum("v").get_result(_fold(agg.sum("v"), rows)) == 8
    assert agg.max("v").get_result(_fold(agg.max("v"), rows)) == 5
    with pytest.raises(KeyError, match="no column 'w'"):
        agg.count("w").add({"v": 1}, 0)
    with pytest.raises(TypeError, match="column name"):
        agg.sum(3)  # type: ignore[arg-type]
    assert repr(agg.count()) == "count()" and repr(agg.avg("v")) == "avg('v')"
    assert agg.min("v") == agg.min("v") and agg.min("v") != agg.max("v")


def test_sql_partials_make_the_accumulators() -> None:
    """What Spark SQL's partial aggregates of a group give becomes the accumulator the group's
    elements fold to (the subtask merges it as it merges its own)."""
    rows = [{"v": 3}, {"v": None}, {"v": 1.5}]
    partials = {
        "count": (3,),
        "count_v": (2,),
        "sum": (4.5,),
        "min": (1.5,),
        "max": (3,),
        "avg": (2, 4.5),
    }
    for kind, fn in BUILT.items():
        assert fn.accumulator_from_partials(partials[kind]) == _fold(fn, rows), kind
    assert agg.avg("v").accumulator_from_partials((0, None)) == agg.avg("v").create_accumulator()
    assert agg.sum("v").accumulator_from_partials((None,)) == agg.sum("v").create_accumulator()


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_built_ins_run_per_record_in_the_local_runner(backend: str) -> None:
    # a@1, a@4 and b@5 in [0, 10); a@12 in [10, 20) closes [0, 10), so b@8 is late
    events = [("a", 1, 3), ("a", 4, None), ("b", 5, 2), ("a", 12, 7), ("b", 8, 5)]
    outs = {}
    for kind, fn in BUILT.items():
        runner = LocalRunner(
            window(TumblingEventTimeWindows.of(10)).aggregate(fn),
            key_selector=lambda e: e["k"],
            timestamp_assigner=lambda e: e["t"],
            watermark_delay=0,
            state_backend=backend,
        )
        outs[kind] = sorted(runner.run([{"k": k, "t": t, "v": v} for k, t, v in events]))
    assert outs == {
        "count": [1, 1, 2],
        "count_v": [1, 1, 1],
        "sum": [2, 3, 7],
        "min": [2, 3, 7],
        "max": [2, 3, 7],
        "avg": [2.0, 3.0, 7.0],
    }
