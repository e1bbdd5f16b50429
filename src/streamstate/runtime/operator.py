"""The keyed process operator: one subtask hosting a user function with its state (SPEC §2.3).

The operator owns the subtask's keyed state backend, operator state backend and timer service,
and turns records and timers into calls of the user's ``KeyedProcessFunction``. The local runner
and the Spark runtime both drive operators; they differ only in how records reach them.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable
from itertools import islice
from typing import Any

from streamstate._compiled import compiled
from streamstate.api.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
    validate_name,
)
from streamstate.api.functions import (
    CheckpointedFunction,
    FunctionInitializationContext,
    FunctionSnapshotContext,
    KeyedProcessFunction,
    KeyedStateStore,
    OperatorStateStore,
    OutputTag,
    RuntimeContext,
    TimeDomain,
    TimerService,
)
from streamstate.backends.base import Clock, KeyContext, KeyedStateBackend
from streamstate.backends.factory import StateBackend
from streamstate.backends.operator import OperatorStateBackend, OperatorStateSnapshot
from streamstate.backends.registry import state_backend_from
from streamstate.errors import StateAccessError
from streamstate.keygroups import compute_key_group_range_for_operator_index
from streamstate.metrics import MetricGroup
from streamstate.namespace import VOID_NAMESPACE
from streamstate.serializers import TypeSerializer, VoidNamespaceSerializer
from streamstate.timers import MIN_WATERMARK, InternalTimerService, UserTimerService

__all__ = [
    "RECORD_LOOPS",
    "InternalOperatorContext",
    "KeyedProcessOperator",
    "OperatorSnapshot",
    "RecordLoop",
    "RecordRoute",
    "note_failed_record",
    "process_records",
    "record_loop",
    "use_record_loop",
]

_VOID_SERIALIZER = VoidNamespaceSerializer()


class OperatorSnapshot:
    """The synchronous result of snapshotting one operator subtask."""

    __slots__ = ("checkpoint_id", "keyed", "operator")

    def __init__(self, checkpoint_id: int, keyed: Any, operator: OperatorStateSnapshot) -> None:
        self.checkpoint_id = checkpoint_id
        self.keyed = keyed
        self.operator = operator


class _KeyedStateStore(KeyedStateStore):
    __slots__ = ("_backend",)

    def __init__(self, backend: KeyedStateBackend) -> None:
        self._backend = backend

    def _get(self, descriptor: StateDescriptor, cls: type) -> Any:
        if not isinstance(descriptor, cls):
            raise TypeError(_wrong_descriptor(descriptor, cls))
        return self._backend.get_partitioned_state(VOID_NAMESPACE, _VOID_SERIALIZER, descriptor)

    def get_state(self, descriptor: ValueStateDescriptor) -> Any:
        return self._get(descriptor, ValueStateDescriptor)

    def get_list_state(self, descriptor: ListStateDescriptor) -> Any:
        return self._get(descriptor, ListStateDescriptor)

    def get_map_state(self, descriptor: MapStateDescriptor) -> Any:
        return self._get(descriptor, MapStateDescriptor)

    def get_reducing_state(self, descriptor: ReducingStateDescriptor) -> Any:
        return self._get(descriptor, ReducingStateDescriptor)

    def get_aggregating_state(self, descriptor: AggregatingStateDescriptor) -> Any:
        return self._get(descriptor, AggregatingStateDescriptor)


#: the getter of each descriptor kind, for errors that name the right one
_GETTERS: dict[type, str] = {
    ValueStateDescriptor: "get_state",
    ListStateDescriptor: "get_list_state",
    MapStateDescriptor: "get_map_state",
    ReducingStateDescriptor: "get_reducing_state",
    AggregatingStateDescriptor: "get_aggregating_state",
}


def _wrong_descriptor(descriptor: Any, expected: type) -> str:
    for cls, getter in _GETTERS.items():
        if isinstance(descriptor, cls):
            name = getattr(descriptor, "name", "")
            return (
                f"{_GETTERS[expected]}() takes a {expected.__name__}, got the {cls.__name__} "
                f"{name!r}: use runtime_context.{getter}(...) for it"
            )
    return f"{_GETTERS[expected]}() takes a {expected.__name__}, got {descriptor!r}"


class _RuntimeContext(_KeyedStateStore, RuntimeContext):
    __slots__ = ("_op",)

    def __init__(self, op: KeyedProcessOperator) -> None:
        super().__init__(op.keyed_backend)
        self._op = op

    def get_index_of_this_subtask(self) -> int:
        return self._op.subtask_index

    def get_number_of_parallel_subtasks(self) -> int:
        return self._op.parallelism

    def get_max_number_of_parallel_subtasks(self) -> int:
        return self._op.max_parallelism

    def get_task_name(self) -> str:
        return self._op.operator_name

    def get_metrics_group(self) -> MetricGroup:
        return self._op.metric_group


class _ProcessContext(KeyedProcessFunction.OnTimerContext):
    __slots__ = ("_domain", "_key", "_op", "_timer_service", "_ts")

    def __init__(self, op: KeyedProcessOperator) -> None:
        self._op = op
        #: the backend's key context (read directly: a function asks for its key per record)
        self._key = op.keyed_backend.ctx
        self._ts: int | None = None
        self._domain = TimeDomain.EVENT_TIME
        self._timer_service = UserTimerService(op.timer_service)

    def get_current_key(self) -> Any:
        key = self._key.key
        if key is None:
            return self._op.keyed_backend.get_current_key()  # raises NoCurrentKeyError
        return key

    def timestamp(self) -> int | None:
        return self._ts

    def timer_service(self) -> TimerService:
        return self._timer_service

    def output(self, tag: OutputTag, value: Any) -> None:
        self._op.side_outputs.setdefault(tag, []).append(value)

    def time_domain(self) -> str:
        return self._domain


class InternalOperatorContext:
    """Internal access to the hosting operator, for built-in functions (windows, SPEC §9).

    A :class:`KeyedProcessFunction` that defines ``bind_operator(context)`` gets it called once
    per subtask with this context, before ``initialize_state`` and ``open``. Through it the
    function reaches what user functions do not see: the keyed backend (states in any namespace),
    timer services with their own namespace serializer and their own callbacks, and the
    operator's main and side outputs for results produced outside ``process_element`` (timers).
    It is not part of the public API.
    """

    __slots__ = ("_op",)

    def __init__(self, op: KeyedProcessOperator) -> None:
        self._op = op

    @property
    def keyed_backend(self) -> KeyedStateBackend:
        return self._op.keyed_backend

    @property
    def metric_group(self) -> MetricGroup:
        return self._op.metric_group

    def get_internal_timer_service(
        self, name: str, namespace_serializer: TypeSerializer[Any], triggerable: Any
    ) -> InternalTimerService:
        """The operator's timer service ``name`` calling ``triggerable.on_event_time`` /
        ``on_processing_time(timestamp, key, namespace)``; see
        :meth:`KeyedProcessOperator.get_internal_timer_service`."""
        return self._op.get_internal_timer_service(name, namespace_serializer, triggerable)

    def emit(self, value: Any) -> None:
        """Append ``value`` to the operator's main output."""
        self._op.output.append(value)

    def output(self, tag: OutputTag, value: Any) -> None:
        """Append ``value`` to the side output ``tag``."""
        self._op.side_outputs.setdefault(tag, []).append(value)


