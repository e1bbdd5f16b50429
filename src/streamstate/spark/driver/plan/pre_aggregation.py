"""The driver's side of two-phase window aggregation (SPEC §13.2): which jobs are
pre-aggregated, and the Spark plan of a micro-batch that folds records per (key, window) before
the shuffle.

``keyed_process(..., pre_aggregate=None)`` runs a window aggregate pre-aggregated wherever its
outputs are those of the per-record path (:mod:`streamstate.windows.pre_aggregation` says
when); ``True`` also where only intermediate firings can differ, ``False`` never. Two folds:

* **Spark SQL** for a built-in aggregate (``count``, ``sum``, ``min``, ``max``, ``avg`` of
  :mod:`streamstate.api.aggregates`) over an event time that is a timestamp or a long: the
  windows (Flink's start with offset: ``ts - pmod(ts - offset, slide)``) and the fold are SQL
  expressions, and ``groupBy(key, kind, window)`` is Spark's own partial aggregation: no Python
  touches a record before the shuffle. Lateness is the subtask's to decide (the statement is
  then the same every micro-batch and Spark reuses its generated code), except with a late
  side output, whose elements the statement keeps whole: it then compares with the batch's
  watermark. The key
  group is computed on the grouped rows (in SQL for an integer key), which are then
  repartitioned by subtask: two shuffles, the second of one row per group.
* **Python** for any other ``AggregateFunction`` or reduce function: a ``mapInArrow`` pass
  over each map partition (:class:`~streamstate.spark.partial_fold.PartialFold`) assigns the
  windows for whole columns, folds the groups with ``add`` and computes the key groups; then
  one shuffle by subtask.

Either way the subtask receives the rows of :mod:`streamstate.spark.partials` and merges them
(:meth:`~streamstate.windows.operator.WindowOperator.process_partial`).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from streamstate.api.aggregates import BuiltinAggregate
from streamstate.errors import PreAggregationError
from streamstate.spark.job import KEY_GROUP_COLUMN
from streamstate.spark.partials import (
    ACCUMULATOR,
    COUNT,
    KIND,
    MAX_TS,
    MIN_TS,
    RECORDS,
    RESERVED,
    WINDOW,
    sql_accumulator,
)
from streamstate.windows.partial import LATE, PARTIAL, WINDOWLESS
from streamstate.windows.pre_aggregation import PreAggregation, choose_pre_aggregation

__all__ = [
    "PreAggregationPlan",
    "collected_fold",
    "folded",
    "plan_pre_aggregation",
    "pre_aggregated",
]

#: Spark SQL types a built-in aggregate's column may have (by aggregate)
_NUMERIC = ("ByteType", "ShortType", "IntegerType", "LongType", "FloatType", "DoubleType")
_ORDERED = (*_NUMERIC, "StringType", "BooleanType")
_COLUMN_TYPES = {"count": None, "sum": _NUMERIC, "avg": _NUMERIC, "min": _ORDERED, "max": _ORDERED}
_INTEGRAL = ("ByteType", "ShortType", "IntegerType", "LongType")
_LATE_ID = "_pre_late_id"
_TS = "_pre_ts"
_LAST = "_pre_last"
_STARTS = "_pre_starts"
_POS = "_pre_pos"


@dataclasses.dataclass(frozen=True)
class PreAggregationPlan:
    """How a keyed job's micro-batches are pre-aggregated."""

    #: "sql" (a built-in aggregate, Spark's partial aggregation) or "python"
    mode: str
    pre: PreAggregation
    #: the built-in aggregate (mode "sql")
    aggregate: BuiltinAggregate | None
    key_columns: list[str]
    value_columns: list[str]
    event_time: str | None
    #: the event-time column is a timestamp (microseconds) rather than long milliseconds
    event_time_is_timestamp: bool

    @property
    def carries_values(self) -> bool:
        """Late elements cross the shuffle whole (a late side output)."""
        return self.pre.late_output


