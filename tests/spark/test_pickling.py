"""The user's record classes travel by value whole (``streamstate.serializers.class_pickling``),
and the driver's check of a function leaves them as it found them.

A class of this module travels by value (tests are not an installed package), as a job script's
does; ``detached`` loads make new classes in this process, as another process would. The
end-to-end test is ``test_record_types.py`` (a ``__main__`` script on Spark)."""

from __future__ import annotations

import dataclasses
import enum
import inspect
import pickle
import typing
from types import SimpleNamespace
from typing import Any, ClassVar

import msgspec
import pytest

from streamstate import (
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from streamstate.serializers import Int64Serializer
from streamstate.spark.job import pickle_function


@dataclasses.dataclass
class Visit:
    v: int
    at: Place | None = None


class Place(msgspec.Struct, frozen=True):
    name: str


class Base(msgspec.Struct, kw_only=True):
    z: int = 0


class Tagged(Base, tag=True, rename="camel", omit_defaults=True):
    """A struct with the options msgspec takes when the class is created."""

    some_a: int
    some_b: list[int] = []
    visit: Visit | None = None
    registry: ClassVar[dict[str, int]] = {}

    def __post_init__(self) -> None:
        if self.some_a < 0:
            raise ValueError("some_a must not be negative")

    def total(self) -> int:
        return self.some_a + sum(self.some_b) + self.z


class Node(msgspec.Struct):
    value: int
    children: list[Node] = []


class Level(enum.Enum):
    LOW = 1
    HIGH = 2


class Pair(typing.NamedTuple):
    first: int
    last: int = 0


class Named(typing.TypedDict):
    key: int


VALUES: list[Any] = [
    Visit(1, Place("p")),
    Place("q"),
    Tagged(some_a=1, some_b=[2], visit=Visit(3), z=4),
    Node(1, [Node(2, [Node(3)])]),
    Level.HIGH,
    Pair(1, 2),
]


def _load(blob: bytes) -> Any:
    return pickle.loads(blob)


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_a_record_class_arrives_whole_and_reads_what_the_original_wrote(value: Any) -> None:
    cls = type(value)
    msgspec.msgpack.Decoder(cls)  # msgspec caches what it learns in the class
    copy = _load(pickle_function(cls, detached=True))
    assert copy is not cls and copy.__qualname__ == cls.__qualname__
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(value), type=copy)
    assert msgspec.msgpack.encode(decoded) == msgspec.msgpack.encode(value)
    assert repr(decoded) == repr(value)


def test_a_struct_keeps_its_options_methods_and_post_init() -> None:
    copy = _load(pickle_function(Tagged, detached=True))
    assert copy.__struct_config__.tag == "Tagged"
    assert copy.__struct_fields__ == Tagged.__struct_fields__
    assert copy.__struct_encode_fields__ == Tagged.__struct_encode_fields__
    value = copy(some_a=1, some_b=[2], z=3)
    assert value.total() == 6 and copy.registry == {}
    with pytest.raises(ValueError, match="must not be negative"):
        copy(some_a=-1)
    assert str(inspect.signature(copy)) == str(inspect.signature(Tagged))  # z keyword-only
    td = _load(pickle_function(Named, detached=True))
    assert msgspec.msgpack.decode(msgspec.msgpack.encode({"key": 1}), type=td) == {"key": 1}


def test_a_class_loaded_in_the_process_that_pickled_it_is_the_same_class() -> None:
    assert _load(pickle_function(Tagged)) is Tagged
    assert _load(pickle_function(Visit)) is Visit


class Tracker(KeyedProcessFunction):
    def __init__(self) -> None:
        # descriptors made before the function is shipped carry their serializers
        self.visits = ListStateDescriptor("visits", Visit)

    def open(self, ctx: Any) -> None:
        self.last = ctx.get_state(ValueStateDescriptor("last", Tagged))
        self.places = ctx.get_map_state(MapStateDescriptor("places", Place, Visit))
        self.list = ctx.get_list_state(self.visits)

    def process_element(self, value: Any, ctx: Any) -> Any:
        yield value


def test_the_drivers_check_leaves_the_users_classes_as_it_found_them() -> None:
    from streamstate.spark.driver.plan.checks import _open_function

    classes = [Visit, Place, Tagged, Base]
    for cls in classes:
        if "__msgspec_cache__" in cls.__dict__:
            delattr(cls, "__msgspec_cache__")
    function = Tracker()  # its descriptor inspects Visit (the user's doing, not the check's)
    function.visits.serializer.deserialize(function.visits.serializer.serialize([Visit(1)]))
    before = {cls: dict(cls.__dict__) for cls in classes}
    registry = Tagged.registry
    options = SimpleNamespace(
        function=function, operator_name="op", parallelism=2, max_parallelism=128
    )
    _open_function(options, Int64Serializer(), [])
    for cls in classes:
        assert dict(cls.__dict__) == before[cls], cls
    assert Tagged.registry is registry
    # and the function still ships (its descriptors' serializers too)
    loaded = _load(pickle_function(function, detached=True))
    serializer = loaded.visits.serializer
    assert serializer.deserialize(serializer.serialize([Visit(2)]))[0].v == 2


def test_a_pickle_serializer_carries_the_record_classes_of_the_script_whole() -> None:
    from streamstate.serializers import PickleSerializer

    msgspec.msgpack.Decoder(Visit)  # msgspec's cache in the class does not travel
    serializer = PickleSerializer()
    value = {"visit": Visit(1, Place("p")), "tagged": Tagged(some_a=2)}
    assert serializer.deserialize(serializer.serialize(value)) == value
