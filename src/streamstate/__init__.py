"""streamstate: Apache Flink's state layer for PySpark.

Spark moves the data; streamstate keeps the state. The public API:

* state descriptors and interfaces (value, list, map, reducing, aggregating; operator list,
  union list and broadcast state) and ``StateTtlConfig``;
* functions: ``KeyedProcessFunction``, ``ReduceFunction``, ``AggregateFunction``,
  ``CheckpointedFunction``;
* serializers (``Types``, ``serializer_for``, ``PickleSerializer`` as an explicit opt-in);
* state backends (``HeapStateBackend``, ``RocksDBStateBackend``) and the ``LocalRunner``;
* windows: ``window(assigner)`` with PyFlink's assigners, triggers and window functions;
* ``streamstate.spark`` for pipelines on PySpark.
"""

from streamstate.api import *  # noqa: F403 - the API package defines __all__
from streamstate.api import __all__ as _api_all
from streamstate.backends.factory import StateBackend
from streamstate.backends.heap.factory import HeapStateBackend
from streamstate.backends.rocksdb.factory import RocksDBStateBackend
from streamstate.errors import (
    CheckpointError,
    CheckpointFencedError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    InvalidStateNameError,
    KeyGroupOutOfRangeError,
    MaxParallelismMismatchError,
    NoCurrentKeyError,
    OutputSchemaError,
    PickleNotAllowedError,
    RemoteError,
    StateAccessError,
    StateBackendError,
    StateMigrationException,
    StreamStateError,
    UnsupportedKeyTypeError,
    UnsupportedStateTypeError,
)
from streamstate.keygroups import KeyGroupRange
from streamstate.metrics import MetricGroup
from streamstate.namespace import VOID_NAMESPACE
from streamstate.runtime.local import LocalRunner
from streamstate.serializers import (
    PickleSerializer,
    Types,
    TypeSerializer,
    serializer_for,
)
from streamstate.windows import (
    ContinuousEventTimeTrigger,
    ContinuousProcessingTimeTrigger,
    CountEvictor,
    CountTrigger,
    DeltaEvictor,
    DeltaTrigger,
    DynamicEventTimeSessionWindows,
    DynamicProcessingTimeSessionWindows,
    EndOfStreamTrigger,
    EventTimeSessionWindows,
    EventTimeTrigger,
    Evictor,
    EvictorContext,
    GlobalWindow,
    GlobalWindows,
    MergingWindowAssigner,
    NeverTrigger,
    OnMergeContext,
    ProcessingTimeSessionWindows,
    ProcessingTimeTrigger,
    ProcessWindowFunction,
    PurgingTrigger,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    TimeEvictor,
    TimestampedValue,
    TimeWindow,
    Trigger,
    TriggerContext,
    TriggerResult,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WindowAssigner,
    WindowAssignerContext,
    WindowedStream,
    WindowFunction,
    WindowStagger,
    window,
)

__version__ = "0.1.0"

__all__ = [
    *_api_all,
    "VOID_NAMESPACE",
    "CheckpointError",
    "CheckpointFencedError",
    "CheckpointNotFoundError",
    "ContinuousEventTimeTrigger",
    "ContinuousProcessingTimeTrigger",
    "CorruptCheckpointError",
    "CountEvictor",
    "CountTrigger",
    "DeltaEvictor",
    "DeltaTrigger",
    "DynamicEventTimeSessionWindows",
    "DynamicProcessingTimeSessionWindows",
    "EndOfStreamTrigger",
    "EventTimeSessionWindows",
    "EventTimeTrigger",
    "Evictor",
    "EvictorContext",
    "GlobalWindow",
    "GlobalWindows",
    "HeapStateBackend",
    "InvalidStateNameError",
    "KeyGroupOutOfRangeError",
    "KeyGroupRange",
    "LocalRunner",
    "MaxParallelismMismatchError",
    "MergingWindowAssigner",
    "MetricGroup",
    "NeverTrigger",
    "NoCurrentKeyError",
    "OnMergeContext",
    "OutputSchemaError",
    "PickleNotAllowedError",
    "PickleSerializer",
    "ProcessWindowFunction",
    "ProcessingTimeSessionWindows",
    "ProcessingTimeTrigger",
    "PurgingTrigger",
    "RemoteError",
    "RocksDBStateBackend",
    "SlidingEventTimeWindows",
    "SlidingProcessingTimeWindows",
    "StateAccessError",
    "StateBackend",
    "StateBackendError",
    "StateMigrationException",
    "StreamStateError",
    "TimeEvictor",
    "TimeWindow",
    "TimestampedValue",
    "Trigger",
    "TriggerContext",
    "TriggerResult",
    "TumblingEventTimeWindows",
    "TumblingProcessingTimeWindows",
    "TypeSerializer",
    "Types",
    "UnsupportedKeyTypeError",
    "UnsupportedStateTypeError",
    "WindowAssigner",
    "WindowAssignerContext",
    "WindowFunction",
    "WindowStagger",
    "WindowedStream",
    "serializer_for",
    "window",
]
