"""State as a Spark data source (PySpark's Python Data Source API): the formats ``streamstate``
(one state of one operator, or its change feed) and ``streamstate-metadata`` (every state).

Spark calls a data source in three places: ``StateDataSource.schema`` and the reader's
``pushFilters`` / ``partitions`` in a Python worker of the driver while it plans the read (the
checkpoint's metadata and one file header are read there: an unknown state fails the plan), and
the reader's ``read`` in a Python worker of an executor, one per partition. A task needs nothing
of the program that wrote the checkpoint: it reads files and decodes them with serializers
rebuilt from the checkpoint (``layout.py``).

``streamstate.spark.register(spark)`` registers both formats in a session.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import msgspec
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualNullSafe,
    EqualTo,
    Filter,
    In,
    InputPartition,
)

from streamstate.keygroups import KeyGroupRange
from streamstate.spark.offline.catalog import CheckpointRef, open_checkpoint
from streamstate.spark.offline.changes import FEED_COLUMNS, change_batches
from streamstate.spark.offline.entries import KeyedStateFiles
from streamstate.spark.offline.keyed_rows import keyed_batches
from streamstate.spark.offline.layout import StateLayout
from streamstate.spark.offline.metadata import METADATA_SCHEMA, metadata_rows
from streamstate.spark.offline.operator_rows import OperatorStateLayout, operator_state_batches
from streamstate.spark.offline.options import ReadOptions, read_options
from streamstate.spark.offline.plan import FeedStep, ReadPartition, ReadPlan, plan_read

__all__ = [
    "METADATA_FORMAT",
    "STATE_FORMAT",
    "StateDataSource",
    "StateMetadataDataSource",
    "UnfilteredStateDataSource",
    "output_struct",
]

STATE_FORMAT = "streamstate"
METADATA_FORMAT = "streamstate-metadata"

#: the scalar key types whose filters narrow a read to key groups, and the Python type of keys
_KEY_TYPES = {"long": int, "string": str, "binary": bytes, "boolean": bool, "double": float}


def output_struct(plan: ReadPlan) -> Any:
    """The Spark ``StructType`` of a read's rows."""
    if plan.operator_state is not None:
        return OperatorStateLayout(plan.operator_state).struct()
    assert plan.keyed is not None
    layout = StateLayout(plan.keyed, now=plan.now, include_expired=plan.options.include_expired)
    return layout.struct(FEED_COLUMNS if plan.feed else ())


class StateDataSource(DataSource):
    """The ``streamstate`` format (docs/checkpoints/state-source.md): ``load(PATH)`` with
    ``state`` or ``operatorState`` and the other options of ``options.py``."""

    @classmethod
    def name(cls) -> str:
        return STATE_FORMAT

    def schema(self) -> Any:
        return output_struct(plan_read(read_options(self.options)))

    def reader(self, schema: Any) -> DataSourceReader:
        return StateReader(schema, read_options(self.options))


class UnfilteredStateDataSource(StateDataSource):
    """The ``streamstate`` format in a session whose ``spark.sql.python.filterPushdown.enabled``
    is off: the same rows, without narrowing a read to the key groups of a filter on ``key``."""

    def reader(self, schema: Any) -> DataSourceReader:
        return UnfilteredStateReader(schema, read_options(self.options))


