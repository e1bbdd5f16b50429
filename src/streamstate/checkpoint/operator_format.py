"""The operator-state file: magic ``SSOS`` (byte by byte in docs/formats.md).

::

    "SSOS" | u16 version | u32 H | header (msgpack, H bytes) | u32 crc32c(header)
    per state, in header order: data (concatenated msgpack values) | u32 crc32c(data)
    footer (msgpack): per state {offset, length, element_offsets}
    u32 crc32c(footer) | u32 footer length | "SSOS"

Every list element (and every key and value of a broadcast map, alternately) is encoded on its
own, and the footer records where each starts, so that a reader can hand out any run of elements
without decoding the others (split-distribute redistribution deals out runs of elements).

Elements whose serializer is built in are decoded on read; others stay encoded behind a
:class:`~streamstate.format.restore.RestoredSerializer` until the program registers the state
with its descriptor (pickle is refused unless the program declares it).
"""

from __future__ import annotations

import dataclasses
import itertools
import struct
from typing import IO, Any

import msgspec

from streamstate.backends.operator import (
    BroadcastStateSnapshot,
    ListStateSnapshot,
    OperatorStateMode,
    OperatorStateSnapshot,
)
from streamstate.errors import CheckpointError, CorruptCheckpointError
from streamstate.format.codec import crc32c, crc32c_extend
from streamstate.format.restore import RestoredSerializer, is_builtin_snapshot
from streamstate.serializers import serializer_from_snapshot
from streamstate.serializers.base import TypeSerializer

__all__ = [
    "OPERATOR_FORMAT_VERSION",
    "OPERATOR_MAGIC",
    "OperatorFileSummary",
    "OperatorStateReader",
    "read_operator_state",
    "write_operator_state",
]

OPERATOR_MAGIC = b"SSOS"
OPERATOR_FORMAT_VERSION = 1
_SUPPORTED = frozenset({1})
_PREFIX = struct.Struct(">4sHI")
_U32 = struct.Struct(">I")
_TRAILER = struct.Struct(">II4s")
_ENCODER = msgspec.msgpack.Encoder()


@dataclasses.dataclass
class OperatorFileSummary:
    size: int
    checksum: int
    #: state name -> number of elements (entries for broadcast state)
    counts: dict[str, int]


def _encode_values(
    values: list[Any], serializer: TypeSerializer[Any], state: str, what: str
) -> list[bytes]:
    if isinstance(serializer, RestoredSerializer):
        return [bytes(v) for v in values]  # restored, never decoded: write back as read
    decoder = msgspec.msgpack.Decoder(serializer.wire_type)
    out = []
    for v in values:
        try:
            data = _ENCODER.encode(serializer.to_wire(v))
            decoder.decode(data)
        except Exception as exc:
            raise CheckpointError(
                f"cannot snapshot operator state {state!r}: {what} {v!r} does not match its "
                f"serializer {serializer!r} ({str(exc).split(' - at ')[0]})"
            ) from None
        out.append(data)
    return out


