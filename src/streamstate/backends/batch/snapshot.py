"""The savepoint of a batch run, streamed key by key (SPEC §13.3).

A batch backend holds one key at a time, so its savepoint cannot be taken at the end the way the
heap backend's is: by then every key but the last is gone. Instead, when a key ends, its entries
go to a :class:`KeyGroupSpool`, which collects them per key group and state and, whenever a
collection reaches ``piece_entries`` entries (or all of them together ``max_entries``), encodes it
as an *entries section* of the canonical snapshot format (``format/codec.py``,
docs/formats.md) appended to a local spool file, with an index ``key group -> (state, count,
offset, length)``. Memory holds at most ``max_entries`` collected entries, never the whole state,
whatever order the keys come in (the Spark runtime sorts them by key, so their key groups
interleave).

At the end, :class:`BatchKeyedStateSnapshot` hands the spooled sections to the ordinary snapshot
writer as :class:`~streamstate.format.snapshot.EncodedEntries`, key group by key group (a key
group spooled in several pieces is decoded and encoded again as one section: memory holds one
key group, as for every snapshot, whose blocks are whole key groups); the writer compresses them
into blocks and writes header, blocks and index as for any full snapshot. So a batch savepoint
is a canonical savepoint, readable by ``read_state`` and restorable into either backend at any
parallelism.

>>> from streamstate.keygroups import KeyGroupRange
>>> from streamstate.serializers import Int64Serializer, StrSerializer, VoidNamespaceSerializer
>>> from streamstate.namespace import VOID_NAMESPACE
>>> meta = StateMetaInfo("n", "value", VoidNamespaceSerializer(), Int64Serializer())
>>> spool = KeyGroupSpool(StrSerializer(), KeyGroupRange(0, 127))
>>> spool.register(meta)
>>> spool.add(3, "a", "n", [(VOID_NAMESPACE, 1)]); spool.add(3, "b", "n", [(VOID_NAMESPACE, 2)])
>>> spool.add(9, "c", "n", [(VOID_NAMESPACE, 3)]); spool.finish()
>>> [(name, count) for name, count, _ in spool.sections(3)], spool.key_groups()
([('n', 2)], [3, 9])
>>> spool.close()
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from streamstate.errors import CheckpointError
from streamstate.format.codec import EntryEncodeError, StateCodec
from streamstate.format.entries import COUNTED_BY_ELEMENT
from streamstate.format.meta import StateMetaInfo
from streamstate.format.snapshot import (
    FULL_SNAPSHOT,
    EncodedEntries,
    EntryColumns,
    KeyedStateSnapshot,
)
from streamstate.keygroups import KeyGroupRange
from streamstate.serializers.base import TypeSerializer

__all__ = ["BatchKeyedStateSnapshot", "KeyGroupSpool"]


class _Columns:
    """One state's entries of the key group being collected."""

    __slots__ = ("keys", "namespaces", "states")

    def __init__(self) -> None:
        self.keys: list[Any] = []
        self.namespaces: list[Any] = []
        self.states: list[Any] = []


