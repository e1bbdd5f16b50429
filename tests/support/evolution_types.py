"""Record types of the schema-evolution tests: each old type and the new types it evolves into
(tests/evolution/). The moved record lives in ``evolution_moved_types``."""

from __future__ import annotations

import dataclasses
import enum
from typing import NamedTuple

import msgspec


@dataclasses.dataclass
class Acc:
    n: int
    tag: str


@dataclasses.dataclass
class AccAdded:  # a field added with a default
    n: int
    tag: str
    extra: int = 7


@dataclasses.dataclass
class AccRemoved:  # a field removed
    n: int


@dataclasses.dataclass
class AccReordered:  # fields reordered
    tag: str
    n: int


@dataclasses.dataclass
class AccWider:  # int -> float
    n: float
    tag: str


@dataclasses.dataclass
class AccOptional:  # T -> T | None
    n: int | None
    tag: str | None


@dataclasses.dataclass
class AccRenamed:  # the class renamed, same fields
    n: int
    tag: str


@dataclasses.dataclass
class AccTagInt:  # str -> int: refused
    n: int
    tag: int


@dataclasses.dataclass
class AccRequired:  # a field added without a default: refused
    n: int
    tag: str
    extra: int


@dataclasses.dataclass
class Inner:
    x: int


@dataclasses.dataclass
class Outer:
    inner: Inner
    scores: list[int]


@dataclasses.dataclass
class InnerV2:
    x: float
    y: str = "y"


@dataclasses.dataclass
class OuterV2:  # a nested record evolving, list[int] -> list[float]
    inner: InnerV2
    scores: list[float]


class Point(msgspec.Struct):
    x: int
    y: int


class PointV2(msgspec.Struct):  # a Struct: a field added, another widened
    x: float
    y: int
    label: str = ""


class Pair(NamedTuple):
    a: int
    b: str


class PairV2(NamedTuple):  # an array-like record: a field appended with a default
    a: float
    b: str
    c: int = 0


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class ColorV2(enum.Enum):  # an enum gaining a member
    RED = "red"
    GREEN = "green"
    BLUE = "blue"