def write_operator_state(
    snapshot: OperatorStateSnapshot, out: IO[bytes], *, path: str
) -> OperatorFileSummary:
    """Write every operator state of one subtask to ``out``."""
    states_meta: list[dict[str, Any]] = []
    blobs: list[list[bytes]] = []
    counts: dict[str, int] = {}
    for name in sorted(snapshot.list_states):
        ls = snapshot.list_states[name]
        blobs.append(_encode_values(list(ls.elements), ls.element_serializer, name, "element"))
        states_meta.append(
            {
                "name": name,
                "mode": ls.mode.value,
                "element_serializer": ls.element_serializer.snapshot(),
                "count": len(ls.elements),
            }
        )
        counts[name] = len(ls.elements)
    for name in sorted(snapshot.broadcast_states):
        bs = snapshot.broadcast_states[name]
        keys = _encode_values(list(bs.entries), bs.key_serializer, name, "key")
        values = _encode_values(list(bs.entries.values()), bs.value_serializer, name, "value")
        blobs.append([x for pair in zip(keys, values, strict=True) for x in pair])
        states_meta.append(
            {
                "name": name,
                "mode": OperatorStateMode.BROADCAST.value,
                "key_serializer": bs.key_serializer.snapshot(),
                "value_serializer": bs.value_serializer.snapshot(),
                "count": len(bs.entries),
            }
        )
        counts[name] = len(bs.entries)
    header = _ENCODER.encode({"format": "streamstate-operator-state", "states": states_meta})
    parts = [_PREFIX.pack(OPERATOR_MAGIC, OPERATOR_FORMAT_VERSION, len(header)), header]
    parts.append(_U32.pack(crc32c(header)))
    offset = sum(len(p) for p in parts)
    footer_states = []
    for items in blobs:
        data = b"".join(items)
        rel, pos = [], 0
        for item in items:
            rel.append(pos)
            pos += len(item)
        footer_states.append({"offset": offset, "length": len(data), "element_offsets": rel})
        parts += [data, _U32.pack(crc32c(data))]
        offset += len(data) + 4
    footer = _ENCODER.encode({"states": footer_states})
    parts += [footer, _TRAILER.pack(crc32c(footer), len(footer), OPERATOR_MAGIC)]
    size, crc = 0, 0
    for p in parts:
        out.write(p)
        size += len(p)
        crc = crc32c_extend(crc, p)
    return OperatorFileSummary(size, crc, counts)


class _StateHeader(msgspec.Struct):
    """One state of an SSOS header (checked before any of it is used)."""

    name: str
    mode: OperatorStateMode
    count: int = 0
    element_serializer: dict[str, Any] | None = None
    key_serializer: dict[str, Any] | None = None
    value_serializer: dict[str, Any] | None = None


class _Header(msgspec.Struct):
    states: list[_StateHeader]


class _StateIndex(msgspec.Struct):
    offset: int
    length: int
    element_offsets: list[int]


class _Footer(msgspec.Struct):
    states: list[_StateIndex]


#: what msgspec raises for malformed input (invalid UTF-8 in a string is a UnicodeDecodeError)
_MALFORMED = (msgspec.DecodeError, UnicodeDecodeError)


