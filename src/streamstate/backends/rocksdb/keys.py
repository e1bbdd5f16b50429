"""Composite RocksDB keys of keyed state (SPEC §10): ``[key group][key][namespace][user key]``.

Every entry of a keyed state is one RocksDB key in the state's column family::

    [key group: 1 byte if max_parallelism <= 128 else 2, big-endian]
    [varint length of the key, only if the key serializer is variable-length][key bytes]
    [varint length of the namespace, only if variable-length AND a user key follows][namespace]
    [user key bytes: MapState only]

The key-group prefix keeps each key group contiguous and ordered, so a key-group range is one
RocksDB key range (rescaling = ``delete_range`` + range copy). The void namespace is encoded as
zero bytes.

Why lengths go *before* the variable-length parts (Flink appends them after): Flink's
serializers delimit themselves, ours do not (a ``str`` is its raw UTF-8 bytes), and MapState
appends a user key. A length written before a part lets a reader split a composite key from left
to right and makes the ``(key group, key, namespace)`` prefix of a map entry *prefix-free*: no
other ``(key, namespace)`` prefix can start with it, so a ``seek`` to the prefix followed by a
``startswith`` test yields exactly that map. The key's length depends on the key serializer only,
so the ``[key group][key]`` part is computed once per record and shared by every state. Fixed-length
parts carry no length.

>>> from streamstate.serializers import Int64Serializer, StrSerializer
>>> layout = KeyLayout(128, StrSerializer(), StrSerializer(), has_user_key=False)
>>> ck = layout.key_prefix(5, "ab") + layout.namespace_bytes("c")
>>> ck
b'\\x05\\x02abc'
>>> layout.decode(ck)
(5, 'ab', 'c', b'')
>>> layout.key_prefix(5, "a") + layout.namespace_bytes("bc") != ck
True
>>> KeyLayout(1024, Int64Serializer(), StrSerializer(), has_user_key=True).key_prefix(300, 7)
b'\\x01,\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x07'
"""

from __future__ import annotations

import struct
from typing import Any

from streamstate.namespace import VOID_NAMESPACE
from streamstate.serializers import Int64Serializer, TypeSerializer, VoidNamespaceSerializer

__all__ = [
    "KeyLayout",
    "decode_varint",
    "encode_varint",
    "key_group_bound",
    "key_group_prefix_bytes",
    "prefix_successor",
]


_INT64 = struct.Struct(">q")


def key_group_prefix_bytes(max_parallelism: int) -> int:
    """Bytes of the key-group prefix: 1 if ``max_parallelism <= 128``, else 2 (as Flink).

    >>> key_group_prefix_bytes(128), key_group_prefix_bytes(129)
    (1, 2)
    """
    return 1 if max_parallelism <= 128 else 2


def key_group_bound(key_group: int, prefix_bytes: int) -> bytes:
    """The smallest composite key of ``key_group`` (and the exclusive end of ``key_group - 1``).

    ``key_group`` may equal ``max_parallelism``, which is the exclusive end of the last group.

    >>> key_group_bound(3, 1), key_group_bound(3, 2), key_group_bound(128, 1)
    (b'\\x03', b'\\x00\\x03', b'\\x80')
    """
    return key_group.to_bytes(prefix_bytes, "big")


def encode_varint(n: int) -> bytes:
    """Unsigned LEB128: 7 bits per byte, high bit set on every byte but the last.

    >>> encode_varint(5), encode_varint(300)
    (b'\\x05', b'\\xac\\x02')
    """
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def decode_varint(data: bytes, pos: int) -> tuple[int, int]:
    """``(value, position after it)`` of the varint at ``data[pos]``.

    >>> decode_varint(b'x\\xac\\x02', 1)
    (300, 3)
    """
    b = data[pos]
    if b < 0x80:
        return b, pos + 1
    result = 0
    shift = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def prefix_successor(prefix: bytes) -> bytes | None:
    """The smallest byte string greater than every string that starts with ``prefix``.

    None when there is none (``prefix`` is all ``0xff``).

    >>> prefix_successor(b'a\\xff'), prefix_successor(b'\\xff')
    (b'b', None)
    """
    p = bytearray(prefix)
    while p:
        if p[-1] != 0xFF:
            p[-1] += 1
            return bytes(p)
        p.pop()
    return None


