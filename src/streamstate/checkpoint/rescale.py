"""Redistribution of state to a new parallelism (SPEC §7).

Keyed state moves by key group (each new subtask reads the key groups of its range). Operator
state follows Flink's round-robin rules:

* ``SPLIT_DISTRIBUTE``: per state name, the elements of all old subtasks (in subtask order) are
  dealt out in contiguous runs: ``base = total // p'`` each, and the first ``total % p'`` subtasks
  visited get one more. The subtask visited first rotates from one state name to the next (it
  becomes the first subtask that got no extra element), so extra elements do not always land on
  subtask 0. State names are visited in sorted order, so the result is deterministic.
* ``UNION``: every new subtask gets all elements of all old subtasks.
* ``BROADCAST``: new subtask ``i`` gets the copy of old subtask ``i % p``.
* With ``p' == p`` every subtask keeps its own split-distribute and broadcast state (Flink's
  ``RoundRobinOperatorStateRepartitioner.repartitionState`` at unchanged parallelism); only union
  state is spread, every subtask getting all of it. Without union state nothing changes.

>>> from streamstate.serializers import Int64Serializer
>>> from streamstate.backends.operator import (
...     ListStateSnapshot, OperatorStateMode, OperatorStateSnapshot)
>>> split = OperatorStateMode.SPLIT_DISTRIBUTE
>>> old = [OperatorStateSnapshot({"offsets": ListStateSnapshot(
...     "offsets", split, Int64Serializer(), list(range(i * 3, i * 3 + 3)))}) for i in range(2)]
>>> [s.list_states["offsets"].elements for s in repartition_operator_state(old, 4)]
[[0, 1], [2, 3], [4], [5]]
"""

from __future__ import annotations

from collections.abc import Sequence

from streamstate.backends.operator import (
    BroadcastStateSnapshot,
    ListStateSnapshot,
    OperatorStateMode,
    OperatorStateSnapshot,
)
from streamstate.errors import CheckpointError

__all__ = ["repartition_operator_state", "split_distribute_counts"]


def split_distribute_counts(total: int, new_parallelism: int, start: int) -> tuple[list[int], int]:
    """Elements per new subtask for one split-distribute state, and the next start subtask.

    >>> split_distribute_counts(7, 3, 0)
    ([3, 2, 2], 1)
    >>> split_distribute_counts(7, 3, 1)
    ([2, 3, 2], 2)
    """
    base, remainder = divmod(total, new_parallelism)
    counts = [0] * new_parallelism
    next_start = start
    for i in range(new_parallelism):
        index = (i + start) % new_parallelism
        n = base
        if remainder > 0:
            n += 1
            remainder -= 1
        elif remainder == 0:
            next_start = index
            remainder -= 1
        counts[index] = n
    return counts, next_start


def repartition_operator_state(
    old: Sequence[OperatorStateSnapshot], new_parallelism: int
) -> list[OperatorStateSnapshot]:
    """The operator state of each of ``new_parallelism`` subtasks, from the old subtasks' state."""
    if new_parallelism < 1:
        raise ValueError(f"new parallelism must be >= 1, got {new_parallelism}")
    old_parallelism = len(old)
    if old_parallelism == new_parallelism:
        return _spread_union_state(old)

    split: dict[str, list[ListStateSnapshot]] = {}
    union: dict[str, list[ListStateSnapshot]] = {}
    broadcast: dict[str, list[BroadcastStateSnapshot | None]] = {}
    for subtask, snap in enumerate(old):
        for name, ls in snap.list_states.items():
            target = split if ls.mode is OperatorStateMode.SPLIT_DISTRIBUTE else union
            other = union if target is split else split
            if name in other:
                raise CheckpointError(
                    f"operator state {name!r} appears with different modes in different subtasks"
                )
            target.setdefault(name, []).append(ls)
        for name, bs in snap.broadcast_states.items():
            broadcast.setdefault(name, [None] * old_parallelism)[subtask] = bs

    result = [OperatorStateSnapshot() for _ in range(new_parallelism)]

    start = 0
    for name in sorted(split):
        parts = split[name]
        elements = [e for ls in parts for e in ls.elements]
        counts, next_start = split_distribute_counts(len(elements), new_parallelism, start)
        serializer = parts[0].element_serializer
        # Elements are dealt in contiguous runs, visiting subtasks from `start` on.
        pos = 0
        for i in range(new_parallelism):
            index = (i + start) % new_parallelism
            n = counts[index]
            result[index].list_states[name] = ListStateSnapshot(
                name, OperatorStateMode.SPLIT_DISTRIBUTE, serializer, elements[pos : pos + n]
            )
            pos += n
        start = next_start

    for name in sorted(union):
        parts = union[name]
        elements = [e for ls in parts for e in ls.elements]
        serializer = parts[0].element_serializer
        for snap in result:
            snap.list_states[name] = ListStateSnapshot(
                name, OperatorStateMode.UNION, serializer, list(elements)
            )

    for name in sorted(broadcast):
        copies = broadcast[name]
        present = [c for c in copies if c is not None]
        for i, snap in enumerate(result):
            chosen = copies[i % old_parallelism] or present[0]
            snap.broadcast_states[name] = BroadcastStateSnapshot(
                name, chosen.key_serializer, chosen.value_serializer, dict(chosen.entries)
            )
    return result


def _spread_union_state(old: Sequence[OperatorStateSnapshot]) -> list[OperatorStateSnapshot]:
    """Unchanged parallelism: each subtask keeps its own split-distribute and broadcast state,
    so a plain failover moves nothing; union state, if any, goes to every subtask in full."""
    union: dict[str, list[ListStateSnapshot]] = {}
    for snap in old:
        for name, ls in snap.list_states.items():
            if ls.mode is OperatorStateMode.UNION:
                union.setdefault(name, []).append(ls)
    if not union:
        return list(old)
    for snap in old:
        for name, ls in snap.list_states.items():
            if name in union and ls.mode is not OperatorStateMode.UNION:
                raise CheckpointError(
                    f"operator state {name!r} appears with different modes in different subtasks"
                )
    result = []
    for snap in old:
        own = OperatorStateSnapshot(dict(snap.list_states), dict(snap.broadcast_states))
        for name in sorted(union):
            parts = union[name]
            own.list_states[name] = ListStateSnapshot(
                name,
                OperatorStateMode.UNION,
                parts[0].element_serializer,
                [e for ls in parts for e in ls.elements],
            )
        result.append(own)
    return result
