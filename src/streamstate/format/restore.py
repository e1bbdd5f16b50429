"""What a checkpoint restore hands to a backend (SPEC §7), the same for every backend.

Restore reads snapshot files and hands each backend one :class:`KeyedStateRestore` per file, in
the order they must be applied (for each old subtask: its full snapshot, then its deltas). Each
yields verified key-group blocks whose entries are still encoded: the backend decides when and
with which serializers to decode them. State whose serializers can be rebuilt from the
checkpoint without running code (:func:`is_builtin_snapshot`) can be decoded at once; other
state waits, encoded, until the program registers it with its descriptor.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import IO, Any, Protocol

import msgspec

from streamstate.errors import CorruptCheckpointError
from streamstate.format.handles import StateFileHandle
from streamstate.format.keyed_file import KeyedSnapshotReader
from streamstate.format.meta import StateMetaSnapshot
from streamstate.format.snapshot import EncodedEntries
from streamstate.keygroups import KeyGroupRange
from streamstate.serializers.base import Compatibility, SerializerSnapshot, TypeSerializer

__all__ = [
    "BUILTIN_SERIALIZER_TYPES",
    "EncodedKeyGroup",
    "FileKeyedStateRestore",
    "KeyedStateRestore",
    "RestoredBlock",
    "RestoredSerializer",
    "SnapshotLocation",
    "expand_namespaces",
    "is_builtin_snapshot",
]

BUILTIN_SERIALIZER_TYPES = frozenset(
    {
        "int64",
        "float64",
        "bool",
        "str",
        "bytes",
        "void_namespace",
        "optional",
        "list",
        "dict",
        "tuple",
    }
)
"""Serializer types that :func:`~streamstate.serializers.serializer_from_snapshot` rebuilds
without importing anything named by the checkpoint."""


def is_builtin_snapshot(snap: Any) -> bool:
    """Whether a serializer snapshot (and every nested one) is of a built-in type.

    >>> is_builtin_snapshot({"type": "list", "version": 1, "element": {"type": "int64"}})
    True
    >>> is_builtin_snapshot({"type": "struct", "class": "app:Order"})
    False
    """
    if not isinstance(snap, dict) or snap.get("type") not in BUILTIN_SERIALIZER_TYPES:
        return False
    for key in ("inner", "element", "key", "value"):
        if key in snap and not is_builtin_snapshot(snap[key]):
            return False
    return all(is_builtin_snapshot(f) for f in snap.get("fields", ()))


class RestoredSerializer(TypeSerializer[Any]):
    """A serializer known only by the snapshot found in a checkpoint.

    Stands in for the real one while restored values are still encoded: its values are the
    encoded msgpack bytes of each value, written back as they are. :meth:`decode_with` turns them
    into values once the program supplies the serializer.
    """

    type_name = "restored"
    wire_native = False
    immutable = True

    def __init__(self, snapshot: SerializerSnapshot) -> None:
        self._snapshot = dict(snapshot)

    def snapshot(self) -> SerializerSnapshot:
        return dict(self._snapshot)

    @property
    def wire_type(self) -> Any:
        return msgspec.Raw

    def serialize(self, value: Any) -> bytes:
        return bytes(value)

    def deserialize(self, data: bytes) -> Any:
        return bytes(data)

    def to_wire(self, value: Any) -> Any:
        return msgspec.Raw(value)

    def from_wire(self, wire: Any) -> Any:
        return bytes(wire)

    def resolve_compatibility(self, old: SerializerSnapshot) -> Compatibility:
        if old == self._snapshot:
            return Compatibility.COMPATIBLE_AS_IS
        return Compatibility.INCOMPATIBLE

    def decode_with(self, encoded: list[bytes], serializer: TypeSerializer[Any]) -> list[Any]:
        """Decode values kept encoded with the serializer the program declares now."""
        decoder = msgspec.msgpack.Decoder(serializer.wire_type)
        if serializer.wire_native:
            return [decoder.decode(b) for b in encoded]
        fr = serializer.from_wire
        return [fr(decoder.decode(b)) for b in encoded]

    def __repr__(self) -> str:
        return f"RestoredSerializer({self._snapshot!r})"


class RestoredBlock:
    """One state's entries in one key group of a snapshot file (verified, still encoded)."""

    __slots__ = ("count", "entries", "key_group", "removed", "state")

    def __init__(
        self,
        key_group: int,
        state: StateMetaSnapshot,
        count: int,
        entries: bytes,
        removed: bytes | None,
    ) -> None:
        self.key_group = key_group
        #: the state's meta data from the file header
        self.state = state
        self.count = count
        #: the entries section (docs/formats.md)
        self.entries = entries
        #: None: ``entries`` replace the key group's content; else the removed section
        self.removed = removed