class KeyLayout:
    """Encoding and decoding of one state's composite keys (see the module docstring).

    ``has_user_key`` is true for states that append a user key after the namespace (MapState).
    """

    __slots__ = (
        "_key_bytes",
        "has_user_key",
        "key_fixed",
        "key_serializer",
        "kg_bytes",
        "kg_prefixes",
        "max_parallelism",
        "namespace_serializer",
        "ns_fixed",
        "ns_len_prefixed",
        "ns_void",
    )

    def __init__(
        self,
        max_parallelism: int,
        key_serializer: TypeSerializer[Any],
        namespace_serializer: TypeSerializer[Any],
        *,
        has_user_key: bool,
    ) -> None:
        self.max_parallelism = max_parallelism
        self.kg_bytes = key_group_prefix_bytes(max_parallelism)
        #: the prefix of every key group, indexed by key group (one allocation per backend)
        self.kg_prefixes = [key_group_bound(kg, self.kg_bytes) for kg in range(max_parallelism)]
        self.key_serializer = key_serializer
        # the hot path of misses and flushes: skip the serializer's method layers for int keys
        self._key_bytes = (
            _INT64.pack if type(key_serializer) is Int64Serializer else key_serializer.serialize
        )
        self.namespace_serializer = namespace_serializer
        self.has_user_key = has_user_key
        self.key_fixed = key_serializer.fixed_length
        self.ns_void = isinstance(namespace_serializer, VoidNamespaceSerializer)
        self.ns_fixed = 0 if self.ns_void else namespace_serializer.fixed_length
        self.ns_len_prefixed = has_user_key and self.ns_fixed < 0

    # ---- encoding ------------------------------------------------------------------------------

    def key_prefix(self, key_group: int, key: Any) -> bytes:
        """``[key group][key]``: shared by every state of a backend for the current key."""
        try:
            kb = self._key_bytes(key)
        except (struct.error, TypeError) as exc:
            raise TypeError(
                f"key {key!r} cannot be written by the key serializer {self.key_serializer!r}: "
                f"{exc}"
            ) from None
        if self.key_fixed < 0:
            return self.kg_prefixes[key_group] + encode_varint(len(kb)) + kb
        return self.kg_prefixes[key_group] + kb

    def namespace_bytes(self, namespace: Any) -> bytes:
        """The namespace part (with its length when one is needed)."""
        if self.ns_void:
            return b""
        nb = self.namespace_serializer.serialize(namespace)
        if self.ns_len_prefixed:
            return encode_varint(len(nb)) + nb
        return nb

    def composite(self, key_group: int, key: Any, namespace: Any, user_key: bytes = b"") -> bytes:
        """The whole composite key (``user_key`` already serialized)."""
        return self.key_prefix(key_group, key) + self.namespace_bytes(namespace) + user_key

    # ---- decoding ------------------------------------------------------------------------------

    def key_end(self, raw: bytes) -> int:
        """Offset just after the key part of ``raw``."""
        pos = self.kg_bytes
        if self.key_fixed < 0:
            n, pos = decode_varint(raw, pos)
            return pos + n
        return pos + self.key_fixed

    def entry_end(self, raw: bytes) -> int:
        """Offset just after the namespace part, i.e. the length of the entry prefix.

        For states without user key this is ``len(raw)``.
        """
        if not self.has_user_key:
            return len(raw)
        pos = self.key_end(raw)
        if self.ns_void:
            return pos
        if self.ns_len_prefixed:
            n, pos = decode_varint(raw, pos)
            return pos + n
        return pos + self.ns_fixed

    def key_group_of(self, raw: bytes) -> int:
        return int.from_bytes(raw[: self.kg_bytes], "big")

    def decode_key(self, raw: bytes) -> Any:
        """The key of a composite key."""
        pos = self.kg_bytes
        if self.key_fixed < 0:
            n, pos = decode_varint(raw, pos)
            return self.key_serializer.deserialize(raw[pos : pos + n])
        return self.key_serializer.deserialize(raw[pos : pos + self.key_fixed])

    def decode_keys(self, raw_keys: list[bytes]) -> list[Any]:
        """The keys of composite keys that end with their key (no namespace, no user key), in
        one call of the key serializer where their bytes allow it (``deserialize_many``)."""
        start = self.kg_bytes
        if self.key_fixed >= 0:
            end = start + self.key_fixed
            return self.key_serializer.deserialize_many([k[start:end] for k in raw_keys])
        parts = [k[start + 1 :] for k in raw_keys]
        # every length in the varint's one byte (below 0x80) and the key up to the end
        if [k[start] for k in raw_keys] == list(map(len, parts)):
            return self.key_serializer.deserialize_many(parts)
        return [self.decode_key(k) for k in raw_keys]

    def decode_namespace(self, raw: bytes, start: int, end: int) -> Any:
        """The namespace encoded in ``raw[start:end]`` (the namespace part, with its length)."""
        if self.ns_void:
            return VOID_NAMESPACE
        if self.ns_len_prefixed:
            _, start = decode_varint(raw, start)
        return self.namespace_serializer.deserialize(raw[start:end])

    def decode(self, raw: bytes) -> tuple[int, Any, Any, bytes]:
        """``(key group, key, namespace, serialized user key)`` of a composite key."""
        key_end = self.key_end(raw)
        entry_end = self.entry_end(raw)
        return (
            self.key_group_of(raw),
            self.decode_key(raw),
            self.decode_namespace(raw, key_end, entry_end),
            raw[entry_end:],
        )

    def __repr__(self) -> str:
        return (
            f"KeyLayout(kg_bytes={self.kg_bytes}, key_length_prefixed={self.key_fixed < 0}, "
            f"namespace_length_prefixed={self.ns_len_prefixed}, user_key={self.has_user_key})"
        )
