"""The record schemas of the earliest record snapshots, read from text.

Record serializer snapshots of format version 1 kept each field's type only as the text of
``repr(msgspec.inspect.<Type>)``, e.g. ``UnionType(types=(StrType(min_length=None, ...),
NoneType()))``. :func:`record_schema_of_v1_fields` reads that text as data (calls, tuples, lists,
dicts, literals and ``<...>`` reprs) into a :class:`~streamstate.serializers.schema.RecordSchema`;
nothing is evaluated or imported. What that text did not keep: an enum's values (such a field
reads any value) and the layout of the record itself — whether it was array-like or tagged, and
its fields' wire names (nested records' layouts are in the text). The schema read here assumes a
map keyed by field names; a reader that finds an array (or other keys) in the data knows the
record was array-like (or renamed) and says so.

>>> fields = [{"name": "n", "type": "IntType(gt=None, ge=None)", "required": True},
...           {"name": "tag", "type": "UnionType(types=(StrType(), NoneType()))",
...            "required": False}]
>>> from streamstate.serializers.schema import describe_schema
>>> describe_schema(record_schema_of_v1_fields("Acc", fields))
'Acc{n: int, tag: str | None}'
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from streamstate.serializers.schema import (
    AnySchema,
    BoolSchema,
    BytesSchema,
    DictSchema,
    FieldSchema,
    FloatSchema,
    IntSchema,
    ListSchema,
    NoneSchema,
    RecordSchema,
    StrSchema,
    TemporalSchema,
    TupleSchema,
    TypeSchema,
    UnionSchema,
)

__all__ = ["record_schema_of_v1_fields"]


def record_schema_of_v1_fields(name: str, fields: Any) -> RecordSchema:
    """The schema of a record named ``name`` from a version-1 snapshot's ``fields``;
    ``ValueError`` when the text cannot be read."""
    try:
        return RecordSchema(
            name,
            tuple(
                FieldSchema(
                    str(f["name"]),
                    _schema_of_repr(_parse_repr(str(f["type"]))),
                    bool(f.get("required", True)),
                )
                for f in fields
            ),
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"unreadable record fields: {exc}") from None


# The earlier record snapshots keep a field's type as ``repr(msgspec.inspect.<Type>)``, e.g.
# ``UnionType(types=(StrType(min_length=None, ...), NoneType()))``. The parser below reads that
# text as data: calls, tuples, lists, dicts, literals and ``<...>`` reprs; nothing is evaluated.

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<str>[rbuRBU]{0,2}(?:'(?:\\.|[^'\\])*'|"(?:\\.|[^"\\])*"))
      | (?P<num>-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)
      | (?P<name>[A-Za-z_][\w.]*)
      | (?P<angle><)
      | (?P<punct>[()\[\]{},=:])
    )""",
    re.VERBOSE,
)


class _Call(msgspec.Struct, frozen=True):
    name: str
    kwargs: dict[str, Any]


class _Opaque(msgspec.Struct, frozen=True):
    text: str


class _ReprParser:
    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0

    def _token(self) -> tuple[str, str]:
        m = _TOKEN.match(self.text, self.pos)
        if m is None or m.lastgroup is None:
            raise ValueError(f"cannot read {self.text[self.pos : self.pos + 40]!r}")
        self.pos = m.end()
        return m.lastgroup, m.group(m.lastgroup)

    def _peek(self) -> tuple[str, str] | None:
        saved = self.pos
        try:
            return self._token() if self.text[self.pos :].strip() else None
        finally:
            self.pos = saved

    def value(self) -> Any:
        kind, text = self._token()
        if kind in ("str", "num"):
            return _Opaque(text)
        if kind == "angle":
            return self._angle()
        if kind == "name":
            if self._peek() == ("punct", "("):
                self._token()
                return self._call(text)
            return _Opaque(text)
        if text in "([{":
            return self._sequence({"(": ")", "[": "]", "{": "}"}[text])
        raise ValueError(f"unexpected {text!r} at {self.pos}")

    def _angle(self) -> _Opaque:
        depth, start = 1, self.pos
        while depth:
            if self.pos >= len(self.text):
                raise ValueError("unterminated <...>")
            c = self.text[self.pos]
            if c in "'\"":
                end = self.text.find(c, self.pos + 1)
                if end < 0:
                    raise ValueError("unterminated string")
                self.pos = end
            depth += {"<": 1, ">": -1}.get(c, 0)
            self.pos += 1
        return _Opaque(self.text[start : self.pos - 1])

    def _sequence(self, close: str) -> tuple[Any, ...]:
        items: list[Any] = []
        while self._peek() != ("punct", close):
            items.append(self.value())
            if self._peek() == ("punct", ":"):
                self._token()
                items.append(self.value())
            if self._peek() == ("punct", ","):
                self._token()
        self._token()
        return tuple(items)

    def _call(self, name: str) -> _Call:
        kwargs: dict[str, Any] = {}
        while self._peek() != ("punct", ")"):
            key_kind, key = self._token()
            if key_kind != "name" or self._token() != ("punct", "="):
                raise ValueError(f"expected a keyword argument in {name}(...)")
            kwargs[key] = self.value()
            if self._peek() == ("punct", ","):
                self._token()
        self._token()
        return _Call(name.rsplit(".", 1)[-1], kwargs)


