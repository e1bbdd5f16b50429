"""TTL semantics for every state kind and every (update type x visibility) combination."""

from __future__ import annotations

import pytest

from streamstate import (
    AggregateFunction,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)
from streamstate.backends.decorators.ttl import LONG_MAX, TtlValueState
from streamstate.backends.heap.backend import HeapKeyedStateBackend
from streamstate.backends.heap.states import HeapValueState
from streamstate.backends.rocksdb.states import RocksDBValueState
from streamstate.errors import StateAccessError
from streamstate.namespace import VOID_NAMESPACE
from streamstate.serializers import StrSerializer, VoidNamespaceSerializer

UT = StateTtlConfig.UpdateType
SV = StateTtlConfig.StateVisibility
TTL = 100


class SumAgg(AggregateFunction):
    def create_accumulator(self):
        return 0

    def add(self, value, accumulator):
        return accumulator + value

    def get_result(self, accumulator):
        return accumulator

    def merge(self, acc_a, acc_b):
        return acc_a + acc_b


class ListAcc(AggregateFunction):
    """A mutable accumulator: copies must be deep."""

    def create_accumulator(self):
        return []

    def add(self, value, accumulator):
        accumulator.append(value)
        return accumulator

    def get_result(self, accumulator):
        return sorted(accumulator)

    def merge(self, acc_a, acc_b):
        acc_a.extend(acc_b)
        return acc_a


# kind -> (descriptor factory, write(state, x), read(state), empty read, read of one written x)
KINDS = {
    "value": (
        lambda: ValueStateDescriptor("s", int),
        lambda s, x: s.update(x),
        lambda s: s.value(),
        None,
        lambda x: x,
    ),
    "list": (
        lambda: ListStateDescriptor("s", int),
        lambda s, x: s.add(x),
        lambda s: s.get(),
        [],
        lambda x: [x],
    ),
    "map": (
        lambda: MapStateDescriptor("s", str, int),
        lambda s, x: s.put("k", x),
        lambda s: s.get("k"),
        None,
        lambda x: x,
    ),
    "reducing": (
        lambda: ReducingStateDescriptor("s", lambda a, b: a + b, int),
        lambda s, x: s.add(x),
        lambda s: s.get(),
        None,
        lambda x: x,
    ),
    "aggregating": (
        lambda: AggregatingStateDescriptor("s", SumAgg(), int),
        lambda s, x: s.add(x),
        lambda s: s.get(),
        None,
        lambda x: x,
    ),
}


def config(update_type=UT.OnCreateAndWrite, visibility=SV.NeverReturnExpired, **kw):
    return StateTtlConfig(ttl=TTL, update_type=update_type, state_visibility=visibility, **kw)


def ttl_state(backend, descriptor, key="a", namespace=VOID_NAMESPACE, namespace_serializer=None):
    backend.set_current_key(key)
    return backend.get_partitioned_state(
        namespace, namespace_serializer or VoidNamespaceSerializer(), descriptor
    )


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("update_type", [UT.OnCreateAndWrite, UT.OnReadAndWrite])
@pytest.mark.parametrize("visibility", [SV.NeverReturnExpired, SV.ReturnExpiredIfNotCleanedUp])
def test_expiry_matrix(backend, clock, kind, update_type, visibility):
    make, write, read, empty, one = KINDS[kind]
    d = make().enable_time_to_live(config(update_type, visibility, cleanup_size=0))
    s = ttl_state(backend, d)
    write(s, 7)  # ts = 1000
    clock.time = 1000 + TTL - 1
    assert read(s) == one(7)  # still alive; OnReadAndWrite refreshes ts to 1099
    clock.time = 1000 + TTL  # 1000 + 100 <= 1100: expired unless refreshed
    if update_type is UT.OnReadAndWrite:
        assert read(s) == one(7)  # refreshed at 1099 -> alive until 1199; refreshed again
        clock.time = 1100 + TTL
    expected_expired = one(7) if visibility is SV.ReturnExpiredIfNotCleanedUp else empty
    assert read(s) == expected_expired
    # cleanup on read: the expired value is gone, whatever the visibility
    assert backend.num_entries("s") == 0
    assert read(s) == empty