class OperatorStateReader:
    """Reads an operator-state file; every checksum is verified before data is handed out, and
    every offset and length of its header and index is checked against the file's size."""

    def __init__(self, data: bytes, path: str) -> None:
        self.path = path
        self._data = data
        if len(data) < _PREFIX.size + 4 + _TRAILER.size:
            raise self._corrupt("file is truncated")
        magic, version, header_len = _PREFIX.unpack_from(data, 0)
        if magic != OPERATOR_MAGIC:
            raise self._corrupt(f"not an operator-state file (magic {magic!r})")
        if version not in _SUPPORTED:
            raise CheckpointError(
                f"{path}: operator-state format version {version} is not supported by this "
                f"streamstate (it reads versions {sorted(_SUPPORTED)})"
            )
        data_start = _PREFIX.size + header_len + 4
        if data_start + _TRAILER.size > len(data):
            raise self._corrupt(f"header length {header_len} is beyond the end of the file")
        header = data[_PREFIX.size : _PREFIX.size + header_len]
        (crc,) = _U32.unpack_from(data, _PREFIX.size + header_len)
        if crc32c(header) != crc:
            raise self._corrupt("header checksum mismatch")
        crc, footer_len, end_magic = _TRAILER.unpack_from(data, len(data) - _TRAILER.size)
        if end_magic != OPERATOR_MAGIC:
            raise self._corrupt("missing end magic: the file is truncated or was not finished")
        footer_start = len(data) - _TRAILER.size - footer_len
        if footer_start < data_start:
            raise self._corrupt("footer length is out of range")
        footer = data[footer_start : len(data) - _TRAILER.size]
        if crc32c(footer) != crc:
            raise self._corrupt("footer checksum mismatch")
        try:
            states = msgspec.msgpack.decode(header, type=_Header).states
            index = msgspec.msgpack.decode(footer, type=_Footer).states
        except _MALFORMED as exc:
            raise self._corrupt(f"unreadable header or footer ({exc})") from None
        if len(index) != len(states):
            raise self._corrupt("footer and header disagree on the number of states")
        for meta, entry in zip(states, index, strict=True):
            self._check(meta, entry, data_start, footer_start)
        self.states: list[dict[str, Any]] = [msgspec.to_builtins(m) for m in states]
        self._index: list[dict[str, Any]] = [msgspec.to_builtins(e) for e in index]

    def _check(self, meta: _StateHeader, entry: _StateIndex, start: int, end: int) -> None:
        """The index of one state lies in the data area and splits it into its elements."""
        name = meta.name
        if not (
            start <= entry.offset and entry.length >= 0 and entry.offset + entry.length + 4 <= end
        ):
            raise self._corrupt(f"state {name!r} lies outside the data")
        rel = entry.element_offsets
        if any(b < a for a, b in itertools.pairwise(rel)) or (
            rel and (rel[0] != 0 or rel[-1] > entry.length)
        ):
            raise self._corrupt(f"the element offsets of state {name!r} are out of order or range")
        broadcast = meta.mode is OperatorStateMode.BROADCAST
        if len(rel) != (2 * meta.count if broadcast else meta.count):
            raise self._corrupt(
                f"state {name!r} has {len(rel)} items, its header says {meta.count}"
            )
        wanted = ("key_serializer", "value_serializer") if broadcast else ("element_serializer",)
        if any(getattr(meta, w) is None for w in wanted):
            raise self._corrupt(f"state {name!r} has no {' or '.join(wanted)}")

    def _corrupt(self, what: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(f"corrupt operator-state file {self.path}: {what}")

    def _state_index(self, name: str) -> int:
        for i, s in enumerate(self.states):
            if s["name"] == name:
                return i
        raise KeyError(f"{self.path} has no operator state named {name!r}")

    def read_encoded(self, name: str, start: int = 0, stop: int | None = None) -> list[bytes]:
        """Encoded items ``start:stop`` of one state (checksum verified)."""
        i = self._state_index(name)
        entry = self._index[i]
        off, length, rel = entry["offset"], entry["length"], entry["element_offsets"]
        data = self._data[off : off + length]
        if len(data) != length:
            raise self._corrupt(f"state {name!r} is truncated")
        (crc,) = _U32.unpack_from(self._data, off + length)
        if crc32c(data) != crc:
            raise self._corrupt(f"checksum mismatch in state {name!r}")
        ends = [*rel[1:], length]
        stop = len(rel) if stop is None else stop
        return [data[rel[j] : ends[j]] for j in range(start, stop)]

    def snapshot(self) -> OperatorStateSnapshot:
        """The whole file as an :class:`OperatorStateSnapshot`."""
        lists: dict[str, ListStateSnapshot] = {}
        broadcasts: dict[str, BroadcastStateSnapshot] = {}
        for meta in self.states:
            name = meta["name"]
            items = self.read_encoded(name)
            mode = OperatorStateMode(meta["mode"])
            if mode is OperatorStateMode.BROADCAST:
                ks, vs = (
                    _decoder_for(meta["key_serializer"]),
                    _decoder_for(meta["value_serializer"]),
                )
                keys = self._decode(ks, items[0::2], name)
                values = self._decode(vs, items[1::2], name)
                broadcasts[name] = BroadcastStateSnapshot(
                    name, ks, vs, dict(zip(keys, values, strict=True))
                )
            else:
                es = _decoder_for(meta["element_serializer"])
                lists[name] = ListStateSnapshot(name, mode, es, self._decode(es, items, name))
        return OperatorStateSnapshot(lists, broadcasts)

    def _decode(self, serializer: TypeSerializer[Any], items: list[bytes], name: str) -> list[Any]:
        if isinstance(serializer, RestoredSerializer):
            return items
        decoder = msgspec.msgpack.Decoder(serializer.wire_type)
        try:
            return [serializer.from_wire(decoder.decode(b)) for b in items]
        except _MALFORMED as exc:
            raise self._corrupt(f"undecodable element in state {name!r} ({exc})") from None


def _decoder_for(snap: dict[str, Any]) -> TypeSerializer[Any]:
    if is_builtin_snapshot(snap):
        return serializer_from_snapshot(snap)
    return RestoredSerializer(snap)


def read_operator_state(data: bytes, path: str) -> OperatorStateSnapshot:
    """Decode a whole operator-state file (see :class:`OperatorStateReader`)."""
    return OperatorStateReader(data, path).snapshot()
