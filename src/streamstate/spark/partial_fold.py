"""The Python fold before the shuffle (SPEC §13.2): in the pre-shuffle Spark task of a window
aggregate that Spark SQL cannot fold (any ``AggregateFunction`` or reduce function but the
built-ins), :class:`PartialFold` assigns the windows for whole columns, folds each (key, window)
group of the map partition with ``add`` and yields the pre-aggregated rows of
:mod:`streamstate.spark.partials`, key groups computed.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from itertools import repeat
from typing import Any

import numpy as np

from streamstate.spark.partials import (
    ACCUMULATOR,
    COUNT,
    KIND,
    MAX_TS,
    MIN_TS,
    RECORDS,
    WINDOW,
    element_serializer,
)
from streamstate.windows.partial import LATE, PARTIAL, WINDOWLESS
from streamstate.windows.pre_aggregation import PreAggregation

__all__ = ["PartialFold"]


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
        from streamstate.spark.columns import column_values, event_time_ms

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
        keys, kinds, starts, counts, records, lows, highs, accs, elements = self._columns()
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

    def _columns(self) -> tuple[list[Any], ...]:
        """The rows' columns (key, kind, window start, count, records, earliest and latest
        event time, accumulator, late element): the groups, then the late and windowless
        counts, then the late elements kept whole."""
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
        return keys, kinds, starts, counts, records, lows, highs, accs, elements


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
