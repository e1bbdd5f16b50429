"""One state's entries in a checkpoint, key group by key group, decoded without the program.

Every old subtask whose key groups meet the ones read contributes its snapshot: a canonical chain
(a full file, then deltas, each read block by block through the key-group index) or a backend's
own snapshot (a RocksDB manifest), read through its canonical view with serializers rebuilt from
the checkpoint alone (``KeyedStateRestore.serializers``). Only the blocks of the key groups asked
for are read (``only_key_groups``), and only the one state's records are kept.

A key group's content is first *encoded* (:class:`EncodedEntries`: the msgpack of every key,
namespace and stored state; a delta upserts and removes entries by their encoded key and
namespace), then decoded in one ``msgspec`` call per column with the plain serializers'
wire types (:meth:`EncodedEntries.decode`).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Any

import msgspec

from streamstate.checkpoint.restore import keyed_file_restore, operator_metadata
from streamstate.checkpoint.storage import CompletedCheckpoint
from streamstate.errors import CorruptCheckpointError
from streamstate.format.restore import KeyedStateRestore, RestoredBlock, expand_namespaces
from streamstate.keygroups import KeyGroupRange
from streamstate.serializers.plain import plain_serializer_from_snapshot
from streamstate.spark.offline.catalog import KeyedStateRef, subtask_range
from streamstate.spark.offline.layout import StateLayout

__all__ = ["EncodedEntries", "KeyedStateFiles", "key_group_entries"]

_RAW_SECTION = msgspec.msgpack.Decoder(
    tuple[list[msgspec.Raw], list[msgspec.Raw], list[msgspec.Raw]]
)
_RAW_REMOVED = msgspec.msgpack.Decoder(tuple[list[msgspec.Raw], list[msgspec.Raw]])
_ENCODER = msgspec.msgpack.Encoder()


class EncodedEntries:
    """One state's entries in one key group, still encoded: an entries section as a file holds
    it, or the columns of msgpack values ``keys``, ``namespaces`` (one per key) and ``states``
    (for a timer queue, the timestamps) that a delta's merge left."""

    __slots__ = ("_columns", "count", "key_group", "section")

    def __init__(
        self,
        key_group: int,
        count: int,
        section: Any = None,
        columns: tuple[list[Any], list[Any], list[Any]] | None = None,
    ) -> None:
        self.key_group = key_group
        self.count = count
        #: the entries section holding exactly these entries (None: only ``columns``)
        self.section = section
        self._columns = columns

    def __len__(self) -> int:
        return self.count

    def columns(self) -> tuple[list[Any], list[Any], list[Any]]:
        """``(keys, namespaces, states)``, encoded, one of each per entry."""
        if self._columns is None:
            keys, namespaces, states = _RAW_SECTION.decode(self.section)
            self._columns = (keys, expand_namespaces(namespaces, len(keys)), states)
        return self._columns

    def by_entry(self) -> dict[tuple[bytes, bytes], Any]:
        """``(encoded key, encoded namespace) -> encoded state``."""
        keys, namespaces, states = self.columns()
        return {(bytes(k), bytes(n)): s for k, n, s in zip(keys, namespaces, states, strict=True)}

    def decode(self, layout: StateLayout) -> tuple[list[Any], list[Any], list[Any]]:
        """``(keys, namespaces, states)`` decoded with the layout's plain serializers (in one
        ``msgspec`` call per column; one for the whole section when it is intact), namespaces
        one per key or, from an intact section, possibly one for all."""
        k, n, s = layout.key_serializer, layout.namespace_serializer, layout.state_serializer
        if self.section is not None:
            decoder = _section_decoder(k.wire_type, n.wire_type, s.wire_type)
            keys, namespaces, states = decoder.decode(self.section)
        else:
            raw_keys, raw_namespaces, raw_states = self.columns()
            keys = _column(raw_keys, k.wire_type)
            namespaces = _column(raw_namespaces, n.wire_type)
            states = _column(raw_states, s.wire_type)
        return (
            keys if k.wire_native else [k.from_wire(x) for x in keys],
            namespaces if n.wire_native else [n.from_wire(x) for x in namespaces],
            states if s.wire_native else [s.from_wire(x) for x in states],
        )


_DECODERS: dict[tuple[Any, Any, Any], Any] = {}


def _section_decoder(key: Any, namespace: Any, state: Any) -> Any:
    found = _DECODERS.get((key, namespace, state))
    if found is None:
        found = msgspec.msgpack.Decoder(tuple[list[key], list[namespace], list[state]])  # type: ignore[valid-type]
        _DECODERS[(key, namespace, state)] = found
    return found


