"""The local runner: a keyed function over an iterable of records, in one process.

``p`` subtasks live side by side; each record is routed by its key group to the subtask that
owns it, exactly as the Spark runtime routes records to partitions. It is the engine's test
bench and the quickest way to try a function:

>>> from streamstate import KeyedProcessFunction, ValueStateDescriptor
>>> class Count(KeyedProcessFunction):
...     def open(self, ctx):
...         self.n = ctx.get_state(ValueStateDescriptor("n", int, default=0))
...     def process_element(self, value, ctx):
...         self.n.update(self.n.value() + 1)
...         yield (ctx.get_current_key(), self.n.value())
>>> LocalRunner(Count(), key_selector=lambda r: r, parallelism=2).run(["a", "b", "a"])
[('a', 1), ('b', 1), ('a', 2)]
"""

from __future__ import annotations

import copy as _copy
from collections.abc import Callable, Iterable
from typing import Any

from streamstate.api.functions import KeyedProcessFunction, OutputTag
from streamstate.backends.base import Clock
from streamstate.backends.factory import StateBackend, state_backend_from
from streamstate.keygroups import (
    assign_to_key_group,
    compute_default_max_parallelism,
    compute_operator_index_for_key_group,
)
from streamstate.runtime.operator import KeyedProcessOperator
from streamstate.serializers import TypeSerializer, serializer_for
from streamstate.timers import MIN_WATERMARK

__all__ = ["LocalRunner"]

MAX_WATERMARK = (1 << 63) - 1


class LocalRunner:
    """Runs a :class:`KeyedProcessFunction` with ``parallelism`` subtasks in this process.

    Parameters:
        function: the user function; each subtask gets its own deep copy.
        key_selector: record -> key.
        parallelism: number of subtasks.
        max_parallelism: number of key groups (default: Flink's default for ``parallelism``).
        state_backend: ``"heap"`` (default), ``"rocksdb"`` or a configured backend.
        key_type: type or serializer of keys (default: inferred from the first key).
        timestamp_assigner: record -> event time in ms (enables event time).
        watermark_delay: bounded out-of-orderness in ms; the watermark after each record is
            ``max_timestamp - watermark_delay - 1`` (Flink's bounded-out-of-orderness rule).
        clock: processing-time source (tests inject one).
        operator_name: names the operator in checkpoints.
    """

    def __init__(
        self,
        function: KeyedProcessFunction[Any, Any],
        key_selector: Callable[[Any], Any],
        *,
        parallelism: int = 1,
        max_parallelism: int | None = None,
        state_backend: StateBackend | str | None = None,
        key_type: Any = None,
        timestamp_assigner: Callable[[Any], int] | None = None,
        watermark_delay: int | None = None,
        clock: Clock | None = None,
        operator_name: str = "keyed-process",
    ) -> None:
        if parallelism < 1:
            raise ValueError(f"parallelism must be >= 1, got {parallelism}")
        self.function = function
        self.key_selector = key_selector
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism or compute_default_max_parallelism(parallelism)
        if parallelism > self.max_parallelism:
            raise ValueError(
                f"parallelism {parallelism} exceeds max_parallelism {self.max_parallelism}"
            )
        self.state_backend = state_backend_from(state_backend)
        self.key_serializer: TypeSerializer[Any] | None = (
            serializer_for(key_type) if key_type is not None else None
        )
        self.timestamp_assigner = timestamp_assigner
        self.watermark_delay = watermark_delay
        self.clock = clock or Clock()
        self.operator_name = operator_name
        self.subtasks: list[KeyedProcessOperator] = []
        self.watermark = MIN_WATERMARK
        self._max_timestamp = MIN_WATERMARK
        self._side_outputs: dict[OutputTag, list[Any]] = {}

    # ---- set-up --------------------------------------------------------------------------------

    def _ensure_started(self, first_key: Any) -> None:
        if self.subtasks:
            return
        if self.key_serializer is None:
            self.key_serializer = serializer_for(type(first_key))
        self._start(self.parallelism)

    def _start(self, parallelism: int) -> None:
        assert self.key_serializer is not None
        self.parallelism = parallelism
        self.subtasks = [
            KeyedProcessOperator(
                _copy.deepcopy(self.function),
                self.key_serializer,
                operator_name=self.operator_name,
                subtask_index=i,
                parallelism=parallelism,
                max_parallelism=self.max_parallelism,
                state_backend=self.state_backend,
                clock=self.clock,
            )
            for i in range(parallelism)
        ]
        for op in self.subtasks:
            op.open()

    def subtask_for_key(self, key: Any) -> int:
        kg = assign_to_key_group(key, self.max_parallelism)
        return compute_operator_index_for_key_group(self.max_parallelism, self.parallelism, kg)

    # ---- processing ----------------------------------------------------------------------------

    def process(self, record: Any) -> list[Any]:
        """Process one record; returns the outputs it (and any timers it made due) produced."""
        key = self.key_selector(record)
        self._ensure_started(key)
        kg = assign_to_key_group(key, self.max_parallelism)
        op = self.subtasks[
            compute_operator_index_for_key_group(self.max_parallelism, self.parallelism, kg)
        ]
        ts = None
        if self.timestamp_assigner is not None:
            ts = int(self.timestamp_assigner(record))
        op.process_element(key, record, ts, kg)
        out = op.drain_output()
        self._collect_side_outputs(op)
        if ts is not None and self.watermark_delay is not None and ts > self._max_timestamp:
            self._max_timestamp = ts
            out.extend(self.advance_watermark(ts - self.watermark_delay - 1))
        return out

    def run(self, records: Iterable[Any], *, final_watermark: bool = True) -> list[Any]:
        """Process every record; with ``final_watermark`` fire all event-time timers at the end
        (as Flink does when a bounded input ends). Returns all outputs in order."""
        out: list[Any] = []
        for record in records:
            out.extend(self.process(record))
        if final_watermark and self.subtasks and self.timestamp_assigner is not None:
            out.extend(self.advance_watermark(MAX_WATERMARK))
        return out

    def advance_watermark(self, watermark: int) -> list[Any]:
        """Advance event time on every subtask, firing due timers; returns their outputs."""
        if watermark <= self.watermark:
            return []
        self.watermark = watermark
        out: list[Any] = []
        for op in self.subtasks:
            op.advance_watermark(watermark)
            out.extend(op.drain_output())
            self._collect_side_outputs(op)
        return out

    def advance_processing_time(self, time: int) -> list[Any]:
        """Set processing time on every subtask, firing due processing-time timers."""
        out: list[Any] = []
        for op in self.subtasks:
            op.advance_processing_time(time)
            out.extend(op.drain_output())
            self._collect_side_outputs(op)
        return out

    def _collect_side_outputs(self, op: KeyedProcessOperator) -> None:
        if op.side_outputs:
            for tag, values in op.side_outputs.items():
                self._side_outputs.setdefault(tag, []).extend(values)
            op.side_outputs.clear()

    def side_output(self, tag: OutputTag) -> list[Any]:
        """Everything emitted to ``tag`` so far (and forget it)."""
        return self._side_outputs.pop(tag, [])

    def close(self) -> None:
        for op in self.subtasks:
            op.dispose()
        self.subtasks = []

    def __enter__(self) -> LocalRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
