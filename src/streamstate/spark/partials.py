"""Pre-aggregated rows (SPEC §13.2): what crosses the shuffle instead of every record when a
window aggregate is folded before it, and how a subtask reads them back as
:class:`~streamstate.windows.pre_aggregation.Partial`\\ s (the Python fold that makes them in the
pre-shuffle Spark task is :mod:`streamstate.spark.partial_fold`).

One row per (key, window) group of a micro-batch's map partition, with the key columns, the key
group ``_kg`` and

=================== =========================================================================
``_pre_kind``       PARTIAL (a group), LATE (late elements) or WINDOWLESS (elements in no
                    window) of :mod:`streamstate.windows.pre_aggregation`
``_pre_window``     the window's start (ms); null when the subtask assigns the windows
                    (processing-time and global windows) and for LATE rows; WINDOWLESS rows:
                    the elements' timestamp
``_pre_n``          elements in the group
``_pre_records``    input records counted by this row (a record of several sliding windows
                    counts in its first): their sum is the batch's records
``_pre_min_ts``     earliest event time (ms) of the group, null without event time
``_pre_max_ts``     latest event time: the watermark of the next batch comes from it
``_pre_acc``        Python fold: the accumulator (or reduced value) serialized with the window
                    contents' serializer
``_pre_acc<i>``     Spark SQL's partial aggregation of a built-in aggregate: the values of its
                    partial aggregates (``BuiltinAggregate.partials``)
=================== =========================================================================

A fold given the micro-batch's watermark decides lateness: late elements are LATE rows. Spark
SQL's fold is given none when there is no late side output (the same SQL every micro-batch, so
Spark reuses its generated code): the subtask decides, with the same watermark, and a PARTIAL
row of a late window counts its ``_pre_records`` as late, a WINDOWLESS row its elements if
their timestamp is behind the watermark. With a late side output, every late element is a row
of its own (LATE, ``_pre_n`` 1) carrying all the input's columns; without one, the late
elements of a key are one LATE row that counts them. PARTIAL rows carry only the key among the
input's columns.
"""

from __future__ import annotations

from typing import Any

from streamstate.api.aggregates import BuiltinAggregate
from streamstate.serializers.window_namespaces import TimeWindow
from streamstate.windows.partial import LATE, PARTIAL, Partial
from streamstate.windows.pre_aggregation import PreAggregation

__all__ = [
    "ACCUMULATOR",
    "COUNT",
    "KIND",
    "MAX_TS",
    "MIN_TS",
    "RECORDS",
    "RESERVED",
    "WINDOW",
    "PartialReader",
    "element_serializer",
    "partial_schema",
    "sql_accumulator",
]

KIND = "_pre_kind"
WINDOW = "_pre_window"
COUNT = "_pre_n"
RECORDS = "_pre_records"
MIN_TS = "_pre_min_ts"
MAX_TS = "_pre_max_ts"
ACCUMULATOR = "_pre_acc"
#: column names a pre-aggregated job's input must not use
RESERVED = frozenset({KIND, WINDOW, COUNT, RECORDS, MIN_TS, MAX_TS, ACCUMULATOR})


def sql_accumulator(i: int) -> str:
    """The column of the ``i``-th partial aggregate of a built-in aggregate."""
    return f"{ACCUMULATOR}{i}"


def partial_schema(
    input_schema: Any,
    key_columns: list[str],
    value_columns: list[str],
    late_output: bool,
    accumulators: list[Any] | None = None,
) -> Any:
    """The Arrow schema of pre-aggregated rows made from records of ``input_schema``: the key
    (or, with a late side output, every value) column, ``_kg``, the ``_pre_*`` columns, and
    ``_pre_acc`` (binary; the Python fold) or the types of a built-in aggregate's partial
    aggregates (``accumulators``; Spark SQL).

    >>> import pyarrow as pa
    >>> s = partial_schema(pa.schema([("k", pa.string()), ("ts", pa.int64())]), ["k"],
    ...                    ["k", "ts"], False)
    >>> s.names
    ['k', '_kg', '_pre_kind', '_pre_window', '_pre_n', '_pre_records', '_pre_min_ts', \
'_pre_max_ts', '_pre_acc']
    """
    import pyarrow as pa

    kept = value_columns if late_output else key_columns
    fields = [pa.field(c, input_schema.field(c).type) for c in value_columns if c in kept]
    fields += [
        pa.field("_kg", pa.int32()),
        pa.field(KIND, pa.int32()),
        pa.field(WINDOW, pa.int64()),
        pa.field(COUNT, pa.int64()),
        pa.field(RECORDS, pa.int64()),
        pa.field(MIN_TS, pa.int64()),
        pa.field(MAX_TS, pa.int64()),
    ]
    if accumulators is None:
        fields.append(pa.field(ACCUMULATOR, pa.binary()))
    else:
        fields += [pa.field(sql_accumulator(i), t) for i, t in enumerate(accumulators)]
    return pa.schema(fields)


def element_serializer(function: Any) -> Any:
    """The serializer of what the window contents hold (accumulator or reduced value)."""
    return function.contents.descriptor().serializer