class KeyedStateRestore(ABC):
    """One snapshot file as a restoring backend sees it, limited to the backend's key groups."""

    #: where the data comes from (for error messages)
    path: str
    #: "full" or "delta"
    kind: str
    #: snapshot of the key serializer that wrote the file
    key_serializer: SerializerSnapshot
    max_parallelism: int
    #: the meta data of the file's states (from its header)
    states: list[StateMetaSnapshot]

    @abstractmethod
    def blocks(self) -> Iterator[RestoredBlock]:
        """Every block of the backend's key groups, ascending by key group.

        Each key group is verified as a whole before any of its blocks is yielded; corruption
        raises :class:`~streamstate.errors.CorruptCheckpointError` naming the file and key group.
        """

    #: restore only these states (and no timers), None: everything; a reader of one state sets
    #: it so that the other states' serializers never matter
    only_states: set[str] | None = None
    #: restore only these key groups of the file's range (None: all of them): the blocks of the
    #: others are never read (a reader of some keys reads only the key groups that hold them)
    only_key_groups: frozenset[int] | None = None
    #: how a snapshot in a backend's own format rebuilds the serializers that give its canonical
    #: view (None: the program's, ``serializer_from_snapshot``); a reader without the program
    #: passes ``plain_serializer_from_snapshot``
    serializers: Callable[[SerializerSnapshot], TypeSerializer[Any]] | None = None

    def close(self) -> None:  # noqa: B027 - optional
        """Release what reading the file holds (an open file, a local copy)."""


def expand_namespaces(namespaces: list[Any], n: int) -> list[Any]:
    """A restored block's namespace column for ``n`` keys: one namespace per key, or one for
    all of them (a block of a single namespace stores it once)."""
    if len(namespaces) == n:
        return namespaces
    if len(namespaces) == 1:
        return namespaces * n
    raise ValueError(f"namespace column has {len(namespaces)} values for {n} keys")


class SnapshotLocation(Protocol):
    """Where the files of a snapshot are (a ``CompletedCheckpoint``): its storage and
    directory, which the paths of its file handles are relative to."""

    @property
    def storage(self) -> Any:
        """The checkpoint storage (``open_read``, ``url_of``, ...)."""
        ...

    @property
    def directory(self) -> str: ...

    def resolve(self, path: str) -> str:
        """A handle's path relative to the storage root."""
        ...


