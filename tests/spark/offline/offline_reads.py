"""Reading a checkpoint through the state formats without Spark: the reader Spark would run,
called here (planning, filters, partitions, each partition's ``read``), rows as dicts."""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import In

from streamstate.spark.offline.options import read_options
from streamstate.spark.offline.plan import plan_read
from streamstate.spark.offline.source import (
    MetadataReader,
    StateReader,
    output_struct,
)


def state_reader(path: str, **options: Any) -> StateReader:
    """The reader of format ``streamstate`` for ``load(path)`` with Spark-named ``options``."""
    opts = read_options({"path": path, **{k: str(v) for k, v in options.items()}})
    return StateReader(output_struct(plan_read(opts)), opts)


def read_rows(path: str, *, keys: list[Any] | None = None, **options: Any) -> list[dict[str, Any]]:
    """Every row format ``streamstate`` gives (``keys``: as filtered by ``key IN keys``)."""
    reader = state_reader(path, **options)
    if keys is not None:
        list(reader.pushFilters([In(("key",), tuple(keys))]))
    return [
        row
        for partition in reader.partitions()
        for batch in reader.read(partition)
        for row in batch.to_pylist()
    ]


def metadata_rows(path: str, **options: Any) -> list[dict[str, Any]]:
    """The rows of format ``streamstate-metadata``, as dicts."""
    from streamstate.spark.offline.metadata import METADATA_SCHEMA

    opts = read_options({"path": path, **{k: str(v) for k, v in options.items()}})
    reader = MetadataReader(opts)
    names = METADATA_SCHEMA.fieldNames()
    return [dict(zip(names, row, strict=True)) for row in reader.read(None)]  # type: ignore[arg-type]


def plain(value: Any) -> Any:
    """A row value with maps as dicts (Arrow gives a map as a list of pairs)."""
    if (
        isinstance(value, list)
        and value
        and all(isinstance(v, tuple) and len(v) == 2 for v in value)
    ):
        return {k: plain(v) for k, v in value}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value
