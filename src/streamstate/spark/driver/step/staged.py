"""The staged outputs a committed checkpoint records, read back as the checkpoint gives them.

A step's outputs (and each side output's) are Parquet files the subtasks staged below
``outputs/`` of the job directory; the checkpoint that commits the step lists them in its
``_metadata`` properties, so that a replay or a query taking over hands the same files to the
sinks. Those properties come from the checkpoint, which the driver does not trust to name only
its own files: every path must be a plain name below ``outputs/``
(:func:`streamstate.format.names.name_below`), else the checkpoint is reported corrupt.
"""

from __future__ import annotations

from typing import Any

import msgspec

from streamstate.errors import CorruptCheckpointError
from streamstate.format.names import name_below
from streamstate.spark.subtask import OUTPUTS_DIR
from streamstate.spark.wire.results import StagedOutput

__all__ = ["staged_outputs", "staged_side_outputs"]


def _staged(checkpoint: Any, values: Any, field: str) -> list[StagedOutput]:
    """The staged outputs a committed checkpoint's properties record under ``field``: each
    path a plain name below ``outputs/`` of the job directory (``streamstate.format.names``),
    else :class:`CorruptCheckpointError` naming the checkpoint and the field."""
    try:
        staged = msgspec.convert(values, list[StagedOutput])
    except msgspec.ValidationError as exc:
        raise CorruptCheckpointError(
            f"checkpoint {checkpoint.url}: {field} in _metadata is malformed ({exc})"
        ) from None
    for i, o in enumerate(staged):
        name_below(
            o.path, OUTPUTS_DIR, checkpoint=checkpoint.url, file="_metadata", field=f"{field}[{i}]"
        )
    return staged


def staged_outputs(checkpoint: Any) -> list[StagedOutput]:
    """The outputs a committed checkpoint staged (its ``outputs`` property), checked."""
    return _staged(checkpoint, checkpoint.metadata.properties.get("outputs", []), "outputs")


def staged_side_outputs(checkpoint: Any) -> dict[str, list[StagedOutput]]:
    """The side outputs a committed checkpoint staged, per tag id, checked."""
    side = checkpoint.metadata.properties.get("side_outputs", {})
    if not isinstance(side, dict):
        raise CorruptCheckpointError(
            f"checkpoint {checkpoint.url}: side_outputs in _metadata is not a map"
        )
    return {
        str(tag): _staged(checkpoint, files, f"side_outputs[{tag!r}]")
        for tag, files in side.items()
    }