class FileKeyedStateRestore(KeyedStateRestore):
    """One canonical keyed snapshot file of a checkpoint, limited to a key-group range.

    The file is opened on first use and closed once its blocks were read; its size is checked
    against the handle's.
    """

    def __init__(
        self, location: SnapshotLocation, handle: StateFileHandle, key_groups: KeyGroupRange
    ) -> None:
        self.location = location
        self.handle = handle
        self.key_groups = key_groups
        self._path = location.resolve(handle.path)
        self.path = location.storage.url_of(self._path)
        self._file: IO[bytes] | None = None
        self._reader: KeyedSnapshotReader | None = None

    def _open(self) -> KeyedSnapshotReader:
        if self._reader is None:
            f = self.location.storage.open_read(self._path)
            try:
                f.seek(0, 2)
                size = f.tell()
                if size != self.handle.size:
                    kgs = self.key_groups
                    raise CorruptCheckpointError(
                        f"corrupt checkpoint file {self.path} (key groups {kgs.start}-{kgs.end}): "
                        f"it has {size} bytes but the checkpoint metadata says {self.handle.size}"
                    )
                self._reader = KeyedSnapshotReader(f, self.path, size, self.key_groups)
            except BaseException:
                f.close()
                raise
            self._file = f
        return self._reader

    @property
    def kind(self) -> str:  # type: ignore[override]
        return self._open().kind

    @property
    def key_serializer(self) -> dict[str, Any]:  # type: ignore[override]
        return self._open().key_serializer

    @property
    def max_parallelism(self) -> int:  # type: ignore[override]
        return self._open().max_parallelism

    @property
    def states(self) -> list[StateMetaSnapshot]:  # type: ignore[override]
        return self._open().states

    def blocks(self) -> Iterator[RestoredBlock]:
        reader = self._open()
        states = reader.states
        only = self.only_states
        try:
            for kg, records in reader.read(self.key_groups, self.only_key_groups):
                for r in records:
                    meta = states[r.state_id]
                    if only is None or meta.name in only:
                        yield RestoredBlock(kg, meta, r.count, r.entries, r.removed)
        finally:
            self.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = None
        self._reader = None


_ENCODER = msgspec.msgpack.Encoder()
_RAW_SECTION = msgspec.msgpack.Decoder(
    tuple[list[msgspec.Raw], list[msgspec.Raw], list[msgspec.Raw]]
)
_RAW_REMOVED = msgspec.msgpack.Decoder(tuple[list[msgspec.Raw], list[msgspec.Raw]])


class EncodedKeyGroup:
    """The entries of one state in one key group, merged from a chain of blocks (a full
    snapshot's, then deltas') without decoding anything: keys, namespaces and states stay the
    bytes the files hold. A key group whose chain is one full block keeps that block's section
    byte for byte."""

    __slots__ = ("encoded", "merged")

    def __init__(self) -> None:
        self.encoded: EncodedEntries | None = None
        #: (key bytes, namespace bytes) -> state bytes, once a delta had to be merged in
        self.merged: dict[tuple[bytes, bytes], bytes] | None = None

    def apply(self, count: int, entries: bytes, removed: bytes | None) -> None:
        """Apply the next block: ``removed`` None replaces the content, else upserts
        ``entries`` and removes the ``removed`` section's entries."""
        if removed is None:  # replacement
            self.encoded = EncodedEntries(bytes(entries), count)
            self.merged = None
            return
        merged = self._materialize()
        keys, nss, states = _RAW_SECTION.decode(entries)
        for k, ns, s in zip(keys, expand_namespaces(nss, len(keys)), states, strict=True):
            merged[(bytes(k), bytes(ns))] = bytes(s)
        gone_keys, gone_nss = _RAW_REMOVED.decode(removed)
        for k, ns in zip(gone_keys, expand_namespaces(gone_nss, len(gone_keys)), strict=True):
            merged.pop((bytes(k), bytes(ns)), None)

    def _materialize(self) -> dict[tuple[bytes, bytes], bytes]:
        if self.merged is None:
            self.merged = {}
            if self.encoded is not None and self.encoded.count:
                keys, nss, states = _RAW_SECTION.decode(self.encoded.data)
                for k, ns, s in zip(keys, expand_namespaces(nss, len(keys)), states, strict=True):
                    self.merged[(bytes(k), bytes(ns))] = bytes(s)
            self.encoded = None
        return self.merged

    def result(self) -> EncodedEntries | None:
        """The merged entries as one entries section (None when none is left)."""
        if self.merged is not None:
            if not self.merged:
                return None
            items = list(self.merged.items())
            data = _ENCODER.encode(
                (
                    [msgspec.Raw(k) for (k, _), _ in items],
                    [msgspec.Raw(ns) for (_, ns), _ in items],
                    [msgspec.Raw(s) for _, s in items],
                )
            )
            return EncodedEntries(data, len(items))
        if self.encoded is None or not self.encoded.count:
            return None
        return self.encoded