@pytest.mark.parametrize("kind", list(KINDS))
def test_write_refreshes_timestamp(backend, clock, kind):
    make, write, read, _, _ = KINDS[kind]
    s = ttl_state(backend, make().enable_time_to_live(config(cleanup_size=0)))
    write(s, 1)
    clock.advance(60)
    write(s, 1)  # a write refreshes the timestamp under both update types
    clock.advance(60)  # 120 ms after the first write, 60 after the second
    assert read(s) is not None and read(s) != []


@pytest.mark.parametrize("kind", list(KINDS))
def test_create_and_write_does_not_refresh_on_read(backend, clock, kind):
    make, write, read, empty, one = KINDS[kind]
    s = ttl_state(backend, make().enable_time_to_live(config(UT.OnCreateAndWrite, cleanup_size=0)))
    write(s, 3)
    for t in (1010, 1050, 1099):
        clock.time = t
        assert read(s) == one(3)
    clock.time = 1100
    assert read(s) == empty


@pytest.mark.parametrize("kind", list(KINDS))
def test_disabled_update_type_means_no_ttl(backend, clock, kind):
    make, write, read, _, one = KINDS[kind]
    d = make().enable_time_to_live(config(UT.Disabled))
    assert d.ttl_config is None
    s = ttl_state(backend, d)
    assert not type(s).__name__.startswith("Ttl")
    write(s, 5)
    clock.advance(10 * TTL)
    assert read(s) == one(5)


@pytest.mark.parametrize("kind", list(KINDS))
def test_keys_and_namespaces_expire_independently(backend, clock, kind):
    make, write, read, empty, one = KINDS[kind]
    d = make().enable_time_to_live(config(cleanup_size=0))
    names = StrSerializer()
    s = ttl_state(backend, d, "a", "main", names)
    write(s, 1)
    clock.advance(50)
    s = ttl_state(backend, d, "b", "main", names)
    write(s, 2)
    s.set_current_namespace("other")
    write(s, 3)
    clock.advance(50)  # a expired, b alive
    assert read(ttl_state(backend, d, "a", "main", names)) == empty
    s = ttl_state(backend, d, "b", "main", names)
    assert read(s) == one(2)
    s.set_current_namespace("other")
    assert read(s) == one(3)


def test_void_namespace_serializer_refuses_other_namespaces(backend, clock):
    s = ttl_state(backend, ValueStateDescriptor("v", int).enable_time_to_live(config()))
    with pytest.raises(StateAccessError, match="'v'.*void namespace serializer.*'other'"):
        s.set_current_namespace("other")


def test_value_default_and_none(backend, clock):
    d = ValueStateDescriptor("v", list[int], default=[0]).enable_time_to_live(config())
    s = ttl_state(backend, d)
    assert isinstance(s, TtlValueState)
    assert s.value() == [0]
    s.value().append(1)  # the default is copied, not shared
    assert s.value() == [0]
    s.update([5])
    clock.advance(TTL)
    assert s.value() == [0]
    s.update([6])
    s.update(None)
    assert backend.num_entries("v") == 0


def test_list_elements_expire_one_by_one(heap_backend, clock):
    backend = heap_backend
    d = ListStateDescriptor("l", str).enable_time_to_live(config(cleanup_size=0))
    s = ttl_state(backend, d)
    s.add("a")  # 1000
    clock.time = 1050
    s.add_all(["b", "c"])
    clock.time = 1100
    assert s.get() == ["b", "c"]
    raw = backend.state_table("l").get(VOID_NAMESPACE)
    assert raw == [(1050, "b"), (1050, "c")]  # the expired element was removed on read
    clock.time = 1149
    s.add("d")
    clock.time = 1150
    assert s.get() == ["d"]
    s.update(["x", "y"])
    assert backend.state_table("l").get(VOID_NAMESPACE) == [(1150, "x"), (1150, "y")]
    s.update([])
    assert backend.num_entries("l") == 0


