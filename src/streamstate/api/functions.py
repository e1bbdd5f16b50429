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
    def reduce(self, value1: T, value2: T) -> T:
        """The combination of ``value1`` (the value so far) and ``value2`` (the new one)."""

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
    def create_accumulator(self) -> ACC:
        """A new, empty accumulator (the state of a key and namespace before any ``add``)."""

    @abstractmethod
    def add(self, value: IN, accumulator: ACC) -> ACC:
        """``accumulator`` with ``value`` folded in; what it returns is stored."""

    @abstractmethod
    def get_result(self, accumulator: ACC) -> OUT:
        """The aggregate of ``accumulator`` (what ``AggregatingState.get()`` returns and a
        window's function receives)."""

    @abstractmethod
    def merge(self, acc_a: ACC, acc_b: ACC) -> ACC:
        """One accumulator holding both (merging session windows, two-phase aggregation)."""


class TimeDomain:
    """Which clock a timer belongs to; ``OnTimerContext.time_domain()`` returns one of these
    strings."""

    EVENT_TIME = "event_time"
    PROCESSING_TIME = "processing_time"


class TimerService(ABC):
    """Registers timers for the current key and namespace and reads the clocks
    (``ctx.timer_service()`` in ``process_element`` and ``on_timer``).

    Times are milliseconds since the epoch. Timers are a set per ``(timestamp, key,
    namespace)``: registering one twice keeps one, deleting one that is not there does nothing.
    They are keyed state: checkpointed with the key's state and moved with it on rescale.
    """

    @abstractmethod
    def current_processing_time(self) -> int:
        """The processing time (ms): the operator's clock (on Spark the driver's clock when
        the micro-batch was planned; the ``LocalRunner``'s ``clock=``)."""

    @abstractmethod
    def current_watermark(self) -> int:
        """The current event-time watermark (ms); ``-2**63`` before the first one. On Spark it
        is fixed for a micro-batch: the largest event time of the earlier batches minus
        ``watermark_delay`` minus 1 ms."""

    @abstractmethod
    def register_event_time_timer(self, timestamp: int) -> None:
        """Call ``on_timer(timestamp, ctx)`` for the current key once the watermark reaches
        ``timestamp`` (at the next advance if it already has)."""

    @abstractmethod
    def register_processing_time_timer(self, timestamp: int) -> None:
        """Call ``on_timer(timestamp, ctx)`` for the current key once processing time reaches
        ``timestamp``."""

    @abstractmethod
    def delete_event_time_timer(self, timestamp: int) -> None:
        """Delete the current key's event-time timer at ``timestamp``, if there is one."""

    @abstractmethod
    def delete_processing_time_timer(self, timestamp: int) -> None:
        """Delete the current key's processing-time timer at ``timestamp``, if there is
        one."""


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
    def get_state(self, descriptor: ValueStateDescriptor) -> ValueState[Any]:
        """The value state ``descriptor`` declares (created on first use; the same handle on
        every call)."""

    @abstractmethod
    def get_list_state(self, descriptor: ListStateDescriptor) -> ListState[Any]:
        """The list state ``descriptor`` declares."""

    @abstractmethod
    def get_map_state(self, descriptor: MapStateDescriptor) -> MapState[Any, Any]:
        """The map state ``descriptor`` declares."""

    @abstractmethod
    def get_reducing_state(self, descriptor: ReducingStateDescriptor) -> ReducingState[Any]:
        """The reducing state ``descriptor`` declares."""

    @abstractmethod
    def get_aggregating_state(
        self, descriptor: AggregatingStateDescriptor
    ) -> AggregatingState[Any, Any]:
        """The aggregating state ``descriptor`` declares."""


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
    def get_index_of_this_subtask(self) -> int:
        """This subtask's index, ``0 .. parallelism - 1`` (on Spark: the partition)."""

    @abstractmethod
    def get_number_of_parallel_subtasks(self) -> int:
        """The operator's parallelism."""

    @abstractmethod
    def get_max_number_of_parallel_subtasks(self) -> int:
        """The number of key groups (``max_parallelism``), fixed for the life of a job."""

    @abstractmethod
    def get_task_name(self) -> str:
        """The operator's name (``operator_name=``)."""

    @abstractmethod
    def get_metrics_group(self) -> MetricGroup:
        """The subtask's metric group: counters, gauges and histograms of the function, and
        under ``state`` the state latency and size metrics when they are on."""

    # SPEC-style aliases (properties read better in Python)
    @property
    def index_of_this_subtask(self) -> int:
        """:meth:`get_index_of_this_subtask`."""
        return self.get_index_of_this_subtask()

    @property
    def number_of_parallel_subtasks(self) -> int:
        """:meth:`get_number_of_parallel_subtasks`."""
        return self.get_number_of_parallel_subtasks()

    @property
    def max_number_of_parallel_subtasks(self) -> int:
        """:meth:`get_max_number_of_parallel_subtasks`."""
        return self.get_max_number_of_parallel_subtasks()


