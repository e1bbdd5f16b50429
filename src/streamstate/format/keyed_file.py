"""The keyed snapshot file: magic ``SSKS`` (SPEC §6.2; byte by byte in docs/formats.md).

::

    "SSKS" | u16 version | u32 H | header (msgpack, H bytes) | u32 crc32c(header)
    block*            one per non-empty key group, ascending
    footer (msgpack)  key-group offset index
    u32 crc32c(footer) | u32 footer length | "SSKS"

A block is ``u32 key group | u32 raw length | u32 stored length | stored bytes | u32 crc32c``,
the CRC covering the 12 frame bytes and the stored bytes. The stored bytes are the block's
payload compressed on their own (none / lz4 / zstd); the payload is the msgpack array
``[key_group, [[state_id, count, entries_section, removed_section_or_nil], ...]]`` whose
sections are described in :mod:`streamstate.format.codec`.

``removed = nil`` means the entries are the complete content of the key group for that state
(always so in full files); a list of removed ``(key, namespace)`` means the entries are upserts
on top of the previous checkpoint (delta files).

Readers check the magic, the version, the header and footer checksums, and each block's
checksum before decoding anything of it; a mismatch raises
:class:`~streamstate.errors.CorruptCheckpointError` naming the file and the key group. Only the
blocks of the key groups asked for are read (adjacent blocks in one read).
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import IO, Any

import msgspec

from streamstate.errors import CheckpointError, CorruptCheckpointError
from streamstate.format.codec import (
    CODECS,
    EntryEncodeError,
    StateCodec,
    compress,
    crc32c,
    crc32c_extend,
    decompress,
)
from streamstate.format.meta import StateMetaInfo, StateMetaSnapshot
from streamstate.format.snapshot import (
    DELTA_SNAPSHOT,
    FULL_SNAPSHOT,
    DeltaEntries,
    EncodedEntries,
    EntryColumns,
    KeyedStateSnapshot,
)
from streamstate.keygroups import UPPER_BOUND_MAX_PARALLELISM, KeyGroupRange
from streamstate.serializers.base import TypeSerializer

__all__ = [
    "FORMAT_VERSION",
    "KEYED_MAGIC",
    "SUPPORTED_VERSIONS",
    "BlockState",
    "KeyedFileSummary",
    "KeyedSnapshotReader",
    "KeyedSnapshotWriter",
    "write_keyed_snapshot",
]

KEYED_MAGIC = b"SSKS"
FORMAT_VERSION = 1
"""Bumped on every change of the byte layout (docs/formats.md, "Version policy")."""
SUPPORTED_VERSIONS = frozenset({1})

_PREFIX = struct.Struct(">4sHI")
_U32 = struct.Struct(">I")
_FRAME = struct.Struct(">III")
_TRAILER = struct.Struct(">II4s")
_MAX_SPAN = 8 << 20
_ENCODER = msgspec.msgpack.Encoder()
_PAYLOAD = msgspec.msgpack.Decoder(tuple[int, list[tuple[int, int, msgspec.Raw, msgspec.Raw]]])
_NIL = b"\xc0"


class _Header(msgspec.Struct):
    """The header's fields a reader uses, typed (other keys are ignored)."""

    kind: str
    key_serializer: dict[str, Any]
    max_parallelism: int
    key_group_range: tuple[int, int]
    compression: str
    states: list[StateMetaSnapshot]
    checkpoint_id: int = 0


class _KeyGroupIndex(msgspec.Struct):
    """The footer: where each key group's block is (0 and size 0: an empty key group)."""

    first_key_group: int
    offsets: list[int]
    sizes: list[int]
    entries: list[int]


_INDEX = msgspec.msgpack.Decoder(_KeyGroupIndex)


@dataclasses.dataclass
class KeyedFileSummary:
    """What a writer reports about the file it wrote."""

    size: int
    #: CRC32C of the whole file
    checksum: int
    kind: str
    key_group_range: KeyGroupRange
    #: key group -> entries written there (non-empty key groups only)
    entries: dict[int, int]
    state_names: list[str]


