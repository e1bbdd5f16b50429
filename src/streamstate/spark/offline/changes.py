"""The change feed of a keyed state: what changed from one checkpoint to the next.

For checkpoint ``c`` and the checkpoint before it, the feed is the difference of what the
``streamstate`` format reads from each (the same options: the same ``now``, the same TTL view):
per ``(key, namespace)``, ``"update"`` with the new row when the entry is new or its row differs,
``"delete"`` when it is gone. A list or map changes as a whole: its update holds the whole new
value. Timers are sets: an added timer is an update, a removed one a delete. So, on every backend,
the state read at ``a - 1`` with the feed of ``[a, b]`` applied in order is the state read at
``b``.

Only what may differ is decoded: entries are compared encoded first (an entry whose stored bytes
did not change did not change), and only the others are decoded and compared as rows. Only key
groups that may differ are read: ``candidate_key_groups`` asks the checkpoints' files — a
subtask whose files are the same in both checkpoints changed nothing, a heap subtask whose chain
only grew by delta files changed only the key groups those deltas hold, and a RocksDB subtask
whose SST files are the same changed no keyed state (its timers live in its manifest).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec

from streamstate.checkpoint.metadata import SubtaskStateHandle
from streamstate.checkpoint.storage import CompletedCheckpoint
from streamstate.format.handles import CANONICAL_KINDS
from streamstate.keygroups import KeyGroupRange
from streamstate.serializers.schema import IntSchema, StrSchema
from streamstate.spark.offline.catalog import KeyedStateRef, subtask_range
from streamstate.spark.offline.entries import EncodedEntries, KeyedStateFiles, key_group_entries
from streamstate.spark.offline.keyed_rows import BATCH_ROWS
from streamstate.spark.offline.layout import Column, StateLayout

__all__ = ["FEED_COLUMNS", "candidate_key_groups", "change_batches", "changed_rows"]

UPDATE = "update"
DELETE = "delete"
FEED_COLUMNS = (Column("checkpoint_id", IntSchema()), Column("change_type", StrSchema()))
"""The columns a change feed adds before a state's own."""

_ENCODER = msgspec.msgpack.Encoder()


def _chain(sub: SubtaskStateHandle) -> list[tuple[str, int]]:
    return [(h.path, h.checksum) for h in sub.keyed]


def candidate_key_groups(
    before: CompletedCheckpoint,
    after: CompletedCheckpoint,
    ref: KeyedStateRef,
    key_groups: KeyGroupRange,
) -> frozenset[int] | None:
    """The key groups of ``key_groups`` in which ``ref`` may differ between the checkpoints
    (None: any of them); see the module docstring."""
    old = before.metadata.operators.get(ref.operator)
    new = after.metadata.operators.get(ref.operator)
    if old is None or new is None:
        return None
    old_by_range = {tuple(s.key_group_range): s for s in old.subtasks}
    out: set[int] = set()
    for sub in new.subtasks:
        wanted = subtask_range(sub).intersection(key_groups)
        if not wanted:
            continue
        prev = old_by_range.get(tuple(sub.key_group_range))
        if prev is None:
            return None  # rescaled in between
        chain, prev_chain = _chain(sub), _chain(prev)
        if chain == prev_chain:
            continue
        canonical = bool(sub.keyed) and sub.keyed[0].kind in CANONICAL_KINDS
        if canonical and chain[: len(prev_chain)] == prev_chain:
            for handle in sub.keyed[len(prev_chain) :]:
                # every key group with a block (removals only: no upsert, still a block)
                out.update(kg for kg, _ in handle.entries if wanted.contains(kg))
        elif not canonical and not ref.is_timer and chain[1:] == prev_chain[1:]:
            continue  # the same SST files: the same keyed state (timers are in the manifest)
        else:
            return None
    return frozenset(out)


def _paired(
    before: Iterator[EncodedEntries], after: Iterator[EncodedEntries]
) -> Iterator[tuple[EncodedEntries | None, EncodedEntries | None]]:
    """The key groups of both streams (ascending), each with its content on either side."""
    b, a = next(before, None), next(after, None)
    while b is not None or a is not None:
        if a is None or (b is not None and b.key_group < a.key_group):
            yield b, None
            b = next(before, None)
        elif b is None or a.key_group < b.key_group:
            yield None, a
            a = next(after, None)
        else:
            yield b, a
            b, a = next(before, None), next(after, None)


def _same(left: tuple[Any, ...], right: tuple[Any, ...]) -> bool:
    # equal rows, or rows of the same bytes (a NaN is not equal to itself)
    return bool(left == right) or _ENCODER.encode(left) == _ENCODER.encode(right)