class KeyedProcessFunction(Function, Generic[IN, OUT]):
    """Processes the records of a keyed stream one at a time, with keyed state and timers.

    ``process_element`` and ``on_timer`` may ``yield`` outputs, return an iterable of outputs, or
    return None. Use ``ctx.output(tag, value)`` for side outputs.
    """

    class Context(ABC):
        """What ``process_element`` sees besides the record."""

        @abstractmethod
        def get_current_key(self) -> Any:
            """The key of the current record (a tuple for several key columns)."""

        @abstractmethod
        def timestamp(self) -> int | None:
            """Event time of the current record (or of the firing timer), if any."""

        @abstractmethod
        def timer_service(self) -> TimerService:
            """Timers of the current key, and the clocks."""

        @abstractmethod
        def output(self, tag: OutputTag, value: Any) -> None:
            """Emit ``value`` to the side output ``tag``."""

    class OnTimerContext(Context):
        """What ``on_timer`` sees: the :class:`KeyedProcessFunction.Context` of the timer's key
        (its state is the
        current state; ``timestamp()`` is the timer's), plus the timer's time domain."""

        @abstractmethod
        def time_domain(self) -> str:
            """``TimeDomain.EVENT_TIME`` or ``TimeDomain.PROCESSING_TIME``."""

    @abstractmethod
    def process_element(self, value: IN, ctx: KeyedProcessFunction.Context) -> Iterable[OUT] | None:
        """Process one record of the current key: ``value`` is the record (on Spark a
        :class:`~streamstate.spark.records.Row`), ``ctx`` the :class:`Context`. Yield (or return an
        iterable of) outputs; state handles read and write the current key's state."""

    def on_timer(
        self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext
    ) -> Iterable[OUT] | None:
        """Called when a timer registered for the current key fires, with the key's state
        current; ``timestamp`` is the timer's, ``ctx.time_domain()`` says which clock. Yields
        outputs like :meth:`process_element`."""
        return None


class FunctionSnapshotContext(ABC):
    """What ``CheckpointedFunction.snapshot_state`` sees."""

    @abstractmethod
    def get_checkpoint_id(self) -> int:
        """The id of the checkpoint being taken (on Spark: the micro-batch)."""

    @abstractmethod
    def get_checkpoint_timestamp(self) -> int:
        """When the checkpoint was triggered (ms since the epoch)."""


class FunctionInitializationContext(ABC):
    """What ``CheckpointedFunction.initialize_state`` sees."""

    @abstractmethod
    def is_restored(self) -> bool:
        """Whether the subtask's state was restored from a checkpoint or savepoint."""

    @abstractmethod
    def get_operator_state_store(self) -> OperatorStateStore:
        """Where the function's operator state lives."""

    @abstractmethod
    def get_keyed_state_store(self) -> KeyedStateStore | None:
        """Keyed state, as in :meth:`Function.open` (None where there is no keyed state)."""

    @property
    def operator_state_store(self) -> OperatorStateStore:
        """:meth:`get_operator_state_store`."""
        return self.get_operator_state_store()

    @property
    def keyed_state_store(self) -> KeyedStateStore | None:
        """:meth:`get_keyed_state_store`."""
        return self.get_keyed_state_store()


class CheckpointedFunction(ABC):
    """A function that manages operator state (and optionally keyed state) itself."""

    @abstractmethod
    def snapshot_state(self, context: FunctionSnapshotContext) -> None:
        """Called when a checkpoint is taken: bring operator state up to date."""

    @abstractmethod
    def initialize_state(self, context: FunctionInitializationContext) -> None:
        """Called before ``open``, on a fresh start and on restore."""