def _column(encoded: list[Any], wire_type: Any) -> list[Any]:
    return msgspec.msgpack.decode(_ENCODER.encode(encoded), type=list[wire_type])  # type: ignore[valid-type]


class KeyedStateFiles:
    """The snapshot files of one state that hold some key groups of a checkpoint.

    Parameters:
        checkpoint: the checkpoint (or savepoint).
        ref: the state.
        key_groups: the range read.
        only: read only these key groups of the range (None: all of them).
    """

    def __init__(
        self,
        checkpoint: CompletedCheckpoint,
        ref: KeyedStateRef,
        key_groups: KeyGroupRange,
        only: frozenset[int] | None = None,
    ) -> None:
        self.checkpoint = checkpoint
        self.ref = ref
        self.key_groups = key_groups
        self.only = only
        op = operator_metadata(checkpoint, ref.operator)
        #: per old subtask meeting the key groups: the handles of its files (to compare
        #: checkpoints without reading them) and the range of it that is read
        self.subtasks = []
        for sub in op.subtasks:
            wanted = subtask_range(sub).intersection(key_groups)
            if wanted and (only is None or any(kg in only for kg in wanted)):
                self.subtasks.append((sub, wanted))

    def restores(self) -> list[KeyedStateRestore]:
        """The restore files, in the order to apply them (per old subtask: its chain)."""
        files: list[KeyedStateRestore] = []
        for sub, wanted in self.subtasks:
            try:
                chain = keyed_file_restore(self.checkpoint, list(sub.keyed), wanted)
            except CorruptCheckpointError as exc:
                raise CorruptCheckpointError(
                    f"operator {self.ref.operator!r} subtask {sub.subtask_index}: {exc}"
                ) from None
            for f in chain:
                f.only_states = {self.ref.meta.name}
                f.only_key_groups = self.only
                f.serializers = plain_serializer_from_snapshot
            files.extend(chain)
        return files


def _ordered_blocks(files: list[KeyedStateRestore]) -> Iterator[tuple[int, list[RestoredBlock]]]:
    """``(key group, its blocks in the order of the files)``, ascending by key group."""
    streams = [((b.key_group, i, b) for b in f.blocks()) for i, f in enumerate(files)]
    current: int | None = None
    blocks: list[RestoredBlock] = []
    for kg, _, block in heapq.merge(*streams, key=lambda t: (t[0], t[1])):
        if kg != current:
            if blocks:
                assert current is not None
                yield current, blocks
            current, blocks = kg, []
        blocks.append(block)
    if blocks:
        assert current is not None
        yield current, blocks


def _applied(key_group: int, blocks: list[RestoredBlock]) -> EncodedEntries:
    """The content of a key group after its blocks, in order (full, then deltas)."""
    if len(blocks) == 1 and blocks[0].removed is None:
        return EncodedEntries(key_group, blocks[0].count, blocks[0].entries)
    content: dict[tuple[bytes, bytes], Any] = {}
    for block in blocks:
        if block.removed is None:  # the block replaces the key group's content
            content = {}
        else:
            gone_keys, gone_namespaces = _RAW_REMOVED.decode(block.removed)
            for k, n in zip(
                gone_keys, expand_namespaces(gone_namespaces, len(gone_keys)), strict=True
            ):
                content.pop((bytes(k), bytes(n)), None)
        content.update(EncodedEntries(key_group, block.count, block.entries).by_entry())
    pairs = list(content)
    columns = (
        [msgspec.Raw(k) for k, _ in pairs],
        [msgspec.Raw(n) for _, n in pairs],
        list(content.values()),
    )
    return EncodedEntries(key_group, len(pairs), columns=columns)


def _applied_timers(key_group: int, blocks: list[RestoredBlock]) -> EncodedEntries:
    """A timer queue's key group: the last block replaces the others (timers are written whole
    per key group, also in delta files), and one ``(key, namespace)`` may hold many timers."""
    return EncodedEntries(key_group, blocks[-1].count, blocks[-1].entries)


def key_group_entries(files: KeyedStateFiles) -> Iterator[EncodedEntries]:
    """The encoded content of every non-empty key group of ``files``, ascending."""
    restores = files.restores()
    apply = _applied_timers if files.ref.is_timer else _applied
    try:
        for kg, blocks in _ordered_blocks(restores):
            entries = apply(kg, blocks)
            if len(entries):
                yield entries
    finally:
        for f in restores:
            f.close()
