"""What a subtask reports at the end of a step: its :class:`BatchResult`, with the outputs it
staged (:class:`StagedOutput`).

A state host sends it in its DONE message (:mod:`streamstate.spark.wire.messages`), the task
hands it on in its acknowledgement (:mod:`streamstate.spark.wire.acks`), and the driver commits
the step from every subtask's result; batch mode's savepoint tasks report the same. The staged
outputs' paths are also committed in the checkpoint's properties, as plain data.
"""

from __future__ import annotations

from typing import Any

import msgspec

from streamstate.backends.figures import StateFigures
from streamstate.checkpoint.metadata import SubtaskStateHandle

__all__ = ["BatchResult", "StagedOutput"]


class StagedOutput(msgspec.Struct, kw_only=True):
    """One subtask's staged outputs of one batch (a Parquet file in checkpoint storage)."""

    #: relative to the job's checkpoint directory
    path: str
    size: int
    rows: int


class BatchResult(msgspec.Struct, kw_only=True):
    """What a subtask reports at the end of a batch (the acknowledgement the driver collects)."""

    subtask: int
    batch: int
    #: the state version the subtask now holds (== batch)
    version: int
    attempt: int
    #: the files of chk-<batch> (or of the savepoint)
    handle: SubtaskStateHandle
    outputs: StagedOutput | None = None
    rows: int = 0
    output_rows: int = 0
    #: largest event time of the batch's records (ms), None without event time or records
    max_event_time: int | None = None
    restore: str = ""
    stats: dict[str, float] = {}
    #: side-output tag id -> its staged outputs (only the tags the job declares)
    side_outputs: dict[str, StagedOutput] = {}
    #: values emitted to side outputs the job does not declare (dropped)
    side_outputs_dropped: int = 0
    #: late elements the window operator dropped in this batch (no late-data side output)
    late_records_dropped: int = 0
    #: the subtask's earliest pending event-time and processing-time timers after the batch
    #: (None: none): the driver runs a no-data micro-batch when one is due
    #: (streamstate.spark.driver.step.no_data)
    event_timer: int | None = None
    processing_timer: int | None = None
    #: pre-aggregated rows received (SPEC §13.2; ``rows`` counts the records they fold)
    partials: int = 0
    #: the keyed backend's figures after the checkpoint (rows, changes, bytes)
    state: StateFigures | None = None
    #: timers pending after the batch, and timers the batch fired
    timers: int = 0
    timers_fired: int = 0
    #: bytes of the files this checkpoint wrote, and of every file it references (the
    #: subtask's whole checkpointed state)
    checkpoint_bytes: int = 0
    checkpoint_full_bytes: int = 0
    #: resident memory of the process that holds the state (the state host), None if unknown
    memory_bytes: int | None = None
    #: the latency and size histograms of the backend's metrics decorators (only with
    #: ``latency_tracking`` / ``size_tracking`` on): ``streamstate.metrics.report_rows``
    state_metrics: list[dict[str, Any]] = []
