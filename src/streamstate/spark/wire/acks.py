"""A task's acknowledgement to the driver: one typed :class:`TaskAck` per subtask and step.

A ``mapInArrow`` task yields one row of :data:`ACK_SCHEMA`, whose one column is the encoded
ack (:func:`encode_ack`); the driver decodes the collected rows here, once
(:func:`decode_acks`). The driver's own delivery (a local master's pre-aggregated rows) makes
the same acks without a row. An ack carries the subtask's :class:`~streamstate.spark.wire.
results.BatchResult`, the task's timings, where the subtask's host is now, or instead of a
result the function's error as data (a deterministic error is not a failed task: the driver
raises it once, :func:`~streamstate.spark.failures.raise_function_error`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from streamstate.spark.wire.messages import ErrorReport, HostLocation
from streamstate.spark.wire.results import BatchResult

__all__ = ["ACK_COLUMN", "ACK_SCHEMA", "TaskAck", "TaskTimings", "decode_acks", "encode_ack"]

#: the Spark schema of acknowledgement rows: one encoded :class:`TaskAck` each
ACK_SCHEMA = "ack binary"
ACK_COLUMN = "ack"


class TaskTimings(msgspec.Struct, kw_only=True):
    """How the subtask's records reached its host, as the task (or the driver) saw it."""

    #: reaching the host (ms), starting it (ms; None: it was running) and streaming the
    #: records to it until its DONE (ms)
    connect_ms: float = 0.0
    spawn_ms: float | None = None
    stream_ms: float = 0.0
    #: how the host was reached: ``unix`` (its node), ``tcp`` (another node), ``fallback``
    #: (its last location could not be reached: a host on the task's node, reloading)
    route: str = ""
    #: why it fell back
    fallback: str | None = None
    #: the task's process and Spark's attempt number of the task (None: the driver's delivery)
    worker_pid: int | None = None
    attempt_number: int | None = None
    #: the driver's delivery of this subtask's rows, all tries (ms; None: a task)
    deliver_ms: float | None = None


class TaskAck(msgspec.Struct, kw_only=True):
    """One subtask's acknowledgement of one step: its result, or the function's error."""

    subtask: int
    result: BatchResult | None = None
    timings: TaskTimings = msgspec.field(default_factory=TaskTimings)
    #: where the subtask's host is now (None: no host, batch mode)
    location: HostLocation | None = None
    error: ErrorReport | None = None


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(TaskAck).decode


def encode_ack(ack: TaskAck) -> bytes:
    """An ack as the task's row carries it."""
    return _encode(ack)


def decode_acks(rows: Iterable[Any]) -> list[TaskAck]:
    """The acks of collected :data:`ACK_SCHEMA` rows (Spark ``Row`` s, or dicts)."""
    return [_decode(row[ACK_COLUMN]) for row in rows]