def test_list_return_expired_returns_then_cleans(backend, clock):
    # Flink's IteratorWithCleanup: expired elements are returned until cleanup removes them;
    # a read clears the list only when nothing unexpired is left
    d = ListStateDescriptor("l", int).enable_time_to_live(
        config(visibility=SV.ReturnExpiredIfNotCleanedUp, cleanup_size=0)
    )
    s = ttl_state(backend, d)
    s.add(1)
    clock.time = 1050
    s.add(2)
    clock.time = 1100
    assert s.get() == [1, 2]
    assert s.get() == [1, 2]  # 2 is unexpired: nothing is cleaned up by reading
    assert backend.num_entries("l") == 2  # both elements are still stored
    clock.time = 1150
    assert s.get() == [1, 2]  # all expired: returned once more, then cleared
    assert backend.num_entries("l") == 0
    assert s.get() == []


def test_list_return_expired_with_read_refresh_keeps_only_unexpired(backend, clock):
    # Flink's TtlListState.updateTs: a read under OnReadAndWrite rewrites the unexpired elements
    # with the new timestamp, so the expired ones are returned by this read only
    d = ListStateDescriptor("l", int).enable_time_to_live(
        config(UT.OnReadAndWrite, SV.ReturnExpiredIfNotCleanedUp, cleanup_size=0)
    )
    s = ttl_state(backend, d)
    s.add(1)
    clock.time = 1050
    s.add(2)
    clock.time = 1100
    assert s.get() == [1, 2]
    assert s.get() == [2]
    clock.time = 1199  # 2 was refreshed at 1100
    assert s.get() == [2]


def test_list_rejects_none(backend):
    s = ttl_state(backend, ListStateDescriptor("l", int).enable_time_to_live(config()))
    with pytest.raises(StateAccessError, match="None cannot be added"):
        s.add(None)
    with pytest.raises(StateAccessError, match="None cannot be added"):
        s.add_all([1, None])
    with pytest.raises(StateAccessError, match="None cannot be added"):
        s.update([None])
    assert backend.num_entries("l") == 0


def test_list_read_and_write_refreshes_every_element(heap_backend, clock):
    backend = heap_backend
    d = ListStateDescriptor("l", int).enable_time_to_live(config(UT.OnReadAndWrite, cleanup_size=0))
    s = ttl_state(backend, d)
    s.add(1)
    clock.time = 1060
    s.add(2)
    clock.time = 1090
    assert s.get() == [1, 2]
    assert backend.state_table("l").get(VOID_NAMESPACE) == [(1090, 1), (1090, 2)]


@pytest.mark.parametrize("visibility", [SV.NeverReturnExpired, SV.ReturnExpiredIfNotCleanedUp])
@pytest.mark.parametrize("update_type", [UT.OnCreateAndWrite, UT.OnReadAndWrite])
def test_map_values_expire_one_by_one(backend, clock, update_type, visibility):
    d = MapStateDescriptor("m", str, int).enable_time_to_live(
        config(update_type, visibility, cleanup_size=0)
    )
    s = ttl_state(backend, d)
    s.put("old", 1)
    clock.time = 1050
    s.put_all({"new": 2, "newer": 3})
    clock.time = 1100
    ret = visibility is SV.ReturnExpiredIfNotCleanedUp
    expected = {"new": 2, "newer": 3} | ({"old": 1} if ret else {})
    assert dict(s.items()) == expected
    assert dict(s.items()) == {"new": 2, "newer": 3}  # "old" was cleaned up by the first read
    assert sorted(s.keys()) == ["new", "newer"]
    assert sorted(s.values()) == [2, 3]
    assert s.contains("new") and not s.contains("old") and "newer" in s
    assert not s.is_empty()
    s.remove("new")
    if update_type is UT.OnReadAndWrite:
        clock.time = 1149  # "newer" was read at 1100: alive until 1200
        assert s.get("newer") == 3
        clock.time = 1248
        assert s.get("newer") == 3
        clock.time = 1400
    else:
        clock.time = 1150
    if ret:
        assert s.is_empty() is False  # the expired "newer" is visible once more
    assert s.is_empty() is True
    assert backend.num_entries("m") == 0


