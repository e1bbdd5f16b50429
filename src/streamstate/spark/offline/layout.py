"""What one checkpointed keyed state (or timer queue) looks like as rows of the ``streamstate``
format, the same on every backend.

A state's stored entries are ``(key, namespace, stored value)``; a timer queue's are ``(key,
namespace, timestamp)``. ``StateLayout`` decodes them with serializers rebuilt from the
checkpoint alone (``serializers/plain.py``: no class of the program is needed) and
turns them into columns:

========================================  ======================================================
state                                     columns
========================================  ======================================================
value, reducing, aggregating              ``key, namespace, value``
list                                      ``key, namespace, value`` (an array)
map                                       ``key, namespace, value`` (a map)
with time-to-live                         ``value`` is the user's value, typed as without TTL;
                                          entries expired at ``now`` are left out (a list keeps
                                          its unexpired elements, a map its unexpired mappings).
                                          ``includeExpired`` keeps everything and adds
                                          ``last_access`` (ms): a long, or an array (list) or
                                          map (map) of one timestamp per element
timer (``_timers.<service>.<domain>``)    ``key, namespace, timestamp, time_domain``
========================================  ======================================================

Keys, namespaces and values have the Spark types of :mod:`~streamstate.spark.offline.spark_types`
(records are structs); ``namespace`` is null for the default namespace, a window is
``struct<start: bigint, end: bigint>``. Expiry is the TTL decorator's rule (``last_access + ttl
<= now``, saturating), judged against one ``now`` for the whole read.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pyspark.sql.types import StringType, StructField, StructType

from streamstate.format.meta import TIMER_STATE_KIND
from streamstate.namespace import VoidNamespace
from streamstate.serializers.base import TypeSerializer
from streamstate.serializers.plain import plain_serializer_from_snapshot, readable_schema
from streamstate.serializers.schema import (
    DictSchema,
    IntSchema,
    ListSchema,
    StrSchema,
    TypeSchema,
)
from streamstate.spark.offline.catalog import KeyedStateRef
from streamstate.spark.offline.spark_types import arrow_array, spark_type

__all__ = ["Column", "StateLayout", "time_domain_of", "user_value_snapshot"]

_LONG_MAX = (1 << 63) - 1


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


class Column:
    """One output column: its name, its values' schema (None: a string column of nulls, the
    default namespace) and its Spark type."""

    __slots__ = ("data_type", "name", "schema")

    def __init__(self, name: str, schema: TypeSchema | None) -> None:
        self.name = name
        self.schema = schema
        self.data_type = StringType() if schema is None else spark_type(schema)

    @property
    def field(self) -> Any:
        return StructField(self.name, self.data_type)

    def array(self, values: list[Any], arrow_type: Any) -> Any:
        import pyarrow as pa

        if self.schema is None:
            return pa.nulls(len(values), arrow_type)
        return arrow_array(values, self.schema, arrow_type)


class StateLayout:
    """How the entries of one keyed state or timer queue become rows (module docstring).

    Parameters:
        ref: the state as the checkpoint describes it.
        now: processing time (ms) at which TTL expiry is judged.
        include_expired: keep expired TTL entries and add their ``last_access``.
    """

    def __init__(self, ref: KeyedStateRef, *, now: int, include_expired: bool = False) -> None:
        meta = ref.meta
        self.name = meta.name
        self.kind = meta.kind
        self.ttl: int | None = int(meta.ttl["ttl"]) if meta.ttl else None
        self.now = now
        self.include_expired = include_expired
        self.key_serializer = plain_serializer_from_snapshot(ref.key_serializer)
        self.namespace_serializer = plain_serializer_from_snapshot(meta.namespace_serializer)
        #: reads what the state stores (TTL pairs included)
        self.state_serializer: TypeSerializer[Any] = plain_serializer_from_snapshot(
            meta.state_serializer
        )
        void = meta.namespace_serializer.get("type") == "void_namespace"
        key = Column("key", readable_schema(ref.key_serializer))
        namespace = Column(
            "namespace", None if void else readable_schema(meta.namespace_serializer)
        )
        self.entry_columns = [key, namespace]
        if self.is_timer:
            self.value_columns = [
                Column("timestamp", IntSchema()),
                Column("time_domain", StrSchema()),
            ]
            return
        value = readable_schema(user_value_snapshot(meta.state_serializer))
        self.value_columns = [Column("value", value)]
        if self.ttl is not None and include_expired:
            access: TypeSchema = IntSchema()
            if isinstance(value, ListSchema):
                access = ListSchema(IntSchema())
            elif isinstance(value, DictSchema):
                access = DictSchema(value.key, IntSchema())
            self.value_columns.append(Column("last_access", access))

    @property
    def is_timer(self) -> bool:
        return self.kind == TIMER_STATE_KIND

    @property
    def columns(self) -> list[Column]:
        return [*self.entry_columns, *self.value_columns]

    def struct(self, prefix: Iterable[Column] = ()) -> Any:
        """The rows' schema, a Spark ``StructType`` (``prefix`` columns first)."""
        return StructType([c.field for c in [*prefix, *self.columns]])

    def _cutoff(self) -> int:
        """A stored value is expired iff its last access is ``<=`` this."""
        if self.include_expired:
            return -(1 << 64)
        assert self.ttl is not None
        return self.now - self.ttl if self.now < _LONG_MAX else _LONG_MAX

    def visible(self, stored: Any) -> tuple[Any, ...] | None:
        """The value columns of one stored state: ``(value,)``, with TTL and expired entries
        kept ``(value, last_access)``, without what expired (unless expired entries are
        kept); a timer's ``(timestamp, time_domain)``. None when nothing is left."""
        if self.is_timer:
            return (stored, time_domain_of(self.name))
        if self.ttl is None:
            return None if stored is None else (stored,)
        shown = self._unexpired(stored)
        if shown is None or self.include_expired:
            return shown
        return shown[:1]

    def _unexpired(self, stored: Any) -> tuple[Any, Any] | None:
        """``(value, last_access)`` of a TTL state's stored value without what expired."""
        if stored is None:
            return None
        cutoff = self._cutoff()
        if self.kind == "list":
            live = [e for e in stored if e[0] > cutoff]
            return ([e[1] for e in live], [e[0] for e in live]) if live else None
        if self.kind == "map":
            live_map = {k: tv for k, tv in stored.items() if tv[0] > cutoff}
            if not live_map:
                return None
            return (
                {k: tv[1] for k, tv in live_map.items()},
                {k: tv[0] for k, tv in live_map.items()},
            )
        if stored[0] <= cutoff:
            return None
        return stored[1], stored[0]

    def namespace_value(self, namespace: Any) -> Any:
        """A namespace as its column holds it (None for the default namespace)."""
        return None if isinstance(namespace, VoidNamespace) else namespace

    def rows(
        self, keys: list[Any], namespaces: list[Any], states: list[Any]
    ) -> tuple[list[Any], list[Any], list[list[Any]]]:
        """``(keys, namespaces, value columns)`` of decoded entries, without those
        :meth:`visible` leaves out. ``namespaces`` has one per key, or one for all."""
        if len(namespaces) == 1 and len(keys) != 1:
            ns_column = [self.namespace_value(namespaces[0])] * len(keys)
        else:
            void = VoidNamespace
            ns_column = [None if isinstance(n, void) else n for n in namespaces]
        if self.ttl is None and not self.is_timer:
            return keys, ns_column, [states]
        out_k, out_n, out_v = [], [], []
        for k, n, s in zip(keys, ns_column, states, strict=True):
            shown = self.visible(s)
            if shown is not None:
                out_k.append(k)
                out_n.append(n)
                out_v.append(shown)
        return out_k, out_n, self.value_lists(out_v)

    def value_lists(self, rows: Sequence[tuple[Any, ...] | None]) -> list[list[Any]]:
        """Rows of value columns (None: a row without values, a delete) as columns."""
        return [
            [None if row is None else row[i] for row in rows]
            for i in range(len(self.value_columns))
        ]

    def batch(
        self,
        arrow_schema: Any,
        keys: list[Any],
        namespaces: list[Any],
        values: list[list[Any]],
        prefix: list[tuple[Column, list[Any]]] = (),  # type: ignore[assignment]
    ) -> Any:
        """An Arrow record batch of ``arrow_schema`` (the Arrow form of :meth:`struct`) from
        columns: keys, namespaces, one list per value column (``prefix``: leading columns with
        their values)."""
        import pyarrow as pa

        columns: list[tuple[Column, list[Any]]] = [
            *prefix,
            (self.entry_columns[0], keys),
            (self.entry_columns[1], namespaces),
            *zip(self.value_columns, values, strict=True),
        ]
        arrays = [
            column.array(data, field.type)
            for (column, data), field in zip(columns, arrow_schema, strict=True)
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)
