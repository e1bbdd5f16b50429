"""Pre-aggregated rows (SPEC §13.2): what crosses the shuffle instead of every record when a
window aggregate is folded before it, how the Python fold makes them (in the pre-shuffle Spark
task), and how a subtask reads them back as
:class:`~streamstate.windows.pre_aggregation.Partial`\\ s.

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

import gc
from collections.abc import Iterator
from itertools import repeat
from typing import Any

import numpy as np

from streamstate.api.aggregates import BuiltinAggregate
from streamstate.serializers.window_namespaces import TimeWindow
from streamstate.windows.partial import LATE, PARTIAL, WINDOWLESS, Partial
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
    "PartialFold",
    "PartialReader",
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


class PartialFold:
    """Fold one Spark partition of a micro-batch per (key, window) with the window's
    ``add`` (or reduce function): the Python path of the pre-shuffle stage.

    Parameters:
        function: the window operator (a fresh copy: its contents' element type may be set).
        pre: how it is pre-aggregated.
        key_columns, value_columns, event_time: the job's columns.
        watermark: the micro-batch's watermark (None: none yet).
        output_schema: the Arrow schema of the rows to produce (key, or value columns with a
            late side output, then ``_kg`` and the ``_pre_*`` columns).
        max_parallelism: for the key groups.
    """

    #: input records gathered before they are folded together (bounds the memory they hold)
    GATHER_ROWS = 200_000

    def __init__(
        self,
        function: Any,
        pre: PreAggregation,
        *,
        key_columns: list[str],
        value_columns: list[str],
        event_time: str | None,
        watermark: int | None,
        output_schema: Any,
        max_parallelism: int,
    ) -> None:
        from streamstate.spark.records import row_class

        self.function = function
        self.pre = pre
        self.key_columns = key_columns
        self.value_columns = value_columns
        self.event_time = event_time
        self.watermark = watermark
        self.schema = output_schema
        self.max_parallelism = max_parallelism
        self.row_type = row_class(value_columns)
        contents = function.contents
        self.reducing = contents.kind == "reducing"
        fn = contents.function
        self._add = fn.reduce if self.reducing else fn.add
        self._create = None if self.reducing else fn.create_accumulator
        self._merge = fn.reduce if self.reducing else fn.merge
        self.serializer = element_serializer(function)
        #: (key, window start) -> [accumulator, elements, records, min ts, max ts]
        self.groups: dict[tuple[Any, Any], list[Any]] = {}
        #: key -> [elements, min ts, max ts] of late elements (without a side output), and
        #: (key, ts) -> the same of elements in no window
        self.late: dict[Any, list[Any]] = {}
        self.windowless: dict[tuple[Any, Any], list[Any]] = {}
        #: late elements themselves (with a late side output): (key, element, ts)
        self.late_elements: list[tuple[Any, Any, int]] = []
        self._gathered: list[Any] = []
        self._gathered_rows = 0

    def add(self, batch: Any) -> None:
        """Fold one Arrow batch of input records. Batches are gathered up to
        :attr:`GATHER_ROWS` records and folded together: the groups are found for whole columns
        (NumPy), then one loop calls ``add`` (or the reduce function) per element, in order
        (Spark hands a partition over in batches of 10,000 records: folded one by one, each
        would look up its groups again)."""
        if not batch.num_rows:
            return
        self._gathered.append(batch)
        self._gathered_rows += batch.num_rows
        if self._gathered_rows >= self.GATHER_ROWS:
            self._fold_gathered()

    def _fold_gathered(self) -> None:
        import pyarrow as pa

        gathered = self._gathered
        if not gathered:
            return
        batch = gathered[0] if len(gathered) == 1 else pa.concat_batches(gathered)
        self._gathered, self._gathered_rows = [], 0
        # the fold makes a few objects per record and frees none of them until it ends: the
        # cyclic collector would scan them again and again (none is part of a cycle)
        collecting = gc.isenabled()
        gc.disable()
        try:
            self._fold_batch(batch)
        finally:
            if collecting:
                gc.enable()

    def _fold_batch(self, batch: Any) -> None:
        from streamstate.spark.records import column_values, event_time_ms

        codes, keys = _key_codes([batch.column(c) for c in self.key_columns])
        columns = [column_values(batch.column(c)) for c in self.value_columns]
        rows = list(map(tuple.__new__, repeat(self.row_type), zip(*columns, strict=True)))
        ts = None
        if self.event_time is not None:
            ts = event_time_ms(batch.column(self.event_time)).to_numpy(zero_copy_only=False)
        windowing = self.pre.windowing
        if windowing is None:
            self._fold(codes, keys, rows, ts, None, None, None)
            return
        assert ts is not None  # event-time windows need event time (checked when planned)
        found = windowing.assign(ts, self.watermark)
        index = found.elements
        first = np.ones(len(index), dtype=bool)
        first[1:] = index[1:] != index[:-1]
        self._fold(codes, keys, rows, ts, index, found.starts, first)
        tss = ts.tolist()
        for i in found.late.tolist():
            key = keys[codes[i]]
            if self.pre.late_output:
                self.late_elements.append((key, rows[i], tss[i]))
            else:
                _count(self.late, key, tss[i])
        for i in found.windowless.tolist():
            # by timestamp: an element in no window is late on its own (decided by the subtask
            # when the fold had no watermark)
            _count(self.windowless, (keys[codes[i]], tss[i]), tss[i])

    def _fold(
        self,
        codes: np.ndarray,
        keys: list[Any],
        rows: list[Any],
        ts: np.ndarray | None,
        index: np.ndarray | None,
        starts: np.ndarray | None,
        first: np.ndarray | None,
    ) -> None:
        """Fold the (element ``index``, window ``starts``) pairs (all elements, without
        windows, when None) into :attr:`groups`."""
        if index is not None:
            if not len(index):
                return
            # index is increasing: with as many distinct entries as elements, it is all of them
            if len(index) != len(rows) or (first is not None and not first.all()):
                codes = codes[index]
                rows = [rows[i] for i in index.tolist()]
                if ts is not None:
                    ts = ts[index]
        if starts is None:
            start_values: list[Any] = [None]
            pair = codes.astype(np.int64)
        else:
            unique_starts, start_codes = np.unique(starts, return_inverse=True)
            start_values = unique_starts.tolist()
            pair = codes.astype(np.int64) * len(start_values) + start_codes
        found, group = np.unique(pair, return_inverse=True)
        width = len(start_values)
        groups = self.groups
        entries = []
        for g in found.tolist():
            gk = (keys[g // width], start_values[g % width])
            entry = groups.get(gk)
            if entry is None:
                init = None if self._create is None else self._create()
                entry = groups[gk] = [init, 0, 0, None, None]
            entries.append(entry)
        accs = [e[0] for e in entries]
        fn = self._add
        if self._create is None:  # reduce: the first element is the value
            for g, row in zip(group.tolist(), rows, strict=True):
                acc = accs[g]
                accs[g] = row if acc is None else fn(acc, row)
        else:
            for g, row in zip(group.tolist(), rows, strict=True):
                accs[g] = fn(row, accs[g])
        m = len(entries)
        counts = np.bincount(group, minlength=m).tolist()
        if first is None:
            records = counts
        else:
            records = np.bincount(group, weights=first, minlength=m).astype(np.int64).tolist()
        if ts is None:
            lows: list[Any] = [None] * m
            highs: list[Any] = lows
        else:
            low = np.full(m, np.iinfo(np.int64).max, dtype=np.int64)
            high = np.full(m, np.iinfo(np.int64).min, dtype=np.int64)
            np.minimum.at(low, group, ts)
            np.maximum.at(high, group, ts)
            lows, highs = low.tolist(), high.tolist()
        for entry, acc, c, r, lo, hi in zip(
            entries, accs, counts, records, lows, highs, strict=True
        ):
            entry[0] = acc
            entry[1] += c
            entry[2] += r
            if lo is not None:
                if entry[3] is None or lo < entry[3]:
                    entry[3] = lo
                if entry[4] is None or hi > entry[4]:
                    entry[4] = hi

    def batches(self) -> Iterator[Any]:
        """The partition's pre-aggregated rows (one Arrow batch, none if it had no record)."""
        import pyarrow as pa

        from streamstate.keygroups import assign_key_groups_for_columns

        self._fold_gathered()

        keys: list[Any] = []
        kinds: list[int] = []
        starts: list[Any] = []
        counts: list[int] = []
        records: list[int] = []
        lows: list[Any] = []
        highs: list[Any] = []
        accs: list[Any] = []
        elements: list[Any] = []
        serialize = self.serializer.serialize
        for (key, start), (acc, n, recs, lo, hi) in self.groups.items():
            keys.append(key)
            kinds.append(PARTIAL)
            starts.append(start)
            counts.append(n)
            records.append(recs)
            lows.append(lo)
            highs.append(hi)
            accs.append(serialize(acc))
            elements.append(None)
        for key, (n, lo, hi) in self.late.items():
            keys.append(key)
            kinds.append(LATE)
            starts.append(None)
            counts.append(n)
            records.append(n)
            lows.append(lo)
            highs.append(hi)
            accs.append(None)
            elements.append(None)
        for (key, t), (n, lo, hi) in self.windowless.items():
            keys.append(key)
            kinds.append(WINDOWLESS)
            starts.append(t)
            counts.append(n)
            records.append(n)
            lows.append(lo)
            highs.append(hi)
            accs.append(None)
            elements.append(None)
        for key, element, t in self.late_elements:
            keys.append(key)
            kinds.append(LATE)
            starts.append(None)
            counts.append(1)
            records.append(1)
            lows.append(t)
            highs.append(t)
            accs.append(None)
            elements.append(element)
        if not keys:
            return
        schema = self.schema
        key_arrays = (
            [pa.array(keys, schema.field(self.key_columns[0]).type)]
            if len(self.key_columns) == 1
            else [
                pa.array([k[j] for k in keys], schema.field(c).type)
                for j, c in enumerate(self.key_columns)
            ]
        )
        by_name = dict(zip(self.key_columns, key_arrays, strict=True))
        n = len(keys)
        for j, c in enumerate(self.value_columns):
            if c in by_name or c not in schema.names:
                continue
            by_name[c] = pa.array(
                [None if e is None else e[j] for e in elements], schema.field(c).type
            )
        by_name["_kg"] = pa.array(
            assign_key_groups_for_columns(key_arrays, self.max_parallelism), pa.int32()
        )
        by_name[KIND] = pa.array(kinds, pa.int32())
        by_name[WINDOW] = pa.array(starts, pa.int64())
        by_name[COUNT] = pa.array(counts, pa.int64())
        by_name[RECORDS] = pa.array(records, pa.int64())
        by_name[MIN_TS] = pa.array(lows, pa.int64())
        by_name[MAX_TS] = pa.array(highs, pa.int64())
        by_name[ACCUMULATOR] = pa.array(accs, pa.binary())
        arrays = [by_name.get(f.name) for f in schema]
        yield pa.RecordBatch.from_arrays(
            [pa.nulls(n, f.type) if a is None else a for a, f in zip(arrays, schema, strict=True)],
            schema=schema,
        )


def _key_codes(columns: list[Any]) -> tuple[np.ndarray, list[Any]]:
    """(a code per row, the key of each code) of the key column(s) of a batch: equal keys have
    equal codes (one column dictionary-encoded by Arrow; several: the tuples of their codes)."""
    import pyarrow.compute as pc

    from streamstate.errors import UnsupportedKeyTypeError

    if any(c.null_count for c in columns):
        raise UnsupportedKeyTypeError("a key column must not contain nulls")
    encoded = [pc.dictionary_encode(c) for c in columns]
    if len(encoded) == 1:
        codes = encoded[0].indices.to_numpy(zero_copy_only=False).astype(np.int64)
        return codes, encoded[0].dictionary.to_pylist()
    parts = np.stack(
        [e.indices.to_numpy(zero_copy_only=False).astype(np.int64) for e in encoded], axis=1
    )
    unique, codes = np.unique(parts, axis=0, return_inverse=True)
    values = [e.dictionary.to_pylist() for e in encoded]
    keys = [tuple(values[j][c] for j, c in enumerate(row)) for row in unique.tolist()]
    return codes.reshape(-1).astype(np.int64), keys


def _count(table: dict[Any, list[Any]], key: Any, t: Any) -> None:
    entry = table.get(key)
    if entry is None:
        table[key] = [1, t, t]
        return
    entry[0] += 1
    if t is not None:
        if t < entry[1]:
            entry[1] = t
        elif t > entry[2]:
            entry[2] = t


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

        from streamstate.spark.records import column_values

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
