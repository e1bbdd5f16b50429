"""State time-to-live configuration (SPEC §8).

The configuration object only; the behaviour lives in the TTL state decorator. Names follow
PyFlink (``StateTtlConfig.new_builder(Time.seconds(1)).set_update_type(...)...build()``), and a
plain constructor is available too.
"""

from __future__ import annotations

import dataclasses
import enum
from datetime import timedelta
from typing import Any

__all__ = ["StateTtlConfig", "Time", "TtlTimeCharacteristic"]


class Time:
    """PyFlink-style durations, in milliseconds."""

    @staticmethod
    def milliseconds(n: int) -> int:
        """``n`` milliseconds."""
        return int(n)

    @staticmethod
    def seconds(n: float) -> int:
        """``n`` seconds, in ms."""
        return int(n * 1000)

    @staticmethod
    def minutes(n: float) -> int:
        """``n`` minutes, in ms."""
        return int(n * 60_000)

    @staticmethod
    def hours(n: float) -> int:
        """``n`` hours, in ms."""
        return int(n * 3_600_000)

    @staticmethod
    def days(n: float) -> int:
        """``n`` days, in ms."""
        return int(n * 86_400_000)


class TtlTimeCharacteristic(enum.Enum):
    """Which clock TTL uses; only processing time exists, as in Flink."""

    ProcessingTime = "processing_time"


def _to_millis(ttl: int | float | timedelta) -> int:
    if isinstance(ttl, timedelta):
        return int(ttl.total_seconds() * 1000)
    return int(ttl)


