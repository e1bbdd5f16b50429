"""Key groups: the unit in which keyed state is distributed and rescaled (SPEC §3).

Every key maps to exactly one of ``max_parallelism`` key groups, and every subtask owns a
contiguous :class:`KeyGroupRange`. The arithmetic is Flink's, bit for bit, so that a key lands
in the same key group here as in a Flink job with the same max parallelism:

>>> assign_to_key_group(42, 128)
29
>>> assign_to_key_group("hello", 128)
35
>>> compute_key_group_range_for_operator_index(128, 3, 1)
KeyGroupRange(43, 85)

``java_hash`` never uses Python's ``hash()``: string hashing is randomized per process and would
send the same key to different key groups in different Spark workers.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from streamstate._compiled import compiled
from streamstate.errors import UnsupportedKeyTypeError

__all__ = [
    "DEFAULT_LOWER_BOUND_MAX_PARALLELISM",
    "PLACEMENT_PROPERTY",
    "PLACEMENT_VERSION",
    "UPPER_BOUND_MAX_PARALLELISM",
    "KeyGroupRange",
    "assign_key_groups",
    "assign_key_groups_for_columns",
    "assign_to_key_group",
    "bit_mix",
    "compute_default_max_parallelism",
    "compute_key_group_for_key_hash",
    "compute_key_group_range_for_operator_index",
    "compute_operator_index_for_key_group",
    "java_hash",
    "java_hash_column",
    "murmur_hash",
    "placement_version",
    "register_key_hash",
]

DEFAULT_LOWER_BOUND_MAX_PARALLELISM = 128
UPPER_BOUND_MAX_PARALLELISM = 32768

_M32 = 0xFFFFFFFF
_INT_MIN = -(1 << 31)
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


#: the checkpoint property (``CheckpointMetadata.properties``) that says how the key groups of
#: the checkpoint's keys were computed
PLACEMENT_PROPERTY = "key_group_placement"
#: 2: as :func:`assign_to_key_group` computes them, on every path. 1 (checkpoints without the
#: property): a Spark job's placement hashed a key column of Spark type INT, SMALLINT or TINYINT
#: to 0, so every such key is in one key group (``assign_to_key_group(0, max_parallelism)``);
#: every other key (and every key of a job that did not run on Spark) is where version 2 puts it
PLACEMENT_VERSION = 2


def placement_version(properties: dict[str, Any]) -> int:
    """The key-group placement a checkpoint's ``properties`` record (1 if none: older files).

    >>> placement_version({})
    1
    >>> placement_version({PLACEMENT_PROPERTY: PLACEMENT_VERSION})
    2
    """
    value = properties.get(PLACEMENT_PROPERTY, 1)
    return value if isinstance(value, int) and not isinstance(value, bool) else 1


def _to_int32(u: int) -> int:
    u &= _M32
    return u - (1 << 32) if u & 0x80000000 else u


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def bit_mix(h: int) -> int:
    """Flink's ``MathUtils.bitMix`` (MurmurHash3's finalizer) on a Java ``int``.

    >>> bit_mix(1)
    1364076727
    """
    h &= _M32
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M32
    h ^= h >> 16
    return _to_int32(h)


def murmur_hash(code: int) -> int:
    """Flink's ``MathUtils.murmurHash``: a non-negative Java ``int`` derived from ``code``.

    >>> murmur_hash(0)
    593689054
    """
    code &= _M32
    code = (code * 0xCC9E2D51) & _M32
    code = _rotl32(code, 15)
    code = (code * 0x1B873593) & _M32
    code = _rotl32(code, 13)
    code = (code * 5 + 0xE6546B64) & _M32
    code ^= 4
    mixed = bit_mix(code)
    if mixed >= 0:
        return mixed
    return -mixed if mixed != _INT_MIN else 0


# --------------------------------------------------------------------------------------------
# java_hash: Java's hashCode for the Python types that can be keys.

_custom_hashes: dict[type, Callable[[Any], int]] = {}


def register_key_hash(key_type: type, fn: Callable[[Any], int]) -> None:
    """Make ``key_type`` usable as a key by giving it a stable hash.

    ``fn`` must return the same int for equal keys in every process (never Python's ``hash()``
    of a ``str``); its result is truncated to a Java ``int``.
    """
    _custom_hashes[key_type] = fn


def _hash_long(v: int) -> int:
    u = v & 0xFFFFFFFFFFFFFFFF
    return _to_int32(u ^ (u >> 32))


def _hash_str(s: str) -> int:
    h = 0
    if s.isascii():
        for b in s.encode("ascii"):
            h = (31 * h + b) & _M32
    else:
        data = s.encode("utf-16-be", "surrogatepass")
        for i in range(0, len(data), 2):
            h = (31 * h + ((data[i] << 8) | data[i + 1])) & _M32
    return _to_int32(h)


def _hash_bytes(b: bytes) -> int:
    h = 1
    for x in b:
        h = (31 * h + (x - 256 if x > 127 else x)) & _M32
    return _to_int32(h)


def _hash_float(f: float) -> int:
    # Java canonicalizes every NaN to one bit pattern in Double.hashCode
    bits = 0x7FF8000000000000 if f != f else struct.unpack(">Q", struct.pack(">d", f))[0]
    return _to_int32(bits ^ (bits >> 32))


def java_hash(key: Any) -> int:
    """Java's ``hashCode`` of ``key``, stable across processes.

    ``int`` hashes as ``Long``, ``str`` as ``String`` (UTF-16 code units), ``bytes`` as
    ``Arrays.hashCode(byte[])``, ``bool`` as ``Boolean``, ``float`` as ``Double``, ``tuple`` as
    ``Arrays.hashCode(Object[])`` of its elements (``None`` elements hash to 0).

    >>> java_hash("hello")
    99162322
    >>> java_hash(-1)
    0
    """
    t = type(key)
    if t is int:
        if not _INT64_MIN <= key <= _INT64_MAX:
            raise UnsupportedKeyTypeError(
                f"int key {key} does not fit in a signed 64-bit integer; use a str or bytes key "
                "(or register_key_hash for a custom type)"
            )
        return _hash_long(key)
    if t is str:
        return _hash_str(key)
    if t is bool:
        return 1231 if key else 1237
    if t is bytes:
        return _hash_bytes(key)
    if t is float:
        return _hash_float(key)
    if t is tuple:
        h = 1
        for e in key:
            h = (31 * h + (0 if e is None else java_hash(e))) & _M32
        return _to_int32(h)
    fn = _custom_hashes.get(t)
    if fn is not None:
        return _to_int32(int(fn(key)))
    if isinstance(key, int) and not isinstance(key, bool):
        return java_hash(int(key))  # int subclasses (IntEnum, numpy scalars via int()) hash as ints
    if isinstance(key, np.integer):
        return java_hash(int(key))
    if isinstance(key, str):
        return _hash_str(str(key))
    if key is None:
        raise UnsupportedKeyTypeError("a key must not be None")
    raise UnsupportedKeyTypeError(
        f"key {key!r} of type {t.__qualname__} has no stable hash; keys must be int, str, bytes, "
        "bool, float or tuples of them, or a type registered with "
        "streamstate.keygroups.register_key_hash"
    )


# --------------------------------------------------------------------------------------------
# Assignment


def _check_max_parallelism(max_parallelism: int) -> None:
    if not 1 <= max_parallelism <= UPPER_BOUND_MAX_PARALLELISM:
        raise ValueError(
            f"max_parallelism must be in [1, {UPPER_BOUND_MAX_PARALLELISM}], got {max_parallelism}"
        )


def compute_key_group_for_key_hash(key_hash: int, max_parallelism: int) -> int:
    """The key group of a key whose Java hash is ``key_hash``."""
    return murmur_hash(key_hash) % max_parallelism


def _assign_to_key_group(key: Any, max_parallelism: int) -> int:
    """The key group (``0 <= kg < max_parallelism``) that ``key`` belongs to.

    >>> _assign_to_key_group(0, 128), _assign_to_key_group(0, 32768)
    (94, 31198)
    """
    return murmur_hash(java_hash(key)) % max_parallelism


#: the reference above, or the same computed in C (``_key_groups.c``: about 20 times cheaper on
#: a string key) for the key types nearly every job has; the C code hands every other key to
#: the reference
assign_to_key_group: Callable[[Any, int], int] = _assign_to_key_group
_native = compiled("streamstate._key_groups")
if _native is not None:
    _native.configure(_assign_to_key_group)
    assign_to_key_group = _native.assign_to_key_group


def compute_operator_index_for_key_group(
    max_parallelism: int, parallelism: int, key_group: int
) -> int:
    """The subtask index that owns ``key_group`` when running with ``parallelism`` subtasks."""
    return key_group * parallelism // max_parallelism


def compute_key_group_range_for_operator_index(
    max_parallelism: int, parallelism: int, index: int
) -> KeyGroupRange:
    """The contiguous range of key groups owned by subtask ``index`` of ``parallelism``.

    >>> [compute_key_group_range_for_operator_index(10, 3, i) for i in range(3)]
    [KeyGroupRange(0, 3), KeyGroupRange(4, 6), KeyGroupRange(7, 9)]
    """
    _check_max_parallelism(max_parallelism)
    if not 1 <= parallelism <= max_parallelism:
        raise ValueError(
            f"parallelism must be in [1, max_parallelism={max_parallelism}], got {parallelism}"
        )
    if not 0 <= index < parallelism:
        raise ValueError(f"subtask index must be in [0, {parallelism}), got {index}")
    start = (index * max_parallelism + parallelism - 1) // parallelism
    end = ((index + 1) * max_parallelism - 1) // parallelism
    return KeyGroupRange(start, end)


def _round_up_pow2(x: int) -> int:
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


def compute_default_max_parallelism(parallelism: int) -> int:
    """Flink's default number of key groups for a job of ``parallelism`` subtasks.

    >>> [compute_default_max_parallelism(p) for p in (1, 85, 86, 1000, 30000)]
    [128, 128, 256, 2048, 32768]
    """
    if parallelism < 1:
        raise ValueError(f"parallelism must be >= 1, got {parallelism}")
    return min(
        max(_round_up_pow2(parallelism + parallelism // 2), DEFAULT_LOWER_BOUND_MAX_PARALLELISM),
        UPPER_BOUND_MAX_PARALLELISM,
    )


class KeyGroupRange:
    """An inclusive range ``[start, end]`` of key groups; ``KeyGroupRange(0, -1)`` is empty.

    >>> r = KeyGroupRange(0, 63)
    >>> len(r), r.contains(63), r.intersection(KeyGroupRange(60, 100))
    (64, True, KeyGroupRange(60, 63))
    """

    __slots__ = ("end", "start")

    start: int
    end: int

    def __init__(self, start: int, end: int) -> None:
        if end < start:
            start, end = 0, -1
        elif start < 0:
            raise ValueError(f"a key group range cannot start below 0, got {start}")
        object.__setattr__(self, "start", start)
        object.__setattr__(self, "end", end)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("KeyGroupRange is immutable")

    @classmethod
    def empty(cls) -> KeyGroupRange:
        return cls(0, -1)

    @classmethod
    def of(cls, start: int, end: int) -> KeyGroupRange:
        return cls(start, end)

    def contains(self, key_group: int) -> bool:
        return self.start <= key_group <= self.end

    __contains__ = contains

    def intersection(self, other: KeyGroupRange) -> KeyGroupRange:
        start = max(self.start, other.start)
        end = min(self.end, other.end)
        return KeyGroupRange(start, end) if start <= end else KeyGroupRange(0, -1)

    @property
    def number_of_key_groups(self) -> int:
        return self.end - self.start + 1 if self.end >= self.start else 0

    def __len__(self) -> int:
        return self.number_of_key_groups

    def __bool__(self) -> bool:
        return self.end >= self.start

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end + 1))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, KeyGroupRange) and self.start == other.start and self.end == other.end
        )

    def __hash__(self) -> int:
        return hash((self.start, self.end))

    def __repr__(self) -> str:
        return f"KeyGroupRange({self.start}, {self.end})"

    def to_tuple(self) -> tuple[int, int]:
        return (self.start, self.end)


# --------------------------------------------------------------------------------------------
# Vectorized assignment (whole Arrow / NumPy columns; used by the Spark runtime)


def _murmur_np(code: np.ndarray) -> np.ndarray:
    """murmur_hash over a uint32 array, returning the non-negative int32 results as int64."""
    c = code.astype(np.uint32, copy=True)
    with np.errstate(over="ignore"):
        c *= np.uint32(0xCC9E2D51)
        c = (c << np.uint32(15)) | (c >> np.uint32(17))
        c *= np.uint32(0x1B873593)
        c = (c << np.uint32(13)) | (c >> np.uint32(19))
        c = c * np.uint32(5) + np.uint32(0xE6546B64)
        c ^= np.uint32(4)
        c ^= c >> np.uint32(16)
        c *= np.uint32(0x85EBCA6B)
        c ^= c >> np.uint32(13)
        c *= np.uint32(0xC2B2AE35)
        c ^= c >> np.uint32(16)
    signed = c.view(np.int32).astype(np.int64)
    # abs, with Integer.MIN_VALUE mapped to 0 as Flink does
    out = np.abs(signed)
    out[signed == _INT_MIN] = 0
    return out


def _hash_int64_np(values: np.ndarray) -> np.ndarray:
    u = values.astype(np.int64, copy=False).view(np.uint64)
    return (u ^ (u >> np.uint64(32))).astype(np.uint32)


def _pow31_table(n: int) -> np.ndarray:
    table = np.empty(max(n, 1), dtype=np.uint32)
    table[0] = 1
    with np.errstate(over="ignore"):
        for i in range(1, n):
            table[i] = table[i - 1] * np.uint32(31)
    return table


def _hash_ascii_strings_np(offsets: np.ndarray, data: np.ndarray) -> np.ndarray:
    """String.hashCode for ASCII strings given Arrow offsets (len n+1) and their bytes."""
    n = len(offsets) - 1
    starts = offsets[:-1]
    ends = offsets[1:]
    lengths = ends - starts
    out = np.zeros(n, dtype=np.uint32)
    total = int(ends[-1] - starts[0]) if n else 0
    if total == 0:
        return out
    base = int(starts[0])
    chunk = data[base : base + total].astype(np.uint32)
    owner = np.repeat(np.arange(n), lengths)
    pos = np.arange(base, base + total)
    exponent = ends[owner] - 1 - pos
    pow31 = _pow31_table(int(lengths.max()))
    with np.errstate(over="ignore"):
        weighted = chunk * pow31[exponent]
    nonempty = lengths > 0
    sums = np.add.reduceat(weighted, (starts[nonempty] - base).astype(np.int64), dtype=np.uint32)
    out[nonempty] = sums
    return out


def java_hash_column(column: Any) -> np.ndarray:
    """Java hash codes (as uint32) of every value of one Arrow column, vectorized.

    Integers hash as ``Long``, strings as ``String``, booleans as ``Boolean``; other types (bytes,
    floats, ...) fall back to :func:`java_hash` value by value. Nulls are rejected.

    >>> import pyarrow as pa
    >>> java_hash_column(pa.array(["hello", "a"])).tolist()
    [99162322, 97]
    """
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        parts = [java_hash_column(c) for c in column.chunks]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint32)
    if not isinstance(column, pa.Array):
        column = pa.array(column)
    if column.null_count:
        raise UnsupportedKeyTypeError("a key column must not contain nulls")
    t = column.type
    if pa.types.is_integer(t):
        return _hash_int64_np(column.to_numpy(zero_copy_only=False).astype(np.int64))
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return _hash_string_array(column)
    if pa.types.is_boolean(t):
        return np.where(column.to_numpy(zero_copy_only=False), 1231, 1237).astype(np.uint32)
    return np.fromiter(
        (java_hash(k) & _M32 for k in column.to_pylist()), dtype=np.uint32, count=len(column)
    )


def assign_key_groups(keys: Any, max_parallelism: int) -> np.ndarray:
    """Key groups (int32 NumPy array) for a whole column of keys, vectorized.

    ``keys`` may be a ``pyarrow`` Array/ChunkedArray of integers or strings, a NumPy integer
    array, or any sequence (hashed one by one). Results equal :func:`assign_to_key_group`.

    >>> assign_key_groups(np.array([0, 1, 2, 42], dtype=np.int64), 128).tolist()
    [94, 86, 127, 29]
    """
    import pyarrow as pa

    _check_max_parallelism(max_parallelism)
    if isinstance(keys, pa.Array | pa.ChunkedArray):
        return (_murmur_np(java_hash_column(keys)) % max_parallelism).astype(np.int32)
    if isinstance(keys, np.ndarray) and np.issubdtype(keys.dtype, np.integer):
        hashes = _hash_int64_np(keys.astype(np.int64, copy=False))
        return (_murmur_np(hashes) % max_parallelism).astype(np.int32)
    if isinstance(keys, np.ndarray) and keys.dtype.kind in "US":
        return assign_key_groups(pa.array(keys.tolist()), max_parallelism)
    seq = list(keys)
    return np.fromiter(
        (assign_to_key_group(k, max_parallelism) for k in seq), dtype=np.int32, count=len(seq)
    )


def assign_key_groups_for_columns(columns: list[Any], max_parallelism: int) -> np.ndarray:
    """Key groups of composite keys: row ``i`` is the tuple of the ``i``-th values of
    ``columns`` (hashed like :func:`java_hash` of a tuple, ``Arrays.hashCode(Object[])``).

    >>> import pyarrow as pa
    >>> cols = [pa.array(["a", "b"]), pa.array([1, 2])]
    >>> assign_key_groups_for_columns(cols, 128).tolist() == [
    ...     assign_to_key_group(("a", 1), 128), assign_to_key_group(("b", 2), 128)]
    True
    """
    _check_max_parallelism(max_parallelism)
    if len(columns) == 1:
        return assign_key_groups(columns[0], max_parallelism)
    h = np.ones(len(columns[0]), dtype=np.uint32)
    with np.errstate(over="ignore"):
        for column in columns:
            h = h * np.uint32(31) + java_hash_column(column)
    return (_murmur_np(h) % max_parallelism).astype(np.int32)


def _hash_string_array(keys: Any) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    offsets_type = np.int64 if pa.types.is_large_string(keys.type) else np.int32
    buffers = keys.buffers()
    n = len(keys)
    offsets = np.frombuffer(buffers[1], dtype=offsets_type)[keys.offset : keys.offset + n + 1]
    offsets = offsets.astype(np.int64)
    data = (
        np.frombuffer(buffers[2], dtype=np.uint8)
        if buffers[2] is not None
        else np.zeros(0, dtype=np.uint8)
    )
    hashes = _hash_ascii_strings_np(offsets, data)
    ascii_mask = pc.string_is_ascii(keys).to_numpy(zero_copy_only=False)
    if not ascii_mask.all():
        # Non-ASCII strings need UTF-16 code units; there are few of them in practice.
        for i in np.nonzero(~ascii_mask)[0]:
            hashes[i] = np.uint32(_hash_str(keys[int(i)].as_py()) & _M32)
    return hashes