class _Sink:
    """Counts bytes and accumulates the whole-file CRC32C while writing."""

    __slots__ = ("crc", "out", "size")

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.size = 0
        self.crc = 0

    def write(self, data: bytes) -> None:
        self.out.write(data)
        self.size += len(data)
        self.crc = crc32c_extend(self.crc, data)


def _no_pause() -> None:
    return None


class KeyedSnapshotWriter:
    """Writes one keyed snapshot file, key group by key group in ascending order."""

    def __init__(
        self,
        out: IO[bytes],
        *,
        path: str,
        key_serializer: TypeSerializer[Any],
        max_parallelism: int,
        key_group_range: KeyGroupRange,
        states: Sequence[StateMetaInfo],
        kind: str = FULL_SNAPSHOT,
        checkpoint_id: int = 0,
        compression: str = "lz4",
        pause: Callable[[], None] | None = None,
    ) -> None:
        if compression not in CODECS:
            raise ValueError(
                f"unknown compression codec {compression!r}; use one of {', '.join(CODECS)}"
            )
        if kind not in (FULL_SNAPSHOT, DELTA_SNAPSHOT):
            raise ValueError(f"unknown snapshot kind {kind!r}")
        self.path = path
        self.kind = kind
        self.key_serializer = key_serializer
        self.key_group_range = key_group_range
        self.compression = compression
        self.states = list(states)
        self._pause = pause or _no_pause
        self._codecs: list[StateCodec | None] = [None] * len(self.states)
        self._sink = _Sink(out)
        self._offsets = [0] * len(key_group_range)
        self._sizes = [0] * len(key_group_range)
        self._entries = [0] * len(key_group_range)
        self._last_kg = key_group_range.start - 1
        header = {
            "format": "streamstate-keyed-snapshot",
            "kind": kind,
            "checkpoint_id": checkpoint_id,
            "key_serializer": key_serializer.snapshot(),
            "max_parallelism": max_parallelism,
            "key_group_range": [key_group_range.start, key_group_range.end],
            "compression": compression,
            "states": [{"id": i, **m.to_dict()} for i, m in enumerate(self.states)],
        }
        data = _ENCODER.encode(header)
        self._sink.write(_PREFIX.pack(KEYED_MAGIC, FORMAT_VERSION, len(data)))
        self._sink.write(data)
        self._sink.write(_U32.pack(crc32c(data)))

    def _codec(self, state_index: int) -> StateCodec:
        codec = self._codecs[state_index]
        if codec is None:
            meta = self.states[state_index]
            codec = self._codecs[state_index] = StateCodec(
                self.key_serializer, meta.namespace_serializer, meta.state_serializer
            )
        return codec

    def write_key_group(
        self,
        key_group: int,
        items: Iterable[tuple[int, Any]],
    ) -> int:
        """Write the block of one key group; returns the number of entries written.

        ``items`` are ``(state index, entries)`` as a :class:`KeyedStateSnapshot` yields them.
        A value its serializer cannot write fails the snapshot with a :class:`CheckpointError`
        naming the state, the key group and the value.
        """
        if key_group <= self._last_kg or not self.key_group_range.contains(key_group):
            raise ValueError(
                f"{self.path}: key group {key_group} is out of order or outside "
                f"{self.key_group_range}"
            )
        self._last_kg = key_group
        records: list[tuple[int, int, msgspec.Raw, msgspec.Raw | None]] = []
        total = 0
        for state_index, entries in items:
            record = self._record(key_group, state_index, entries)
            if record is not None:
                records.append(record)
                total += record[1]
        if not records:
            return 0
        payload = _ENCODER.encode((key_group, records))
        stored = compress(self.compression, payload)
        frame = _FRAME.pack(key_group, len(payload), len(stored))
        crc = crc32c_extend(crc32c(frame), stored)
        index = key_group - self.key_group_range.start
        self._offsets[index] = self._sink.size
        self._sink.write(frame)
        self._sink.write(stored)
        self._sink.write(_U32.pack(crc))
        self._sizes[index] = len(frame) + len(stored) + 4
        self._entries[index] = total
        self._pause()
        return total

    def _record(
        self, key_group: int, state_index: int, entries: Any
    ) -> tuple[int, int, msgspec.Raw, msgspec.Raw | None] | None:
        if isinstance(entries, EncodedEntries):
            if entries.count == 0:
                return None
            return (state_index, entries.count, msgspec.Raw(entries.data), None)
        meta = self.states[state_index]
        try:
            if isinstance(entries, DeltaEntries):
                upserts = entries.upserts
                removed = entries.removed
                if not len(upserts) and removed is not None and not len(removed):
                    return None
                codec = self._codec(state_index)
                data = codec.encode(upserts, self._pause)
                gone = None if removed is None else codec.encode_removed(removed, self._pause)
                return (
                    state_index,
                    len(upserts),
                    msgspec.Raw(data),
                    None if gone is None else msgspec.Raw(gone),
                )
            listed = entries if type(entries) in (list, EntryColumns) else list(entries)
            if not len(listed):
                return None
            data = self._codec(state_index).encode(listed, self._pause)
            return (state_index, len(listed), msgspec.Raw(data), None)
        except EntryEncodeError as exc:
            raise CheckpointError(
                f"cannot snapshot state {meta.name!r} in key group {key_group} (writing "
                f"{self.path}): {exc}; the value does not match the state's serializer "
                f"{meta.state_serializer!r}"
            ) from None

    def finish(self) -> KeyedFileSummary:
        """Write the footer; the file is complete once the returned summary exists."""
        footer = _ENCODER.encode(
            {
                "first_key_group": self.key_group_range.start,
                "offsets": self._offsets,
                "sizes": self._sizes,
                "entries": self._entries,
            }
        )
        self._sink.write(footer)
        self._sink.write(_TRAILER.pack(crc32c(footer), len(footer), KEYED_MAGIC))
        start = self.key_group_range.start
        return KeyedFileSummary(
            size=self._sink.size,
            checksum=self._sink.crc,
            kind=self.kind,
            key_group_range=self.key_group_range,
            entries={start + i: n for i, n in enumerate(self._entries) if self._sizes[i]},
            state_names=[m.name for m in self.states],
        )