@dataclasses.dataclass(frozen=True)
class StateTtlConfig:
    """When a state value expires and how expired values are seen and cleaned up.

    ``ttl`` is in milliseconds (or a ``timedelta``). A value is expired once
    ``last_access + ttl <= now``.
    """

    class UpdateType(enum.Enum):
        """What refreshes a value's last-access timestamp."""

        Disabled = "disabled"
        OnCreateAndWrite = "on_create_and_write"
        OnReadAndWrite = "on_read_and_write"

    class StateVisibility(enum.Enum):
        """Whether an expired value that is still stored may be returned."""

        ReturnExpiredIfNotCleanedUp = "return_expired_if_not_cleaned_up"
        NeverReturnExpired = "never_return_expired"

    ttl: int
    update_type: StateTtlConfig.UpdateType = UpdateType.OnCreateAndWrite
    state_visibility: StateTtlConfig.StateVisibility = StateVisibility.NeverReturnExpired
    ttl_time_characteristic: TtlTimeCharacteristic = TtlTimeCharacteristic.ProcessingTime
    #: drop expired entries when a full snapshot is written; off unless asked for, as in Flink
    #: (``StateTtlConfig.Builder.cleanupFullSnapshot()``)
    cleanup_full_snapshot: bool = False
    #: heap backend: entries visited per state access (0 disables incremental cleanup)
    cleanup_size: int = 5
    #: heap backend: also run an incremental cleanup step for every processed record
    run_cleanup_for_every_record: bool = False
    #: rocksdb backend: at most this many entries swept per checkpoint (0 disables)
    rocksdb_sweep_per_checkpoint: int = 1000

    def __post_init__(self) -> None:
        object.__setattr__(self, "ttl", _to_millis(self.ttl))
        if self.ttl <= 0:
            raise ValueError(f"StateTtlConfig.ttl must be > 0 ms, got {self.ttl}")
        if self.cleanup_size < 0:
            raise ValueError(f"StateTtlConfig.cleanup_size must be >= 0, got {self.cleanup_size}")
        if self.rocksdb_sweep_per_checkpoint < 0:
            raise ValueError(
                "StateTtlConfig.rocksdb_sweep_per_checkpoint must be >= 0, got "
                f"{self.rocksdb_sweep_per_checkpoint}"
            )

    @property
    def is_enabled(self) -> bool:
        """Whether values expire (``update_type`` is not ``Disabled``)."""
        return self.update_type is not StateTtlConfig.UpdateType.Disabled

    @staticmethod
    def new_builder(ttl: int | float | timedelta) -> StateTtlConfigBuilder:
        """A :class:`StateTtlConfigBuilder` for a time-to-live of ``ttl`` ms (or a
        ``timedelta``)."""
        return StateTtlConfigBuilder(_to_millis(ttl))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form, written into checkpoints."""
        return {
            "ttl": self.ttl,
            "update_type": self.update_type.value,
            "state_visibility": self.state_visibility.value,
            "cleanup_full_snapshot": self.cleanup_full_snapshot,
            "cleanup_size": self.cleanup_size,
            "run_cleanup_for_every_record": self.run_cleanup_for_every_record,
            "rocksdb_sweep_per_checkpoint": self.rocksdb_sweep_per_checkpoint,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StateTtlConfig:
        """The configuration :meth:`to_dict` wrote (into a checkpoint)."""
        return cls(
            ttl=d["ttl"],
            update_type=cls.UpdateType(d["update_type"]),
            state_visibility=cls.StateVisibility(d["state_visibility"]),
            cleanup_full_snapshot=d.get("cleanup_full_snapshot", False),
            cleanup_size=d.get("cleanup_size", 5),
            run_cleanup_for_every_record=d.get("run_cleanup_for_every_record", False),
            rocksdb_sweep_per_checkpoint=d.get("rocksdb_sweep_per_checkpoint", 1000),
        )


class StateTtlConfigBuilder:
    """PyFlink-style builder of :class:`StateTtlConfig`."""

    def __init__(self, ttl: int) -> None:
        self._kw: dict[str, Any] = {"ttl": ttl}

    def set_update_type(self, update_type: StateTtlConfig.UpdateType) -> StateTtlConfigBuilder:
        """When the last-access timestamp is refreshed (see :class:`StateTtlConfig`)."""
        self._kw["update_type"] = update_type
        return self

    def update_ttl_on_create_and_write(self) -> StateTtlConfigBuilder:
        """Refresh the timestamp on every write (the default)."""
        return self.set_update_type(StateTtlConfig.UpdateType.OnCreateAndWrite)

    def update_ttl_on_read_and_write(self) -> StateTtlConfigBuilder:
        """Refresh the timestamp on every write and every read of an unexpired value."""
        return self.set_update_type(StateTtlConfig.UpdateType.OnReadAndWrite)

    def set_state_visibility(
        self, visibility: StateTtlConfig.StateVisibility
    ) -> StateTtlConfigBuilder:
        """Whether an expired value still stored is returned (see :class:`StateTtlConfig`)."""
        self._kw["state_visibility"] = visibility
        return self

    def return_expired_if_not_cleaned_up(self) -> StateTtlConfigBuilder:
        """Return an expired value that is still stored (once; the read removes it)."""
        return self.set_state_visibility(StateTtlConfig.StateVisibility.ReturnExpiredIfNotCleanedUp)

    def never_return_expired(self) -> StateTtlConfigBuilder:
        """An expired value reads as absent (the default)."""
        return self.set_state_visibility(StateTtlConfig.StateVisibility.NeverReturnExpired)

    def set_ttl(self, ttl: int | float | timedelta) -> StateTtlConfigBuilder:
        """The time-to-live (ms or a ``timedelta``)."""
        self._kw["ttl"] = _to_millis(ttl)
        return self

    def cleanup_full_snapshot(self) -> StateTtlConfigBuilder:
        """Leave expired values out of full snapshots."""
        self._kw["cleanup_full_snapshot"] = True
        return self

    def disable_cleanup_in_background(self) -> StateTtlConfigBuilder:
        """No incremental cleanup (heap) and no sweep per checkpoint (RocksDB): expired values go
        only when read."""
        self._kw["cleanup_size"] = 0
        self._kw["rocksdb_sweep_per_checkpoint"] = 0
        return self

    def cleanup_incrementally(
        self, cleanup_size: int = 5, run_cleanup_for_every_record: bool = False
    ) -> StateTtlConfigBuilder:
        """Heap backend: check ``cleanup_size`` entries per state access (and per record with
        ``run_cleanup_for_every_record``)."""
        self._kw["cleanup_size"] = cleanup_size
        self._kw["run_cleanup_for_every_record"] = run_cleanup_for_every_record
        return self

    def cleanup_in_rocksdb_compact_filter(
        self, query_time_after_num_entries: int = 1000
    ) -> StateTtlConfigBuilder:
        # rocksdict exposes no compaction filter; the equivalent is a bounded sweep per checkpoint.
        """RocksDB backend: sweep at most this many entries per checkpoint (rocksdict has no
        compaction filter; this bounded sweep stands in for it)."""
        self._kw["rocksdb_sweep_per_checkpoint"] = query_time_after_num_entries
        return self

    def build(self) -> StateTtlConfig:
        """The :class:`StateTtlConfig`."""
        return StateTtlConfig(**self._kw)