def plan_pre_aggregation(
    df: Any,
    function: Any,
    requested: bool | None,
    *,
    key_columns: list[str],
    event_time: str | None,
    streaming: bool,
) -> tuple[Any, PreAggregationPlan | None]:
    """(the function to run, its pre-aggregation or None) for ``keyed_process(df, ...,
    pre_aggregate=requested)``. A pre-aggregated reduce without ``element_type`` runs on a
    copy of the function typed from the input's schema (the subtask never sees a first element
    to infer it from). Raises PreAggregationError where ``requested`` is True and it cannot
    run, ValueError for a built-in aggregate over a column it does not take."""
    from streamstate.spark.records import row_serializer
    from streamstate.windows.operator import WindowOperator

    if isinstance(function, WindowOperator):
        _check_builtin_column(df, function.contents.function)
    pre = choose_pre_aggregation(function, requested, bounded=not streaming)
    if pre is None:
        return function, None

    def refuse(why: str) -> tuple[Any, None]:
        if requested:
            raise PreAggregationError(why)
        return function, None

    if pre.windowing is not None and event_time is None:
        return refuse(
            "event-time windows need the records' timestamps before the shuffle: give "
            "keyed_process(event_time=...)"
        )
    clash = sorted(RESERVED.intersection(df.columns))
    if clash:
        return refuse(f"the input has columns {clash}, which pre-aggregated rows use")
    if pre.contents == "reducing" and function.contents.element_type is None:
        element = row_serializer(df.schema, list(df.columns))
        if element is None:
            return refuse(
                "a reduce is pre-aggregated with its reduced records serialized, and the "
                f"input's schema ({df.schema.simpleString()}) has a column without a "
                "built-in serializer: pass element_type= to reduce()"
            )
        function = copy.deepcopy(function)
        function.assume_element_type(element)
    aggregate = function.contents.function
    ts_type = None if event_time is None else type(df.schema[event_time].dataType).__name__
    sql = isinstance(aggregate, BuiltinAggregate) and (
        event_time is None or ts_type in ("TimestampType", *_INTEGRAL)
    )
    return function, PreAggregationPlan(
        mode="sql" if sql else "python",
        pre=pre,
        aggregate=aggregate if sql else None,
        key_columns=list(key_columns),
        value_columns=list(df.columns),
        event_time=event_time,
        event_time_is_timestamp=ts_type == "TimestampType",
    )


def _check_builtin_column(df: Any, aggregate: Any) -> None:
    if not isinstance(aggregate, BuiltinAggregate) or aggregate.column is None:
        return
    column = aggregate.column
    if column not in df.columns:
        raise ValueError(f"{aggregate!r}: column {column!r} is not in the input {df.columns}")
    allowed = _COLUMN_TYPES[aggregate.kind]
    found = type(df.schema[column].dataType).__name__
    if allowed is not None and found not in allowed:
        raise ValueError(
            f"{aggregate!r} takes a column of type {', '.join(allowed)}; {column!r} is "
            f"{df.schema[column].dataType.simpleString()} (cast it)"
        )


def folded(df: Any, plan: PreAggregationPlan, *, watermark: int | None, fold_task: Any) -> Any:
    """The micro-batch ``df`` folded per (key, window) (the rows of
    :mod:`streamstate.spark.partials`; the Python fold's have ``_kg``), not yet placed."""
    if plan.mode == "sql":
        return _sql_fold(df, plan, watermark)
    return df.mapInArrow(fold_task, partial_struct(df, plan))


def collected_fold(
    df: Any, plan: PreAggregationPlan, *, watermark: int | None, fold_task: Any
) -> Any:
    """:func:`folded` for the driver to collect (a local master): when the micro-batch is one
    partition, Spark SQL's fold is told so (``coalesce(1)``, which changes nothing else), and
    plans its partial and final aggregation in one stage, without a shuffle; with several, each
    reads its own and the groups are merged after a shuffle (a shuffle the driver's collect would
    make unnecessary, as the hosts merge groups, but Spark plans no partial aggregation alone)."""
    if plan.mode == "sql" and _partitions(df) == 1:
        df = df.coalesce(1)
    return folded(df, plan, watermark=watermark, fold_task=fold_task)


def _partitions(df: Any) -> int | None:
    """The number of partitions of a classic DataFrame; None where it cannot be asked (Spark
    Connect). A ``foreachBatch`` micro-batch is a ``LogicalRDD`` over the RDD Spark already
    planned: its partitions are read from there, without planning ``df`` again (10-35 ms per
    micro-batch, a plan the fold's own job would not reuse); any other DataFrame is planned."""
    try:
        execution = df._jdf.queryExecution()
    except Exception:
        return None
    try:
        return int(execution.analyzed().rdd().getNumPartitions())
    except Exception:
        pass  # not a LogicalRDD
    try:
        return int(execution.toRdd().getNumPartitions())
    except Exception:
        return None


