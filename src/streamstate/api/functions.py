"""User functions and the contexts they see (SPEC §2.3). Names follow PyFlink.

A :class:`KeyedProcessFunction` is opened once per subtask with a :class:`RuntimeContext`
(through which it creates keyed state), then sees every record of its keys in
``process_element`` and every due timer in ``on_timer``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from streamstate.api.descriptors import (
        AggregatingStateDescriptor,
        ListStateDescriptor,
        MapStateDescriptor,
        ReducingStateDescriptor,
        ValueStateDescriptor,
    )
    from streamstate.api.state import (
        AggregatingState,
        BroadcastState,
        ListState,
        MapState,
        ReducingState,
        ValueState,
    )
    from streamstate.metrics import MetricGroup

__all__ = [
    "AggregateFunction",
    "CheckpointedFunction",
    "Function",
    "FunctionInitializationContext",
    "FunctionSnapshotContext",
    "KeyedProcessFunction",
    "KeyedStateStore",
    "OperatorStateStore",
    "OutputTag",
    "ReduceFunction",
    "RuntimeContext",
    "TimeDomain",
    "TimerService",
]

IN = TypeVar("IN")
ACC = TypeVar("ACC")
OUT = TypeVar("OUT")
T = TypeVar("T")


class Function:
    """Base of user functions with a lifecycle."""

    def open(self, runtime_context: RuntimeContext) -> None:
        """Called once per subtask before the first record; create state handles here."""

    def close(self) -> None:
        """Called once per subtask after the last record."""


class ReduceFunction(ABC, Generic[T]):
    """Combines two values of the same type into one (used by reducing state and windows)."""

    @abstractmethod
    def reduce(self, value1: T, value2: T) -> T: ...

    @staticmethod
    def of(fn: Callable[[Any, Any], Any]) -> ReduceFunction[Any]:
        """Wrap a plain two-argument callable."""
        return _CallableReduceFunction(fn)


class _CallableReduceFunction(ReduceFunction[Any]):
    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[Any, Any], Any]) -> None:
        self.fn = fn

    def reduce(self, value1: Any, value2: Any) -> Any:
        return self.fn(value1, value2)


class AggregateFunction(ABC, Generic[IN, ACC, OUT]):
    """Incremental aggregation through an accumulator (as Flink's ``AggregateFunction``).

    ``add`` and ``merge`` may mutate and return their accumulator argument.
    """

    @abstractmethod
    def create_accumulator(self) -> ACC: ...

    @abstractmethod
    def add(self, value: IN, accumulator: ACC) -> ACC: ...

    @abstractmethod
    def get_result(self, accumulator: ACC) -> OUT: ...

    @abstractmethod
    def merge(self, acc_a: ACC, acc_b: ACC) -> ACC: ...


class TimeDomain:
    """Which clock a timer belongs to."""

    EVENT_TIME = "event_time"
    PROCESSING_TIME = "processing_time"


class TimerService(ABC):
    """Registers timers for the current key and namespace and reads the clocks."""

    @abstractmethod
    def current_processing_time(self) -> int: ...

    @abstractmethod
    def current_watermark(self) -> int: ...

    @abstractmethod
    def register_event_time_timer(self, timestamp: int) -> None: ...

    @abstractmethod
    def register_processing_time_timer(self, timestamp: int) -> None: ...

    @abstractmethod
    def delete_event_time_timer(self, timestamp: int) -> None: ...

    @abstractmethod
    def delete_processing_time_timer(self, timestamp: int) -> None: ...


class OutputTag:
    """Names a side output (e.g. late window data).

    >>> OutputTag("late")
    OutputTag('late')
    """

    __slots__ = ("tag_id",)

    def __init__(self, tag_id: str) -> None:
        if not tag_id:
            raise ValueError("an OutputTag needs a non-empty id")
        self.tag_id = tag_id

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OutputTag) and other.tag_id == self.tag_id

    def __hash__(self) -> int:
        return hash(("OutputTag", self.tag_id))

    def __repr__(self) -> str:
        return f"OutputTag({self.tag_id!r})"


class KeyedStateStore(ABC):
    """Creates keyed state handles scoped to the current key (and the default namespace)."""

    @abstractmethod
    def get_state(self, descriptor: ValueStateDescriptor) -> ValueState[Any]: ...

    @abstractmethod
    def get_list_state(self, descriptor: ListStateDescriptor) -> ListState[Any]: ...

    @abstractmethod
    def get_map_state(self, descriptor: MapStateDescriptor) -> MapState[Any, Any]: ...

    @abstractmethod
    def get_reducing_state(self, descriptor: ReducingStateDescriptor) -> ReducingState[Any]: ...

    @abstractmethod
    def get_aggregating_state(
        self, descriptor: AggregatingStateDescriptor
    ) -> AggregatingState[Any, Any]: ...


class OperatorStateStore(ABC):
    """Creates operator (non-keyed) state handles of one subtask."""

    @abstractmethod
    def get_list_state(self, descriptor: ListStateDescriptor) -> ListState[Any]:
        """A list redistributed by splitting its elements on rescale (SPLIT_DISTRIBUTE)."""

    @abstractmethod
    def get_union_list_state(self, descriptor: ListStateDescriptor) -> ListState[Any]:
        """A list of which every subtask receives all elements on restore (UNION)."""

    @abstractmethod
    def get_broadcast_state(self, descriptor: MapStateDescriptor) -> BroadcastState[Any, Any]:
        """A map of which every subtask holds a full copy (BROADCAST)."""


class RuntimeContext(KeyedStateStore):
    """What a function knows about where it runs, and its access to keyed state."""

    @abstractmethod
    def get_index_of_this_subtask(self) -> int: ...

    @abstractmethod
    def get_number_of_parallel_subtasks(self) -> int: ...

    @abstractmethod
    def get_max_number_of_parallel_subtasks(self) -> int: ...

    @abstractmethod
    def get_task_name(self) -> str: ...

    @abstractmethod
    def get_metrics_group(self) -> MetricGroup: ...

    # SPEC-style aliases (properties read better in Python)
    @property
    def index_of_this_subtask(self) -> int:
        return self.get_index_of_this_subtask()

    @property
    def number_of_parallel_subtasks(self) -> int:
        return self.get_number_of_parallel_subtasks()

    @property
    def max_number_of_parallel_subtasks(self) -> int:
        return self.get_max_number_of_parallel_subtasks()


class KeyedProcessFunction(Function, Generic[IN, OUT]):
    """Processes the records of a keyed stream one at a time, with keyed state and timers.

    ``process_element`` and ``on_timer`` may ``yield`` outputs, return an iterable of outputs, or
    return None. Use ``ctx.output(tag, value)`` for side outputs.
    """

    class Context(ABC):
        """What ``process_element`` sees besides the record."""

        @abstractmethod
        def get_current_key(self) -> Any: ...

        @abstractmethod
        def timestamp(self) -> int | None:
            """Event time of the current record (or of the firing timer), if any."""

        @abstractmethod
        def timer_service(self) -> TimerService: ...

        @abstractmethod
        def output(self, tag: OutputTag, value: Any) -> None:
            """Emit ``value`` to the side output ``tag``."""

    class OnTimerContext(Context):
        """What ``on_timer`` sees."""

        @abstractmethod
        def time_domain(self) -> str:
            """``TimeDomain.EVENT_TIME`` or ``TimeDomain.PROCESSING_TIME``."""

    @abstractmethod
    def process_element(self, value: IN, ctx: KeyedProcessFunction.Context) -> Iterable[OUT] | None:
        """Process one record of the current key."""

    def on_timer(
        self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext
    ) -> Iterable[OUT] | None:
        """Called when a timer registered for the current key fires."""
        return None


class FunctionSnapshotContext(ABC):
    """What ``CheckpointedFunction.snapshot_state`` sees."""

    @abstractmethod
    def get_checkpoint_id(self) -> int: ...

    @abstractmethod
    def get_checkpoint_timestamp(self) -> int: ...


class FunctionInitializationContext(ABC):
    """What ``CheckpointedFunction.initialize_state`` sees."""

    @abstractmethod
    def is_restored(self) -> bool: ...

    @abstractmethod
    def get_operator_state_store(self) -> OperatorStateStore: ...

    @abstractmethod
    def get_keyed_state_store(self) -> KeyedStateStore | None: ...

    @property
    def operator_state_store(self) -> OperatorStateStore:
        return self.get_operator_state_store()

    @property
    def keyed_state_store(self) -> KeyedStateStore | None:
        return self.get_keyed_state_store()


class CheckpointedFunction(ABC):
    """A function that manages operator state (and optionally keyed state) itself."""

    @abstractmethod
    def snapshot_state(self, context: FunctionSnapshotContext) -> None:
        """Called when a checkpoint is taken: bring operator state up to date."""

    @abstractmethod
    def initialize_state(self, context: FunctionInitializationContext) -> None:
        """Called before ``open``, on a fresh start and on restore."""
