"""State backends: the factories of keyed and operator state backends (SPEC §1).

A backend package (``backends/<name>/factory.py``) subclasses :class:`StateBackend` with its
options; ``streamstate.backends.registry.state_backend_from`` finds one by name.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from streamstate.backends.base import Clock, KeyedStateBackend
from streamstate.backends.operator import OperatorStateBackend
from streamstate.keygroups import KeyGroupRange
from streamstate.serializers.base import TypeSerializer

__all__ = ["StateBackend"]


@dataclasses.dataclass
class StateBackend:
    """Where working state lives; creates one keyed and one operator backend per subtask."""

    #: record latency histograms of state operations (sampled, SPEC §8)
    latency_tracking: bool = False
    #: record size histograms of state values (sampled, SPEC §8)
    size_tracking: bool = False

    name: str = dataclasses.field(default="", init=False)
    #: the keyed backend holds one key at a time: only an operator of sorted input (batch
    #: execution) may use it
    requires_sorted_input = False

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

    def with_change_tracking(self) -> StateBackend:
        """This configuration with change tracking, so that checkpoints can write deltas
        (``incremental_checkpoints``); itself if the backend has none."""
        return self