def pre_aggregated(
    df: Any,
    plan: PreAggregationPlan,
    *,
    parallelism: int,
    max_parallelism: int,
    watermark: int | None,
    fold_task: Any = None,
) -> Any:
    """The micro-batch ``df`` pre-aggregated and placed: partition ``i`` holds subtask ``i``'s
    rows of :mod:`streamstate.spark.partials`. ``fold_task``: the Python fold's ``mapInArrow``
    function (mode "python")."""
    from streamstate.spark.driver.plan.placement import place
    from streamstate.spark.driver.session import functions_for

    if plan.mode == "sql":
        return place(_sql_fold(df, plan, watermark), plan.key_columns, parallelism, max_parallelism)
    sf = functions_for(df)
    folded = df.mapInArrow(fold_task, partial_struct(df, plan))
    subtask = f"CAST(({KEY_GROUP_COLUMN} * {parallelism}) div {max_parallelism} AS INT)"
    return folded.repartitionById(parallelism, sf.expr(subtask))


def partial_struct(df: Any, plan: PreAggregationPlan) -> Any:
    """The Spark schema of the Python fold's rows."""
    from pyspark.sql.types import (
        BinaryType,
        IntegerType,
        LongType,
        StructField,
        StructType,
    )

    kept = plan.value_columns if plan.carries_values else plan.key_columns
    fields = [
        StructField(f.name, f.dataType, True) for f in df.schema.fields if f.name in set(kept)
    ]
    return StructType(
        [
            *fields,
            StructField(KEY_GROUP_COLUMN, IntegerType(), True),
            StructField(KIND, IntegerType(), True),
            StructField(WINDOW, LongType(), True),
            StructField(COUNT, LongType(), True),
            StructField(RECORDS, LongType(), True),
            StructField(MIN_TS, LongType(), True),
            StructField(MAX_TS, LongType(), True),
            StructField(ACCUMULATOR, BinaryType(), True),
        ]
    )


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


@dataclasses.dataclass(frozen=True)
class SqlFold:
    """Spark SQL's partial aggregation of a built-in aggregate per (key, kind, window) as the
    steps of the micro-batch's DataFrame: projections (each a ``selectExpr`` of new columns),
    then ``groupBy(group).agg(aggregates)``, then the ``columns`` kept."""

    projections: list[list[str]]
    group: list[str]
    aggregates: list[str]
    #: the columns kept, or None: all the grouped ones (read by name)
    columns: list[str] | None

    def apply(self, df: Any) -> Any:
        """The steps over ``df`` (a call into the JVM and an analysis each: a tumbling or
        processing-time window without a late side output is one ``groupBy(...).agg(...)``)."""
        from streamstate.spark.driver.session import functions_for

        sf = functions_for(df)
        for exprs in self.projections:
            df = df.selectExpr("*", *exprs)
        grouped = df.groupBy(*[sf.expr(g) for g in self.group]).agg(
            *[sf.expr(a) for a in self.aggregates]
        )
        return grouped if self.columns is None else grouped.selectExpr(*self.columns)


def sql_fold(plan: PreAggregationPlan, watermark: int | None) -> SqlFold:
    """The :class:`SqlFold` of a micro-batch under ``watermark``."""
    pre = plan.pre
    aggregate = plan.aggregate
    assert aggregate is not None
    keys = [_q(c) for c in plan.key_columns]
    carried = [c for c in plan.value_columns if c not in plan.key_columns]
    if plan.event_time is None:
        ts = "CAST(NULL AS BIGINT)"
    elif plan.event_time_is_timestamp:
        ts = f"unix_millis({_q(plan.event_time)})"  # floor division, as event_time_ms
    else:
        ts = f"CAST({_q(plan.event_time)} AS BIGINT)"
    windowing = pre.windowing
    aggregates = _aggregate_columns(aggregate, ts)
    if not plan.carries_values and (windowing is None or windowing.slide == windowing.size):
        # one step, the expressions inlined (every DataFrame step is an analysis by the driver)
        if windowing is None:
            # the subtask assigns the windows (the same for every element of the batch)
            start = "CAST(NULL AS BIGINT)"
        else:
            start = f"({ts} - pmod({ts} - {windowing.offset}, {windowing.slide}))"
        group = [*keys, f"{PARTIAL} AS {KIND}", f"{start} AS {WINDOW}"]
        return SqlFold([], group, [*aggregates, f"count(1) AS {RECORDS}"], None)
    projections = [[f"{ts} AS {_TS}"]]
    aggregates = _aggregate_columns(aggregate, _TS)
    records = f"count(1) AS {RECORDS}"
    if windowing is None:
        projections.append([f"{PARTIAL} AS {KIND}", f"CAST(NULL AS BIGINT) AS {WINDOW}"])
    else:
        windows, records = _window_steps(plan, watermark)
        projections += windows
    group = [*keys, KIND, WINDOW]
    if plan.carries_values:
        # every late element is a group of its own, which keeps its columns
        projections.append(
            [f"CASE WHEN {KIND} = {LATE} THEN monotonically_increasing_id() END AS {_LATE_ID}"]
        )
        group.append(_LATE_ID)
    aggregates.append(records)
    if plan.carries_values:
        aggregates += [f"first({_q(c)}) AS {_q(c)}" for c in carried]
    kept = plan.value_columns if plan.carries_values else plan.key_columns
    columns = [
        *[_q(c) for c in kept],
        KIND,
        WINDOW,
        COUNT,
        RECORDS,
        MIN_TS,
        MAX_TS,
        *[sql_accumulator(i) for i in range(len(aggregate.partials()))],
    ]
    return SqlFold(projections, group, aggregates, columns)