def _decoded_rows(
    layout: StateLayout, kg: int, picked: list[tuple[tuple[bytes, bytes], Any]]
) -> list[tuple[Any, Any, tuple[Any, ...] | None]]:
    """``(key, namespace, row values or None)`` of some encoded entries."""
    if not picked:
        return []
    columns = (
        [msgspec.Raw(k) for (k, _), _ in picked],
        [msgspec.Raw(n) for (_, n), _ in picked],
        [s for _, s in picked],
    )
    entries = EncodedEntries(kg, len(picked), columns=columns)
    keys, namespaces, states = entries.decode(layout)
    return [
        (k, layout.namespace_value(n), layout.visible(s))
        for k, n, s in zip(keys, namespaces, states, strict=True)
    ]


def _state_changes(
    before: EncodedEntries | None,
    after: EncodedEntries | None,
    layouts: tuple[StateLayout, StateLayout],
) -> Iterator[tuple[str, Any, Any, tuple[Any, ...] | None]]:
    old = before.by_entry() if before is not None else {}
    new = after.by_entry() if after is not None else {}
    kg = (after or before).key_group  # type: ignore[union-attr]
    differ = [(e, s) for e, s in new.items() if old.get(e) != s]
    gone = [(e, s) for e, s in old.items() if e not in new]
    in_old = [(e, old[e]) for e, _ in differ if e in old]
    was = {
        e: row
        for (e, _), (_, _, row) in zip(in_old, _decoded_rows(layouts[0], kg, in_old), strict=True)
    }
    now_rows = _decoded_rows(layouts[1], kg, differ)
    for (entry, _), (key, namespace, row) in zip(differ, now_rows, strict=True):
        previous_row = was.get(entry)
        if row is None:
            if previous_row is not None:
                yield DELETE, key, namespace, None
        elif previous_row is None or not _same(previous_row, row):
            yield UPDATE, key, namespace, row
    for key, namespace, row in _decoded_rows(layouts[0], kg, gone):
        if row is not None:
            yield DELETE, key, namespace, None


def _timer_changes(
    before: EncodedEntries | None, after: EncodedEntries | None, layout: StateLayout
) -> Iterator[tuple[str, Any, Any, tuple[Any, ...] | None]]:
    def timers(entries: EncodedEntries | None) -> set[tuple[bytes, bytes, bytes]]:
        if entries is None:
            return set()
        keys, namespaces, timestamps = entries.columns()
        return {
            (bytes(k), bytes(n), bytes(t))
            for k, n, t in zip(keys, namespaces, timestamps, strict=True)
        }

    old, new = timers(before), timers(after)
    kg = (after or before).key_group  # type: ignore[union-attr]
    for change, picked in ((UPDATE, sorted(new - old)), (DELETE, sorted(old - new))):
        rows = _decoded_rows(layout, kg, [((k, n), msgspec.Raw(t)) for k, n, t in picked])
        for key, namespace, row in rows:
            yield change, key, namespace, row


def changed_rows(
    before: tuple[KeyedStateFiles, StateLayout] | None,
    after: tuple[KeyedStateFiles, StateLayout] | None,
) -> Iterator[tuple[str, Any, Any, tuple[Any, ...] | None]]:
    """``(change type, key, namespace, row values)`` of what changed from ``before`` to
    ``after`` (each: the state's files in the key groups read, and its layout; None: the
    checkpoint does not hold the state). A delete's row is None."""
    olds = key_group_entries(before[0]) if before is not None else iter(())
    news = key_group_entries(after[0]) if after is not None else iter(())
    layout = (after or before)[1]  # type: ignore[index]
    layouts = (before[1] if before is not None else layout, layout)
    for old, new in _paired(olds, news):
        if layout.is_timer:
            yield from _timer_changes(old, new, layout)
        else:
            yield from _state_changes(old, new, layouts)


def change_batches(
    checkpoint_id: int,
    before: tuple[KeyedStateFiles, StateLayout] | None,
    after: tuple[KeyedStateFiles, StateLayout] | None,
    arrow_schema: Any,
) -> Iterator[Any]:
    """Record batches of ``arrow_schema`` (the Arrow form of the layout's struct after
    :data:`FEED_COLUMNS`) holding :func:`changed_rows`."""
    layout = (after or before)[1]  # type: ignore[index]
    columns: tuple[list[Any], ...] = ([], [], [], [])
    for change, key, namespace, row in changed_rows(before, after):
        for column, value in zip(columns, (change, key, namespace, row), strict=True):
            column.append(value)
        if len(columns[0]) >= BATCH_ROWS:
            yield _batch(layout, arrow_schema, checkpoint_id, columns)
            columns = ([], [], [], [])
    if columns[0]:
        yield _batch(layout, arrow_schema, checkpoint_id, columns)


def _batch(
    layout: StateLayout, arrow_schema: Any, checkpoint_id: int, columns: tuple[list[Any], ...]
) -> Any:
    changes, keys, namespaces, rows = columns
    prefix = [(FEED_COLUMNS[0], [checkpoint_id] * len(changes)), (FEED_COLUMNS[1], changes)]
    return layout.batch(arrow_schema, keys, namespaces, layout.value_lists(rows), prefix)