@pytest.mark.parametrize("visibility", [SV.NeverReturnExpired, SV.ReturnExpiredIfNotCleanedUp])
def test_map_put_none_is_a_contained_mapping(backend, clock, visibility):
    # as Flink's TtlMapState (and the map state without TTL): None is a value, the key is there
    d = MapStateDescriptor("m", str, int | None).enable_time_to_live(
        config(visibility=visibility, cleanup_size=0)
    )
    s = ttl_state(backend, d)
    s.put("a", None)
    s.put_all({"b": None, "c": 3})
    assert s.get("a") is None and s.contains("a") and s.contains("b")
    assert dict(s.items()) == {"a": None, "b": None, "c": 3}
    assert not s.contains("x")
    clock.advance(TTL)
    assert s.contains("a") is (visibility is SV.ReturnExpiredIfNotCleanedUp)
    assert not s.contains("a")  # removed by the read that found it expired


def test_map_put_none_refused_when_the_value_type_has_no_none(backend):
    s = ttl_state(backend, MapStateDescriptor("m", str, int).enable_time_to_live(config()))
    with pytest.raises(StateAccessError, match="'m'.*'k' -> None.*T \\| None"):
        s.put("k", None)
    with pytest.raises(StateAccessError, match="'m'.*'j' -> None"):
        s.put_all({"i": 1, "j": None})
    assert backend.num_entries("m") == 0


def test_map_is_empty_with_return_expired(backend, clock):
    d = MapStateDescriptor("m", str, int).enable_time_to_live(
        config(visibility=SV.ReturnExpiredIfNotCleanedUp, cleanup_size=0)
    )
    s = ttl_state(backend, d)
    s.put("a", 1)
    clock.advance(TTL)
    assert s.is_empty() is False  # expired but still there: visible once
    assert s.is_empty() is True


def test_reducing_add_after_expiry_starts_afresh(backend, clock):
    d = ReducingStateDescriptor("r", lambda a, b: a + b, int).enable_time_to_live(
        config(visibility=SV.NeverReturnExpired, cleanup_size=0)
    )
    s = ttl_state(backend, d)
    s.add(1)
    clock.time = 1050
    s.add(2)  # reduce refreshes: (1050, 3)
    clock.time = 1149
    assert s.get() == 3
    clock.time = 1150
    s.add(10)  # the stored 3 expired: writes never build on expired values
    assert s.get() == 10
    s.add(None)
    assert s.get() is None and backend.num_entries("r") == 0


def test_aggregating_add_after_expiry_starts_afresh(backend, clock):
    d = AggregatingStateDescriptor("g", ListAcc(), list[int]).enable_time_to_live(
        config(visibility=SV.NeverReturnExpired, cleanup_size=0)
    )
    s = ttl_state(backend, d)
    s.add(1)
    clock.time = 1050
    s.add(2)
    clock.time = 1149
    assert s.get() == [1, 2]
    assert s.get_internal() == [1, 2]
    clock.time = 1150
    s.add(3)
    assert s.get() == [3]
    s.update_internal([7, 8])
    assert s.get() == [7, 8]
    s.update_internal(None)
    assert backend.num_entries("g") == 0


@pytest.mark.parametrize("kind", ["reducing", "aggregating"])
def test_add_builds_on_an_expired_value_not_cleaned_up(backend, clock, kind):
    # Flink's TtlReduceFunction / TtlAggregateFunction use getUnexpired: with
    # ReturnExpiredIfNotCleanedUp an expired value still stored is built upon
    make, write, read, _, _ = KINDS[kind]
    d = make().enable_time_to_live(
        config(visibility=SV.ReturnExpiredIfNotCleanedUp, cleanup_size=0)
    )
    s = ttl_state(backend, d)
    write(s, 1)
    clock.time = 1050
    write(s, 2)  # (1050, 3)
    clock.time = 1150  # expired, not cleaned up
    write(s, 10)
    assert read(s) == 13
    clock.time = 1249  # the add refreshed the timestamp
    assert read(s) == 13


