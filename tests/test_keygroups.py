"""Key groups: Flink's vectors, range properties, cross-process stability, vectorized agreement."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamstate import keygroups
from streamstate._compiled import compiled, pure_python
from streamstate.errors import UnsupportedKeyTypeError
from streamstate.keygroups import (
    KeyGroupRange,
    assign_key_groups,
    assign_to_key_group,
    bit_mix,
    compute_default_max_parallelism,
    compute_key_group_range_for_operator_index,
    compute_operator_index_for_key_group,
    java_hash,
    murmur_hash,
)

# (key, java hash, murmur hash, kg @128, kg @32768) from SPEC §3 (checked against Java 17)
VECTORS = [
    (0, 0, 593689054, 94, 31198),
    (1, 1, 68075478, 86, 16342),
    (2, 2, 1085422463, 127, 15231),
    (42, 42, 1134849565, 29, 28189),
]


@pytest.mark.parametrize(("key", "h", "m", "kg128", "kg32768"), VECTORS)
def test_integer_vectors(key: int, h: int, m: int, kg128: int, kg32768: int) -> None:
    assert java_hash(key) == h
    assert murmur_hash(h) == m
    assert assign_to_key_group(key, 128) == kg128
    assert assign_to_key_group(key, 32768) == kg32768


def test_java_integer_minus_one_vector() -> None:
    # Java Integer(-1) hashes to -1; Python's -1 is an int64 and hashes as Long(-1), i.e. 0.
    assert murmur_hash(-1) == 1982413648
    assert murmur_hash(-1) % 128 == 80
    assert murmur_hash(-1) % 32768 == 15184
    assert java_hash(-1) == 0
    assert assign_to_key_group(-1, 128) == 94


def test_string_and_long_vectors() -> None:
    assert java_hash("hello") == 99162322
    assert assign_to_key_group("hello", 128) == 35
    assert assign_to_key_group(500000, 128) == 98
    assert bit_mix(1) == 1364076727


def test_java_hash_of_other_types() -> None:
    assert java_hash(True) == 1231
    assert java_hash(False) == 1237
    assert java_hash(b"") == 1
    assert java_hash(bytes([1, 255])) == 31 * (31 * 1 + 1) + (-1)
    assert java_hash(1.0) == 1072693248  # Double.hashCode(1.0)
    assert java_hash(float("nan")) == java_hash(float("-nan"))
    assert java_hash((1, "a")) == ((31 * 1 + 1) * 31 + 97)
    assert java_hash((None,)) == 31
    # Long.hashCode of a large value: (v ^ (v >>> 32)) truncated
    assert java_hash(2**32) == 1
    assert java_hash(-(2**63)) == -(2**31)
    # UTF-16 code units: U+1F600 is the surrogate pair D83D DE00
    assert java_hash("\U0001f600") == ((31 * 0xD83D + 0xDE00) & 0xFFFFFFFF) - (1 << 32) * (
        ((31 * 0xD83D + 0xDE00) & 0xFFFFFFFF) >= 1 << 31
    )


def test_unsupported_keys_are_rejected_clearly() -> None:
    with pytest.raises(UnsupportedKeyTypeError, match="64-bit"):
        java_hash(2**70)
    with pytest.raises(UnsupportedKeyTypeError, match="no stable hash"):
        java_hash(object())
    with pytest.raises(UnsupportedKeyTypeError, match="None"):
        java_hash(None)
    with pytest.raises(UnsupportedKeyTypeError, match="frozenset"):
        java_hash(frozenset({1}))


def test_ranges_from_spec() -> None:
    r = compute_key_group_range_for_operator_index
    assert [r(128, 3, i) for i in range(3)] == [
        KeyGroupRange(0, 42),
        KeyGroupRange(43, 85),
        KeyGroupRange(86, 127),
    ]
    assert [r(128, 2, i) for i in range(2)] == [KeyGroupRange(0, 63), KeyGroupRange(64, 127)]
    assert [r(10, 3, i) for i in range(3)] == [
        KeyGroupRange(0, 3),
        KeyGroupRange(4, 6),
        KeyGroupRange(7, 9),
    ]


@pytest.mark.parametrize(
    ("p", "expected"),
    [(1, 128), (2, 128), (85, 128), (86, 256), (100, 256), (1000, 2048), (30000, 32768)],
)
def test_default_max_parallelism(p: int, expected: int) -> None:
    assert compute_default_max_parallelism(p) == expected


def _check_partition(max_p: int, p: int) -> None:
    ranges = [compute_key_group_range_for_operator_index(max_p, p, i) for i in range(p)]
    assert ranges[0].start == 0
    assert ranges[-1].end == max_p - 1
    for a, b in itertools.pairwise(ranges):
        assert b.start == a.end + 1  # contiguous and ascending
    for i, rng in enumerate(ranges):
        assert len(rng) >= 1
        for kg in (rng.start, rng.end, (rng.start + rng.end) // 2):
            assert compute_operator_index_for_key_group(max_p, p, kg) == i


def test_ranges_partition_exhaustively_up_to_128() -> None:
    for max_p in range(1, 129):
        for p in range(1, max_p + 1):
            ranges = [compute_key_group_range_for_operator_index(max_p, p, i) for i in range(p)]
            owner = [compute_operator_index_for_key_group(max_p, p, kg) for kg in range(max_p)]
            expected = [i for i, rng in enumerate(ranges) for _ in rng]
            assert owner == expected, (max_p, p)


# exhaustive (about half a million pairs): make test runs it; make check samples the pairs below
@pytest.mark.slow
def test_ranges_partition_vectorized_for_every_pair_up_to_1024() -> None:
    """All 1 <= p <= max_p <= 1024: the range formula partitions [0, max_p) and agrees with
    compute_operator_index_for_key_group; the vectorized formula is checked against the
    functions on a sample of pairs in the hypothesis test below."""
    # int32 throughout (every product stays below 2**21): half the memory traffic of int64,
    # and no Python loop over p
    for max_p in range(1, 1025):
        p = np.arange(1, max_p + 1, dtype=np.int32)
        # ranges of subtask i for every (p, i): flatten i < p; offsets[p - 1] is where p's
        # subtask 0 sits in the flattened arrays
        pp = np.repeat(p, p)
        offsets = np.cumsum(p, dtype=np.int32) - p
        ii = np.arange(len(pp), dtype=np.int32) - np.repeat(offsets, p)
        starts = (ii * max_p + pp - 1) // pp
        ends = ((ii + 1) * max_p - 1) // pp
        assert (starts <= ends).all()
        first = ii == 0
        last = ii == pp - 1
        assert (starts[first] == 0).all() and (ends[last] == max_p - 1).all()
        inner = ~last
        assert (starts[np.nonzero(inner)[0] + 1] == ends[inner] + 1).all()
        # every key group, for every p: its owner's range holds it
        kg = np.arange(max_p, dtype=np.int32)
        owner = (kg[None, :] * p[:, None]) // max_p
        owner += offsets[:, None]  # its index in the flattened arrays
        assert ((starts.take(owner) <= kg) & (kg <= ends.take(owner))).all(), max_p


@settings(max_examples=400, deadline=None)
@given(st.integers(1, 1024).flatmap(lambda m: st.tuples(st.just(m), st.integers(1, m))))
def test_ranges_partition_property(pair: tuple[int, int]) -> None:
    _check_partition(*pair)


def test_range_validation() -> None:
    with pytest.raises(ValueError, match="parallelism"):
        compute_key_group_range_for_operator_index(128, 129, 0)
    with pytest.raises(ValueError, match="subtask index"):
        compute_key_group_range_for_operator_index(128, 2, 2)
    with pytest.raises(ValueError, match="max_parallelism"):
        compute_key_group_range_for_operator_index(40000, 2, 0)


def test_key_group_range_api() -> None:
    r = KeyGroupRange(10, 20)
    assert len(r) == 11 and list(r)[:2] == [10, 11] and 20 in r and 21 not in r
    assert r.intersection(KeyGroupRange(15, 30)) == KeyGroupRange(15, 20)
    assert len(r.intersection(KeyGroupRange(30, 40))) == 0
    empty = KeyGroupRange(0, -1)
    assert not empty and len(empty) == 0 and list(empty) == []
    assert KeyGroupRange.empty() == empty
    with pytest.raises(AttributeError):
        r.start = 3  # type: ignore[misc]
    assert hash(KeyGroupRange(1, 2)) == hash(KeyGroupRange(1, 2))


_PROBE = (
    "from streamstate.keygroups import assign_to_key_group as a;"
    "print([a(k, 1000) for k in ['hello', 'wörld', 'x' * 40, '\\U0001f600', 'a', '']])"
)


@pytest.mark.subprocess
def test_assignment_is_identical_across_processes() -> None:
    outputs = set()
    for seed in ("1", "2", "random"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": os.path.abspath("src")}
        out = subprocess.run(
            [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True
        ).stdout
        outputs.add(out)
    assert len(outputs) == 1
    expected = [
        assign_to_key_group(k, 1000) for k in ["hello", "wörld", "x" * 40, "\U0001f600", "a", ""]
    ]
    assert outputs.pop().strip() == str(expected)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=50), st.integers(1, 32768))
def test_vectorized_int64_equals_scalar(keys: list[int], max_p: int) -> None:
    expected = [assign_to_key_group(k, max_p) for k in keys]
    assert assign_key_groups(np.array(keys, dtype=np.int64), max_p).tolist() == expected
    assert assign_key_groups(pa.array(keys, type=pa.int64()), max_p).tolist() == expected
    assert (
        assign_key_groups(pa.array(keys, type=pa.int64()).cast(pa.int64()), max_p).tolist()
        == expected
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=30), max_size=40), st.integers(1, 32768), st.integers(0, 5))
def test_vectorized_strings_equal_scalar(keys: list[str], max_p: int, offset: int) -> None:
    arr = pa.array(["pad"] * offset + keys, type=pa.string()).slice(offset)
    expected = [assign_to_key_group(k, max_p) for k in keys]
    assert assign_key_groups(arr, max_p).tolist() == expected
    large = pa.array(keys, type=pa.large_string())
    assert assign_key_groups(large, max_p).tolist() == expected
    chunked = pa.chunked_array(
        [pa.array(keys[:3], type=pa.string()), pa.array(keys[3:], type=pa.string())]
    )
    assert assign_key_groups(chunked, max_p).tolist() == expected


def test_vectorized_rejects_null_keys() -> None:
    with pytest.raises(UnsupportedKeyTypeError, match="null"):
        assign_key_groups(pa.array([1, None]), 128)


def test_vectorized_other_types_fall_back_to_scalar() -> None:
    keys = [b"a", b"bc"]
    assert assign_key_groups(pa.array(keys), 128).tolist() == [
        assign_to_key_group(k, 128) for k in keys
    ]
    assert assign_key_groups(pa.array([True, False]), 128).tolist() == [
        assign_to_key_group(True, 128),
        assign_to_key_group(False, 128),
    ]
    assert assign_key_groups([(1, "a"), (2, "b")], 128).tolist() == [
        assign_to_key_group((1, "a"), 128),
        assign_to_key_group((2, "b"), 128),
    ]


# --------------------------------------------------------------------------------------------
# The compiled key group (_key_groups.c) against the pure-Python reference


def _reference_or_error(key: object, max_p: object) -> tuple[str, object]:
    try:
        return "ok", keygroups._assign_to_key_group(key, max_p)  # type: ignore[arg-type]
    except Exception as exc:  # the same error type and message from both paths
        return type(exc).__name__, str(exc)


def _compiled_or_error(key: object, max_p: object) -> tuple[str, object]:
    try:
        return "ok", _compiled_key_group(key, max_p)
    except Exception as exc:
        return type(exc).__name__, str(exc)


_compiled_key_group = getattr(compiled("streamstate._key_groups"), "assign_to_key_group", None)
needs_compiled = pytest.mark.skipif(
    _compiled_key_group is None, reason="the compiled key group is not built (or pure Python)"
)

_scalars = (
    st.integers(min_value=-(2**64), max_value=2**64)
    | st.text(alphabet=st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF))
    | st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), max_size=3)
    | st.binary()
    | st.booleans()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.none()
    | st.sampled_from([frozenset({1}), object, np.int64(7), 1.5j])
)
_keys = st.recursive(
    _scalars, lambda inner: st.tuples(inner, inner) | st.tuples(inner), max_leaves=6
)


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(_keys, st.sampled_from([1, 2, 3, 128, 129, 4096, 32768]))
def test_the_compiled_key_group_is_the_references(key: object, max_p: int) -> None:
    """Every key: the same key group, or the same error, from C and from Python."""
    assert _compiled_or_error(key, max_p) == _reference_or_error(key, max_p)


@needs_compiled
def test_the_compiled_key_group_on_edges() -> None:
    keys: list[object] = [
        0,
        -1,
        2**63 - 1,
        -(2**63),
        2**63,
        -(2**63) - 1,
        True,
        False,
        0.0,
        -0.0,
        float("nan"),
        float("inf"),
        "",
        "\x7f\x80\xff",
        "\u0100\uffff",
        "\ud800",
        "\U0001f600a",
        b"",
        bytes(range(256)),
        (),
        (None,),
        (1, ("a", (b"x", None)), 2.5),
        IntSubclass(3),
        StrSubclass("x"),
        None,
    ]
    for key in keys:
        for max_p in (1, 128, 32768, 0, -3, 2**70):
            assert _compiled_or_error(key, max_p) == _reference_or_error(key, max_p), (key, max_p)
    assert _compiled_or_error("x", 128.0) == _reference_or_error("x", 128.0)


@needs_compiled
def test_a_registered_key_hash_reaches_the_compiled_path() -> None:
    class Point:
        def __init__(self, x: int) -> None:
            self.x = x

    keygroups.register_key_hash(Point, lambda p: p.x * 7)
    try:
        for x in range(50):
            assert _compiled_key_group(Point(x), 128) == keygroups._assign_to_key_group(
                Point(x), 128
            )
            assert _compiled_key_group((Point(x), "a"), 128) == keygroups._assign_to_key_group(
                (Point(x), "a"), 128
            )
    finally:
        keygroups._custom_hashes.pop(Point)


def test_assign_to_key_group_is_the_compiled_one_unless_pure_python() -> None:
    # the README's setup compiles it (gcc is required): a silent fallback would go unnoticed
    if pure_python():
        assert assign_to_key_group is keygroups._assign_to_key_group
    else:
        assert _compiled_key_group is not None, "streamstate._key_groups is not built"
        assert assign_to_key_group is _compiled_key_group


class IntSubclass(int):
    pass


class StrSubclass(str):
    pass