def write_keyed_snapshot(
    snapshot: KeyedStateSnapshot,
    out: IO[bytes],
    *,
    path: str,
    compression: str = "lz4",
    pause: Callable[[], None] | None = None,
    key_groups: Iterable[int] | None = None,
) -> KeyedFileSummary:
    """Write ``snapshot`` to ``out``, releasing each key group once written.

    ``pause`` is called between blocks (and between chunks of large blocks): the asynchronous
    writer passes a function that yields the GIL to the processing thread. ``key_groups``: write
    only these key groups of the snapshot's range, ascending (None: every one).
    """
    writer = KeyedSnapshotWriter(
        out,
        path=path,
        key_serializer=snapshot.key_serializer,
        max_parallelism=snapshot.max_parallelism,
        key_group_range=snapshot.key_group_range,
        states=snapshot.states,
        kind=snapshot.kind,
        checkpoint_id=snapshot.checkpoint_id,
        compression=compression,
        pause=pause,
    )
    for kg in snapshot.key_group_range if key_groups is None else key_groups:
        writer.write_key_group(kg, snapshot.key_group_entries(kg))
        snapshot.release_key_group(kg)
    return writer.finish()


# ---- reading ------------------------------------------------------------------------------------


@dataclasses.dataclass
class BlockState:
    """One state's record in a verified key-group block (sections still encoded)."""

    state_id: int
    count: int
    entries: msgspec.Raw
    #: None: the entries replace the key group's content; else the removed section (delta)
    removed: msgspec.Raw | None


