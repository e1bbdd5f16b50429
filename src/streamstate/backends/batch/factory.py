"""The batch execution backend's configuration (Flink's ``BatchExecutionStateBackend``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from streamstate.backends.base import Clock, KeyedStateBackend
from streamstate.backends.factory import StateBackend
from streamstate.keygroups import KeyGroupRange
from streamstate.serializers.base import TypeSerializer

__all__ = ["BatchExecutionStateBackend"]


@dataclasses.dataclass
class BatchExecutionStateBackend(StateBackend):
    """The state backend of batch execution (SPEC §13.3): the state of one key at a time, for
    records sorted by key (``backends/batch/``). The batch runtime (``runtime/batch.py``) uses
    it whatever backend the job names, as Flink's BATCH mode does; the job's latency and size
    tracking carry over. Users do not choose it by name: ``execution_mode="batch"`` does."""

    #: spool finished keys' state for a savepoint written at the end of the input
    savepoint: bool = False
    #: where the spool file lives (default: the system's temporary directory)
    spool_directory: str | None = None

    requires_sorted_input = True

    def __post_init__(self) -> None:
        self.name = "batch"

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
        from streamstate.backends.batch.backend import BatchExecutionKeyedStateBackend
        from streamstate.backends.batch.snapshot import KeyGroupSpool

        spool = None
        if self.savepoint:
            spool = KeyGroupSpool(key_serializer, key_group_range, self.spool_directory)
        return BatchExecutionKeyedStateBackend(
            key_serializer,
            max_parallelism,
            key_group_range,
            clock=clock,
            latency_tracking=self.latency_tracking,
            size_tracking=self.size_tracking,
            metric_group=metric_group,
            spool=spool,
        )
