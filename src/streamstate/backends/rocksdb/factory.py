"""The RocksDB state backend's configuration: one RocksDB instance per subtask."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Any

from streamstate.backends.base import Clock, KeyedStateBackend
from streamstate.backends.factory import StateBackend
from streamstate.keygroups import KeyGroupRange
from streamstate.serializers.base import TypeSerializer

__all__ = ["RocksDBStateBackend"]


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
