"""Composite key layout (SPEC §10): key-group prefix ordering, unambiguity, prefix-freeness."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamstate.backends.rocksdb.keys import (
    KeyLayout,
    decode_varint,
    encode_varint,
    key_group_bound,
    key_group_prefix_bytes,
    prefix_successor,
)
from streamstate.backends.rocksdb.snapshot import decode_entries
from streamstate.format.meta import StateMetaInfo
from streamstate.namespace import VOID_NAMESPACE
from streamstate.serializers import (
    BytesSerializer,
    Int64Serializer,
    ListSerializer,
    StrSerializer,
    StructSerializer,
    TupleSerializer,
    VoidNamespaceSerializer,
)

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
TEXT = st.text(max_size=12)
BYTES = st.binary(max_size=12)

#: (key serializer, key strategy), (namespace serializer, namespace strategy)
KEYS = [(Int64Serializer(), INT64), (StrSerializer(), TEXT), (BytesSerializer(), BYTES)]


class Visit(msgspec.Struct):
    page: str
    clicks: int


#: (value serializer, value strategy): fixed-width bytes, UTF-8, msgpack containers and records
VALUES = [
    (Int64Serializer(), INT64),
    (StrSerializer(), TEXT),
    (ListSerializer(Int64Serializer()), st.lists(INT64, max_size=3)),
    (StructSerializer(Visit), st.builds(Visit, TEXT, INT64)),
]
NAMESPACES = [
    (VoidNamespaceSerializer(), st.just(VOID_NAMESPACE)),
    (Int64Serializer(), INT64),
    (StrSerializer(), TEXT),
    (TupleSerializer(Int64Serializer(), Int64Serializer()), st.tuples(INT64, INT64)),
]


def test_key_group_prefix_is_one_byte_up_to_128_then_two() -> None:
    assert key_group_prefix_bytes(1) == key_group_prefix_bytes(128) == 1
    assert key_group_prefix_bytes(129) == key_group_prefix_bytes(32768) == 2
    layout = KeyLayout(128, Int64Serializer(), VoidNamespaceSerializer(), has_user_key=False)
    assert layout.key_prefix(127, 5)[:1] == b"\x7f"
    layout = KeyLayout(32768, Int64Serializer(), VoidNamespaceSerializer(), has_user_key=False)
    assert layout.key_prefix(32767, 5)[:2] == b"\x7f\xff"
    assert key_group_bound(32768, 2) == b"\x80\x00"


@pytest.mark.parametrize("max_parallelism", [128, 4096])
@given(data=st.data())
@settings(max_examples=60, deadline=None)
def test_key_groups_are_contiguous_and_ordered(max_parallelism: int, data: Any) -> None:
    layout = KeyLayout(max_parallelism, StrSerializer(), StrSerializer(), has_user_key=True)
    n = layout.kg_bytes
    kg_a = data.draw(st.integers(0, max_parallelism - 2))
    kg_b = data.draw(st.integers(kg_a + 1, max_parallelism - 1))
    a = layout.composite(kg_a, data.draw(TEXT), data.draw(TEXT), data.draw(BYTES))
    b = layout.composite(kg_b, data.draw(TEXT), data.draw(TEXT), data.draw(BYTES))
    assert a < b  # every key of a lower key group sorts first
    assert key_group_bound(kg_a, n) <= a < key_group_bound(kg_a + 1, n)
    assert key_group_bound(kg_b, n) <= b < key_group_bound(kg_b + 1, n)
    assert layout.key_group_of(a) == kg_a


@pytest.mark.parametrize("key_ser,key_st", KEYS, ids=lambda x: type(x).__name__)
@pytest.mark.parametrize("ns_ser,ns_st", NAMESPACES, ids=lambda x: type(x).__name__)
@pytest.mark.parametrize("user_key", [False, True], ids=["value", "map"])
@given(data=st.data())
@settings(max_examples=80, deadline=None)
def test_distinct_entries_never_collide(
    key_ser: Any, key_st: Any, ns_ser: Any, ns_st: Any, user_key: bool, data: Any
) -> None:
    layout = KeyLayout(128, key_ser, ns_ser, has_user_key=user_key)
    kg = data.draw(st.integers(0, 127))
    k1, k2 = data.draw(key_st), data.draw(key_st)
    n1, n2 = data.draw(ns_st), data.draw(ns_st)
    u1 = data.draw(BYTES) if user_key else b""
    u2 = data.draw(BYTES) if user_key else b""
    c1, c2 = layout.composite(kg, k1, n1, u1), layout.composite(kg, k2, n2, u2)
    if (k1, n1, u1) != (k2, n2, u2):
        assert c1 != c2
    # decoding gives back the parts
    assert layout.decode(c1) == (kg, k1, n1, u1)
    if user_key:
        # the map prefix (kg, key, ns) is prefix-free: a seek to it yields only its own mappings
        p1 = layout.composite(kg, k1, n1)
        assert c2.startswith(p1) == ((k1, n1) == (k2, n2))
        assert layout.entry_end(c1) == len(p1)


def test_lengths_only_where_needed() -> None:
    void = VoidNamespaceSerializer()
    # fixed-length key and void namespace: no length at all
    assert KeyLayout(128, Int64Serializer(), void, has_user_key=False).composite(1, 7, None) == (
        b"\x01" + Int64Serializer().serialize(7)
    )
    # variable-length key: its length comes first; the last part needs none
    layout = KeyLayout(128, StrSerializer(), StrSerializer(), has_user_key=False)
    assert layout.composite(1, "ab", "c") == b"\x01\x02abc"
    # a namespace followed by a map user key carries its length too
    layout = KeyLayout(128, Int64Serializer(), StrSerializer(), has_user_key=True)
    assert layout.composite(1, 0, "ns", b"u") == b"\x01" + b"\x00" * 8 + b"\x02ns" + b"u"
    # the void namespace is zero bytes
    assert (
        KeyLayout(128, StrSerializer(), void, has_user_key=True).namespace_bytes(VOID_NAMESPACE)
        == b""
    )


@given(st.integers(0, 2**40))
def test_varint_round_trip(n: int) -> None:
    data = b"x" + encode_varint(n) + b"y"
    assert decode_varint(data, 1) == (n, len(data) - 1)


@given(st.binary(max_size=6), st.binary(max_size=6))
def test_prefix_successor_bounds_exactly_the_prefixed_strings(prefix: bytes, other: bytes) -> None:
    succ = prefix_successor(prefix)
    if succ is None:
        assert set(prefix) <= {0xFF}
        return
    assert (prefix <= other < succ) == other.startswith(prefix)


#: keys whose encoded length is anywhere around the one-byte varint bound (0x80)
LONG_TEXT = st.one_of(TEXT, st.text(min_size=120, max_size=300))
LONG_BYTES = st.one_of(BYTES, st.binary(min_size=120, max_size=300))


@pytest.mark.parametrize(
    "key_ser,key_st",
    [(Int64Serializer(), INT64), (StrSerializer(), LONG_TEXT), (BytesSerializer(), LONG_BYTES)],
    ids=lambda x: type(x).__name__,
)
@pytest.mark.parametrize("ns_ser,ns_st", NAMESPACES, ids=lambda x: type(x).__name__)
@given(data=st.data())
@settings(max_examples=40, deadline=None)
def test_decoded_entries_are_the_entries_written(
    key_ser: Any, key_st: Any, ns_ser: Any, ns_st: Any, data: Any
) -> None:
    """``decode_entries`` (with its column-wise decoding of keys and values without a
    namespace) gives back the entries written, for fixed- and variable-length keys, lengths on
    both sides of 0x80, and values of fixed width, UTF-8, msgpack containers and records."""
    max_parallelism = data.draw(st.sampled_from([128, 4096]))
    value_ser, value_st = data.draw(st.sampled_from(VALUES))
    layout = KeyLayout(max_parallelism, key_ser, ns_ser, has_user_key=False)
    meta = StateMetaInfo("s", "value", ns_ser, value_ser)
    parts = data.draw(
        st.lists(
            st.tuples(st.integers(0, max_parallelism - 1), key_st, ns_st, value_st),
            max_size=20,
            unique_by=lambda p: (p[0], p[1], p[2]),
        )
    )
    # the model: the parts themselves, in the order of their composite keys
    rows = sorted(
        ((layout.composite(kg, key, ns), i, key, ns) for i, (kg, key, ns, _) in enumerate(parts)),
        key=lambda r: r[0],
    )
    raw = [(composite, value_ser.serialize(parts[i][3])) for composite, i, _, _ in rows]
    expected = [(key, ns, parts[i][3]) for _, i, key, ns in rows]
    assert list(decode_entries(meta, layout, raw)) == expected