class KeyGroupSpool:
    """Entries of finished keys, encoded key group by key group into a local file.

    Parameters:
        key_serializer: the backend's key serializer (keys are encoded with it).
        key_group_range: the backend's key groups.
        directory: where the spool file lives (a temporary file, deleted on :meth:`close`;
            default: the system's temporary directory).
        piece_entries: a state's entries of one key group collected before they are encoded.
        max_entries: entries collected in all before everything collected is encoded.
    """

    def __init__(
        self,
        key_serializer: TypeSerializer[Any],
        key_group_range: KeyGroupRange,
        directory: str | None = None,
        *,
        piece_entries: int = 8192,
        max_entries: int = 131072,
    ) -> None:
        self.key_serializer = key_serializer
        self.key_group_range = key_group_range
        self.piece_entries = piece_entries
        self.max_entries = max_entries
        # deleted when closed (close(), or the backend's dispose)
        self._file = tempfile.TemporaryFile(prefix="streamstate-spool-", dir=directory)  # noqa: SIM115
        self._end = 0
        #: key group -> [(state name, entries, offset, length)]
        self._index: dict[int, list[tuple[str, int, int, int]]] = {}
        self._metas: dict[str, StateMetaInfo] = {}
        self._codecs: dict[str, StateCodec] = {}
        self._transforms: dict[str, Callable[[Any], Any]] = {}
        #: (key group, state name) -> the entries collected, not encoded yet
        self._collecting: dict[tuple[int, str], _Columns] = {}
        self._collected = 0
        #: keys and entries spooled so far
        self.keys = 0
        self.entries = 0
        self.bytes = 0
        #: state name -> its entries spooled so far, as ``streamstate.format.entries`` counts
        #: them (a list's elements, a map's mappings)
        self.counts: dict[str, int] = {}

    def register(self, meta: StateMetaInfo, transform: Callable[[Any], Any] | None = None) -> None:
        """Declare a state whose entries will be spooled; ``transform`` (TTL's full-snapshot
        cleanup) maps a stored state to what the savepoint gets, None dropping it; it runs when
        the snapshot reads the spool."""
        self._metas[meta.name] = meta
        self._codecs[meta.name] = StateCodec(
            self.key_serializer, meta.namespace_serializer, meta.state_serializer
        )
        if transform is not None:
            self._transforms[meta.name] = transform

    def set_transform(self, name: str, transform: Callable[[Any], Any] | None) -> None:
        if transform is None:
            self._transforms.pop(name, None)
        else:
            self._transforms[name] = transform

    def add(self, key_group: int, key: Any, name: str, entries: Iterable[tuple[Any, Any]]) -> None:
        """Spool the ``(namespace, stored state)`` entries of ``key``'s state ``name``."""
        slot = (key_group, name)
        columns = self._collecting.get(slot)
        if columns is None:
            columns = self._collecting[slot] = _Columns()
        keys, namespaces, states = columns.keys, columns.namespaces, columns.states
        n = 0
        by_element = self._metas[name].kind in COUNTED_BY_ELEMENT
        counted = 0
        for ns, value in entries:
            keys.append(key)
            namespaces.append(ns)
            states.append(value)
            n += 1
            if by_element:
                counted += len(value)
        self.counts[name] = self.counts.get(name, 0) + (counted if by_element else n)
        self.entries += n
        self._collected += n
        if len(keys) >= self.piece_entries:
            self._encode(slot, self._collecting.pop(slot))
        if self._collected >= self.max_entries:
            self._flush()

    def key_done(self) -> None:
        """Count a finished key (statistics)."""
        self.keys += 1

    @property
    def collected(self) -> int:
        """Entries collected and not encoded yet (at most ``max_entries``)."""
        return self._collected

    def _flush(self) -> None:
        collecting, self._collecting = self._collecting, {}
        for slot, columns in collecting.items():
            self._encode(slot, columns)
        self._collected = 0

    def _encode(self, slot: tuple[int, str], columns: _Columns) -> None:
        kg, name = slot
        n = len(columns.keys)
        if not n:
            return
        self._collected -= n
        try:
            data = self._codecs[name].encode(
                EntryColumns(columns.keys, columns.namespaces, columns.states)
            )
        except EntryEncodeError as exc:
            meta = self._metas[name]
            raise CheckpointError(
                f"cannot write state {name!r} of key group {kg} into the savepoint: {exc}; "
                f"the value does not match the state's serializer {meta.state_serializer!r}"
            ) from None
        self._file.seek(self._end)
        self._file.write(data)
        self._index.setdefault(kg, []).append((name, n, self._end, len(data)))
        self._end += len(data)
        self.bytes += len(data)

    def finish(self) -> None:
        """Encode what is still collected."""
        self._flush()

    def key_groups(self) -> list[int]:
        """Key groups with spooled entries, ascending."""
        return sorted(self._index)

    def sections(self, key_group: int) -> Iterator[tuple[str, int, bytes]]:
        """``(state name, entries, entries section)`` of one key group, one per state."""
        parts = self._index.get(key_group)
        if not parts:
            return
        by_state: dict[str, list[tuple[int, int, int]]] = {}
        for name, count, offset, length in parts:
            by_state.setdefault(name, []).append((count, offset, length))
        for name, pieces in by_state.items():
            transform = self._transforms.get(name)
            if len(pieces) == 1 and transform is None:
                count, offset, length = pieces[0]
                yield name, count, self._read(offset, length)
                continue
            # the key group was spooled in pieces, or TTL drops what has expired by now (the
            # time of the snapshot, as the heap backend's snapshot does): decoded and encoded
            # again as one section (memory: one key group)
            codec = self._codecs[name]
            keys: list[Any] = []
            namespaces: list[Any] = []
            states: list[Any] = []
            for _count, offset, length in pieces:
                k, ns, st = codec.decode(self._read(offset, length))
                keys += k
                namespaces += ns if len(ns) == len(k) else ns * len(k)
                states += st
            if transform is not None:
                kept = [
                    (k, ns, new)
                    for k, ns, st in zip(keys, namespaces, states, strict=True)
                    if (new := transform(st)) is not None
                ]
                keys = [e[0] for e in kept]
                namespaces = [e[1] for e in kept]
                states = [e[2] for e in kept]
            if keys:
                yield name, len(keys), codec.encode(EntryColumns(keys, namespaces, states))

    def _read(self, offset: int, length: int) -> bytes:
        self._file.seek(offset)
        data = self._file.read(length)
        if len(data) != length:
            raise CheckpointError(
                f"the savepoint spool file is truncated at offset {offset} (read {len(data)} of "
                f"{length} bytes)"
            )
        return data

    def close(self) -> None:
        """Delete the spool file."""
        self._file.close()
        self._index.clear()
        self._collecting.clear()
        self._collected = 0


class BatchKeyedStateSnapshot(KeyedStateSnapshot):
    """The spooled entries of a batch backend as a keyed snapshot (a savepoint's source).

    ``states`` lists every registered state and timer queue, in registration order: a state
    no key kept an entry of is still declared (as the heap backend's snapshot does).
    """

    def __init__(
        self,
        key_serializer: TypeSerializer[Any],
        max_parallelism: int,
        key_group_range: KeyGroupRange,
        states: list[StateMetaInfo],
        spool: KeyGroupSpool,
        checkpoint_id: int = 0,
    ) -> None:
        self.key_serializer = key_serializer
        self.max_parallelism = max_parallelism
        self.key_group_range = key_group_range
        self.states = states
        self.kind = FULL_SNAPSHOT
        self.checkpoint_id = checkpoint_id
        self._spool = spool
        self._index = {meta.name: i for i, meta in enumerate(states)}

    def key_group_entries(self, key_group: int) -> Iterator[tuple[int, EncodedEntries]]:
        index = self._index
        for name, count, data in self._spool.sections(key_group):
            yield index[name], EncodedEntries(data, count)

    def release_key_group(self, key_group: int) -> None:
        """Nothing to release: the spool is read, never changed."""

    def release(self) -> None:
        """Nothing to release: the backend deletes the spool when it is disposed."""
