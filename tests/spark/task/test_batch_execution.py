"""Batch execution against the streaming path, in process (no Spark; SPEC §13.3).

Random jobs run twice over the same bounded input, subtask by subtask, exactly as Spark's tasks
run them: through :class:`~streamstate.spark.task.batch_subtask.BatchSubtaskRuntime` over each
subtask's records sorted by key and event time (floating-point keys by key group first: what
``sortWithinPartitions`` hands a task; their key groups interleave), and through the streaming
:class:`~streamstate.spark.subtask.SubtaskRuntime` over the same records as they come
(event-time order when there is event time, so that each key sees its records in the same
order). Both are fed Arrow batches with the placement's ``_kg`` column, in chunks that cut keys
across batch boundaries.

The streaming reference ends as Flink's BATCH mode does: the watermark jumps to the end of time
at the end of the input, and so does processing time (every processing-time timer fires). Per
key the outputs must be the same sequence (across keys Flink leaves the order open), and a
savepoint written in batch mode must hold exactly the entries the streaming path's savepoint
holds. Functions never register timers from timer callbacks at the end: batch execution ignores
those, as Flink does (tested on its own below).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamstate import (
    AggregateFunction,
    AggregatingStateDescriptor,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    OutputTag,
    ReducingStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)
from streamstate.backends.base import Clock
from streamstate.checkpoint.coordinator import CheckpointCoordinator
from streamstate.checkpoint.metadata import SubtaskStateHandle
from streamstate.checkpoint.storage import FileSystemCheckpointStorage
from streamstate.format.codec import StateCodec
from streamstate.format.keyed_file import KeyedSnapshotReader
from streamstate.keygroups import (
    assign_key_groups_for_columns,
    assign_to_key_group,
    compute_operator_index_for_key_group,
)
from streamstate.serializers import Int64Serializer, serializer_from_snapshot
from streamstate.spark.job import JobSpec, arrow_schema_to_bytes
from streamstate.spark.subtask import SubtaskRuntime
from streamstate.spark.task.batch_subtask import BatchSubtaskRuntime
from streamstate.spark.wire.results import BatchResult
from streamstate.windows import (
    CountEvictor,
    CountTrigger,
    DeltaTrigger,
    EventTimeSessionWindows,
    GlobalWindows,
    ProcessingTimeTrigger,
    ProcessWindowFunction,
    PurgingTrigger,
    SlidingEventTimeWindows,
    TimeEvictor,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    window,
)

MAX_TS = (1 << 63) - 1
#: processing time when a run begins, and the clock while timers fire at the end
PT0 = 1_000_000
PT_END = PT0 + 100_000
OUTPUT = pa.schema([("key", pa.string()), ("out", pa.string())])

#: key kind -> (key columns with their Arrow types, key of a record from an int)
KEY_KINDS: dict[str, tuple[list[tuple[str, pa.DataType]], Callable[[int], Any]]] = {
    "int": ([("k", pa.int64())], lambda i: i * 7919 - 3),
    "str": ([("k", pa.string())], lambda i: f"user-{i}"),
    "bytes": ([("k", pa.binary())], lambda i: bytes([i % 7, i])),
    "tuple": ([("k", pa.int64()), ("k2", pa.string())], lambda i: (i % 3, f"s{i}")),
    "float": ([("k", pa.float64())], lambda i: i * 0.5 - 2.5),
}


class ManualClock(Clock):
    """The processing-time clock of both runs, moved by the functions themselves: to a record's
    ``pt`` when it is processed, to ``PT_END`` when a timer fires. So a key sees the same
    clock in both runs."""

    def __init__(self) -> None:
        self.t = PT0

    def now(self) -> int:
        return self.t


def _out(key: Any, *rest: Any) -> tuple[str, str]:
    return repr(key), repr(rest)


# ---- the jobs ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Input:
    key_kind: str
    #: (key index, v, ts, pt) in arrival order
    records: list[tuple[int, int, int, int]]
    parallelism: int
    max_parallelism: int
    event_time: bool
    chunk: int


@st.composite
def inputs(draw: Any, max_records: int = 60) -> Input:
    n_keys = draw(st.integers(1, 12))
    records = draw(
        st.lists(
            st.tuples(
                st.integers(0, n_keys - 1),
                st.integers(0, 50),
                st.integers(0, 120),
                st.integers(PT0, PT0 + 60),
            ),
            min_size=1,
            max_size=max_records,
        )
    )
    return Input(
        key_kind=draw(st.sampled_from(sorted(KEY_KINDS))),
        records=records,
        parallelism=draw(st.sampled_from([1, 3])),
        # few key groups: several keys share a key group
        max_parallelism=draw(st.sampled_from([3, 4, 8])),
        event_time=draw(st.booleans()),
        chunk=draw(st.integers(1, 9)),
    )


def _schemas(kind: str) -> tuple[pa.Schema, list[str], list[str]]:
    key_fields, _ = KEY_KINDS[kind]
    value_fields = [*key_fields, ("v", pa.int64()), ("ts", pa.int64()), ("pt", pa.int64())]
    schema = pa.schema([*value_fields, ("_kg", pa.int32())])
    return schema, [n for n, _ in key_fields], [n for n, _ in value_fields]


def _job(inp: Input, checkpoint_url: str = "") -> JobSpec:
    schema, keys, values = _schemas(inp.key_kind)
    return JobSpec(
        operator="op",
        parallelism=inp.parallelism,
        max_parallelism=inp.max_parallelism,
        key_columns=keys,
        value_columns=values,
        input_schema=arrow_schema_to_bytes(schema),
        output_schema=arrow_schema_to_bytes(OUTPUT),
        event_time="ts" if inp.event_time else None,
        checkpoint_url=checkpoint_url,
    )


def _rows(inp: Input) -> list[tuple[Any, ...]]:
    """``(key, v, ts, pt, kg)`` per record, in the order the streaming path processes them
    (arrival order, or event-time order with event time; ties keep their arrival order).

    The processing time ``pt`` never goes back in that order (a record's drawn ``pt`` is its
    increment), so it never goes back either within one key's records, which is all batch
    execution needs: TTL then decides the same in both modes.
    """
    make = KEY_KINDS[inp.key_kind][1]
    records = list(inp.records)
    if inp.event_time:
        records.sort(key=lambda r: r[2])
    out = []
    pt = PT0
    for i, v, ts, step in records:
        pt += (step - PT0) % 16
        key = make(i)
        out.append((key, v, ts, pt, assign_to_key_group(key, inp.max_parallelism)))
    return out


def _batches(inp: Input, rows: list[tuple[Any, ...]]) -> list[pa.RecordBatch]:
    schema, key_names, _ = _schemas(inp.key_kind)
    out = []
    for start in range(0, len(rows), inp.chunk):
        part = rows[start : start + inp.chunk]
        keys = [r[0] for r in part]
        key_columns = (
            [pa.array(keys, schema.field(key_names[0]).type)]
            if len(key_names) == 1
            else [
                pa.array([k[j] for k in keys], schema.field(key_names[j]).type)
                for j in range(len(key_names))
            ]
        )
        kgs = assign_key_groups_for_columns(key_columns, inp.max_parallelism)
        assert list(kgs) == [r[4] for r in part]  # the placement's key groups, vectorized
        arrays = [
            *key_columns,
            pa.array([r[1] for r in part], pa.int64()),
            pa.array([r[2] for r in part], pa.int64()),
            pa.array([r[3] for r in part], pa.int64()),
            pa.array(kgs, pa.int32()),
        ]
        out.append(pa.RecordBatch.from_arrays(arrays, schema=schema))
    return out


def _partition(inp: Input, mode: str) -> list[list[tuple[Any, ...]]]:
    rows = _rows(inp)
    parts: list[list[tuple[Any, ...]]] = [[] for _ in range(inp.parallelism)]
    for r in rows:
        parts[
            compute_operator_index_for_key_group(inp.max_parallelism, inp.parallelism, r[4])
        ].append(r)
    if mode == "batch":  # Spark's sortWithinPartitions (spark/driver/batch.py, sort_columns)
        first = inp.key_kind == "float"  # by key group first
        for part in parts:
            part.sort(key=lambda r: (r[4] if first else 0, r[0], r[2] if inp.event_time else 0))
    return parts


@dataclasses.dataclass
class Run:
    outputs: list[tuple[str, str]]
    handles: list[Any]
    ignored_timers: int = 0
    #: late elements dropped or sent to a side output (none: no watermark before a key ends)
    late: int = 0


def run(
    mode: str,
    inp: Input,
    factory: Callable[[], KeyedProcessFunction],
    clock: ManualClock,
    savepoint: tuple[str, str] | None = None,
) -> Run:
    """Run every subtask of the job in ``mode`` ("batch" or "streaming"); with ``savepoint``
    (storage root, directory) each subtask writes its savepoint files there."""
    clock.t = PT0
    job = _job(inp, savepoint[0] if savepoint else "")
    outputs: list[tuple[str, str]] = []
    handles = []
    ignored = 0
    late = 0
    for index, part in enumerate(_partition(inp, mode)):
        runtime: SubtaskRuntime
        if mode == "batch":
            runtime = BatchSubtaskRuntime(
                job, index, factory, clock=clock, savepoint=savepoint is not None
            )
        else:
            runtime = SubtaskRuntime(job, index, factory, incremental=False, clock=clock)
        batches: list[pa.RecordBatch] = []
        try:
            runtime.prepare(-1, "empty")
            runtime.begin(None, PT0)
            for batch in _batches(inp, part):
                runtime.process(batch)
                batches.extend(runtime.output_batches())
            runtime.end_of_input()
            if mode == "streaming":
                runtime.op.advance_processing_time(MAX_TS)  # as Flink's BATCH mode: all fire
            else:
                ignored += runtime.op.ignored_timers
            batches.extend(runtime.output_batches())
            late += runtime._late_records_dropped() + runtime._side_dropped
            late += sum(len(v) for v in runtime._pending_side.values())
            if savepoint is not None:
                clock.t = PT_END
                result = runtime.finish(1, index, "savepoint", savepoint=savepoint[1])
                assert isinstance(result, BatchResult)
                handles.append(result.handle)
        finally:
            runtime.close()
        for b in batches:
            outputs.extend(zip(b.column(0).to_pylist(), b.column(1).to_pylist(), strict=True))
    return Run(outputs, handles, ignored, late)


def per_key(outputs: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = collections.defaultdict(list)
    for key, rest in outputs:
        out[key].append(rest)
    return dict(out)


def assert_same(batch: Run, streaming: Run) -> None:
    assert collections.Counter(batch.outputs) == collections.Counter(streaming.outputs)
    assert per_key(batch.outputs) == per_key(streaming.outputs)
    assert batch.ignored_timers == 0
    assert batch.late == streaming.late == 0


def commit_savepoint(
    root: str, directory: str, inp: Input, handles: list[SubtaskStateHandle]
) -> None:
    """What the driver does once every task wrote its savepoint files
    (``spark/driver/batch.py``)."""

    storage = FileSystemCheckpointStorage(root, "")
    coordinator = CheckpointCoordinator(storage)
    try:
        coordinator.commit(
            1,
            handles,
            expected={"op": inp.parallelism},
            properties={"batch_mode": True},
            savepoint_directory=directory,
        )
    finally:
        coordinator.close()


def savepoint_entries(root: str, directory: str) -> tuple[list[Any], dict[Any, Any]]:
    """The declared states (name, kind) and every ``(state, key group, key, namespace) ->
    value`` entry of a savepoint, read from its files."""
    storage = FileSystemCheckpointStorage(root, "")
    cp = storage.load(directory)
    declared = set()
    entries: dict[Any, Any] = {}
    for op in cp.metadata.operators.values():
        for sub in op.subtasks:
            for handle in sub.keyed:
                path = cp.resolve(handle.path)
                with storage.open_read(path) as f:
                    reader = KeyedSnapshotReader(f, path)
                    key_serializer = serializer_from_snapshot(reader.key_serializer)
                    for s in reader.states:
                        declared.add((s.name, s.kind))
                    for kg, blocks in reader.read():
                        for block in blocks:
                            meta = reader.states[block.state_id]
                            codec = StateCodec(
                                key_serializer,
                                serializer_from_snapshot(meta.namespace_serializer),
                                serializer_from_snapshot(meta.state_serializer),
                            )
                            keys, namespaces, values = codec.decode(block.entries)
                            if len(namespaces) != len(keys):
                                namespaces = namespaces * len(keys)
                            for key, ns, value in zip(keys, namespaces, values, strict=True):
                                ident = (meta.name, kg, key, ns)
                                assert ident not in entries, f"{ident} twice"
                                entries[ident] = value
    return sorted(declared), entries


# ---- a function using every state kind, namespaces, timers and TTL -------------------------------


class Average(AggregateFunction):
    def create_accumulator(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, value: int, acc: tuple[int, int]) -> tuple[int, int]:
        return (acc[0] + value, acc[1] + 1)

    def get_result(self, acc: tuple[int, int]) -> float:
        return acc[0] / acc[1]

    def merge(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        return (a[0] + b[0], a[1] + b[1])


TTL_MODES = {
    "write": StateTtlConfig.new_builder(20).cleanup_full_snapshot().build(),
    # incremental cleanup (the default) visits other keys' entries while a key is processed:
    # invisible to reads that never return expired values, but it decides which expired
    # entries a savepoint without full-snapshot cleanup still holds (so not in the savepoint
    # test)
    "incremental": StateTtlConfig.new_builder(20).cleanup_incrementally(3, True).build(),
    "read": StateTtlConfig.new_builder(20)
    .update_ttl_on_read_and_write()
    .disable_cleanup_in_background()
    .build(),
    # with a value returned "if not cleaned up", the streaming path's incremental cleanup (which
    # visits other keys' entries) decides what a read returns: turned off
    "expired": StateTtlConfig.new_builder(20)
    .return_expired_if_not_cleaned_up()
    .disable_cleanup_in_background()
    .cleanup_full_snapshot()
    .build(),
}


class AllKinds(KeyedProcessFunction):
    """Value, list, map, reducing and aggregating state, a namespaced list and reducing state
    merged across namespaces, TTL value and list state, event- and processing-time timers
    registered and deleted; the record's ``v`` chooses what it does. Every output starts with
    the key and shows the state it read."""

    def __init__(self, clock: ManualClock, ttl: str) -> None:
        self.clock = clock
        self.ttl = ttl

    def bind_operator(self, context: Any) -> None:
        self.backend = context.keyed_backend

    def open(self, ctx: Any) -> None:
        ttl = TTL_MODES[self.ttl]
        self.value = ctx.get_state(ValueStateDescriptor("value", int, default=0))
        self.list = ctx.get_list_state(ListStateDescriptor("list", int))
        self.map = ctx.get_map_state(MapStateDescriptor("map", int, str))
        self.reducing = ctx.get_reducing_state(ReducingStateDescriptor("max", max, int))
        self.agg = ctx.get_aggregating_state(
            AggregatingStateDescriptor("avg", Average(), tuple[int, int])
        )
        self.ttl_value = ctx.get_state(
            ValueStateDescriptor("ttl-value", int).enable_time_to_live(ttl)
        )
        self.ttl_list = ctx.get_list_state(
            ListStateDescriptor("ttl-list", int).enable_time_to_live(ttl)
        )
        self.by_ns = self.backend.get_partitioned_state(
            0, Int64Serializer(), ListStateDescriptor("by-ns", int)
        )
        self.sum_ns = self.backend.get_partitioned_state(
            0, Int64Serializer(), ReducingStateDescriptor("sum-ns", lambda a, b: a + b, int)
        )

    def process_element(self, row: Any, ctx: Any) -> Any:
        self.clock.t = row.pt
        key = ctx.get_current_key()
        v = row.v
        timers = ctx.timer_service()
        yield _out(
            key, "in", v, ctx.timestamp(), timers.current_watermark(), self.value.value(),
            self.ttl_value.value(), list(self.ttl_list.get()),
        )  # fmt: skip
        self.value.update(self.value.value() + v)
        self.reducing.add(v)
        self.agg.add(v)
        op = v % 10
        if op == 0:
            self.list.add(v)
            self.ttl_value.update(v)
        elif op == 1:
            self.map.put(v % 3, f"m{v}")
            self.ttl_list.add(v)
        elif op == 2:
            self.map.remove((v // 10) % 3)
            self.list.update([v, v + 1] if v % 4 else [])
        elif op == 3:
            self.by_ns.set_current_namespace(v % 3)
            self.by_ns.add(v)
            self.sum_ns.set_current_namespace(v % 4)
            self.sum_ns.add(v)
        elif op == 4:
            self.by_ns.merge_namespaces(0, [1, 2])
            self.sum_ns.merge_namespaces(v % 4, [(v + 1) % 4, (v + 2) % 4])
            self.by_ns.set_current_namespace(0)
            yield _out(key, "merged", list(self.by_ns.get()))
        elif op == 5:
            timers.register_event_time_timer(row.ts + v % 7)
        elif op == 6:
            timers.register_processing_time_timer(PT0 + v % 5)
            timers.delete_event_time_timer(row.ts + (v + 3) % 7)
        elif op == 7:
            self.list.clear()
            self.map.clear()
            self.ttl_value.clear()
        elif op == 8:
            timers.register_event_time_timer(row.ts)
            timers.register_event_time_timer(row.ts)  # set semantics
            self.ttl_list.add_all([v, v])
        else:
            self.agg.add(None)  # clears, as Flink's heap backend
            self.reducing.clear()
        yield _out(
            key, "state", self.reducing.get(), self.agg.get(), list(self.list.get()),
            sorted(self.map.items()), self.map.contains(v % 3), self.map.is_empty(),
        )  # fmt: skip

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        self.clock.t = PT_END
        key = ctx.get_current_key()
        self.by_ns.set_current_namespace(0)
        yield _out(
            key, "timer", timestamp, ctx.time_domain(), ctx.timer_service().current_watermark(),
            self.value.value(), self.ttl_value.value(), list(self.ttl_list.get()),
            list(self.by_ns.get()),
        )  # fmt: skip
        self.value.update(self.value.value() + 1000)
        if timestamp % 2:
            self.map.put(-1, "timer")


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(inp=inputs(), ttl=st.sampled_from(sorted(TTL_MODES)))
def test_batch_execution_equals_the_streaming_path(inp: Input, ttl: str) -> None:
    clock = ManualClock()
    factory = lambda: AllKinds(clock, ttl)  # noqa: E731
    assert_same(run("batch", inp, factory, clock), run("streaming", inp, factory, clock))


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(inp=inputs(), ttl=st.sampled_from(["expired", "read", "write"]))
def test_a_batch_savepoint_equals_the_streaming_paths_entry_by_entry(
    tmp_path_factory: Any, inp: Input, ttl: str
) -> None:
    root = str(tmp_path_factory.mktemp("sp"))
    clock = ManualClock()
    factory = lambda: AllKinds(clock, ttl)  # noqa: E731
    batch = run("batch", inp, factory, clock, savepoint=(root, "batch"))
    streaming = run("streaming", inp, factory, clock, savepoint=(root, "streaming"))
    assert_same(batch, streaming)
    commit_savepoint(root, "batch", inp, batch.handles)
    commit_savepoint(root, "streaming", inp, streaming.handles)
    batch_states, batch_entries = savepoint_entries(root, "batch")
    streaming_states, streaming_entries = savepoint_entries(root, "streaming")
    assert batch_states == streaming_states
    assert batch_entries == streaming_entries
    if inp.records:
        assert batch_entries  # "value" is written for every key


# ---- windows -------------------------------------------------------------------------------------


class Describe(ProcessWindowFunction):
    """``(key, window, contents)`` of every firing; the elements are tuples of the record's
    fields, ``v`` third from the end."""

    def process(self, key: Any, context: Any, elements: Any) -> Any:
        w = context.window()
        where = (w.start, w.end) if hasattr(w, "start") else "global"
        # a record (or a reduced one) shows its v; an aggregate's result is shown whole
        contents = [e[-3] if isinstance(e, tuple) and len(e) >= 4 else e for e in elements]
        yield _out(key, where, contents, context.current_watermark())


class CountSum(AggregateFunction):
    def create_accumulator(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, value: Any, acc: tuple[int, int]) -> tuple[int, int]:
        return (acc[0] + 1, acc[1] + value[-3])

    def get_result(self, acc: tuple[int, int]) -> tuple[int, int]:
        return acc

    def merge(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        return (a[0] + b[0], a[1] + b[1])


def _reduce(a: Any, b: Any) -> Any:
    return (*a[:-3], a[-3] + b[-3], max(a[-2], b[-2]), a[-1])


ASSIGNERS: dict[str, Callable[[], Any]] = {
    "end-of-stream": lambda: GlobalWindows.create_with_end_of_stream_trigger(),
    "tumbling": lambda: TumblingEventTimeWindows.of(20),
    "tumbling-offset": lambda: TumblingEventTimeWindows.of(25, 7),
    "sliding": lambda: SlidingEventTimeWindows.of(30, 10),
    "session": lambda: EventTimeSessionWindows.with_gap(8),
    "global": lambda: GlobalWindows.create(),
    "processing": lambda: TumblingProcessingTimeWindows.of(40),
}
TRIGGERS: dict[str, Callable[[], Any] | None] = {
    "default": None,
    "count": lambda: CountTrigger.of(2),
    "purging-count": lambda: PurgingTrigger.of(CountTrigger.of(3)),
    "processing": lambda: ProcessingTimeTrigger.create(),
    "delta": lambda: None,  # built for the key kind (its state holds an element)
}
#: the Python types of a record's fields, per key kind (the delta trigger's state type)
RECORD_TYPES: dict[str, Any] = {
    "int": tuple[int, int, int, int],
    "float": tuple[float, int, int, int],
    "str": tuple[str, int, int, int],
    "bytes": tuple[bytes, int, int, int],
    "tuple": tuple[int, str, int, int, int],
}
EVICTORS: dict[str, Callable[[], Any] | None] = {
    "none": None,
    "count": lambda: CountEvictor.of(2),
    "count-after": lambda: CountEvictor.of(1, do_evict_after=True),
    "time": lambda: TimeEvictor.of(6),
}


@dataclasses.dataclass
class WindowSpec:
    assigner: str
    trigger: str
    evictor: str
    function: str
    lateness: int
    #: late elements to a side output (as Flink's BATCH mode: none is ever late)
    late_output: bool = False

    def factory(self, key_kind: str) -> Callable[[], Any]:
        return lambda: self.build(key_kind)

    def build(self, key_kind: str) -> Any:
        stream = window(ASSIGNERS[self.assigner]())
        if self.trigger == "delta":
            stream = stream.trigger(
                DeltaTrigger.of(10, lambda a, b: b[-3] - a[-3], RECORD_TYPES[key_kind])
            )
        elif (trigger := TRIGGERS[self.trigger]) is not None:
            stream = stream.trigger(trigger())
        evictor = EVICTORS[self.evictor]
        if evictor is not None:
            stream = stream.evictor(evictor())
        if self.lateness:
            stream = stream.allowed_lateness(self.lateness)
        if self.late_output:
            stream = stream.side_output_late_data(OutputTag("late"))
        if self.function == "process":
            return stream.process(Describe())
        if self.function == "aggregate":
            return stream.aggregate(CountSum(), Describe())
        return stream.reduce(_reduce, Describe())


@st.composite
def window_specs(draw: Any) -> WindowSpec:
    assigner = draw(st.sampled_from(sorted(ASSIGNERS)))
    triggers = sorted(TRIGGERS)
    if assigner == "global":
        triggers.remove("default")  # never fires: nothing to compare
    if assigner == "end-of-stream":
        triggers = ["default"]  # the trigger is the point
    if assigner == "session":
        triggers = ["default", "count", "processing"]  # the ones that merge
    if assigner == "processing":
        triggers = ["default", "count"]
    return WindowSpec(
        assigner=assigner,
        trigger=draw(st.sampled_from(triggers)),
        evictor=draw(st.sampled_from(sorted(EVICTORS))),
        function=draw(st.sampled_from(["process", "aggregate", "reduce"])),
        lateness=draw(st.sampled_from([0, 15])),
        late_output=draw(st.booleans()),
    )


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(inp=inputs(), spec=window_specs())
def test_windows_in_batch_execution_equal_the_streaming_path(inp: Input, spec: WindowSpec) -> None:
    clock = ManualClock()
    inp = dataclasses.replace(inp, event_time=spec.assigner != "processing")
    factory = spec.factory(inp.key_kind)
    assert_same(run("batch", inp, factory, clock), run("streaming", inp, factory, clock))


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(inp=inputs(), spec=window_specs())
def test_window_savepoints_of_both_modes_hold_the_same_entries(
    tmp_path_factory: Any, inp: Input, spec: WindowSpec
) -> None:
    root = str(tmp_path_factory.mktemp("wsp"))
    clock = ManualClock()
    inp = dataclasses.replace(inp, event_time=spec.assigner != "processing")
    factory = spec.factory(inp.key_kind)
    batch = run("batch", inp, factory, clock, savepoint=(root, "batch"))
    streaming = run("streaming", inp, factory, clock, savepoint=(root, "streaming"))
    assert_same(batch, streaming)
    commit_savepoint(root, "batch", inp, batch.handles)
    commit_savepoint(root, "streaming", inp, streaming.handles)
    assert savepoint_entries(root, "batch") == savepoint_entries(root, "streaming")


# ---- what batch execution does differently (Flink's BATCH mode) ----------------------------------


class Rearm(KeyedProcessFunction):
    """Registers an event-time timer per record and, from every timer, one more event-time
    and one processing-time timer: at the end of a key those are ignored in batch execution
    (the timer service is quiesced), where the streaming path would fire them forever."""

    def process_element(self, row: Any, ctx: Any) -> Any:
        ctx.timer_service().register_event_time_timer(row.ts)
        return None

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        ctx.timer_service().register_event_time_timer(timestamp + 1)
        ctx.timer_service().register_processing_time_timer(timestamp + 1)
        yield _out(ctx.get_current_key(), timestamp, ctx.time_domain())


def test_timers_registered_while_a_finished_keys_timers_fire_are_ignored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inp = Input("str", [(0, 1, 5, PT0), (0, 2, 3, PT0), (1, 3, 9, PT0)], 1, 8, True, 2)
    clock = ManualClock()
    with caplog.at_level(logging.WARNING, logger="streamstate.runtime.batch"):
        got = run("batch", inp, Rearm, clock)
    assert per_key(got.outputs) == {
        "'user-0'": [repr((3, "event_time")), repr((5, "event_time"))],
        "'user-1'": [repr((9, "event_time"))],
    }
    assert got.ignored_timers == 6
    assert sum("is quiesced" in r.getMessage() for r in caplog.records) == 1  # once per service


class Continuous(ProcessWindowFunction):
    def process(self, key: Any, context: Any, elements: Any) -> Any:
        yield _out(key, context.window().start, len(list(elements)))


def test_a_continuous_trigger_fires_at_its_first_interval_and_at_the_end_in_batch_execution() -> (
    None
):
    """Flink's BATCH mode: the trigger's next fire time is registered from its timer, while
    the key's timers fire, and is ignored; the window's end timer was registered with the first
    element. The streaming path fires at every interval (timers registered while firing at the
    end of time are due)."""
    from streamstate.windows import ContinuousEventTimeTrigger

    def build() -> Any:
        return (
            window(TumblingEventTimeWindows.of(100))
            .trigger(ContinuousEventTimeTrigger.of(10))
            .process(Continuous())
        )

    inp = Input("int", [(0, 1, 5, PT0), (0, 2, 37, PT0)], 1, 8, True, 5)
    clock = ManualClock()
    batch = run("batch", inp, build, clock)
    streaming = run("streaming", inp, build, clock)
    fired = [repr((0, 2))] * 2
    assert list(per_key(batch.outputs).values()) == [fired]
    assert list(per_key(streaming.outputs).values()) == [[repr((0, 2))] * 10]
    assert batch.ignored_timers == 1


def test_state_of_a_finished_key_is_gone_and_memory_holds_one_key() -> None:
    """The batch backend holds no entry of a finished key: after every run only the current
    key's entries exist."""
    seen: list[int] = []

    class Probe(KeyedProcessFunction):
        def bind_operator(self, context: Any) -> None:
            self.backend = context.keyed_backend

        def open(self, ctx: Any) -> None:
            self.n = ctx.get_state(ValueStateDescriptor("n", int, default=0))
            self.items = ctx.get_list_state(ListStateDescriptor("items", int))

        def process_element(self, row: Any, ctx: Any) -> Any:
            self.n.update(self.n.value() + 1)
            self.items.add(row.v)
            seen.append(self.backend.num_entries())
            yield _out(ctx.get_current_key(), self.n.value(), len(self.items.get()))

    records = [(i % 50, i, i, PT0) for i in range(400)]
    inp = Input("int", records, 1, 128, False, 64)
    got = run("batch", inp, Probe, ManualClock())
    assert max(seen) == 2  # one value and one list entry: the current key's
    assert sorted(per_key(got.outputs)[repr(KEY_KINDS["int"][1](0))])[-1] == repr((8, 8))


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_a_batch_savepoint_restores_at_another_parallelism_on_either_backend(
    tmp_path: Any, backend: str
) -> None:
    """A batch savepoint of two subtasks restored into three subtasks of a LocalRunner on
    either backend holds every key's final state; the keys go on from it."""
    from streamstate import LocalRunner

    class Count(KeyedProcessFunction):
        def open(self, ctx: Any) -> None:
            self.n = ctx.get_state(ValueStateDescriptor("n", int, default=0))
            self.items = ctx.get_list_state(ListStateDescriptor("items", int))

        def process_element(self, row: Any, ctx: Any) -> Any:
            self.n.update(self.n.value() + 1)
            self.items.add(row[1])
            yield _out(ctx.get_current_key(), self.n.value(), list(self.items.get()))

    records = [(i % 23, i, i, PT0) for i in range(200)]
    inp = Input("str", records, 2, 16, False, 17)
    root = str(tmp_path)
    batch = run("batch", inp, Count, ManualClock(), savepoint=(root, "sp"))
    commit_savepoint(root, "sp", inp, batch.handles)
    runner = LocalRunner(
        Count(),
        key_selector=lambda r: r[0],
        parallelism=3,
        max_parallelism=16,
        state_backend=backend,
        checkpoint_storage=str(tmp_path / "runner"),
        operator_name="op",
    )
    try:
        runner.restore(str(tmp_path / "sp"))
        got = runner.run([(f"user-{k}", 1000 + k) for k in range(23)])
    finally:
        runner.close()
    expected = []
    for k in range(23):
        mine = [v for i, v, _, _ in records if i == k]
        expected.append(_out(f"user-{k}", len(mine) + 1, [*mine, 1000 + k]))
    assert sorted(got) == sorted(expected)