class _InitContext(FunctionInitializationContext):
    def __init__(self, op: KeyedProcessOperator) -> None:
        self._op = op

    def is_restored(self) -> bool:
        return self._op.restored

    def get_operator_state_store(self) -> OperatorStateStore:
        return self._op.operator_backend

    def get_keyed_state_store(self) -> KeyedStateStore | None:
        return _KeyedStateStore(self._op.keyed_backend)


class _SnapshotContext(FunctionSnapshotContext):
    def __init__(self, checkpoint_id: int, timestamp: int) -> None:
        self._id = checkpoint_id
        self._ts = timestamp

    def get_checkpoint_id(self) -> int:
        return self._id

    def get_checkpoint_timestamp(self) -> int:
        return self._ts


_GENERATOR = types.GeneratorType

RecordRoute = tuple[
    Any,
    _ProcessContext,
    KeyContext | None,
    int,
    KeyedStateBackend,
    list[Callable[[Any], None]],
    int | None,
]
"""What the record loop needs to hand a record of one key group to its operator
(:meth:`KeyedProcessOperator.route`): the function's ``process_element``, the operator's
process context, the backend's key context (None: keys are set through ``set_current_key``),
the key group's index in the backend's range, the backend, its key-selected listeners and the
key group."""


def process_records(
    records: Iterable[tuple[Any, Any, int | None, RecordRoute]], out: list[Any]
) -> None:
    """The record loop (Flink's ``StreamTask`` input loop): for each ``(key, value, timestamp,
    route)`` set the current key, call ``process_element`` and collect what it returns into
    ``out``. Every runtime drives records through it (``KeyedProcessOperator.process_elements``
    for one subtask, the ``LocalRunner`` for ``p`` subtasks of one process).

    Per record: one tuple unpack, the key set straight on the backend's key context when nothing
    listens for key changes (the routes are built from the backends' own ranges), the call, and
    one class comparison for the common ``yield`` case (bench/local_runner.py).
    """
    generator = _GENERATOR
    extend = out.extend
    for key, value, ts, route in records:
        process_element, ctx, key_ctx, index, backend, listeners, kg = route
        if key_ctx is None or listeners:
            backend.set_current_key(key, kg)
        else:
            key_ctx.key = key
            key_ctx.kg_index = index
        ctx._ts = ts
        try:  # zero-cost on 3.11 when nothing is raised
            result = process_element(value, ctx)
            if result.__class__ is generator:
                extend(result)
            elif result is not None:
                _collect(out, result, "process_element")
        except Exception as exc:
            _note(exc, f"process_element of key {_short(key)}, record {_short(value)}")
            raise


