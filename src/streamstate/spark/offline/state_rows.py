"""What one checkpointed state looks like as rows of
:func:`~streamstate.spark.offline.reader.read_state`.

A keyed state's stored entries are ``(key, namespace, stored value)``; a timer queue's are
``(timestamp, key, namespace)``. :class:`StateLayout` turns them into rows of the state's
schema, the same on every backend:

========================================  ======================================================
state                                     columns
========================================  ======================================================
value, reducing, aggregating              ``key, namespace, value``
list                                      ``key, namespace, value`` (an array)
map                                       ``key, namespace, value`` (a map)
with time-to-live                         ``value`` is the user's value, typed as without TTL;
                                          entries expired at read time are left out (a list
                                          keeps its unexpired elements, a map its unexpired
                                          mappings). ``include_expired=True`` keeps everything
                                          and adds ``last_access`` (ms): a long, or an array
                                          (list) or map (map) of one timestamp per element
timer (``_timers.<service>.<domain>``)    ``key, namespace, timestamp, time_domain``
========================================  ======================================================

Keys and values of built-in serializers become Spark types (``long``, ``double``, ``boolean``,
``string``, ``binary``, arrays, maps, structs ``_1, _2, ...`` for tuples); anything else
(records, pickled values) becomes a JSON string. ``namespace`` is null for the default
namespace and a JSON string otherwise (a window is ``{"start": ..., "end": ...}``).

Expiry is the TTL decorator's rule (``last_access + ttl <= now``, saturating), judged against
one ``now`` for the whole read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

import msgspec

from streamstate.namespace import VoidNamespace

__all__ = [
    "TIMER_KIND",
    "StateLayout",
    "spark_type_of",
    "time_domain_of",
    "user_value_snapshot",
]

TIMER_KIND = "timer"
_LONG_MAX = (1 << 63) - 1

_SCALARS = {
    "int64": "long",
    "float64": "double",
    "bool": "boolean",
    "str": "string",
    "bytes": "binary",
}


def spark_type_of(snap: Any) -> str | None:
    """The Spark DDL type for values of a serializer snapshot, or None (JSON instead).

    >>> spark_type_of({"type": "list", "element": {"type": "str"}})
    'array<string>'
    >>> spark_type_of({"type": "struct", "class": "app:Order"}) is None
    True
    """
    if not isinstance(snap, dict):
        return None
    t = snap.get("type")
    if t in _SCALARS:
        return _SCALARS[t]
    if t == "optional":
        return spark_type_of(snap.get("inner"))
    if t == "list":
        inner = spark_type_of(snap.get("element"))
        return None if inner is None else f"array<{inner}>"
    if t == "dict":
        k, v = spark_type_of(snap.get("key")), spark_type_of(snap.get("value"))
        return None if k is None or v is None else f"map<{k},{v}>"
    if t == "tuple":
        fields = [spark_type_of(f) for f in snap.get("fields", ())]
        if not fields or any(f is None for f in fields):
            return None
        return "struct<" + ",".join(f"_{i + 1}:{f}" for i, f in enumerate(fields)) + ">"
    return None


def user_value_snapshot(snap: dict[str, Any]) -> dict[str, Any]:
    """The serializer snapshot of the values a function sees, from the one of what a state
    stores: a TTL state stores ``(last access, value)`` pairs (the value, every list element,
    every map value).

    >>> user_value_snapshot({"type": "ttl_value", "inner": {"type": "str"}})
    {'type': 'str'}
    >>> user_value_snapshot({"type": "list", "element": {"type": "ttl_value",
    ...                                                  "inner": {"type": "int64"}}})
    {'type': 'list', 'element': {'type': 'int64'}}
    """
    t = snap.get("type")
    if t == "ttl_value":
        return dict(snap["inner"])
    if t == "list" and snap.get("element", {}).get("type") == "ttl_value":
        return {**snap, "element": dict(snap["element"]["inner"])}
    if t == "dict" and snap.get("value", {}).get("type") == "ttl_value":
        return {**snap, "value": dict(snap["value"]["inner"])}
    return snap


def time_domain_of(timer_state: str) -> str:
    """``"event_time"`` or ``"processing_time"`` for a timer pseudo-state's name.

    >>> time_domain_of("_timers.user.event"), time_domain_of("_timers.window-timers.processing")
    ('event_time', 'processing_time')
    """
    return "event_time" if timer_state.rsplit(".", 1)[-1] == "event" else "processing_time"


def _json(value: Any) -> str:
    try:
        return msgspec.json.encode(value, enc_hook=_enc_hook).decode()
    except (TypeError, msgspec.EncodeError):
        return repr(value)


def _enc_hook(value: Any) -> Any:
    if hasattr(value, "start") and hasattr(value, "end"):
        return {"start": value.start, "end": value.end}
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    raise TypeError(f"cannot encode {type(value).__name__}")


def _to_spark(value: Any, ddl: str | None) -> Any:
    if ddl is None:
        return _json(value)
    if ddl.startswith("struct<") and isinstance(value, tuple | list):
        return {f"_{i + 1}": v for i, v in enumerate(value)}
    if ddl.startswith("array<struct<") and isinstance(value, list):
        return [_to_spark(v, ddl[6:-1]) for v in value]
    return value


def _namespace(namespace: Any) -> str | None:
    return None if isinstance(namespace, VoidNamespace) else _json(namespace)


@dataclasses.dataclass(frozen=True)
class StateLayout:
    """How the entries of one state become rows (see the module docstring).

    Parameters:
        name: the state (or timer pseudo-state) name.
        kind: ``value``, ``list``, ``map``, ``reducing``, ``aggregating`` or ``timer``.
        key_ddl: the Spark type of keys (None: JSON strings).
        value_ddl: the Spark type of the values a function sees (None: JSON strings).
        ttl: the state's time-to-live in ms, None without TTL.
        now: processing time (ms) at which TTL expiry is judged.
        include_expired: keep expired TTL entries and add their ``last_access``.
    """

    name: str
    kind: str
    key_ddl: str | None
    value_ddl: str | None
    ttl: int | None = None
    now: int = 0
    include_expired: bool = False
    #: the Spark type of ``last_access`` (kept expired TTL entries; None: JSON strings)
    access_ddl: str | None = None
    #: the serializer snapshot of what the state stores (TTL pairs included)
    stored_snapshot: dict[str, Any] | None = None

    @classmethod
    def of(
        cls,
        meta: dict[str, Any],
        key_snapshot: Any,
        *,
        now: int,
        include_expired: bool = False,
    ) -> StateLayout:
        """The layout of the state a snapshot file describes as ``meta`` (its header entry:
        name, kind, serializer snapshots, ttl)."""
        kind = str(meta.get("kind", "value"))
        ttl = meta.get("ttl")
        value_ddl = access_ddl = None
        if kind != TIMER_KIND:
            user = user_value_snapshot(meta["state_serializer"])
            value_ddl = spark_type_of(user)
            access_ddl = "long"
            if kind == "list":
                access_ddl = "array<long>"
            elif kind == "map":
                access_ddl = spark_type_of({**user, "value": {"type": "int64"}})
        return cls(
            name=str(meta["name"]),
            kind=kind,
            key_ddl=spark_type_of(key_snapshot),
            value_ddl=value_ddl,
            ttl=None if not ttl else int(ttl["ttl"]),
            now=now,
            include_expired=include_expired,
            access_ddl=access_ddl,
            stored_snapshot=meta.get("state_serializer"),
        )

    def schema(self) -> str:
        """The rows' schema as a DDL string."""
        key = f"key {self.key_ddl or 'string'}, namespace string"
        if self.kind == TIMER_KIND:
            return f"{key}, timestamp long, time_domain string"
        schema = f"{key}, value {self.value_ddl or 'string'}"
        if self.ttl is not None and self.include_expired:
            schema += f", last_access {self.access_ddl or 'string'}"
        return schema

    def _cutoff(self) -> int:
        """A stored value is expired iff its last access is ``<=`` this."""
        assert self.ttl is not None
        return self.now - self.ttl if self.now < _LONG_MAX else _LONG_MAX

    def rows(self, entries: Iterable[tuple[Any, Any, Any]]) -> Iterator[dict[str, Any]]:
        """Rows of a keyed state's ``(key, namespace, stored value)`` entries."""
        key_ddl, value_ddl = self.key_ddl, self.value_ddl
        if self.ttl is None:
            for key, namespace, value in entries:
                yield {
                    "key": _to_spark(key, key_ddl),
                    "namespace": _namespace(namespace),
                    "value": _to_spark(value, value_ddl),
                }
            return
        access_ddl = self.access_ddl
        for key, namespace, stored in entries:
            split = self._split(stored)
            if split is None:
                continue
            value, access = split
            row = {
                "key": _to_spark(key, key_ddl),
                "namespace": _namespace(namespace),
                "value": _to_spark(value, value_ddl),
            }
            if self.include_expired:
                row["last_access"] = _to_spark(access, access_ddl)
            yield row

    def _split(self, stored: Any) -> tuple[Any, Any] | None:
        """``(user value, last access)`` of a TTL state's stored value, without what expired
        (unless expired entries are kept); None when nothing is left."""
        cutoff = -1 << 64 if self.include_expired else self._cutoff()
        if stored is None:
            return None
        if self.kind == "list":
            live = [e for e in stored if e[0] > cutoff]
            if not live:
                return None
            return [e[1] for e in live], [e[0] for e in live]
        if self.kind == "map":
            live_map = {k: tv for k, tv in stored.items() if tv[0] > cutoff}
            if not live_map:
                return None
            return {k: tv[1] for k, tv in live_map.items()}, {
                k: tv[0] for k, tv in live_map.items()
            }
        if stored[0] <= cutoff:
            return None
        return stored[1], stored[0]

    def timer_rows(self, timers: Iterable[tuple[int, Any, Any]]) -> Iterator[dict[str, Any]]:
        """Rows of a timer queue's ``(timestamp, key, namespace)`` entries."""
        domain = time_domain_of(self.name)
        key_ddl = self.key_ddl
        for timestamp, key, namespace in timers:
            yield {
                "key": _to_spark(key, key_ddl),
                "namespace": _namespace(namespace),
                "timestamp": int(timestamp),
                "time_domain": domain,
            }
