"""The heap state backend's configuration: creates one heap keyed backend per subtask."""

from __future__ import annotations

import dataclasses
from typing import Any

from streamstate.backends.base import Clock, KeyedStateBackend
from streamstate.backends.factory import StateBackend
from streamstate.keygroups import KeyGroupRange
from streamstate.serializers.base import TypeSerializer

__all__ = ["HeapStateBackend"]


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

    def with_change_tracking(self) -> HeapStateBackend:
        return self if self.incremental else dataclasses.replace(self, incremental=True)

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