@pytest.mark.parametrize("kind", ["reducing", "aggregating"])
def test_merge_builds_on_expired_values_not_cleaned_up(backend, clock, kind):
    make, write, read, _, _ = KINDS[kind]
    d = make().enable_time_to_live(
        config(visibility=SV.ReturnExpiredIfNotCleanedUp, cleanup_size=0)
    )
    s = ttl_state(backend, d, "a", "w1", StrSerializer())
    write(s, 1)  # 1000
    clock.time = 1060
    s.set_current_namespace("w2")
    write(s, 2)
    s.set_current_namespace("w3")
    write(s, 4)
    clock.time = 1100  # w1 expired but still stored
    s.merge_namespaces("w3", ["w1", "w2"])
    s.set_current_namespace("w3")
    assert read(s) == 7
    assert backend.num_entries("s") == 1
    clock.time = 5000  # every part expired: the merge still yields their values
    s.set_current_namespace("w4")
    write(s, 1)
    clock.time = 9000
    s.merge_namespaces("w5", ["w3", "w4"])
    s.set_current_namespace("w5")
    assert read(s) == 8


@pytest.mark.parametrize("kind", ["list", "reducing", "aggregating"])
def test_merge_namespaces_drops_expired_sources(backend, clock, kind):
    make, write, read, empty, _ = KINDS[kind]
    d = make().enable_time_to_live(config(cleanup_size=0))
    s = ttl_state(backend, d, "a", "w1", StrSerializer())
    write(s, 1)  # 1000
    clock.time = 1060
    s.set_current_namespace("w2")
    write(s, 2)
    s.set_current_namespace("w3")
    write(s, 4)
    clock.time = 1100  # w1 expired
    s.merge_namespaces("w3", ["w1", "w2"])
    s.set_current_namespace("w3")
    got = read(s)
    assert (sorted(got) if kind == "list" else got) == ([2, 4] if kind == "list" else 6)
    for ns in ("w1", "w2"):
        s.set_current_namespace(ns)
        assert read(s) == empty
    # one (key, namespace) left: w3 (a list counts its elements, streamstate.format.entries)
    assert backend.num_entries("s") == (2 if kind == "list" else 1)


@pytest.mark.parametrize("kind", ["reducing", "aggregating"])
def test_merge_of_only_expired_parts_leaves_no_entry(backend, clock, kind):
    make, write, read, empty, _ = KINDS[kind]
    d = make().enable_time_to_live(config(cleanup_size=0))
    s = ttl_state(backend, d, "a", "w1", StrSerializer())
    for ns in ("w1", "w2"):
        s.set_current_namespace(ns)
        write(s, 1)
    clock.advance(TTL)
    s.merge_namespaces("w3", ["w1", "w2"])
    assert backend.num_entries("s") == 0
    s.set_current_namespace("w3")
    assert read(s) == empty


def test_expiry_saturates_at_the_end_of_time(backend, clock):
    d = ValueStateDescriptor("v", int).enable_time_to_live(
        StateTtlConfig(ttl=LONG_MAX, cleanup_size=0)
    )
    s = ttl_state(backend, d)
    clock.time = LONG_MAX - 10
    s.update(1)  # ts + ttl overflows int64: saturates at LONG_MAX
    clock.time = LONG_MAX - 1
    assert s.value() == 1
    clock.time = LONG_MAX
    assert s.value() is None


def test_ttl_state_is_a_decorator_over_the_raw_state(backend):
    d = ValueStateDescriptor("v", int).enable_time_to_live(config())
    s = ttl_state(backend, d, "a", "w1", StrSerializer())
    raw = HeapValueState if isinstance(backend, HeapKeyedStateBackend) else RocksDBValueState
    assert isinstance(s.original, raw)
    assert s.descriptor.ttl_config is not None
    assert s.original.descriptor.serializer.type_name == "ttl_value"
    assert s.ttl_config.ttl == TTL
    s.set_current_namespace("ns")
    assert s.get_current_namespace() == "ns" == s.original.get_current_namespace()
    assert "ttl=100ms" in repr(s)