class UnfilteredStateReader(DataSourceReader):
    """Reads the partitions of a :class:`~streamstate.spark.offline.plan.ReadPlan`."""

    def __init__(self, schema: Any, options: ReadOptions) -> None:
        self.plan = plan_read(options)
        expected = output_struct(self.plan)
        if schema != expected:
            raise ValueError(
                f"format {STATE_FORMAT!r} reads {options.state or options.operator_state!r} as "
                f"{expected.simpleString()}; the schema given is {schema.simpleString()} (leave "
                "the schema out)"
            )
        self.schema = schema
        #: the keys a filter allows (None: any)
        self.keys: list[Any] | None = None

    def partitions(self) -> Sequence[InputPartition]:
        return [InputPartition(msgspec.msgpack.encode(p)) for p in self.plan.partitions(self.keys)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from pyspark.sql.pandas.types import to_arrow_schema

        part = msgspec.msgpack.decode(partition.value, type=ReadPartition)
        arrow_schema = to_arrow_schema(self.schema, timezone="UTC")
        plan = self.plan
        if plan.operator_state is not None:
            cp = plan.checkpoint.open()
            layout = OperatorStateLayout(plan.operator_state)
            yield from operator_state_batches(cp, layout, part.subtask, arrow_schema)
            return
        only = None if part.only is None else frozenset(part.only)
        key_groups = KeyGroupRange(*part.key_groups)
        if part.step is not None:
            yield from self._changes(part.step, key_groups, only, arrow_schema)
            return
        assert plan.keyed is not None
        expired = plan.options.include_expired
        state = StateLayout(plan.keyed, now=plan.now, include_expired=expired)
        cp = plan.checkpoint.open()
        yield from keyed_batches(cp, plan.keyed, state, key_groups, arrow_schema, only)

    def _changes(
        self,
        step: FeedStep,
        key_groups: KeyGroupRange,
        only: frozenset[int] | None,
        arrow_schema: Any,
    ) -> Iterator[Any]:
        plan = self.plan
        expired = plan.options.include_expired
        cp = step.checkpoint.open()
        previous = None if step.previous is None else step.previous.open()
        sides: list[tuple[KeyedStateFiles, StateLayout] | None] = []
        for checkpoint, ref in ((previous, step.previous_state), (cp, step.state)):
            if checkpoint is None or ref is None:
                sides.append(None)
                continue
            files = KeyedStateFiles(checkpoint, ref, key_groups, only)
            sides.append((files, StateLayout(ref, now=plan.now, include_expired=expired)))
        if sides[0] is None and sides[1] is None:
            return
        yield from change_batches(cp.checkpoint_id, sides[0], sides[1], arrow_schema)


class StateReader(UnfilteredStateReader):
    """:class:`UnfilteredStateReader` that narrows a read to the key groups of a filter on
    ``key`` (``=``, ``IN``, ``<=>``); Spark still applies the filter to the rows."""

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:  # noqa: N802 - Spark's
        keys = key_filter_values(self.plan, filters)
        if keys is not None:
            self.keys = keys
        yield from filters  # Spark keeps them: a key group holds other keys too


def key_filter_values(plan: ReadPlan, filters: list[Filter]) -> list[Any] | None:
    """The only keys rows may have under ``filters`` (ANDed), when they can narrow the read:
    filters ``key = v``, ``key IN (...)``, ``key <=> v`` on a scalar key; None otherwise."""
    if plan.keyed is None:
        return None
    key_type = output_struct(plan)["key"].dataType.typeName()
    python_type = _KEY_TYPES.get(key_type)
    if python_type is None:
        return None
    allowed: set[Any] | None = None
    for f in filters:
        if not isinstance(f, EqualTo | EqualNullSafe | In) or f.attribute != ("key",):
            continue
        values = f.value if isinstance(f, In) else (f.value,)
        found = set()
        for v in values:
            if v is None:
                continue  # no key is null
            if python_type is float and type(v) is int:
                v = float(v)
            if isinstance(v, bytearray):
                v = bytes(v)
            if type(v) is not python_type:
                return None  # a literal of another type: not the keys' hash
            found.add(v)
        allowed = found if allowed is None else allowed & found
    return None if allowed is None else sorted(allowed, key=repr)


class StateMetadataDataSource(DataSource):
    """The ``streamstate-metadata`` format: ``load(PATH)``, options ``checkpointId`` and the
    storage options (docs/checkpoints/state-source.md)."""

    @classmethod
    def name(cls) -> str:
        return METADATA_FORMAT

    def schema(self) -> Any:
        return METADATA_SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return MetadataReader(read_options(self.options, format_name=METADATA_FORMAT))


class MetadataReader(DataSourceReader):
    """One partition: the rows of :func:`~streamstate.spark.offline.metadata.metadata_rows`."""

    def __init__(self, options: ReadOptions) -> None:
        given = [
            name
            for name, value in (
                ("state", options.state),
                ("operatorState", options.operator_state),
                ("readChangeFeed", options.read_change_feed or None),
            )
            if value is not None
        ]
        if given:
            raise ValueError(
                f"format {METADATA_FORMAT!r} lists every state of a checkpoint; it takes no "
                f"option {', '.join(given)} (read one state with format {STATE_FORMAT!r})"
            )
        cp = open_checkpoint(options)
        self.checkpoint = CheckpointRef.of(cp, options.storage_options)

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        yield from metadata_rows(self.checkpoint.open())
