"""Exceptions raised by streamstate.

Every error names what it is about (the state, key, key group, file or setting) so that a
user can act on it without a debugger (SPEC §12).
"""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "CheckpointFencedError",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "CorruptCheckpointError",
    "InvalidStateNameError",
    "KeyGroupOutOfRangeError",
    "KeyGroupPlacementError",
    "MaxParallelismMismatchError",
    "NoCurrentKeyError",
    "OutputSchemaError",
    "PickleNotAllowedError",
    "PreAggregationError",
    "RemoteError",
    "SerializerSnapshotError",
    "StateAccessError",
    "StateBackendError",
    "StateHostError",
    "StateMigrationException",
    "StreamStateError",
    "UndeclaredStateWarning",
    "UnsupportedKeyTypeError",
    "UnsupportedStateTypeError",
]


class StreamStateError(Exception):
    """Base class of every error raised by streamstate."""


class StateAccessError(StreamStateError, ValueError):
    """A state was used in a way its contract forbids (e.g. ``None`` added to a list state)."""


class InvalidStateNameError(StreamStateError, ValueError):
    """A state or operator name is empty, reserved, too long or unsafe as a file name."""


class NoCurrentKeyError(StreamStateError, RuntimeError):
    """Keyed state was accessed before a current key was set."""


class KeyGroupOutOfRangeError(StreamStateError, RuntimeError):
    """A key hashes to a key group that this backend does not own."""


class UnsupportedKeyTypeError(StreamStateError, TypeError):
    """A key has a type without a stable, process-independent hash."""


class UnsupportedStateTypeError(StreamStateError, TypeError):
    """A state descriptor names a type that streamstate cannot serialize (no typed serializer
    for it, and pickle is opt-in only)."""


class StateMigrationException(StreamStateError):
    """A restored state cannot be read with the serializer or kind the program now declares."""


class UndeclaredStateWarning(UserWarning):
    """A restored checkpoint holds keyed state the program no longer declares: it is carried
    into every later checkpoint, unread (the warning names each such state and its entries)."""


class PickleNotAllowedError(StateMigrationException):
    """A checkpoint needs pickle to be read but pickle was not explicitly enabled."""


class SerializerSnapshotError(StateMigrationException, TypeError):
    """A checkpoint describes a serializer this program cannot rebuild: an unknown type, a
    malformed description, or a record type whose module the program has not imported (a
    checkpoint never makes a program import code)."""


class PreAggregationError(StreamStateError, ValueError):
    """Pre-aggregation before the shuffle was asked for (``pre_aggregate=True``) where it cannot
    give the per-record results; the message says why (an evictor, a trigger that looks at
    elements, merging windows, ...)."""


class StateBackendError(StreamStateError, RuntimeError):
    """The state backend cannot work (directory locked or unwritable, disposed, ...)."""


class CheckpointError(StreamStateError, RuntimeError):
    """A checkpoint could not be written or read."""


class CheckpointMismatchError(CheckpointError):
    """The state checkpoint does not match the query's progress in Spark's checkpoint (a lost
    latest ``_metadata``, a replaced directory): the query refuses to run, and the message names
    the checkpoint, Spark's micro-batch and the rollback command."""


class CheckpointNotFoundError(CheckpointError):
    """No complete checkpoint exists where one was asked for."""


class CheckpointFencedError(CheckpointError):
    """Another run owns the job's checkpoints: a newer driver took over (a higher epoch), or a
    checkpoint this run meant to commit was already committed by another run. Nothing was
    written."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint file is truncated, has a bad checksum or is otherwise unreadable."""


class MaxParallelismMismatchError(CheckpointError):
    """A checkpoint was taken with a different max parallelism (number of key groups)."""


class KeyGroupPlacementError(CheckpointError):
    """A checkpoint's keys are not in the key groups this job would look for them in (a Spark
    job's integer key column of an older key group placement): restoring it would miss their
    state. The message names the checkpoint, the key column and the remedy
    (``streamstate checkpoints regroup``)."""


class OutputSchemaError(StreamStateError, ValueError):
    """A function produced output that does not match the declared output schema."""


class StateHostError(StreamStateError, RuntimeError):
    """A Spark task could not start or reach its subtask's state host, or the host failed."""


class RemoteError(StreamStateError, RuntimeError):
    """An error raised in another process (a Spark Connect server's micro-batch) whose class
    this process cannot rebuild; ``remote_type`` names it, the message carries its message."""

    def __init__(self, message: str, remote_type: str = "") -> None:
        super().__init__(message)
        self.remote_type = remote_type
