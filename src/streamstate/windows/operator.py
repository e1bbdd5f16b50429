"""The window operator: windows as keyed state namespaces plus timers (SPEC §9).

:class:`WindowOperator` is a :class:`KeyedProcessFunction`, so every runner that runs keyed
functions (the ``LocalRunner``, the Spark runtime) runs windows. Through the operator hook
(``bind_operator``, :class:`~streamstate.runtime.operator.InternalOperatorContext`) it gets the
keyed backend, its own timer service ``"window-timers"`` whose namespaces are windows, and the
operator's outputs. It follows Flink's ``WindowOperator``:

* per element: the assigner gives the windows; a window whose cleanup time has passed is
  skipped; otherwise the window becomes the namespace of the ``window-contents`` state (list
  state for process/apply functions, reducing or aggregating state for incremental ones), the
  element is added, the trigger sees it (its timers and state are in the window's namespace),
  and the *cleanup timer* ``max_timestamp + allowed_lateness`` is registered; an element all of
  whose windows were skipped is late: dropped (counted in ``num_late_records_dropped``) or sent
  to the late-data side output;
* per timer: the trigger decides to fire (emit the window function's results) and/or purge;
  at the cleanup time the window's contents, the trigger's timers and state, the window
  function's per-window state and (sessions) the window's entry in the merging window set are
  all removed, so nothing of a closed window is left behind;
* session windows merge through a per-key :class:`MergingWindowSet` persisted in keyed state
  (``merging-window-set``); a merge moves triggers and cleanup timers to the merge result and
  calls ``merge_namespaces(state_window, merged_state_windows)`` on the contents.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from streamstate.api.descriptors import (
    ListStateDescriptor,
    StateDescriptor,
)
from streamstate.api.functions import (
    KeyedProcessFunction,
    KeyedStateStore,
    OutputTag,
    RuntimeContext,
)
from streamstate.errors import StateAccessError
from streamstate.namespace import VOID_NAMESPACE
from streamstate.serializers import (
    TupleSerializer,
    TypeSerializer,
    VoidNamespaceSerializer,
)
from streamstate.serializers.window_namespaces import MAX_TIMESTAMP
from streamstate.windows.assigners import (
    MergingWindowAssigner,
    WindowAssigner,
    WindowAssignerContext,
)
from streamstate.windows.contents import WINDOW_CONTENTS, WindowContents
from streamstate.windows.functions import InternalWindowFunction, ProcessWindowFunction
from streamstate.windows.merging_window_set import MergingWindowSet
from streamstate.windows.partial import LATE, PARTIAL, Partial
from streamstate.windows.triggers import EventTimeTrigger, OnMergeContext, Trigger, TriggerResult

__all__ = ["WindowOperator"]

MERGING_WINDOW_SET = "merging-window-set"
_CONTINUE = TriggerResult.CONTINUE
TIMER_SERVICE = "window-timers"


class _WindowStateStore(KeyedStateStore):
    """Keyed state scoped to one namespace (a window, or the void namespace)."""

    __slots__ = ("_backend", "_namespace", "_serializer")

    def __init__(self, backend: Any, namespace: Any, serializer: TypeSerializer[Any]) -> None:
        self._backend = backend
        self._namespace = namespace
        self._serializer = serializer

    def _get(self, descriptor: StateDescriptor) -> Any:
        return self._backend.get_partitioned_state(self._namespace, self._serializer, descriptor)

    get_state = get_list_state = get_map_state = _get  # type: ignore[assignment]
    get_reducing_state = get_aggregating_state = _get  # type: ignore[assignment]


class _MergingWindowStateStore(KeyedStateStore):
    """``window_state()`` under a merging assigner: refused, as in Flink, since a merge would
    strand the per-window state of the windows merged away."""

    __slots__ = ()

    def _get(self, descriptor: StateDescriptor) -> Any:
        raise StateAccessError(
            "Per-window state is not allowed when using merging windows. "
            f"(state {descriptor.name!r}: a merge would leave it behind in the merged windows; "
            "use global_state() or the window contents)"
        )

    get_state = get_list_state = get_map_state = _get  # type: ignore[assignment]
    get_reducing_state = get_aggregating_state = _get  # type: ignore[assignment]


class _Context(OnMergeContext, WindowAssignerContext):
    """The trigger context (and assigner context) of the current key and window."""

    __slots__ = ("key", "merged_windows", "op", "window")

    def __init__(self, op: WindowOperator) -> None:
        self.op = op
        self.key: Any = None
        self.window: Any = None
        self.merged_windows: list[Any] = []

    # -- trigger context --
    def get_current_processing_time(self) -> int:
        return self.op._timers.current_processing_time()

    def get_metric_group(self) -> Any:
        return self.op._internal.metric_group

    def get_current_watermark(self) -> int:
        return self.op._timers.current_watermark  # type: ignore[no-any-return]

    def register_processing_time_timer(self, time: int) -> None:
        self.op._timers.register_processing_time_timer(self.window, time)

    def register_event_time_timer(self, time: int) -> None:
        self.op._timers.register_event_time_timer(self.window, time)

    def delete_processing_time_timer(self, time: int) -> None:
        self.op._timers.delete_processing_time_timer(self.window, time)

    def delete_event_time_timer(self, time: int) -> None:
        self.op._timers.delete_event_time_timer(self.window, time)

    def get_partitioned_state(self, state_descriptor: StateDescriptor) -> Any:
        op = self.op
        return op._backend.get_partitioned_state(
            self.window, op._window_serializer, state_descriptor
        )

    def merge_partitioned_state(self, state_descriptor: StateDescriptor) -> None:
        if self.merged_windows:
            self.get_partitioned_state(state_descriptor).merge_namespaces(
                self.window, self.merged_windows
            )

    # -- used by the process window function's context --
    def window_state(self) -> KeyedStateStore:
        op = self.op
        if op._merging:
            return _MergingWindowStateStore()
        return _WindowStateStore(op._backend, self.window, op._window_serializer)

    def global_state(self) -> KeyedStateStore:
        return _WindowStateStore(self.op._backend, VOID_NAMESPACE, VoidNamespaceSerializer())

    def output(self, tag: OutputTag, value: Any) -> None:
        self.op._internal.output(tag, value)


class _FunctionContext(ProcessWindowFunction.Context):
    """``context.window()`` etc. for the user's process window function."""

    __slots__ = ("_ctx",)

    def __init__(self, ctx: _Context) -> None:
        self._ctx = ctx

    def window(self) -> Any:
        return self._ctx.window

    def current_processing_time(self) -> int:
        return self._ctx.get_current_processing_time()

    def current_watermark(self) -> int:
        return self._ctx.get_current_watermark()

    def window_state(self) -> KeyedStateStore:
        return self._ctx.window_state()

    def global_state(self) -> KeyedStateStore:
        return self._ctx.global_state()

    def output(self, tag: OutputTag, value: Any) -> None:
        self._ctx.output(tag, value)


