"""The rows of one keyed state (or timer queue) in some key groups of a checkpoint, as Arrow
record batches: what a task of the ``streamstate`` format returns for its partition."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from streamstate.checkpoint.storage import CompletedCheckpoint
from streamstate.keygroups import KeyGroupRange
from streamstate.spark.offline.catalog import KeyedStateRef
from streamstate.spark.offline.entries import KeyedStateFiles, key_group_entries
from streamstate.spark.offline.layout import StateLayout

__all__ = ["BATCH_ROWS", "keyed_batches"]

BATCH_ROWS = 65_536
"""Rows per Arrow batch a task returns (key groups are gathered up to about this many)."""


def keyed_batches(
    checkpoint: CompletedCheckpoint,
    ref: KeyedStateRef,
    layout: StateLayout,
    key_groups: KeyGroupRange,
    arrow_schema: Any,
    only: frozenset[int] | None = None,
) -> Iterator[Any]:
    """Record batches of ``arrow_schema`` (the Arrow form of ``layout.struct()``) holding the
    state's rows in ``key_groups`` (and in ``only``, when given: no other key group is read)."""
    keys: list[Any] = []
    namespaces: list[Any] = []
    values: list[list[Any]] = [[] for _ in layout.value_columns]
    for entries in key_group_entries(KeyedStateFiles(checkpoint, ref, key_groups, only)):
        k, n, v = layout.rows(*entries.decode(layout))
        keys += k
        namespaces += n
        for column, more in zip(values, v, strict=True):
            column += more
        if len(keys) >= BATCH_ROWS:
            yield layout.batch(arrow_schema, keys, namespaces, values)
            keys, namespaces, values = [], [], [[] for _ in layout.value_columns]
    if keys:
        yield layout.batch(arrow_schema, keys, namespaces, values)