def _parse_repr(text: str) -> Any:
    parser = _ReprParser(text)
    out = parser.value()
    if parser.text[parser.pos :].strip():
        raise ValueError(f"trailing text in {text!r}")
    return out


_REPR_SIMPLE: dict[str, TypeSchema] = {
    "AnyType": AnySchema(),
    "NoneType": NoneSchema(),
    "BoolType": BoolSchema(),
    "IntType": IntSchema(),
    "FloatType": FloatSchema(),
    "StrType": StrSchema(),
    "BytesType": BytesSchema(),
    "ByteArrayType": BytesSchema(),
    "MemoryViewType": BytesSchema(),
    "DateTimeType": TemporalSchema("datetime"),
    "DateType": TemporalSchema("date"),
    "TimeType": TemporalSchema("time"),
    "TimeDeltaType": TemporalSchema("timedelta"),
    "DecimalType": TemporalSchema("decimal"),
    "UUIDType": TemporalSchema("uuid"),
}
_REPR_CONTAINERS = {
    "ListType": "list",
    "SetType": "set",
    "FrozenSetType": "frozenset",
    "VarTupleType": "tuple",
}
_CLASS_NAME = re.compile(r"""^(?:class|enum)\s+'(?:[\w.]*\.)?(\w+)'""")


def _schema_of_repr(node: Any) -> TypeSchema:
    if not isinstance(node, _Call):
        raise ValueError(f"not a type: {node!r}")
    kw = node.kwargs
    if node.name in _REPR_SIMPLE:
        return _REPR_SIMPLE[node.name]
    if node.name == "Metadata":
        return _schema_of_repr(kw["type"])
    if node.name in _REPR_CONTAINERS:
        return ListSchema(_schema_of_repr(kw["item_type"]), _REPR_CONTAINERS[node.name])
    if node.name == "TupleType":
        return TupleSchema(tuple(_schema_of_repr(t) for t in kw["item_types"]))
    if node.name in ("DictType", "FrozenDictType"):
        return DictSchema(_schema_of_repr(kw["key_type"]), _schema_of_repr(kw["value_type"]))
    if node.name == "UnionType":
        return UnionSchema(tuple(_schema_of_repr(t) for t in kw["types"]))
    if node.name in ("EnumType", "LiteralType"):
        # the earlier snapshots did not keep an enum's values: any encoded value reads
        return AnySchema()
    if node.name in ("StructType", "DataclassType", "NamedTupleType", "TypedDictType"):
        return _record_of_repr(node)
    raise ValueError(f"unknown type {node.name!r}")


def _record_of_repr(node: _Call) -> TypeSchema:
    kw = node.kwargs
    cls = kw.get("cls")
    m = _CLASS_NAME.match(cls.text) if isinstance(cls, _Opaque) else None
    fields = []
    for f in kw["fields"]:
        if not (isinstance(f, _Call) and f.name == "Field"):
            raise ValueError(f"not a field: {f!r}")
        name, encode = (_literal_str(f.kwargs[k]) for k in ("name", "encode_name"))
        required = isinstance(f.kwargs.get("required"), _Opaque) and (
            f.kwargs["required"].text == "True"
        )
        fields.append(
            FieldSchema(
                name, _schema_of_repr(f.kwargs["type"]), required, "" if encode == name else encode
            )
        )
    tag_field = kw.get("tag_field")
    tag = kw.get("tag")
    array_like = isinstance(kw.get("array_like"), _Opaque) and kw["array_like"].text == "True"
    return RecordSchema(
        m.group(1) if m else "record",
        tuple(fields),
        array_like or node.name == "NamedTupleType",
        _literal_str(tag_field) if _is_str_literal(tag_field) else "",
        _literal_value(tag) if isinstance(tag, _Opaque) and tag.text != "None" else None,
    )


def _is_str_literal(node: Any) -> bool:
    return isinstance(node, _Opaque) and node.text[:1] in "'\""


def _literal_str(node: Any) -> str:
    if not _is_str_literal(node):
        raise ValueError(f"not a string: {node!r}")
    text = node.text
    # msgspec's field names are identifiers; an escape would mean some other text
    if "\\" in text:
        raise ValueError(f"escaped name {text!r}")
    return str(text[1:-1])


def _literal_value(node: _Opaque) -> Any:
    if _is_str_literal(node):
        return _literal_str(node)
    try:
        return int(node.text)
    except ValueError:
        raise ValueError(f"unsupported tag {node.text!r}") from None