class PartialReader:
    """Reads a subtask's pre-aggregated rows back: the keys, key groups and
    :class:`~streamstate.windows.pre_aggregation.Partial`\\ s of an Arrow batch, and what the
    batch counts (input records, latest event time).

    Parameters:
        function: the subtask's window operator.
        pre: how it is pre-aggregated.
        mode: "sql" (the accumulator from the partial aggregates' columns of a built-in
            aggregate) or "python" (serialized by the fold).
        key_columns, value_columns: the job's columns.
    """

    def __init__(
        self,
        function: Any,
        pre: PreAggregation,
        mode: str,
        key_columns: list[str],
        value_columns: list[str],
    ) -> None:
        from streamstate.spark.records import row_class

        self.pre = pre
        self.mode = mode
        self.key_columns = key_columns
        self.value_columns = value_columns
        self.row_type = row_class(value_columns)
        self.size = None if pre.windowing is None else pre.windowing.size
        aggregate = function.contents.function
        self.builtin: BuiltinAggregate | None = None
        if mode == "sql":
            if not isinstance(aggregate, BuiltinAggregate):
                raise TypeError(f"Spark SQL pre-aggregates built-in aggregates, not {aggregate!r}")
            self.builtin = aggregate
        else:
            self.deserialize = element_serializer(function).deserialize
        self.rebuild_rows = pre.contents == "reducing"

    def read(self, batch: Any) -> tuple[list[Any], list[Any], list[Any], bool, int, int | None]:
        """(keys, key groups, items, folded, input records, latest event time) of one batch.

        The items are :class:`Partial`\\ s for
        :meth:`~streamstate.windows.operator.WindowOperator.process_partial`, or, when every
        row is a PARTIAL of a known window (``folded``: the usual case of event-time windows),
        plain ``(window, accumulator, earliest timestamp, records)`` tuples for
        :meth:`~streamstate.windows.operator.WindowOperator.process_folded` (built by ``zip``
        in C: a Partial object per row cost a sixth of the subtask's time at a million keys).
        """
        import pyarrow.compute as pc

        from streamstate.spark.columns import column_values

        if len(self.key_columns) == 1:
            keys: list[Any] = batch.column(self.key_columns[0]).to_pylist()
        else:
            keys = list(zip(*(batch.column(c).to_pylist() for c in self.key_columns), strict=True))
        kgs = batch.column("_kg").to_pylist()
        kinds = batch.column(KIND).to_pylist()
        starts = batch.column(WINDOW).to_pylist()
        counts = batch.column(COUNT).to_pylist()
        in_first = batch.column(RECORDS).to_pylist()
        lows = batch.column(MIN_TS).to_pylist()
        records = pc.sum(batch.column(RECORDS)).as_py() or 0
        high = pc.max(batch.column(MAX_TS)).as_py()
        accs = self._accumulators(batch, kinds)
        elements: list[Any] = [None] * len(kinds)
        if self.pre.late_output and LATE in kinds:
            cls = self.row_type
            columns = [column_values(batch.column(c)) for c in self.value_columns]
            for i, kind in enumerate(kinds):
                if kind == LATE:
                    elements[i] = tuple.__new__(cls, [col[i] for col in columns])
        size = self.size
        # one window object per distinct start: a batch's groups share a few windows, and
        # equal objects that are the same object compare by identity in every state lookup
        windows: dict[Any, Any] = {}  # none without a window size: the operator assigns them
        if size is not None:
            distinct = set(starts)
            windows.update((s, TimeWindow(s, s + size)) for s in distinct if s is not None)
            if None not in distinct and set(kinds) <= {PARTIAL}:
                items = list(
                    zip(map(windows.__getitem__, starts), accs, lows, in_first, strict=True)
                )
                return keys, kgs, items, True, int(records), None if high is None else int(high)
        partials = [
            Partial(
                kind,
                windows.get(start) if kind == PARTIAL else None,
                acc,
                low,
                n,
                element,
                first,
            )
            for kind, start, acc, low, n, element, first in zip(
                kinds, starts, accs, lows, counts, elements, in_first, strict=True
            )
        ]
        return keys, kgs, partials, False, int(records), None if high is None else int(high)

    def _accumulators(self, batch: Any, kinds: list[int]) -> list[Any]:
        builtin = self.builtin
        if builtin is not None:
            n = len(builtin.partials())
            columns = [batch.column(sql_accumulator(i)).to_pylist() for i in range(n)]
            build = builtin.accumulator_from_partials
            return [
                build(values) if kind == PARTIAL else None
                for kind, values in zip(kinds, zip(*columns, strict=True), strict=True)
            ]
        deserialize = self.deserialize
        raw = batch.column(ACCUMULATOR).to_pylist()
        out = [None if b is None else deserialize(b) for b in raw]
        if self.rebuild_rows:
            # a reduced record crosses the shuffle as the tuple of its fields: give the window
            # function the Row it gets per record (Rows are tuples, so a tuple compares equal)
            cls, width = self.row_type, len(self.value_columns)
            out = [
                tuple.__new__(cls, v) if type(v) is tuple and len(v) == width else v for v in out
            ]
        return out