def _window_steps(plan: PreAggregationPlan, watermark: int | None) -> tuple[list[list[str]], str]:
    """The steps that give each element its windows (and its kind: PARTIAL, LATE,
    WINDOWLESS), and the expression that counts the records, of a fold in event-time windows
    that carries values or slides."""
    windowing = plan.pre.windowing
    assert windowing is not None
    projections: list[list[str]] = []
    records = f"count(1) AS {RECORDS}"
    size, slide, offset = windowing.size, windowing.slide, windowing.offset
    # without a late side output the subtask decides lateness (same watermark): the steps
    # are then the same every micro-batch, and Spark reuses the code it generated for them
    # (a literal watermark would make it compile new code for every micro-batch)
    threshold = windowing.late_threshold(watermark) if plan.carries_values else None
    projections.append([f"{_TS} - pmod({_TS} - {offset}, {slide}) AS {_LAST}"])

    def not_late(start: str) -> str:
        return "TRUE" if threshold is None else f"({start} + {size - 1} > {threshold})"

    element_late = "FALSE" if threshold is None else f"({_TS} <= {threshold})"
    if windowing.slide == windowing.size:
        # tumbling: one window, which holds its element; late iff the element is
        projections.append(
            [
                f"CASE WHEN {not_late(_LAST)} THEN {PARTIAL} ELSE {LATE} END AS {KIND}",
                f"CASE WHEN {not_late(_LAST)} THEN {_LAST} END AS {WINDOW}",
            ]
        )
    else:
        k = windowing.windows_per_element()
        starts = (
            f"filter(transform(sequence(0, {k - 1}), i -> {_LAST} - i * {slide}), "
            f"s -> s > {_TS} - {size} AND {not_late('s')})"
        )
        kind = (
            f"CASE WHEN size({_STARTS}) > 0 THEN {PARTIAL} WHEN {element_late} THEN {LATE} "
            f"ELSE {WINDOWLESS} END"
        )
        # windowless elements: grouped by timestamp (their lateness is their own)
        exploded = (
            f"CASE WHEN size({_STARTS}) > 0 THEN {_STARTS} WHEN {element_late} THEN "
            f"array(CAST(NULL AS BIGINT)) ELSE array({_TS}) END"
        )
        projections.append([f"{starts} AS {_STARTS}"])
        projections.append([f"{kind} AS {KIND}", f"posexplode({exploded}) AS ({_POS}, {WINDOW})"])
        records = f"count_if({_POS} = 0) AS {RECORDS}"
    return projections, records


def _aggregate_columns(aggregate: BuiltinAggregate, ts: str) -> list[str]:
    """The aggregate expressions of a group but its records: the built-in aggregate's partial
    aggregates, the element count and the event-time range (``ts``: the event time in ms)."""
    out = []
    for i, (name, as_double) in enumerate(aggregate.partials()):
        arg = "1" if aggregate.column is None else _q(aggregate.column)
        if as_double:
            arg = f"CAST({arg} AS DOUBLE)"
        out.append(f"{name}({arg}) AS {sql_accumulator(i)}")
    return [*out, f"count(1) AS {COUNT}", f"min({ts}) AS {MIN_TS}", f"max({ts}) AS {MAX_TS}"]


def _sql_fold(df: Any, plan: PreAggregationPlan, watermark: int | None) -> Any:
    """The micro-batch ``df`` folded by :func:`sql_fold`."""
    return sql_fold(plan, watermark).apply(df)
