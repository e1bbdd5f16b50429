"""The rows of one operator state (operator list, union list or broadcast state).

An operator state belongs to a subtask, not to a key; each old subtask's operator-state file holds
its copy. One row per list element or broadcast mapping, decoded with serializers rebuilt from the
file's header alone:

=========================================  ==================================================
state                                      columns
=========================================  ==================================================
operator list, union list                  ``subtask, index, value`` (one row per element, in
                                           the subtask's order)
broadcast                                  ``subtask, key, value`` (one row per mapping of
                                           each subtask's copy)
=========================================  ==================================================
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
from pyspark.sql.types import StructType

from streamstate.checkpoint.operator_format import OperatorStateReader
from streamstate.checkpoint.restore import operator_metadata
from streamstate.checkpoint.storage import CompletedCheckpoint
from streamstate.errors import CorruptCheckpointError
from streamstate.serializers.plain import plain_serializer_from_snapshot, readable_schema
from streamstate.serializers.schema import IntSchema
from streamstate.spark.offline.catalog import OperatorStateRef
from streamstate.spark.offline.layout import Column

__all__ = ["OPERATOR_STATE_KINDS", "OperatorStateLayout", "operator_state_batches"]

OPERATOR_STATE_KINDS = {
    "split_distribute": "operator_list",
    "union": "union_list",
    "broadcast": "broadcast",
}
"""The kind (as the metadata format names it) of each operator-state mode."""

_ENCODER = msgspec.msgpack.Encoder()


class OperatorStateLayout:
    """How one operator state's elements (or mappings) become rows (module docstring)."""

    def __init__(self, ref: OperatorStateRef) -> None:
        self.ref = ref
        self.is_broadcast = ref.mode == "broadcast"
        if self.is_broadcast:
            key, value = ref.serializers["key_serializer"], ref.serializers["value_serializer"]
            self.columns = [
                Column("subtask", IntSchema()),
                Column("key", readable_schema(key)),
                Column("value", readable_schema(value)),
            ]
            self.decoders = [
                plain_serializer_from_snapshot(key),
                plain_serializer_from_snapshot(value),
            ]
        else:
            element = ref.serializers["element_serializer"]
            self.columns = [
                Column("subtask", IntSchema()),
                Column("index", IntSchema()),
                Column("value", readable_schema(element)),
            ]
            self.decoders = [plain_serializer_from_snapshot(element)]

    def struct(self) -> Any:
        return StructType([c.field for c in self.columns])

    def decode(self, items: list[bytes], which: int, where: str) -> list[Any]:
        """Encoded elements (keys: ``which`` 0, values: 1) decoded in one call."""
        serializer = self.decoders[which]
        try:
            values = msgspec.msgpack.decode(
                _ENCODER.encode([msgspec.Raw(b) for b in items]),
                type=list[serializer.wire_type],  # type: ignore[name-defined]
            )
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise CorruptCheckpointError(
                f"{where}: operator state {self.ref.name!r} holds a value that does not read as "
                f"its serializer's ({exc})"
            ) from None
        return values if serializer.wire_native else [serializer.from_wire(v) for v in values]


def operator_state_batches(
    checkpoint: CompletedCheckpoint, layout: OperatorStateLayout, subtask: int, arrow_schema: Any
) -> Iterator[Any]:
    """The rows of old subtask ``subtask``'s copy of the state, one record batch."""
    import pyarrow as pa

    op = operator_metadata(checkpoint, layout.ref.operator)
    handle = op.subtasks[subtask].operator_state
    if handle is None:
        return
    path = checkpoint.resolve(handle.path)
    url = checkpoint.storage.url_of(path)
    data = checkpoint.storage.read_bytes(path)
    if len(data) != handle.size:
        raise CorruptCheckpointError(
            f"corrupt checkpoint file {url}: it has {len(data)} bytes but the checkpoint "
            f"metadata says {handle.size}"
        )
    reader = OperatorStateReader(data, url)
    if not any(m["name"] == layout.ref.name for m in reader.states):
        return
    items = reader.read_encoded(layout.ref.name)
    if layout.is_broadcast:
        columns = [layout.decode(items[0::2], 0, url), layout.decode(items[1::2], 1, url)]
    else:
        columns = [list(range(len(items))), layout.decode(items, 0, url)]
    n = len(columns[0])
    if not n:
        return
    data_columns = [[subtask] * n, *columns]
    arrays = [
        column.array(values, field.type)
        for column, values, field in zip(layout.columns, data_columns, arrow_schema, strict=True)
    ]
    yield pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)