class WindowOperator(KeyedProcessFunction[Any, Any]):
    """A window specification run as a keyed function; build it with
    :func:`~streamstate.windows.windowed_stream.window`."""

    def __init__(
        self,
        assigner: WindowAssigner,
        trigger: Trigger,
        contents: WindowContents,
        window_function: InternalWindowFunction,
        allowed_lateness: int = 0,
        late_data_output_tag: OutputTag | None = None,
    ) -> None:
        if allowed_lateness < 0:
            raise ValueError(f"allowed_lateness must be >= 0, got {allowed_lateness}")
        if isinstance(assigner, MergingWindowAssigner) and not trigger.can_merge():
            raise ValueError(
                f"{type(assigner).__name__} merges windows, which {trigger!r} does not support"
            )
        self.assigner = assigner
        self.trigger = trigger
        self.contents = contents
        self.window_function = window_function
        self.allowed_lateness = allowed_lateness
        self.late_data_output_tag = late_data_output_tag
        self._internal: Any = None

    def assume_element_type(self, element_type: Any) -> None:
        """Type the elements of a ``reduce`` window that was given no ``element_type``, before
        it opens: pre-aggregated on Spark its subtasks never see a first element to infer it
        from, so the type comes from the input's schema."""
        if self.contents.element_type is None:
            self.contents.element_type = element_type

    # ---- lifecycle -------------------------------------------------------------------------

    def bind_operator(self, context: Any) -> None:
        """Called by the hosting operator before ``open`` (see InternalOperatorContext)."""
        self._internal = context

    def open(self, runtime_context: RuntimeContext) -> None:
        internal = self._internal
        if internal is None:
            raise StateAccessError(
                "a window function must run in a keyed operator (LocalRunner, "
                "streamstate.spark.keyed_process); its operator did not call bind_operator"
            )
        self._backend = internal.keyed_backend
        self._window_serializer = self.assigner.get_window_serializer()
        self._timers = internal.get_internal_timer_service(
            TIMER_SERVICE, self._window_serializer, self
        )
        self._event_time = self.assigner.is_event_time()
        self._merging = isinstance(self.assigner, MergingWindowAssigner)
        self._ctx = _Context(self)
        self._fn_ctx = _FunctionContext(self._ctx)
        self._window_state: Any = None
        if self._contents_type_known():
            self._create_window_state(None, False)
        else:
            # restored contents: their element serializer comes from the checkpoint, so pending
            # windows can fire on the first watermark, before any new element
            meta = self._backend.restored_state_meta(WINDOW_CONTENTS)
            descriptor = (
                None if meta is None else self._restored_contents_descriptor(meta.state_serializer)
            )
            if descriptor is not None:
                self._window_state = self._backend.get_or_create_keyed_state(
                    self._window_serializer, descriptor
                )
        for descriptor in self.trigger.state_descriptors():  # declared now, checked now
            self._backend.get_or_create_keyed_state(self._window_serializer, descriptor)
        if self._merging:
            ser = self._window_serializer
            self._merging_sets = self._backend.get_or_create_keyed_state(
                VoidNamespaceSerializer(),
                ListStateDescriptor(MERGING_WINDOW_SET, TupleSerializer(ser, ser)),
            )
        self._late_records_dropped = runtime_context.get_metrics_group().counter(
            "num_late_records_dropped"
        )
        #: the event-time trigger without allowed lateness: a window's one timer is its end,
        #: which is also its cleanup time, and is pending while the window has contents
        self._one_timer_per_window = (
            self._event_time
            and type(self.trigger) is EventTimeTrigger
            and not self.allowed_lateness
        )
        fn = self.contents.function
        #: merges a pre-aggregated group into a window's contents (SPEC §13.2)
        self._merge_contents: Any = None
        if self.contents.kind == "aggregating":
            self._merge_contents = fn.merge
        elif self.contents.kind == "reducing":
            self._merge_contents = fn.reduce
        self.window_function.open(runtime_context)

    def close(self) -> None:
        self.window_function.close()

    def _restored_contents_descriptor(self, state_serializer: Any) -> Any:
        """The window contents' descriptor rebuilt from a checkpoint's state serializer, or None
        if the element type must still be inferred from the first new element."""
        return self.contents.restored_descriptor(state_serializer)

    def _contents_type_known(self) -> bool:
        """Whether the contents state can be created before the first element."""
        return self.contents.kind == "aggregating" or self.contents.element_type is not None

    def _stored_element(self, value: Any, timestamp: int | None) -> Any:
        """What is added to the contents state for an element (the evicting operator keeps
        its timestamp too)."""
        return value

    def _create_window_state(self, element: Any, has_element: bool) -> Any:
        descriptor = self.contents.descriptor(element, has_element)
        self._window_state = self._backend.get_or_create_keyed_state(
            self._window_serializer, descriptor
        )
        return self._window_state

    def _contents_state(self) -> Any:
        state = self._window_state
        if state is None:
            state = self._create_window_state(None, False)
        return state

    # ---- time ------------------------------------------------------------------------------

    def _cleanup_time(self, window: Any) -> int:
        if self._event_time:
            t = window.max_timestamp() + self.allowed_lateness
            return t if t < MAX_TIMESTAMP else MAX_TIMESTAMP
        return window.max_timestamp()  # type: ignore[no-any-return]

    def _is_window_late(self, window: Any) -> bool:
        return self._event_time and self._cleanup_time(window) <= self._timers.current_watermark

    def _is_element_late(self, timestamp: int | None) -> bool:
        return (
            self._event_time
            and timestamp is not None
            and timestamp + self.allowed_lateness <= self._timers.current_watermark
        )

    def _register_cleanup_timer(self, window: Any) -> None:
        t = self._cleanup_time(window)
        if t == MAX_TIMESTAMP:
            return  # no timer at the end of time
        if self._event_time:
            self._timers.register_event_time_timer(window, t)
        else:
            self._timers.register_processing_time_timer(window, t)

    def _delete_cleanup_timer(self, window: Any) -> None:
        t = self._cleanup_time(window)
        if t == MAX_TIMESTAMP:
            return
        if self._event_time:
            self._timers.delete_event_time_timer(window, t)
        else:
            self._timers.delete_processing_time_timer(window, t)

    # ---- elements --------------------------------------------------------------------------

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> None:
        timestamp = ctx.timestamp()
        tctx = self._ctx
        tctx.key = key = ctx.get_current_key()
        windows = self.assigner.assign_windows(value, timestamp, tctx)
        state = self._window_state
        if state is None:
            state = self._create_window_state(value, True)
        element = self._stored_element(value, timestamp)
        trigger = self.trigger
        skipped = True
        if self._merging:
            merging = self._merging_window_set()
            for window in windows:
                actual = merging.add_window(window, self._merge)
                if self._is_window_late(actual):  # can only be a window that merged nothing
                    merging.retire_window(actual)
                    continue
                skipped = False
                state_window = merging.get_state_window(actual)
                if state_window is None:
                    raise StateAccessError(f"window {actual!r} is not in the in-flight set")
                state.set_current_namespace(state_window)
                state.add(element)
                tctx.window = actual
                result = trigger.on_element(value, timestamp, actual, tctx)
                if result.is_fire():
                    self._fire(key, actual, state)
                if result.is_purge():
                    state.clear()
                self._register_cleanup_timer(actual)
            merging.persist()
        else:
            for window in windows:
                if self._is_window_late(window):
                    continue
                skipped = False
                state.set_current_namespace(window)
                state.add(element)
                tctx.window = window
                result = trigger.on_element(value, timestamp, window, tctx)
                if result.is_fire():
                    self._fire(key, window, state)
                if result.is_purge():
                    state.clear()
                self._register_cleanup_timer(window)
        if skipped and self._is_element_late(timestamp):
            if self.late_data_output_tag is not None:
                self._internal.output(self.late_data_output_tag, value)
            else:
                self._late_records_dropped.inc()
        return None

    def process_partial(self, partial: Partial) -> None:
        """Take a group of the current key's elements folded before the shuffle (SPEC §13.2,
        :mod:`streamstate.windows.pre_aggregation`): a PARTIAL's accumulator (or reduced value)
        is merged into its window's contents with ``merge`` (or the reduce function), then the
        trigger sees it as one element with the group's earliest timestamp and the cleanup timer
        is registered, as :meth:`process_element` does for each element; without a window, the
        windows are the assigner's for the subtask's time (processing-time and global windows,
        the same for every element of a micro-batch). LATE elements are dropped and counted, or
        sent to the late side output; WINDOWLESS ones belong to no window.

        Only non-merging assigners (:func:`~streamstate.windows.pre_aggregation.
        pre_aggregation_of`).
        """
        kind = partial.kind
        if kind == LATE:
            if self.late_data_output_tag is not None:
                self._internal.output(self.late_data_output_tag, partial.element)
            else:
                self._late_records_dropped.inc(partial.count)
            return
        if kind != PARTIAL:
            # elements in no window: late (counted) if behind the watermark, as per record
            if partial.timestamp is not None and self._is_element_late(partial.timestamp):
                self._late_elements(partial.records)
            return
        window = partial.window
        if window is not None:
            self._merge_partial(window, partial.accumulator, partial.timestamp, partial.records)
            return
        windows = self.assigner.assign_windows(None, partial.timestamp, self._ctx)
        # one accumulator for several windows: merge may change its arguments
        copy = self._contents_state().descriptor.serializer.copy
        for w in windows:
            self._merge_partial(
                w,
                partial.accumulator if len(windows) == 1 else copy(partial.accumulator),
                partial.timestamp,
                partial.records,
            )

    def process_folded(self, item: tuple[Any, Any, int, int]) -> None:
        """:meth:`process_partial` of a PARTIAL whose window is known, given as the tuple
        ``(window, accumulator, earliest timestamp, records)`` (what
        :class:`~streamstate.spark.partials.PartialReader` hands over when a batch holds only
        such rows: no object per row)."""
        window, accumulator, timestamp, records = item
        self._merge_partial(window, accumulator, timestamp, records)

    def _merge_partial(
        self, window: Any, accumulator: Any, timestamp: int | None, records: int
    ) -> None:
        """:meth:`process_partial` for one window (the per-element steps of
        :meth:`process_element`, with ``merge`` instead of ``add``): ``records`` elements whose
        latest window it is, the earliest at ``timestamp``."""
        if self._event_time and self._is_window_late(window):
            # the fold left lateness to the subtask: the window is late for all of the group's
            # elements, and those whose latest window it is are late
            self._late_elements(records)
            return
        state = self._window_state
        if state is None:
            state = self._contents_state()
        state.set_current_namespace(window)
        current = state.get_internal()
        state.update_internal(
            accumulator if current is None else self._merge_contents(current, accumulator)
        )
        if self._one_timer_per_window:
            # what the trigger and the cleanup timer would do: the window is not late, so the
            # trigger continues, and registers the timer its first contents need (set
            # semantics: once is enough)
            if current is None:
                self._timers.register_event_time_timer(window, window.max_timestamp())
            return
        tctx = self._ctx
        tctx.key = key = self._backend.get_current_key()
        tctx.window = window
        result = self.trigger.on_element(None, timestamp, window, tctx)
        if result is not _CONTINUE:
            if result.is_fire():
                self._fire(key, window, state)
            if result.is_purge():
                state.clear()
        self._register_cleanup_timer(window)

    def _late_elements(self, records: int) -> None:
        """``records`` late elements of a group whose lateness the fold left to the subtask:
        counted (such a fold runs only without a late side output, which needs the
        elements)."""
        if self.late_data_output_tag is not None:
            raise StateAccessError(
                f"{records} late elements reached the window operator pre-aggregated, "
                f"so they cannot go to the late side output {self.late_data_output_tag!r}: the "
                "fold must decide lateness when there is a late side output"
            )
        self._late_records_dropped.inc(records)

    def _merge(
        self, merge_result: Any, merged_windows: list[Any], state_window: Any, merged: list[Any]
    ) -> None:
        """Called by the merging window set for every merge."""
        if self._event_time:
            if self._cleanup_time(merge_result) <= self._timers.current_watermark:
                raise StateAccessError(
                    f"merging into {merge_result!r} would make an event-time window end before "
                    "the current watermark; check the assigner's merge logic"
                )
        elif merge_result.max_timestamp() <= self._timers.current_processing_time():
            raise StateAccessError(
                f"merging into {merge_result!r} would make a processing-time window end before "
                "the current processing time"
            )
        tctx = self._ctx
        tctx.window = merge_result
        tctx.merged_windows = merged_windows
        self.trigger.on_merge(merge_result, tctx)
        tctx.merged_windows = []
        for w in merged_windows:
            tctx.window = w
            self.trigger.clear(w, tctx)
            self._delete_cleanup_timer(w)
        tctx.window = merge_result
        if merged:
            self._contents_state().merge_namespaces(state_window, merged)

    def _merging_window_set(self) -> MergingWindowSet:
        state = self._merging_sets
        state.set_current_namespace(VOID_NAMESPACE)
        return MergingWindowSet(self.assigner, state)

    # ---- timers ----------------------------------------------------------------------------

    def on_event_time(self, timestamp: int, key: Any, window: Any) -> None:
        self._on_timer(timestamp, key, window, event_time=True)

    def on_processing_time(self, timestamp: int, key: Any, window: Any) -> None:
        self._on_timer(timestamp, key, window, event_time=False)

    def _on_timer(self, timestamp: int, key: Any, window: Any, event_time: bool) -> None:
        tctx = self._ctx
        tctx.key = key
        tctx.window = window
        state = self._contents_state()
        if event_time and self._one_timer_per_window and not self._merging:
            # the window's one timer is its end and its cleanup time (what the steps below do
            # then: the trigger fires, the window's state goes, and the trigger's clear deletes
            # the timer that just fired): a million windows firing in a no-data step
            state.set_current_namespace(window)
            self._fire(key, window, state)
            state.clear()
            self.window_function.clear(window, self._fn_ctx)
            return
        merging = None
        if self._merging:
            merging = self._merging_window_set()
            state_window = merging.get_state_window(window)
            if state_window is None:
                return  # the window was merged away or retired; its timers went with it
            state.set_current_namespace(state_window)
        else:
            state.set_current_namespace(window)
        if event_time:
            result = self.trigger.on_event_time(timestamp, window, tctx)
        else:
            result = self.trigger.on_processing_time(timestamp, window, tctx)
        if result.is_fire():
            self._fire(key, window, state)
        if result.is_purge():
            state.clear()
        if event_time == self._event_time and timestamp == self._cleanup_time(window):
            self._clear_all_state(window, state, merging)
        if merging is not None:
            merging.persist()

    def _clear_all_state(self, window: Any, state: Any, merging: MergingWindowSet | None) -> None:
        state.clear()
        tctx = self._ctx
        tctx.window = window
        self.trigger.clear(window, tctx)
        self.window_function.clear(window, self._fn_ctx)
        if merging is not None:
            merging.retire_window(window)

    # ---- output ----------------------------------------------------------------------------

    @property
    def timer_service(self) -> Any:
        """The window timers' service (open only): current watermark and processing time."""
        return self._timers

    @property
    def metric_group(self) -> Any:
        """The hosting operator's metric group (open only)."""
        return self._internal.metric_group

    def emit_results(self, result: Iterable[Any] | None) -> None:
        """Send what a window function returned (a list, a generator or None) to the hosting
        operator's main output."""
        _emit_all(self._internal, result)

    def _fire(self, key: Any, window: Any, state: Any) -> None:
        contents = state.get()
        if contents is None:
            return
        if not self.contents.single:
            if not contents:
                return
            contents = list(contents)  # the function may keep or change it; the state must not
        self._ctx.window = window
        result = self.window_function.process(key, window, self._fn_ctx, contents)
        self.emit_results(result)

    def __repr__(self) -> str:
        return (
            f"WindowOperator({self.assigner!r}, trigger={self.trigger!r}, "
            f"allowed_lateness={self.allowed_lateness})"
        )


def _emit_all(internal: Any, result: Iterable[Any] | None) -> None:
    if result is None:
        return
    if isinstance(result, (str, bytes, tuple, dict)):
        raise StateAccessError(
            f"a window function returned a {type(result).__name__}; return a list of outputs "
            "or use `yield`"
        )
    emit = internal.emit
    for value in result:
        emit(value)
