"""How a serializer relates to the snapshot a checkpoint holds, and snapshots in the user's words.

:class:`Compatibility` is the outcome of comparing the serializer a program declares with the
snapshot of the one that wrote a checkpoint (SPEC §2.4, §14.1); :func:`describe_snapshot` names
the type a snapshot describes as a Python type hint, records with their fields, for messages.
Both are below the serializers themselves, so that the rules of schema evolution
(:mod:`~streamstate.serializers.evolution`) and the serializers
(:mod:`~streamstate.serializers.base`) share them.
"""

from __future__ import annotations

import enum
from typing import Any

from streamstate.serializers.schema import describe_schema
from streamstate.serializers.snapshot_schema import schema_of_snapshot

__all__ = ["Compatibility", "describe_snapshot"]


class Compatibility(enum.Enum):
    """How a new serializer relates to the one that wrote a checkpoint."""

    COMPATIBLE_AS_IS = "compatible_as_is"
    COMPATIBLE_AFTER_MIGRATION = "compatible_after_migration"
    INCOMPATIBLE = "incompatible"

    @property
    def is_incompatible(self) -> bool:
        return self is Compatibility.INCOMPATIBLE

    @property
    def is_compatible_as_is(self) -> bool:
        return self is Compatibility.COMPATIBLE_AS_IS


_TYPE_WORDS = {
    "void_namespace": "no namespace",
    "time_window": "TimeWindow",
    "global_window": "GlobalWindow",
    "pickle": "any value (PickleSerializer)",
    "restored": "a checkpointed serializer",
}


def describe_snapshot(snap: Any) -> str:
    """A serializer snapshot in the words of Python types, records with their fields, for
    messages (a serializer's repr never reaches the user).

    >>> describe_snapshot({"type": "int64", "version": 1})
    'int'
    >>> describe_snapshot({"type": "dict", "key": {"type": "str"},
    ...                    "value": {"type": "optional", "inner": {"type": "float64"}}})
    'dict[str, float | None]'
    >>> describe_snapshot({"type": "ttl_value", "inner": {"type": "struct", "class": "app:Visit",
    ...     "schema": {"kind": "record", "name": "Visit",
    ...                "fields": [{"name": "page", "type": {"kind": "str"}}]}}})
    'Visit{page: str} with time-to-live'
    """
    if not isinstance(snap, dict):
        return repr(snap)
    t = snap.get("type")
    if t in _TYPE_WORDS:
        return _TYPE_WORDS[str(t)]
    if t == "ttl_value":
        return f"{describe_snapshot(snap.get('inner'))} with time-to-live"
    if t == "list":
        return f"list[{describe_snapshot(snap.get('element'))}]"
    if t == "dict":
        return f"dict[{describe_snapshot(snap.get('key'))}, {describe_snapshot(snap.get('value'))}]"
    if t == "optional":
        return f"{describe_snapshot(snap.get('inner'))} | None"
    if t == "tuple":
        return f"tuple[{', '.join(describe_snapshot(f) for f in snap.get('fields', ()))}]"
    schema = schema_of_snapshot(snap)
    if schema is not None:
        return describe_schema(schema)
    if t == "struct":
        qual = str(snap.get("class", "")).partition(":")[2]
        return qual.rsplit(".", 1)[-1] or "a record type"
    return f"{t} serializer"
