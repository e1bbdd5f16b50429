"""Byte-level building blocks of checkpoint files: compression, checksums, entries sections.

An *entries section* holds the entries of one state in one key group as three msgpack arrays
(columns), encoded with one ``msgspec`` call per column (per chunk of 16,384 values for large key
groups, so that no single C call holds the GIL for long):

``[keys, namespaces, states]``

``namespaces`` has one element when every entry shares the same namespace (the usual case:
``VOID_NAMESPACE``, or one window), else one per entry. A *removed section* (delta files) is
``[keys, namespaces]`` with the same rule. See docs/formats.md.

Every value is validated against its serializer's wire type while it is encoded, so a snapshot
never produces a file it cannot read back:

>>> from streamstate.serializers import Int64Serializer, StrSerializer
>>> from streamstate.serializers import VoidNamespaceSerializer
>>> from streamstate.namespace import VOID_NAMESPACE
>>> codec = StateCodec(StrSerializer(), VoidNamespaceSerializer(), Int64Serializer())
>>> data = codec.encode([("a", VOID_NAMESPACE, 1), ("b", VOID_NAMESPACE, 2)])
>>> codec.decode(data)
(['a', 'b'], [VOID_NAMESPACE], [1, 2])
>>> try:
...     codec.encode([("c", VOID_NAMESPACE, "three")])
... except EntryEncodeError as exc:
...     print(exc)
state value 'three' of key 'c': Expected `int`, got `str`
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any

import google_crc32c
import lz4.block
import msgspec
import zstandard

from streamstate.format.snapshot import EntryColumns
from streamstate.serializers.base import TypeSerializer, msgpack_array_header

__all__ = [
    "CHUNK",
    "CODECS",
    "MAX_EXPANSION",
    "UNREADABLE",
    "EntryEncodeError",
    "StateCodec",
    "compress",
    "crc32c",
    "crc32c_extend",
    "decompress",
]

#: what decoding values from bytes a checkpoint holds may raise on damaged or hostile input:
#: msgspec's errors (a string that is not UTF-8 is a ``UnicodeDecodeError``), fixed-size
#: encodings' ``struct.error``, values of the wrong type or size, nesting too deep; every reader
#: turns these into a checkpoint error naming what it read
UNREADABLE: tuple[type[Exception], ...] = (
    msgspec.DecodeError,
    ValueError,
    TypeError,
    struct.error,
    OverflowError,
    RecursionError,
)

CODECS = ("none", "lz4", "zstd")
"""Block compression codecs; each block of a file is compressed on its own."""

CHUNK = 16_384
"""Values per ``msgspec`` call when encoding a large column (bounds GIL hold time)."""

ZSTD_LEVEL = 1

_ENCODER = msgspec.msgpack.Encoder()
_local = threading.local()
_EMPTY_REMOVED = b"\x92\x90\x90"  # [[], []]


def crc32c(data: bytes | memoryview) -> int:
    """CRC32C (Castagnoli) of ``data``.

    >>> hex(crc32c(b"123456789"))
    '0xe3069283'
    """
    return int(google_crc32c.value(data if type(data) is bytes else bytes(data)))


def crc32c_extend(crc: int, data: bytes | memoryview) -> int:
    """Continue a CRC32C over more bytes."""
    return int(google_crc32c.extend(crc, data if type(data) is bytes else bytes(data)))


def compress(codec: str, data: bytes) -> bytes:
    """Compress one block with ``codec`` ("none", "lz4" or "zstd")."""
    if codec == "lz4":
        return lz4.block.compress(data, store_size=False)  # type: ignore[no-any-return]
    if codec == "zstd":
        c = getattr(_local, "zstd_c", None)
        if c is None:
            c = _local.zstd_c = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
        return c.compress(data)  # type: ignore[no-any-return]
    if codec == "none":
        return data
    raise ValueError(f"unknown compression codec {codec!r}; use one of {', '.join(CODECS)}")


#: the most bytes one stored byte can expand to, per codec (lz4's block format: 255; zstd's RLE
#: blocks: 128 KiB from 4 bytes): a raw length beyond that is a lie, refused before anything is
#: allocated for it
MAX_EXPANSION = {"none": 1, "lz4": 255, "zstd": 32768}


def decompress(codec: str, data: bytes, raw_length: int) -> bytes:
    """Undo :func:`compress`; ``raw_length`` is the uncompressed size recorded in the file.

    A ``raw_length`` that ``data`` cannot hold (more than :data:`MAX_EXPANSION` times its size;
    for ``none``, another size) raises ``ValueError`` before any buffer is allocated for it."""
    ratio = MAX_EXPANSION.get(codec)
    if ratio is not None and not (
        raw_length == len(data) if codec == "none" else 0 <= raw_length <= ratio * len(data) + 64
    ):
        raise ValueError(
            f"a {codec} block of {len(data)} bytes cannot hold the {raw_length} bytes its frame "
            "says"
        )
    if codec == "lz4":
        return lz4.block.decompress(data, uncompressed_size=raw_length)  # type: ignore[no-any-return]
    if codec == "zstd":
        d = getattr(_local, "zstd_d", None)
        if d is None:
            d = _local.zstd_d = zstandard.ZstdDecompressor()
        return d.decompress(data, max_output_size=raw_length)  # type: ignore[no-any-return]
    if codec == "none":
        return data
    raise ValueError(f"unknown compression codec {codec!r}; use one of {', '.join(CODECS)}")


# ---- arrays in chunks ---------------------------------------------------------------------------


def _header_length(encoded: bytes) -> int:
    first = encoded[0]
    if 0x90 <= first <= 0x9F:
        return 1
    return 3 if first == 0xDC else 5


def _no_pause() -> None:
    return None


def _convert_validates(tp: Any) -> bool:
    """Whether ``msgspec.convert(..., strict=True)`` checks values of ``tp`` exactly as decoding
    does (true for built-in scalars and containers; not for record types, whose instances it
    passes through unchecked)."""
    try:
        info = msgspec.inspect.type_info(tp)
    except Exception:
        return False
    return _info_ok(info)


def _info_ok(t: Any) -> bool:
    ins = msgspec.inspect
    if isinstance(
        t,
        ins.IntType | ins.FloatType | ins.StrType | ins.BytesType | ins.BoolType | ins.NoneType,
    ):
        # constrained scalars (ge=, max_length=, ...) are checked by convert too
        return True
    if isinstance(t, ins.ListType | ins.VarTupleType):
        return _info_ok(t.item_type)
    if isinstance(t, ins.TupleType):
        return all(_info_ok(x) for x in t.item_types)
    if isinstance(t, ins.DictType):
        return _info_ok(t.key_type) and _info_ok(t.value_type)
    if isinstance(t, ins.UnionType):
        return all(_info_ok(x) for x in t.types)
    if isinstance(t, ins.StructType):
        return not t.fields  # VoidNamespace
    return False


class EntryEncodeError(ValueError):
    """A value cannot be written by its serializer (raised while encoding a section)."""

    def __init__(self, what: str, value: Any, detail: str, index: int) -> None:
        self.what = what
        self.value = value
        self.detail = detail
        #: position of the value in its column
        self.index = index
        self.key: Any = None
        self.has_key = False
        super().__init__(self._message())

    def with_key(self, key: Any) -> EntryEncodeError:
        self.key = key
        self.has_key = True
        self.args = (self._message(),)
        return self

    def _message(self) -> str:
        of_key = f" of key {self.key!r}" if self.has_key else ""
        return f"{self.what} {self.value!r}{of_key}: {self.detail}"


_CHECK_ERRORS = (msgspec.ValidationError, msgspec.DecodeError, TypeError, ValueError)
_ENCODE_ERRORS = (TypeError, OverflowError, ValueError)


class _Column:
    """Encodes and validates one column (keys, namespaces or states) of a section."""

    __slots__ = ("_decoder", "_list_type", "_native", "_serializer", "_via_convert", "what")

    def __init__(self, serializer: TypeSerializer[Any], what: str) -> None:
        self._serializer = serializer
        self.what = what
        self._native = serializer.wire_native
        wire = serializer.wire_type
        self._list_type = list[wire]  # type: ignore[valid-type]
        self._via_convert = _convert_validates(wire)
        self._decoder = msgspec.msgpack.Decoder(self._list_type)

    def to_wire(self, values: list[Any]) -> list[Any]:
        if self._native:
            return values
        to = self._serializer.to_wire
        out = []
        for i, v in enumerate(values):
            try:
                out.append(to(v))
            except Exception as exc:
                raise EntryEncodeError(self.what, v, f"cannot be serialized: {exc}", i) from None
        return out

    def from_wire(self, values: list[Any]) -> list[Any]:
        if self._native:
            return values
        fr = self._serializer.from_wire
        return [fr(v) for v in values]

    def _check(self, values: list[Any], encoded: bytes | None) -> None:
        if self._via_convert:
            msgspec.convert(values, self._list_type, strict=True)
        else:
            self._decoder.decode(encoded if encoded is not None else _ENCODER.encode(values))

    def _validate(self, chunk: list[Any], encoded: bytes, offset: int) -> None:
        try:
            self._check(chunk, encoded)
        except _CHECK_ERRORS as exc:
            for i, v in enumerate(chunk):
                try:
                    self._check([v], None)
                except _CHECK_ERRORS as e:
                    detail = str(e).split(" - at ")[0]
                    raise EntryEncodeError(self.what, v, detail, offset + i) from None
            raise EntryEncodeError(self.what, chunk[0], str(exc), offset) from None

    def _encode(self, chunk: list[Any], offset: int) -> bytes:
        try:
            return _ENCODER.encode(chunk)
        except _ENCODE_ERRORS as exc:
            for i, v in enumerate(chunk):
                try:
                    _ENCODER.encode(v)
                except _ENCODE_ERRORS as e:
                    raise EntryEncodeError(
                        self.what, v, f"cannot be encoded: {e}", offset + i
                    ) from None
            raise EntryEncodeError(self.what, chunk[0], str(exc), offset) from None

    def encode(self, values: list[Any], pause: Callable[[], None]) -> list[bytes | memoryview]:
        """The encoded array, as parts to join; values are validated on the way."""
        wire = self.to_wire(values)
        n = len(wire)
        if n <= CHUNK:
            encoded = self._encode(wire, 0)
            self._validate(wire, encoded, 0)
            return [encoded]
        parts: list[bytes | memoryview] = [msgpack_array_header(n)]
        for start in range(0, n, CHUNK):
            chunk = wire[start : start + CHUNK]
            encoded = self._encode(chunk, start)
            self._validate(chunk, encoded, start)
            parts.append(memoryview(encoded)[_header_length(encoded) :])
            pause()
        return parts


class StateCodec:
    """Encodes and decodes the entries sections of one state (see the module docstring)."""

    __slots__ = ("_keys", "_namespaces", "_removed_decoder", "_section_decoder", "_states")

    def __init__(
        self,
        key_serializer: TypeSerializer[Any],
        namespace_serializer: TypeSerializer[Any],
        state_serializer: TypeSerializer[Any],
    ) -> None:
        self._keys = _Column(key_serializer, "key")
        self._namespaces = _Column(namespace_serializer, "namespace")
        self._states = _Column(state_serializer, "state value")
        kw, nw, sw = (s.wire_type for s in (key_serializer, namespace_serializer, state_serializer))
        self._section_decoder = msgspec.msgpack.Decoder(
            tuple[list[kw], list[nw], list[sw]]  # type: ignore[valid-type]
        )
        self._removed_decoder = msgspec.msgpack.Decoder(
            tuple[list[kw], list[nw]]  # type: ignore[valid-type]
        )

    # ---- encode --------------------------------------------------------------------------------

    def encode(
        self,
        entries: Sequence[tuple[Any, Any, Any]] | EntryColumns,
        pause: Callable[[], None] = _no_pause,
    ) -> bytes:
        """The entries section of ``(key, namespace, state)`` entries (or of columns).

        Raises :class:`EntryEncodeError` naming the value (and its key) that its serializer
        cannot write.
        """
        if isinstance(entries, EntryColumns):
            assert entries.states is not None
            return self._encode_columns(
                entries.keys, entries.namespaces, [entries.states], pause, b"\x93"
            )
        keys = [e[0] for e in entries]
        namespaces = [e[1] for e in entries]
        states = [e[2] for e in entries]
        return self._encode_columns(keys, namespaces, [states], pause, b"\x93")

    def encode_removed(
        self,
        removed: Sequence[tuple[Any, Any]] | EntryColumns,
        pause: Callable[[], None] = _no_pause,
    ) -> bytes:
        """The removed section of ``(key, namespace)`` pairs (delta files)."""
        if not removed:
            return _EMPTY_REMOVED
        if isinstance(removed, EntryColumns):
            return self._encode_columns(removed.keys, removed.namespaces, [], pause, b"\x92")
        keys = [e[0] for e in removed]
        namespaces = [e[1] for e in removed]
        return self._encode_columns(keys, namespaces, [], pause, b"\x92")

    def _encode_columns(
        self,
        keys: list[Any],
        namespaces: list[Any],
        rest: list[list[Any]],
        pause: Callable[[], None],
        header: bytes,
    ) -> bytes:
        if len(namespaces) > 1 and namespaces.count(namespaces[0]) == len(namespaces):
            namespaces = namespaces[:1]
        parts: list[bytes | memoryview] = [header]
        parts += self._keys.encode(keys, pause)
        try:
            parts += self._namespaces.encode(namespaces, pause)
            for column in rest:
                parts += self._states.encode(column, pause)
        except EntryEncodeError as exc:
            if len(namespaces) == 1 and exc.what == "namespace":
                raise
            raise exc.with_key(keys[exc.index]) from None
        return b"".join(parts)

    # ---- decode --------------------------------------------------------------------------------

    def decode(self, data: bytes | memoryview) -> tuple[list[Any], list[Any], list[Any]]:
        """``(keys, namespaces, states)`` of an entries section (``namespaces`` may have one
        element shared by all entries)."""
        keys, namespaces, states = self._section_decoder.decode(data)
        _check_columns(len(keys), len(namespaces), len(states))
        return (
            self._keys.from_wire(keys),
            self._namespaces.from_wire(namespaces),
            self._states.from_wire(states),
        )

    def decode_removed(self, data: bytes | memoryview) -> tuple[list[Any], list[Any]]:
        """``(keys, namespaces)`` of a removed section."""
        keys, namespaces = self._removed_decoder.decode(data)
        _check_columns(len(keys), len(namespaces), len(keys))
        return self._keys.from_wire(keys), self._namespaces.from_wire(namespaces)


def _check_columns(keys: int, namespaces: int, states: int) -> None:
    """A section's columns have one value per entry (the namespaces one for all of them):
    ``ValueError`` otherwise, which every reader reports as a corrupt or unreadable section."""
    if states != keys or not (namespaces == keys or (namespaces == 1 and keys)):
        raise ValueError(
            f"the section's columns do not match: {keys} keys, {namespaces} namespaces, "
            f"{states} values"
        )
