"""The rules of schema evolution: how values checkpointed under one type become values of the
type a program declares now (SPEC §14.1).

:func:`resolve_schema_change` compares two serializer snapshots by the schemas they describe
(``streamstate.serializers.schema``), never by a class's qualified name, and returns a
:class:`SchemaChange`: compatible as is, compatible after migration, or incompatible; what
changed, in the words of Python type hints; and how to convert the stored values.

The rules (the union of Flink 2.x's and Spark 4's):

* as is: the same schema (a record renamed or moved to another module with the same fields;
  its fields reordered);
* after migration: a record field added with a default, or removed; a widening: ``int`` →
  ``float``, ``str`` → ``bytes``, ``bytes`` → ``str`` (UTF-8), ``T`` → ``T | None``, ``A`` →
  ``A | B``, an enum or ``Literal`` gaining values, any type → ``Any``; in record fields, values,
  list elements, map values, tuples and nested records alike; time-to-live turned on (entries
  count as accessed at the restore) or off;
* refused: a field added without a default, a narrowing (``float`` → ``int``, ``T | None`` →
  ``T``), another type (``str`` → ``int``), a map's key type, a container's kind.

Most migrations need no conversion of the stored bytes: msgpack data of the old type *is* data
of the new one for msgspec (a map record with a field more or less, an ``int`` read as a
``float``), so the new serializer reads it as it is (``SchemaChange.direct``). The others
(time-to-live turned on or off, ``str`` ↔ ``bytes``, a record's layout changed: array-like, tag,
wire names) convert the decoded msgpack values first (:meth:`SchemaChange.converter`).

>>> change = resolve_schema_change({"type": "int64"}, {"type": "float64"})
>>> change.compatibility.value, change.changes, change.direct
('compatible_after_migration', ('int → float',), True)
>>> resolve_schema_change({"type": "str"}, {"type": "int64"}).refused
('str → int',)
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import uuid
from collections.abc import Callable
from typing import Any

import msgspec

from streamstate.serializers.compatibility import Compatibility, describe_snapshot
from streamstate.serializers.schema import (
    AnySchema,
    BoolSchema,
    BytesSchema,
    DictSchema,
    EnumSchema,
    FloatSchema,
    IntSchema,
    ListSchema,
    NoneSchema,
    RecordSchema,
    RefSchema,
    StrSchema,
    TemporalSchema,
    TupleSchema,
    TypeSchema,
    UnionSchema,
    describe_schema,
)
from streamstate.serializers.snapshot_schema import schema_of_snapshot

__all__ = ["Converter", "SchemaChange", "resolve_schema_change"]

Converter = Callable[[Any, int], Any]
"""Converts one decoded msgpack value of the old type into msgpack builtins of the new type; the
second argument is the restore's processing time in ms (the timestamp of entries whose
time-to-live is turned on)."""


@dataclasses.dataclass(frozen=True)
class SchemaChange:
    """How values written under an old serializer snapshot relate to a new serializer.

    ``changes`` lists what differs in the user's words (``Acc.n: int → float``, ``Acc.extra:
    added with a default``); ``refused`` the differences that make the change incompatible
    (``Acc.tag: str → int``). ``known`` is false when a snapshot describes no schema (pickled
    values, a serializer of the program's own) and the two differ: the serializer's own rules
    then decide. ``direct``: the new serializer's msgpack decoder reads the old values as they
    are; otherwise :meth:`converter` converts them first.
    """

    compatibility: Compatibility
    changes: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()
    known: bool = True
    direct: bool = True
    _convert: Converter | None = None

    def converter(self) -> Converter | None:
        """The conversion of decoded old values (None when ``direct``)."""
        return self._convert

    def describe(self) -> str:
        """The differences (the refused ones, if any), separated by semicolons."""
        return "; ".join(self.refused or self.changes)


_AS_IS = SchemaChange(Compatibility.COMPATIBLE_AS_IS)


def resolve_schema_change(old: Any, new: Any) -> SchemaChange:
    """Compare the serializer snapshot ``old`` (found in a checkpoint) with ``new`` (what the
    program declares) by their schemas, under the rules of the module docstring.

    >>> old = {"type": "list", "element": {"type": "int64"}}
    >>> new = {"type": "list", "element": {"type": "ttl_value", "inner": {"type": "float64"}}}
    >>> change = resolve_schema_change(old, new)
    >>> change.describe(), change.direct
    ('time-to-live turned on (entries count as accessed at the restore); int → float', False)
    >>> change.converter()([1, 2], 7)
    [[7, 1], [7, 2]]
    """
    if old == new:
        return _AS_IS
    ctx = _Context()
    ok, conv = ctx.snapshots(old, new)
    if not ctx.known:
        return SchemaChange(Compatibility.INCOMPATIBLE, known=False, refused=(_whole(old, new),))
    if not ok:
        return SchemaChange(
            Compatibility.INCOMPATIBLE,
            changes=(*ctx.notes, *ctx.changes),
            refused=tuple(ctx.refused) or (_whole(old, new),),
        )
    if not ctx.changes and conv is None:  # at most a record renamed: the same bytes
        return SchemaChange(Compatibility.COMPATIBLE_AS_IS, changes=tuple(ctx.notes))
    return SchemaChange(
        Compatibility.COMPATIBLE_AFTER_MIGRATION,
        changes=(*ctx.notes, *ctx.changes),
        direct=conv is None,
        _convert=conv,
    )


def _whole(old: Any, new: Any) -> str:
    return f"{describe_snapshot(old)} → {describe_snapshot(new)}"


# -- the comparison ------------------------------------------------------------------------------


class _Context:
    """One comparison: the differences found, and whether every part had a schema."""

    def __init__(self) -> None:
        self.changes: list[str] = []
        self.refused: list[str] = []
        #: differences that change no stored byte (a record class renamed)
        self.notes: list[str] = []
        self.known = True
        #: ids of record schemas read from version-1 snapshot text (their layout is unknown)
        self.v1_records: set[int] = set()

    # ---- serializer snapshots: time-to-live sits at the top, in list elements, in map values --

    def snapshots(self, old: Any, new: Any) -> tuple[bool, Converter | None]:
        if old == new:
            return True, None
        o_ttl = isinstance(old, dict) and old.get("type") == "ttl_value"
        n_ttl = isinstance(new, dict) and new.get("type") == "ttl_value"
        if o_ttl or n_ttl:
            return self._ttl(old, new, o_ttl, n_ttl)
        o_type = old.get("type") if isinstance(old, dict) else None
        n_type = new.get("type") if isinstance(new, dict) else None
        if o_type == n_type == "list":
            ok, conv = self.snapshots(old.get("element"), new.get("element"))
            return ok, None if conv is None else _list_of(conv)
        if o_type == n_type == "dict":
            if not self._same_keys(old.get("key"), new.get("key")):
                return False, None
            ok, conv = self.snapshots(old.get("value"), new.get("value"))
            return ok, None if conv is None else _dict_of(conv)
        old_schema = schema_of_snapshot(old, v1_records=self.v1_records)
        new_schema = schema_of_snapshot(new)
        if old_schema is None or new_schema is None:
            self.known = False
            return False, None
        return self.schemas(old_schema, new_schema, "", lenient=False)

    def _ttl(self, old: Any, new: Any, o_ttl: bool, n_ttl: bool) -> tuple[bool, Converter | None]:
        if o_ttl and n_ttl:
            ok, conv = self.snapshots(old.get("inner"), new.get("inner"))
            return ok, None if conv is None else _ttl_kept(conv)
        if o_ttl:
            self.changes.append("time-to-live turned off (values kept without their timestamps)")
            ok, conv = self.snapshots(old.get("inner"), new)
            return ok, _ttl_off(conv)
        self.changes.append("time-to-live turned on (entries count as accessed at the restore)")
        ok, conv = self.snapshots(old, new.get("inner"))
        return ok, _ttl_on(conv)

    def _same_keys(self, old: Any, new: Any) -> bool:
        if old == new:
            return True
        o, n = schema_of_snapshot(old), schema_of_snapshot(new)
        if o is None or n is None:
            self.known = False
            return False
        if o != n:
            self.refused.append(
                f"map keys: {describe_schema(o)} → {describe_schema(n)} (a map's key type cannot "
                "change)"
            )
            return False
        return True

    # ---- schemas ------------------------------------------------------------------------------

    def schemas(
        self, old: TypeSchema, new: TypeSchema, path: str, *, lenient: bool
    ) -> tuple[bool, Converter | None]:
        """Whether values of ``old`` can become values of ``new``, and the conversion of the
        decoded values (None: msgspec reads them as they are). ``path`` names the place
        (``Acc.inner.x``, ``[]`` for elements); ``lenient``: ``old`` comes from a version-1
        snapshot, whose enums read as ``Any``."""
        if old == new:
            return True, None
        if isinstance(new, AnySchema) or (lenient and isinstance(old, AnySchema)):
            if not isinstance(old, AnySchema):
                self._change(path, old, new)
            return True, None
        if isinstance(new, UnionSchema) or isinstance(old, UnionSchema):
            return self._union(old, new, path, lenient)
        if isinstance(old, IntSchema) and isinstance(new, FloatSchema):
            self._change(path, old, new)
            return True, None
        if isinstance(old, StrSchema) and isinstance(new, BytesSchema):
            self._change(path, old, new)
            return True, _str_to_bytes
        if isinstance(old, BytesSchema) and isinstance(new, StrSchema):
            self._change(path, old, new)
            return True, _bytes_to_str
        if isinstance(old, EnumSchema) and isinstance(new, EnumSchema):
            if set(old.values) <= set(new.values):
                self._change(path, old, new)
                return True, None
            return self._refuse(path, old, new, "values were removed")
        if isinstance(old, ListSchema) and isinstance(new, ListSchema):
            if old.container != new.container:
                return self._refuse(path, old, new)
            ok, conv = self.schemas(old.item, new.item, path + "[]", lenient=lenient)
            return ok, None if conv is None else _list_of(conv)
        if isinstance(old, TupleSchema) and isinstance(new, TupleSchema):
            return self._tuple(old, new, path, lenient)
        if isinstance(old, DictSchema) and isinstance(new, DictSchema):
            if old.key != new.key and not (lenient and isinstance(old.key, AnySchema)):
                return self._refuse(path, old, new, "a map's key type cannot change")
            ok, conv = self.schemas(old.value, new.value, path + "[]", lenient=lenient)
            return ok, None if conv is None else _dict_of(conv)
        if isinstance(old, RecordSchema) and isinstance(new, RecordSchema):
            return self._record(old, new, path, lenient or id(old) in self.v1_records)
        if isinstance(old, RefSchema) and isinstance(new, RefSchema):
            return True, None  # the enclosing record, compared already
        return self._refuse(path, old, new)

    def _change(self, path: str, old: TypeSchema, new: TypeSchema) -> None:
        self.changes.append(_at(path, f"{describe_schema(old)} → {describe_schema(new)}"))

    def _refuse(
        self, path: str, old: TypeSchema, new: TypeSchema, why: str = ""
    ) -> tuple[bool, None]:
        text = f"{describe_schema(old)} → {describe_schema(new)}"
        self.refused.append(_at(path, f"{text} ({why})" if why else text))
        return False, None

    def _quiet(
        self, old: TypeSchema, new: TypeSchema, lenient: bool
    ) -> tuple[bool, Converter | None, list[str]]:
        """Compare without reporting (a union member tried against another)."""
        saved = (self.changes, self.refused, self.notes)
        self.changes, self.refused, self.notes = [], [], []
        try:
            ok, conv = self.schemas(old, new, "", lenient=lenient)
            return ok, conv, self.changes
        finally:
            self.changes, self.refused, self.notes = saved

    def _union(
        self, old: TypeSchema, new: TypeSchema, path: str, lenient: bool
    ) -> tuple[bool, Converter | None]:
        old_members = old.types if isinstance(old, UnionSchema) else (old,)
        new_members = new.types if isinstance(new, UnionSchema) else (new,)
        targets: list[tuple[TypeSchema, Converter | None]] = []
        for member in old_members:
            found = None
            for candidate in new_members:  # the same type first, then a widening
                ok, conv, _ = self._quiet(member, candidate, lenient)
                if ok and (found is None or candidate == member):
                    found = (candidate, conv)
            if found is None:
                why = "None is no longer allowed" if isinstance(member, NoneSchema) else ""
                return self._refuse(path, old, new, why)
            targets.append((member, found[1]))
        self._change(path, old, new)
        if all(conv is None for _, conv in targets):
            return True, None
        return True, _dispatch(targets)

    def _tuple(
        self, old: TupleSchema, new: TupleSchema, path: str, lenient: bool
    ) -> tuple[bool, Converter | None]:
        if len(old.items) != len(new.items):
            return self._refuse(path, old, new, "a tuple's length cannot change")
        convs = []
        ok = True
        for i, (o, n) in enumerate(zip(old.items, new.items, strict=True)):
            item_ok, conv = self.schemas(o, n, f"{path}[{i}]", lenient=lenient)
            ok = ok and item_ok
            convs.append(conv)
        if not ok:
            return False, None
        if all(c is None for c in convs):
            return True, None
        return True, _tuple_of(convs)

    def _record(
        self, old: RecordSchema, new: RecordSchema, path: str, lenient: bool
    ) -> tuple[bool, Converter | None]:
        if lenient and id(old) in self.v1_records:
            old = _with_layout_of(old, new)
        here = path or new.name
        if old.name != new.name:
            self.notes.append(_at(path, f"record {old.name} is now {new.name}"))
        old_fields = {f.name: (i, f) for i, f in enumerate(old.fields)}
        new_names = {f.name for f in new.fields}
        ok = True
        direct = (old.tag_field, old.tag) == (new.tag_field, new.tag) or (
            not new.tag_field and not old.array_like
        )
        direct = direct and old.array_like == new.array_like
        moves: list[tuple[str, str, Converter | None]] = []  # (old wire, new wire, conversion)
        missing_from: int | None = None  # first new position whose field old data lacks
        for j, f in enumerate(new.fields):
            found = old_fields.get(f.name)
            field_path = f"{here}.{f.name}"
            if found is None:
                if f.required:
                    self.refused.append(f"{field_path}: added without a default")
                    ok = False
                else:
                    self.changes.append(f"{field_path}: added with a default")
                if missing_from is None:
                    missing_from = j
                continue
            i, o = found
            field_ok, conv = self.schemas(o.type, f.type, field_path, lenient=lenient)
            ok = ok and field_ok
            if new.array_like and missing_from is not None:
                self.refused.append(
                    f"{here}.{new.fields[missing_from].name}: added before {f.name} in an "
                    "array-like record (its fields are stored by position; add it at the end)"
                )
                ok = False
            if conv is not None or o.wire_name != f.wire_name or (old.array_like and i != j):
                direct = False
            moves.append((o.wire_name if not old.array_like else str(i), f.wire_name, conv))
        common = [f.name for f in old.fields if f.name in new_names]
        if common != [f.name for f in new.fields if f.name in old_fields]:
            self.notes.append(f"{here}: fields reordered")
        for f in old.fields:
            if f.name not in new_names:
                self.changes.append(f"{here}.{f.name}: removed")
                if old.array_like and old_fields[f.name][0] < len(new.fields):
                    direct = False
        if not ok:
            return False, None
        if direct:
            return True, None
        return True, _record_converter(old, new, moves)


def _at(path: str, text: str) -> str:
    """``text`` at ``path``; a path of containers only (``[]``) is the value itself."""
    if not path or path.startswith("["):
        return text
    return f"{path}: {text}"


def _with_layout_of(old: RecordSchema, new: RecordSchema) -> RecordSchema:
    """A version-1 record schema with the layout its text did not keep taken from ``new``
    (array-like, tag, wire names): the program's record is the checkpoint's in these."""
    wire = {f.name: f.encode_name for f in new.fields}
    fields = tuple(msgspec.structs.replace(f, encode_name=wire.get(f.name, "")) for f in old.fields)
    return RecordSchema(old.name, fields, new.array_like, new.tag_field, new.tag)


# -- conversions of decoded msgpack values --------------------------------------------------------


def _list_of(conv: Converter) -> Converter:
    def convert(x: Any, now: int) -> Any:
        return [conv(v, now) for v in x]

    return convert


def _dict_of(conv: Converter) -> Converter:
    def convert(x: Any, now: int) -> Any:
        return {k: conv(v, now) for k, v in x.items()}

    return convert


def _tuple_of(convs: list[Converter | None]) -> Converter:
    def convert(x: Any, now: int) -> Any:
        return [v if c is None else c(v, now) for c, v in zip(convs, x, strict=True)]

    return convert


def _ttl_kept(conv: Converter) -> Converter:
    def convert(x: Any, now: int) -> Any:
        return [x[0], conv(x[1], now)]

    return convert


def _ttl_off(conv: Converter | None) -> Converter:
    if conv is None:
        return lambda x, now: x[1]
    return lambda x, now: conv(x[1], now)


def _ttl_on(conv: Converter | None) -> Converter:
    if conv is None:
        return lambda x, now: [now, x]
    return lambda x, now: [now, conv(x, now)]


def _str_to_bytes(x: Any, now: int) -> Any:
    return x.encode("utf-8")


def _bytes_to_str(x: Any, now: int) -> Any:
    return bytes(x).decode("utf-8")


_TEMPORAL = (datetime.datetime, datetime.date, datetime.time, datetime.timedelta, str)


def _matches(schema: TypeSchema, x: Any) -> bool:
    """Whether a decoded msgpack value is one of ``schema`` (msgspec's unions hold at most one
    member of each msgpack kind, so the kind decides)."""
    if isinstance(schema, NoneSchema):
        return x is None
    if isinstance(schema, BoolSchema):
        return isinstance(x, bool)
    if isinstance(schema, IntSchema):
        return isinstance(x, int) and not isinstance(x, bool)
    if isinstance(schema, FloatSchema):
        return isinstance(x, float)
    if isinstance(schema, StrSchema):
        return isinstance(x, str)
    if isinstance(schema, BytesSchema):
        return isinstance(x, bytes | bytearray)
    if isinstance(schema, TemporalSchema):
        return isinstance(x, (*_TEMPORAL, decimal.Decimal, uuid.UUID))
    if isinstance(schema, EnumSchema):
        return x in schema.values
    if isinstance(schema, ListSchema | TupleSchema):
        return isinstance(x, list | tuple)
    if isinstance(schema, DictSchema):
        return isinstance(x, dict)
    if isinstance(schema, RecordSchema):
        if schema.array_like:
            return isinstance(x, list | tuple)
        if not isinstance(x, dict):
            return False
        return not schema.tag_field or x.get(schema.tag_field) == schema.tag
    return True


def _dispatch(targets: list[tuple[TypeSchema, Converter | None]]) -> Converter:
    def convert(x: Any, now: int) -> Any:
        for member, conv in targets:
            if _matches(member, x):
                return x if conv is None else conv(x, now)
        return x

    return convert


def _record_converter(
    old: RecordSchema, new: RecordSchema, moves: list[tuple[str, str, Converter | None]]
) -> Converter:
    """Old record data (a map by wire name, or an array) to new record data."""
    old_array, new_array = old.array_like, new.array_like
    skip = 1 if old_array and old.tag_field else 0
    new_tag = (new.tag_field, new.tag) if new.tag_field else None
    order = {f.wire_name: j for j, f in enumerate(new.fields)}

    def convert(x: Any, now: int) -> Any:
        out: dict[str, Any] = {}
        for source, target, conv in moves:
            if old_array:
                i = int(source) + skip
                if i >= len(x):
                    continue  # a trailing default the encoder left out
                v = x[i]
            else:
                if source not in x:
                    continue  # a default the encoder left out (omit_defaults)
                v = x[source]
            out[target] = v if conv is None else conv(v, now)
        if not new_array:
            if new_tag is not None:
                out[new_tag[0]] = new_tag[1]
            return out
        values: list[Any] = []
        wires = [wire for wire, _ in sorted(order.items(), key=lambda item: item[1])]
        for j, wire in enumerate(wires):
            if wire not in out:  # the rest take their defaults, if none of them is stored
                later = [w for w in wires[j + 1 :] if w in out]
                if later:
                    raise ValueError(
                        f"record {new.name}: field {wire!r} is not stored (its default was left "
                        f"out) but {later[0]!r}, after it, is: an array-like record needs both"
                    )
                break
            values.append(out[wire])
        return [new_tag[1], *values] if new_tag is not None else values

    return convert
