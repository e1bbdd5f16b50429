"""State backends: the factories of keyed and operator state backends (SPEC §1).

``state_backend="heap"`` or ``"rocksdb"`` is accepted everywhere; pass a :class:`HeapStateBackend`
or :class:`RocksDBStateBackend` instance to set options.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Any

from streamstate.backends.base import Clock, KeyedStateBackend
from streamstate.backends.operator import OperatorStateBackend
from streamstate.keygroups import KeyGroupRange
from streamstate.serializers.base import TypeSerializer

__all__ = ["HeapStateBackend", "RocksDBStateBackend", "StateBackend", "state_backend_from"]


@dataclasses.dataclass
class StateBackend:
    """Where working state lives; creates one keyed and one operator backend per subtask."""

    #: record latency histograms of state operations (sampled, SPEC §8)
    latency_tracking: bool = False
    #: record size histograms of state values (sampled, SPEC §8)
    size_tracking: bool = False

    name: str = dataclasses.field(default="", init=False)

    def create_keyed_backend(
        self,
        key_serializer: TypeSerializer[Any],
        max_parallelism: int,
        key_group_range: KeyGroupRange,
        *,
        operator_name: str = "operator",
        subtask_index: int = 0,
        clock: Clock | None = None,
        metric_group: Any = None,
    ) -> KeyedStateBackend:
        raise NotImplementedError

    def create_operator_backend(self) -> OperatorStateBackend:
        return OperatorStateBackend()


@dataclasses.dataclass
class HeapStateBackend(StateBackend):
    """State as Python objects in memory (SPEC §5)."""

    #: "copy_on_write" (asynchronous snapshots) or "nested_maps" (synchronous snapshots)
    table_kind: str = "copy_on_write"
    #: track changed entries so that checkpoints write deltas (SPEC §6.3)
    incremental: bool = False
    #: install the copy-on-write map's GC policy (``gc.freeze()`` before full collections), which
    #: removes multi-second collector pauses with millions of entries; trade-off: cyclic garbage
    #: that reached the old generation is reclaimed only by an explicit
    #: ``gc.unfreeze(); gc.collect()`` (see ``streamstate.backends.heap.copy_on_write``)
    gc_freeze: bool = False

    def __post_init__(self) -> None:
        self.name = "heap"
        if self.gc_freeze:
            from streamstate.backends.heap.copy_on_write import install_gc_policy

            install_gc_policy()
        if self.table_kind not in ("copy_on_write", "nested_maps"):
            raise ValueError(
                f"HeapStateBackend.table_kind must be 'copy_on_write' or 'nested_maps', got "
                f"{self.table_kind!r}"
            )

    def create_keyed_backend(
        self,
        key_serializer: TypeSerializer[Any],
        max_parallelism: int,
        key_group_range: KeyGroupRange,
        *,
        operator_name: str = "operator",
        subtask_index: int = 0,
        clock: Clock | None = None,
        metric_group: Any = None,
    ) -> KeyedStateBackend:
        from streamstate.backends.heap.backend import HeapKeyedStateBackend

        return HeapKeyedStateBackend(
            key_serializer,
            max_parallelism,
            key_group_range,
            table_kind=self.table_kind,  # type: ignore[arg-type]
            incremental=self.incremental,
            clock=clock,
            latency_tracking=self.latency_tracking,
            size_tracking=self.size_tracking,
            metric_group=metric_group,
        )


@dataclasses.dataclass
class RocksDBStateBackend(StateBackend):
    """State in one RocksDB instance per subtask on local disk (SPEC §10)."""

    #: directory for the subtasks' RocksDB instances (a temporary directory if None)
    working_dir: str | None = None
    block_cache_size: int = 64 * 1024 * 1024
    #: RocksDB's row cache per subtask (bytes; 0 = off, as in Flink): warm point reads skip
    #: the block search; see docs/architecture.md
    row_cache_size: int = 0
    write_buffer_size: int = 32 * 1024 * 1024
    #: "lz4", "zstd", "snappy" or "none"
    compression: str = "lz4"
    #: checkpoints upload only the SST files no earlier checkpoint uploaded (RocksDB's native
    #: format); False writes a full canonical snapshot at every checkpoint
    incremental: bool = True
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.name = "rocksdb"
        for size in ("block_cache_size", "row_cache_size", "write_buffer_size"):
            value = getattr(self, size)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(
                    f"RocksDBStateBackend.{size} must be an integer >= 0 (bytes), got {value!r}"
                )
        if self.compression not in ("lz4", "zstd", "snappy", "none"):
            raise ValueError(
                f"RocksDBStateBackend.compression must be lz4, zstd, snappy or none, got "
                f"{self.compression!r}"
            )

    def resolve_working_dir(self) -> str:
        if self.working_dir is None:
            self.working_dir = tempfile.mkdtemp(prefix="streamstate-rocksdb-")
        os.makedirs(self.working_dir, exist_ok=True)
        return self.working_dir

    def create_keyed_backend(
        self,
        key_serializer: TypeSerializer[Any],
        max_parallelism: int,
        key_group_range: KeyGroupRange,
        *,
        operator_name: str = "operator",
        subtask_index: int = 0,
        clock: Clock | None = None,
        metric_group: Any = None,
    ) -> KeyedStateBackend:
        from streamstate.backends.rocksdb.backend import RocksDBKeyedStateBackend

        return RocksDBKeyedStateBackend(  # type: ignore[no-any-return]
            key_serializer,
            max_parallelism,
            key_group_range,
            options=self,
            path=os.path.join(self.resolve_working_dir(), f"{operator_name}-{subtask_index}"),
            clock=clock,
            latency_tracking=self.latency_tracking,
            size_tracking=self.size_tracking,
            metric_group=metric_group,
        )


def state_backend_from(value: StateBackend | str | None) -> StateBackend:
    """A :class:`StateBackend` from ``"heap"``, ``"rocksdb"``, an instance or None (heap)."""
    if value is None:
        return HeapStateBackend()
    if isinstance(value, StateBackend):
        return value
    if value == "heap":
        return HeapStateBackend()
    if value == "heap-nested":
        return HeapStateBackend(table_kind="nested_maps")
    if value == "rocksdb":
        return RocksDBStateBackend()
    raise ValueError(f"unknown state backend {value!r}; use 'heap' or 'rocksdb'")