def _collect(out: list[Any], result: Any, where: str) -> None:
    if result.__class__ is _GENERATOR:  # the common case (`yield`) first: one comparison
        out.extend(result)
        return
    if result is None:
        return
    if isinstance(result, (str, bytes, tuple, dict)):
        raise StateAccessError(
            f"{where} returned a {type(result).__name__}; return a list of outputs or use "
            "`yield` (a single output must be wrapped: `return [row]` or `yield row`)"
        )
    if result.__class__ is list:
        out.extend(result)
        return
    try:
        outputs = iter(result)
    except TypeError:
        raise StateAccessError(
            f"{where} returned {result!r}, which is not iterable; return a list of outputs, "
            "use `yield`, or return None"
        ) from None
    # outside the try: a generator runs the function's body here, and what that body raises
    # is the user's error, not a bad return value
    out.extend(outputs)


def _note(exc: BaseException, where: str) -> None:
    """Name the key and the record (or timer) in an error raised by the user's function."""
    if any(n.startswith("streamstate: ") for n in getattr(exc, "__notes__", ())):
        return  # an inner operator named it already
    exc.add_note(f"streamstate: raised in {where}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def note_failed_record(exc: BaseException, failed: list[tuple[Any, Any]]) -> None:
    """The note of an error a compiled loop raised in a function: it appended the failing
    record's ``(key, value)`` to ``failed`` (nothing when the error was not the function's)."""
    if failed:
        key, value = failed[-1]
        _note(exc, f"process_element of key {_short(key)}, record {_short(value)}")


class RecordLoop:
    """One implementation of the record loops: ``module`` is the compiled one
    (``runtime/_record_loop.c``), or None for the pure-Python reference (:func:`process_records`,
    :meth:`KeyedProcessOperator.process_runs`, ``LocalRunner._routed``). Both do the same calls
    in the same order; a test runs the record path's behavioural suite with each."""

    __slots__ = ("module", "name")

    def __init__(self, name: str, module: Any) -> None:
        self.name = name
        self.module = module

    def __repr__(self) -> str:
        return f"RecordLoop({self.name!r})"


def _compiled_loop() -> RecordLoop | None:
    module = compiled("streamstate.runtime._record_loop")
    if module is None:
        return None
    module.configure(KeyContext, _ProcessContext, _collect)
    return RecordLoop("compiled", module)


_COMPILED_LOOP = _compiled_loop()

#: the record loops this process can use: the pure-Python reference first, then the compiled
#: one when it is built and ``STREAMSTATE_PURE_PYTHON`` is not set
RECORD_LOOPS: tuple[RecordLoop, ...] = (RecordLoop("python", None),) + (
    () if _COMPILED_LOOP is None else (_COMPILED_LOOP,)
)
_current_loop: list[RecordLoop] = [RECORD_LOOPS[-1]]


def record_loop() -> RecordLoop:
    """The record loop operators and runners use (the compiled one when it is available)."""
    return _current_loop[0]


def use_record_loop(loop: RecordLoop) -> RecordLoop:
    """Select ``loop`` (one of :data:`RECORD_LOOPS`) for every operator and runner of this
    process; returns the one it replaces (tests compare the two)."""
    previous = _current_loop[0]
    _current_loop[0] = loop
    return previous


class KeyedProcessOperator:
    """One subtask of a keyed process operator."""

    #: whether records arrive sorted by key, each key's records together (batch execution)
    sorted_input = False

    def __init__(
        self,
        function: KeyedProcessFunction[Any, Any],
        key_serializer: TypeSerializer[Any],
        *,
        operator_name: str = "keyed-process",
        subtask_index: int = 0,
        parallelism: int = 1,
        max_parallelism: int = 128,
        state_backend: StateBackend | str | None = None,
        clock: Clock | None = None,
        metric_group: MetricGroup | None = None,
    ) -> None:
        if not isinstance(function, KeyedProcessFunction):
            raise TypeError(
                f"function must be a KeyedProcessFunction instance, got {type(function).__name__}"
            )
        self.function = function
        self.operator_name = validate_name(operator_name, "operator")
        self.subtask_index = subtask_index
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self.key_group_range = compute_key_group_range_for_operator_index(
            max_parallelism, parallelism, subtask_index
        )
        self.state_backend = state_backend_from(state_backend)
        if self.state_backend.requires_sorted_input and not self.sorted_input:
            raise TypeError(
                f"the {self.state_backend.name} state backend holds one key at a time and needs "
                "its input sorted by key: it runs in batch execution only "
                "(streamstate.runtime.batch.BatchKeyedProcessOperator)"
            )
        self.clock = clock or Clock()
        self.metric_group = metric_group or MetricGroup(f"{operator_name}.{subtask_index}")
        self.keyed_backend: KeyedStateBackend = self.state_backend.create_keyed_backend(
            key_serializer,
            max_parallelism,
            self.key_group_range,
            operator_name=self.operator_name,
            subtask_index=subtask_index,
            clock=self.clock,
            metric_group=self.metric_group.add_group("state"),
        )
        self.operator_backend: OperatorStateBackend = self.state_backend.create_operator_backend()
        #: timer services by name; "user" is the one the function's TimerService uses
        self.timer_services: dict[str, InternalTimerService] = {}
        self._watermark = MIN_WATERMARK
        self._manual_processing_time: int | None = None
        self.timer_service = self.get_internal_timer_service("user", _VOID_SERIALIZER, self)
        self.runtime_context = _RuntimeContext(self)
        self._ctx = _ProcessContext(self)
        self.output: list[Any] = []
        self.side_outputs: dict[OutputTag, list[Any]] = {}
        self.restored = False
        self._opened = False
        self._route_of_kg: dict[int | None, RecordRoute] = {}

    # ---- lifecycle -----------------------------------------------------------------------------

    def open(self) -> None:
        if self._opened:
            return
        bind = getattr(self.function, "bind_operator", None)
        if bind is not None:
            bind(InternalOperatorContext(self))
        if isinstance(self.function, CheckpointedFunction):
            self.function.initialize_state(_InitContext(self))
        self.function.open(self.runtime_context)
        self._opened = True

    def close(self) -> None:
        if self._opened:
            self.function.close()
            self._opened = False

    def dispose(self) -> None:
        self.close()
        self.keyed_backend.dispose()

    # ---- records and timers --------------------------------------------------------------------

    def route(self, key_group: int | None) -> RecordRoute:
        """How :func:`process_records` hands a record of ``key_group`` to this operator. A key
        group outside the operator's range gets a route through ``set_current_key``, which
        refuses it naming the key; so does None, whose key group the backend computes."""
        backend = self.keyed_backend
        direct = type(backend).set_current_key is KeyedStateBackend.set_current_key
        index = -1 if key_group is None else key_group - self.key_group_range.start
        if not 0 <= index < len(self.key_group_range):
            direct = False
        return (
            self.function.process_element,
            self._ctx,
            backend.ctx if direct else None,
            index,
            backend,
            backend.key_selected_listeners,
            key_group,
        )

    def _routes(self) -> dict[int | None, RecordRoute]:
        """:meth:`route` of every key group (and of None), built once: the function and backend
        of an operator never change."""
        routes = self._route_of_kg
        if not routes:
            routes[None] = self.route(None)
            for kg in range(self.max_parallelism):
                routes[kg] = self.route(kg)
        return routes

    def process_element(
        self, key: Any, value: Any, timestamp: int | None = None, key_group: int | None = None
    ) -> None:
        """Process one record of ``key``; outputs accumulate in :attr:`output`."""
        process_records(((key, value, timestamp, self._routes()[key_group]),), self.output)

    def process_elements(
        self, keys: Iterable[Any], values: Iterable[Any], timestamps: Iterable[Any], key_groups: Any
    ) -> None:
        """:meth:`process_element` for each ``(key, value, timestamp, key_group)`` of the
        zipped iterables, in order (same outputs, errors and notes): the per-record loop of a
        batch (the Spark state hosts), :func:`process_records`."""
        routes = self._routes()
        module = _current_loop[0].module
        if module is not None:
            failed: list[tuple[Any, Any]] = []
            try:
                module.run_zipped(keys, values, timestamps, key_groups, routes, self.output, failed)
            except Exception as exc:
                note_failed_record(exc, failed)
                raise
            return
        process_records(
            zip(keys, values, timestamps, map(routes.__getitem__, key_groups), strict=False),
            self.output,
        )

    def process_runs(
        self,
        keys: Iterable[Any],
        key_groups: Iterable[Any],
        lengths: Iterable[int],
        values: Iterable[Any],
        timestamps: Iterable[Any] | None = None,
    ) -> None:
        """``process_element`` for input sorted by key: ``values`` (and ``timestamps``)
        come in runs of one key each, run ``i`` being ``lengths[i]`` records of ``keys[i]``
        (key group ``key_groups[i]``, or None). The key is set once per run; records reach the
        function in order (same outputs, errors and notes as ``process_records``).

        The record loop of batch execution (``runtime/batch.py``, one call per Arrow batch):
        per record only the function's call and the generator test, and nothing per record of
        ``process_records``' routing (a key is set once per run, and setting it ends the
        previous key in a batch backend).
        """
        set_key = self.keyed_backend.set_current_key
        ctx = self._ctx
        fn = self.function.process_element
        out = self.output
        module = _current_loop[0].module
        if module is not None:
            failed: list[tuple[Any, Any]] = []
            try:
                module.run_runs(
                    keys, key_groups, lengths, values, timestamps, set_key, fn, ctx, out, failed
                )
            except Exception as exc:
                note_failed_record(exc, failed)
                raise
            return
        generator = _GENERATOR
        records = iter(values)
        stamps = None if timestamps is None else iter(timestamps)
        key: Any = None
        value: Any = None
        try:  # zero-cost on 3.11 when nothing is raised
            for key, kg, n in zip(keys, key_groups, lengths, strict=False):
                set_key(key, kg)
                if stamps is None:
                    ctx._ts = None
                    for value in islice(records, n):
                        result = fn(value, ctx)
                        if result.__class__ is generator:
                            out.extend(result)
                        elif result is not None:
                            _collect(out, result, "process_element")
                else:
                    for value, ts in zip(islice(records, n), islice(stamps, n), strict=False):
                        ctx._ts = ts
                        result = fn(value, ctx)
                        if result.__class__ is generator:
                            out.extend(result)
                        elif result is not None:
                            _collect(out, result, "process_element")
        except Exception as exc:
            _note(exc, f"process_element of key {_short(key)}, record {_short(value)}")
            raise

    def process_keyed(
        self,
        keys: Iterable[Any],
        key_groups: Iterable[Any],
        items: Iterable[Any],
        fn: Any,
        what: str = "process_partial",
    ) -> None:
        """``fn(item)`` for each ``(key, key group, item)`` of the zipped iterables, with the
        key as the current key (a window operator's pre-aggregated partials, SPEC §13.2); its
        outputs accumulate in :attr:`output`. An error gets a note naming ``what``, the key and
        the item, as a record's does."""
        set_key = self.keyed_backend.set_current_key
        for key, kg, item in zip(keys, key_groups, items, strict=False):
            set_key(key, kg)
            try:
                fn(item)
            except Exception as exc:
                _note(exc, f"{what} of key {_short(key)}, {_short(item)}")
                raise

    def on_event_time(self, timestamp: int, key: Any, namespace: Any) -> None:
        ctx = self._ctx
        ctx._ts = timestamp
        ctx._domain = TimeDomain.EVENT_TIME
        try:
            result = self.function.on_timer(timestamp, ctx)
            if result.__class__ is _GENERATOR:  # the common case (`yield`), one comparison
                self.output.extend(result)
            elif result is not None:
                _collect(self.output, result, "on_timer")
        except Exception as exc:
            _note(exc, f"on_timer of key {_short(key)}, event-time timer {timestamp}")
            raise

    def on_processing_time(self, timestamp: int, key: Any, namespace: Any) -> None:
        ctx = self._ctx
        ctx._ts = None
        ctx._domain = TimeDomain.PROCESSING_TIME
        try:
            _collect(self.output, self.function.on_timer(timestamp, ctx), "on_timer")
        except Exception as exc:
            _note(exc, f"on_timer of key {_short(key)}, processing-time timer {timestamp}")
            raise
        ctx._domain = TimeDomain.EVENT_TIME

    def get_internal_timer_service(
        self, name: str, namespace_serializer: TypeSerializer[Any], triggerable: Any
    ) -> InternalTimerService:
        """The timer service ``name``, created on first use (as Flink's
        ``getInternalTimerService``).

        Each service has its own namespace serializer and callbacks, is advanced with the
        operator's watermark and processing time; its timer queues belong to the keyed backend,
        which snapshots them as the pseudo-states ``_timers.<name>.event`` / ``.processing``.
        """
        service = self.timer_services.get(name)
        if service is not None:
            if service.triggerable is not triggerable:
                raise StateAccessError(
                    f"operator {self.operator_name!r}: timer service {name!r} is already "
                    "registered with another callback"
                )
            return service
        validate_name(name, "timer service")
        service = self._create_timer_service(name, namespace_serializer, triggerable)
        # a service created late (in open(), after a restore) starts at the operator's time
        watermark = self._watermark
        for other in self.timer_services.values():
            watermark = max(watermark, other.current_watermark)
        service.current_watermark = watermark
        if self._manual_processing_time is not None:
            service.advance_processing_time(self._manual_processing_time)
        # its queues are the backend's (created by the service): snapshotted with the keyed
        # state, and holding already the timers a restore before it existed brought back
        self.timer_services[name] = service
        return service

    def _create_timer_service(
        self, name: str, namespace_serializer: TypeSerializer[Any], triggerable: Any
    ) -> InternalTimerService:
        """A new timer service (the batch runtime's operator creates batch ones)."""
        return InternalTimerService(
            name,
            self.keyed_backend,
            triggerable,
            namespace_serializer,
            processing_time=self.clock.now,
        )

    def advance_watermark(self, watermark: int) -> int:
        """Fire event-time timers of every timer service up to ``watermark``; returns how many
        fired."""
        self._watermark = max(self._watermark, int(watermark))
        return sum(s.advance_watermark(watermark) for s in list(self.timer_services.values()))

    def advance_processing_time(self, time: int) -> int:
        """Set processing time on every timer service and fire due processing-time timers."""
        if self._manual_processing_time is None or time > self._manual_processing_time:
            self._manual_processing_time = int(time)
        return sum(s.advance_processing_time(time) for s in list(self.timer_services.values()))

    @property
    def current_watermark(self) -> int:
        return self._watermark

    def initialize_watermark(self, watermark: int) -> None:
        """Start at ``watermark`` (a restored checkpoint's) without firing any timer: timer
        services, including those created later, begin there; the next
        :meth:`advance_watermark` fires what is due."""
        self._watermark = max(self._watermark, int(watermark))
        for service in self.timer_services.values():
            service.current_watermark = max(service.current_watermark, self._watermark)

    def earliest_timers(self) -> tuple[int | None, int | None]:
        """The next event-time and processing-time timer to fire over every timer service
        (None: none pending); what a subtask reports so that the driver knows when a no-data
        micro-batch is due (``streamstate.spark.driver.step.no_data``)."""
        event = processing = None
        for s in self.timer_services.values():
            e = s.earliest_event_time_timer()
            if e is not None and (event is None or e < event):
                event = e
            p = s.earliest_processing_time_timer()
            if p is not None and (processing is None or p < processing):
                processing = p
        return event, processing

    def num_timers(self) -> int:
        """Event-time plus processing-time timers of every timer service."""
        return sum(
            s.num_event_time_timers() + s.num_processing_time_timers()
            for s in self.timer_services.values()
        )

    def drain_output(self) -> list[Any]:
        out, self.output = self.output, []
        return out

    def drain_side_output(self, tag: OutputTag) -> list[Any]:
        return self.side_outputs.pop(tag, [])

    # ---- checkpoints ---------------------------------------------------------------------------

    def prepare_snapshot(self, checkpoint_id: int) -> None:
        """Let a :class:`CheckpointedFunction` put its state into state handles first."""
        if isinstance(self.function, CheckpointedFunction):
            self.function.snapshot_state(_SnapshotContext(checkpoint_id, self.clock.now()))

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` was committed: the keyed backend may build on it (a
        RocksDB backend's next checkpoint references its SST files instead of uploading them)."""
        self.keyed_backend.notify_checkpoint_complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` will never commit: the keyed backend drops what it
        uploaded for it (a RocksDB backend's next checkpoint will not reference those files)."""
        self.keyed_backend.notify_checkpoint_aborted(checkpoint_id)

    def snapshot(self, checkpoint_id: int) -> OperatorSnapshot:
        """The synchronous phase of a checkpoint of this subtask."""
        self.prepare_snapshot(checkpoint_id)
        return OperatorSnapshot(
            checkpoint_id,
            self.keyed_backend.snapshot(checkpoint_id),
            self.operator_backend.snapshot(),
        )

    def __repr__(self) -> str:
        return (
            f"KeyedProcessOperator({self.operator_name!r}, subtask {self.subtask_index}/"
            f"{self.parallelism}, key groups {self.key_group_range})"
        )
