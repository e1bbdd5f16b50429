"""The ``streamstate-metadata`` format: one row per state of every operator of a checkpoint.

========================  =====================================================================
column                    meaning
========================  =====================================================================
``checkpoint_id``         the checkpoint (or savepoint) read
``operator``              the operator's name
``state``                 the state's name (``option("state", ...)`` or, for an operator state,
                          ``option("operatorState", ...)`` of the ``streamstate`` format)
``kind``                  ``value``, ``list``, ``map``, ``reducing``, ``aggregating``,
                          ``timers``, ``operator_list``, ``union_list`` or ``broadcast``
``key_type``              Spark type (DDL) of the ``key`` column (null for an operator list)
``namespace_type``        Spark type of ``namespace`` (null: the default namespace only)
``value_type``            Spark type of ``value`` (of ``timestamp`` for timers)
``ttl_ms``                the time-to-live in milliseconds, null without
``parallelism``           the operator's parallelism in the checkpoint
``max_parallelism``       its number of key groups
``entries``               the entries of a keyed state when the checkpoint was taken, by the one
                          count of ``streamstate.format.entries`` (the figure of
                          ``numRowsTotal`` and ``streamstate checkpoints inspect``); null for
                          timers, operator states, and checkpoints written before the
                          subtasks recorded their counts
========================  =====================================================================
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from streamstate.checkpoint.metadata import OperatorMetadata
from streamstate.checkpoint.storage import CompletedCheckpoint
from streamstate.format.meta import TIMER_STATE_KIND
from streamstate.serializers.plain import readable_schema
from streamstate.spark.offline.catalog import KeyedStateRef, checkpoint_states
from streamstate.spark.offline.layout import user_value_snapshot
from streamstate.spark.offline.operator_rows import OPERATOR_STATE_KINDS
from streamstate.spark.offline.spark_types import spark_ddl

__all__ = ["METADATA_SCHEMA", "metadata_rows"]

METADATA_SCHEMA = StructType(
    [
        StructField("checkpoint_id", LongType()),
        StructField("operator", StringType()),
        StructField("state", StringType()),
        StructField("kind", StringType()),
        StructField("key_type", StringType()),
        StructField("namespace_type", StringType()),
        StructField("value_type", StringType()),
        StructField("ttl_ms", LongType()),
        StructField("parallelism", IntegerType()),
        StructField("max_parallelism", IntegerType()),
        StructField("entries", LongType()),
    ]
)
"""The columns of the ``streamstate-metadata`` format (module docstring)."""


def _ddl(snapshot: Any) -> str:
    return spark_ddl(readable_schema(snapshot))


def _entries(op: OperatorMetadata, state: str) -> int | None:
    """The entries of ``state`` the subtasks of ``op`` recorded (None if one did not)."""
    total = 0
    for sub in op.subtasks:
        if sub.entries is None:
            return None
        total += sub.entries.get(state, 0)
    return total


def metadata_rows(cp: CompletedCheckpoint) -> Iterator[tuple[Any, ...]]:
    """The rows of the metadata format, in the order of :data:`METADATA_SCHEMA`."""
    for op, ref in checkpoint_states(cp):
        head = (cp.checkpoint_id, op.name)
        tail = (op.parallelism, op.max_parallelism)
        if isinstance(ref, KeyedStateRef):
            meta = ref.meta
            timers = meta.kind == TIMER_STATE_KIND
            void = meta.namespace_serializer.get("type") == "void_namespace"
            value = "bigint" if timers else _ddl(user_value_snapshot(meta.state_serializer))
            yield (
                *head,
                meta.name,
                "timers" if timers else meta.kind,
                _ddl(ref.key_serializer),
                None if void else _ddl(meta.namespace_serializer),
                value,
                int(meta.ttl["ttl"]) if meta.ttl else None,
                *tail,
                None if timers else _entries(op, meta.name),
            )
            continue
        serializers = ref.serializers
        broadcast = ref.mode == "broadcast"
        yield (
            *head,
            ref.name,
            OPERATOR_STATE_KINDS.get(ref.mode, ref.mode),
            _ddl(serializers["key_serializer"]) if broadcast else None,
            None,
            _ddl(serializers["value_serializer" if broadcast else "element_serializer"]),
            None,
            *tail,
            None,
        )