class KeyedSnapshotReader:
    """Reads a keyed snapshot file; verifies every checksum it reads.

    ``f`` is a seekable binary file; ``path`` names it in errors, and so does ``key_groups``
    (the key groups a restore reads from it) when the damage is not inside one key group's
    block (header, index, truncation).
    """

    def __init__(
        self,
        f: IO[bytes],
        path: str,
        file_size: int | None = None,
        key_groups: KeyGroupRange | None = None,
    ) -> None:
        self.path = path
        self._wanted = key_groups
        self._f = f
        if file_size is None:
            f.seek(0, 2)
            file_size = f.tell()
        self.file_size = file_size
        if file_size < _PREFIX.size + 4 + _TRAILER.size:
            raise self._corrupt(f"file is truncated ({file_size} bytes)")
        f.seek(0)
        prefix = f.read(_PREFIX.size)
        magic, version, header_len = _PREFIX.unpack(prefix)
        if magic != KEYED_MAGIC:
            raise self._corrupt(f"not a keyed snapshot file (magic {magic!r}, expected b'SSKS')")
        if version not in SUPPORTED_VERSIONS:
            raise CheckpointError(
                f"{path}{self._where()}: keyed snapshot format version {version} is not "
                "supported by this "
                f"streamstate (it reads versions {sorted(SUPPORTED_VERSIONS)}); "
                + (
                    "upgrade streamstate to read it"
                    if version > FORMAT_VERSION
                    else "restore it with an older streamstate and take a savepoint"
                )
            )
        self.version = version
        if _PREFIX.size + header_len + 4 + _TRAILER.size > file_size:
            raise self._corrupt(f"header length {header_len} is beyond the end of the file")
        raw = f.read(header_len + 4)
        if len(raw) != header_len + 4:
            raise self._corrupt("file is truncated inside the header")
        header_bytes = raw[:header_len]
        if crc32c(header_bytes) != _U32.unpack(raw[header_len:])[0]:
            raise self._corrupt("header checksum mismatch")
        try:
            self.header: dict[str, Any] = msgspec.msgpack.decode(header_bytes)
            head = msgspec.convert(self.header, _Header)
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise self._corrupt(f"unreadable header ({exc})") from None
        start, end = head.key_group_range
        if not 1 <= head.max_parallelism <= UPPER_BOUND_MAX_PARALLELISM or not (
            start >= 0 and end < head.max_parallelism and start <= end + 1
        ):
            raise self._corrupt(
                f"unreadable header (key groups {start}-{end} of max_parallelism "
                f"{head.max_parallelism})"
            )
        if head.compression not in CODECS or head.kind not in (FULL_SNAPSHOT, DELTA_SNAPSHOT):
            raise self._corrupt(
                f"unreadable header (compression {head.compression!r}, kind {head.kind!r})"
            )
        self.key_group_range = KeyGroupRange(start, end)
        self.max_parallelism: int = head.max_parallelism
        self.compression: str = head.compression
        self.kind: str = head.kind
        self.checkpoint_id: int = head.checkpoint_id
        self.states: list[StateMetaSnapshot] = head.states
        self.key_serializer: dict[str, Any] = head.key_serializer
        self._data_start = _PREFIX.size + header_len + 4
        self._read_footer()

    def _where(self, key_group: int | None = None) -> str:
        if key_group is not None:
            return f" (key group {key_group})"
        if self._wanted is not None:
            return f" (key groups {self._wanted.start}-{self._wanted.end})"
        return ""

    def _corrupt(self, what: str, key_group: int | None = None) -> CorruptCheckpointError:
        where = self._where(key_group)
        return CorruptCheckpointError(f"corrupt checkpoint file {self.path}{where}: {what}")

    def _read_footer(self) -> None:
        f = self._f
        f.seek(self.file_size - _TRAILER.size)
        trailer = f.read(_TRAILER.size)
        crc, footer_len, magic = _TRAILER.unpack(trailer)
        if magic != KEYED_MAGIC:
            raise self._corrupt("missing end magic: the file is truncated or was not finished")
        footer_start = self.file_size - _TRAILER.size - footer_len
        if footer_start < self._data_start:
            raise self._corrupt("footer length is out of range")
        f.seek(footer_start)
        footer = f.read(footer_len)
        if crc32c(footer) != crc:
            raise self._corrupt("footer (key-group index) checksum mismatch")
        try:
            index = _INDEX.decode(footer)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            raise self._corrupt(f"unreadable key-group index ({exc})") from None
        self._offsets: list[int] = index.offsets
        self._sizes: list[int] = index.sizes
        self._entries: list[int] = index.entries
        first = index.first_key_group
        n = len(self.key_group_range)
        if first != self.key_group_range.start or not (
            len(self._offsets) == len(self._sizes) == len(self._entries) == n
        ):
            raise self._corrupt("key-group index does not match the header's key-group range")
        for i, (off, size) in enumerate(zip(self._offsets, self._sizes, strict=True)):
            if size < 0 or (size and (off < self._data_start or off + size > footer_start)):
                raise self._corrupt(
                    "key-group index points outside the data", self.key_group_range.start + i
                )

    # ---- index ---------------------------------------------------------------------------------

    def key_groups(self, key_group_range: KeyGroupRange | None = None) -> list[int]:
        """Non-empty key groups of the file within ``key_group_range`` (all if None)."""
        wanted = (
            self.key_group_range
            if key_group_range is None
            else self.key_group_range.intersection(key_group_range)
        )
        start = self.key_group_range.start
        return [kg for kg in wanted if self._sizes[kg - start]]

    def block_size(self, key_group: int) -> int:
        return self._sizes[key_group - self.key_group_range.start]

    # ---- blocks --------------------------------------------------------------------------------

    def read(
        self,
        key_group_range: KeyGroupRange | None = None,
        only: Collection[int] | None = None,
    ) -> Iterator[tuple[int, list[BlockState]]]:
        """``(key group, states)`` for each non-empty key group in range (and in ``only``, when
        given: the blocks of other key groups are never read), ascending.

        Each block is read (adjacent blocks in one read), checked against its checksum and
        decoded as a whole before it is yielded.
        """
        kgs = self.key_groups(key_group_range)
        if only is not None:
            kgs = [kg for kg in kgs if kg in only]
        start = self.key_group_range.start
        i = 0
        while i < len(kgs):
            first = kgs[i]
            span_start = self._offsets[first - start]
            span_end = span_start + self._sizes[first - start]
            j = i + 1
            while j < len(kgs):
                off = self._offsets[kgs[j] - start]
                if off != span_end or off + self._sizes[kgs[j] - start] - span_start > _MAX_SPAN:
                    break
                span_end = off + self._sizes[kgs[j] - start]
                j += 1
            self._f.seek(span_start)
            buf = self._f.read(span_end - span_start)
            if len(buf) != span_end - span_start:
                raise self._corrupt("file is truncated inside the data", first)
            view = memoryview(buf)
            for kg in kgs[i:j]:
                off = self._offsets[kg - start] - span_start
                yield kg, self._decode_block(kg, view[off : off + self._sizes[kg - start]])
            i = j

    def read_key_group(self, key_group: int) -> list[BlockState]:
        """The verified block of one key group ([] when the key group is empty)."""
        for _, states in self.read(KeyGroupRange(key_group, key_group)):
            return states
        return []

    def _decode_block(self, kg: int, block: memoryview) -> list[BlockState]:
        if len(block) < _FRAME.size + 4:
            raise self._corrupt("block is truncated", kg)
        frame_kg, raw_len, stored_len = _FRAME.unpack(block[: _FRAME.size])
        if frame_kg != kg or _FRAME.size + stored_len + 4 != len(block):
            raise self._corrupt("block frame does not match the key-group index", kg)
        stored = block[_FRAME.size : _FRAME.size + stored_len]
        (crc,) = _U32.unpack(block[_FRAME.size + stored_len :])
        if crc32c_extend(crc32c(block[: _FRAME.size]), stored) != crc:
            raise self._corrupt("block checksum mismatch", kg)
        try:
            payload = decompress(self.compression, bytes(stored), raw_len)
            payload_kg, records = _PAYLOAD.decode(payload)
        except Exception as exc:
            raise self._corrupt(f"undecodable block ({exc})", kg) from None
        if payload_kg != kg:
            raise self._corrupt(f"block holds key group {payload_kg}", kg)
        n_states = len(self.states)
        out = []
        for state_id, count, entries, removed in records:
            if not 0 <= state_id < n_states:
                raise self._corrupt(f"block refers to unknown state id {state_id}", kg)
            out.append(
                BlockState(
                    state_id, count, entries, None if memoryview(removed) == _NIL else removed
                )
            )
        return out

    def verify(self) -> int:
        """Read and check every block; returns the number of entries. Raises on corruption."""
        total = 0
        for _kg, states in self.read():
            total += sum(s.count for s in states)
        return total
