"""The compiled per-record path against the pure-Python reference, on random jobs.

The compiled path is the record loop in C (``runtime/_record_loop.c``: ``LocalRunner.run``,
``KeyedProcessOperator.process_elements`` and ``process_runs``) with the heap value state's
``value()`` / ``update()`` in C (``backends/heap/_value_state.c``). The reference is
``process_records`` / ``process_runs`` in Python with ``HeapValueState``. Each random job runs
once on each path, in the same process, and everything observable must be equal: outputs in
order, side outputs, timers' firings, TTL expiry, windows, the state after incremental
checkpoints, a restore and a rescale, on both backends, and the error (type, message, note)
when the function fails.

Under ``STREAMSTATE_PURE_PYTHON=1`` only the reference exists: the comparisons are skipped, and
the behavioural suites run on the reference alone.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from enum import IntEnum
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamstate import (
    AggregateFunction,
    KeyedProcessFunction,
    ListStateDescriptor,
    LocalRunner,
    MapStateDescriptor,
    OutputTag,
    ReducingStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)
from streamstate._compiled import pure_python
from streamstate.api.descriptors import AggregatingStateDescriptor, StateKind
from streamstate.backends.heap import states as heap_states
from streamstate.backends.rocksdb.factory import RocksDBStateBackend
from streamstate.backends.snapshot_strategy import IncrementalPolicy
from streamstate.keygroups import register_key_hash
from streamstate.runtime.batch import BatchKeyedProcessOperator
from streamstate.runtime.record_path import COMPILED_PATH_AVAILABLE, record_path
from streamstate.serializers import PickleSerializer, StrSerializer
from streamstate.windows import TumblingEventTimeWindows, window

COMPILED = COMPILED_PATH_AVAILABLE
needs_compiled = pytest.mark.skipif(
    not COMPILED, reason="only the pure-Python path exists (STREAMSTATE_PURE_PYTHON or no build)"
)
SIDE = OutputTag("side")


@pytest.mark.skipif(pure_python(), reason="STREAMSTATE_PURE_PYTHON selects the reference")
def test_the_compiled_path_is_built_and_used_by_default() -> None:
    # the README's setup compiles it (gcc is required): a silent fallback would go unnoticed
    assert COMPILED
    assert heap_states.STATE_FACTORIES[StateKind.VALUE] is heap_states.CompiledHeapValueState
    from streamstate.runtime.operator import record_loop

    assert record_loop().module is not None


class SumCount(AggregateFunction):
    def create_accumulator(self) -> Any:
        return (0, 0)

    def add(self, value: Any, acc: Any) -> Any:
        return (acc[0] + value, acc[1] + 1)

    def get_result(self, acc: Any) -> Any:
        return acc

    def merge(self, a: Any, b: Any) -> Any:
        return (a[0] + b[0], a[1] + b[1])


OPS = ["v+", "v0", "vm", "l+", "l=", "m+", "m-", "r+", "a+", "t", "side", "ttl", "dump"]


class Mixed(KeyedProcessFunction):
    """Every state kind, driven by the record ``(key, op, arg, ts)``; yields what it reads."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.fail_on = fail_on

    def open(self, rc: Any) -> None:
        self.v = rc.get_state(ValueStateDescriptor("v", int, default=0))
        self.vm = rc.get_state(ValueStateDescriptor("vm", list[int]))
        self.vs = rc.get_state(ValueStateDescriptor("vs", str, default="-"))
        self.lst = rc.get_list_state(ListStateDescriptor("l", int))
        self.map = rc.get_map_state(MapStateDescriptor("m", int, int))
        self.red = rc.get_reducing_state(ReducingStateDescriptor("r", lambda a, b: a + b, int))
        self.agg = rc.get_aggregating_state(
            AggregatingStateDescriptor("a", SumCount(), tuple[int, int])
        )
        self.ttl = rc.get_state(
            ValueStateDescriptor("ttl", int).enable_time_to_live(StateTtlConfig(ttl=5))
        )

    def process_element(self, value: Any, ctx: Any) -> Any:
        key, op, arg, _ = value
        if self.fail_on is not None and arg == self.fail_on:
            raise ValueError(f"failing on {arg}")
        if op == "v+":
            self.v.update(self.v.value() + arg)
            self.vs.update(self.vs.value() + "x")
            yield key, op, self.v.value(), self.vs.value()
        elif op == "v0":
            self.v.update(None)
            yield key, op, self.v.value()
        elif op == "vm":
            got = self.vm.value() or []
            got.append(arg)
            self.vm.update(got)
            yield key, op, list(self.vm.value())
        elif op == "l+":
            self.lst.add(arg)
            yield key, op, list(self.lst.get())
        elif op == "l=":
            self.lst.update([arg, arg + 1])
        elif op == "m+":
            self.map.put(arg % 3, arg)
            yield key, op, sorted(self.map.items())
        elif op == "m-":
            self.map.remove(arg % 3)
        elif op == "r+":
            self.red.add(arg)
            yield key, op, self.red.get()
        elif op == "a+":
            self.agg.add(arg)
            yield key, op, self.agg.get()
        elif op == "t":
            ts = ctx.timestamp() or 0
            ctx.timer_service().register_event_time_timer(ts + arg)
            ctx.timer_service().register_processing_time_timer(100 + arg)
        elif op == "side":
            ctx.output(SIDE, (key, arg, self.v.value()))
        elif op == "ttl":
            old = self.ttl.value()
            self.ttl.update((old or 0) + arg)
            yield key, op, old
        else:  # dump: everything, as the state ends
            yield (
                key,
                "dump",
                self.v.value(),
                self.vm.value(),
                self.vs.value(),
                list(self.lst.get()),
                sorted(self.map.items()),
                self.red.get(),
                self.agg.get(),
            )
        return

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        yield ctx.get_current_key(), "timer", timestamp, ctx.time_domain(), self.v.value()


class StepClock:
    def __init__(self) -> None:
        self.t = 0

    def now(self) -> int:
        return self.t


record = st.tuples(
    st.sampled_from(["a", "b", "c", "d", "e", "f", "g"]),
    st.sampled_from(OPS),
    st.integers(0, 20),
    st.integers(0, 50),
)
batches = st.lists(st.lists(record, max_size=25), min_size=1, max_size=5)


def _backend(name: str, tmp: str) -> Any:
    return RocksDBStateBackend(working_dir=tempfile.mkdtemp(dir=tmp)) if name == "rocksdb" else name


def run_local(
    compiled: bool, backend: str, batches: list[list[Any]], parallelism: int, rescale_to: int
) -> list[Any]:
    """The job through ``LocalRunner.run`` (no event time: the routed loop), one ``run`` per
    batch, an incremental checkpoint after each, a rescale in the middle, processing time
    advanced between batches (TTL, processing-time timers), then every key dumped."""
    seen: list[Any] = []
    with record_path(compiled), tempfile.TemporaryDirectory() as tmp:
        clock = StepClock()
        runner = LocalRunner(
            Mixed(),
            key_selector=lambda r: r[0],
            parallelism=parallelism,
            state_backend=_backend(backend, tmp),
            clock=clock,
            incremental_checkpoints=backend == "heap",
        )
        try:
            for i, batch in enumerate(batches):
                seen.append(runner.run(batch, final_watermark=False))
                seen.append(sorted(runner.side_output(SIDE)))
                clock.t += 3
                seen.append(runner.advance_processing_time(clock.t + 100))
                if batch or runner.subtasks:
                    runner.checkpoint()
                if i == len(batches) // 2 and runner.subtasks:
                    runner.rescale(rescale_to)
            dump = [(k, "dump", 0, 0) for k in "abcdefg"]
            seen.append(runner.run(dump))
        finally:
            runner.close()
    return seen


def run_operators(compiled: bool, backend: str, batches: list[list[Any]]) -> list[Any]:
    """The job through the subtasks' ``process_elements`` with event time (the Spark state
    hosts' micro-batches): per batch the records of each subtask, then the watermark."""
    seen: list[Any] = []
    with record_path(compiled), tempfile.TemporaryDirectory() as tmp:
        runner = LocalRunner(
            Mixed(),
            key_selector=lambda r: r[0],
            parallelism=2,
            state_backend=_backend(backend, tmp),
            key_type=str,
            clock=StepClock(),
        )
        runner.checkpoint()  # starts the subtasks
        try:
            watermark = 0
            for batch in batches:
                for i, op in enumerate(runner.subtasks):
                    mine = [r for r in batch if runner.subtask_for_key(r[0]) == i]
                    op.process_elements(
                        [r[0] for r in mine],
                        mine,
                        [r[3] + watermark for r in mine],
                        [runner.key_group_of(r[0]) for r in mine],
                    )
                    seen.append(op.drain_output())
                    seen.append(op.drain_side_output(SIDE))
                watermark += 20
                seen.append(runner.advance_watermark(watermark))
        finally:
            runner.close()
    return seen


def run_batch(compiled: bool, batch: list[Any]) -> list[Any]:
    """The job in batch execution: the records sorted by key, in runs (``process_runs``)."""
    with record_path(compiled):
        op = BatchKeyedProcessOperator(Mixed(), StrSerializer())
        op.open()
        ordered = sorted(batch, key=lambda r: r[0]) + [(k, "dump", 0, 0) for k in "abcdefg"]
        ordered.sort(key=lambda r: r[0])  # stable: each key's records keep their order
        keys: list[str] = []
        lengths: list[int] = []
        for r in ordered:
            if keys and keys[-1] == r[0]:
                lengths[-1] += 1
            else:
                keys.append(r[0])
                lengths.append(1)
        op.process_runs(keys, [None] * len(keys), lengths, ordered, [r[3] for r in ordered])
        op.end_of_input()
        return [*op.drain_output(), op.drain_side_output(SIDE)]


# RocksDB opens, checkpoints and closes a database per run: fewer examples keep the fast tier's
# time (the compiled value state is the heap's; RocksDB checks the loop with its own states)
EXAMPLES = {"heap": 8, "rocksdb": 3}


def _examples(backend: str) -> Any:
    return settings(
        max_examples=EXAMPLES[backend], deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )


@needs_compiled
@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_local_runner_same_on_both_paths(backend: str) -> None:
    @_examples(backend)
    @given(batches=batches, parallelism=st.integers(1, 3), rescale_to=st.integers(1, 3))
    def check(batches: list[list[Any]], parallelism: int, rescale_to: int) -> None:
        reference = run_local(False, backend, batches, parallelism, rescale_to)
        assert run_local(True, backend, batches, parallelism, rescale_to) == reference

    check()


@needs_compiled
@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_micro_batches_same_on_both_paths(backend: str) -> None:
    @_examples(backend)
    @given(batches=batches)
    def check(batches: list[list[Any]]) -> None:
        assert run_operators(True, backend, batches) == run_operators(False, backend, batches)

    check()


@needs_compiled
@settings(max_examples=15, deadline=None)
@given(batch=st.lists(record, max_size=40))
def test_batch_execution_same_on_both_paths(batch: list[Any]) -> None:
    assert run_batch(True, batch) == run_batch(False, batch)


class WindowSum(AggregateFunction):
    def create_accumulator(self) -> int:
        return 0

    def add(self, value: Any, acc: int) -> int:
        return acc + value[2]

    def get_result(self, acc: int) -> int:
        return acc

    def merge(self, a: int, b: int) -> int:
        return a + b


def run_windows(compiled: bool, backend: str, batches: list[list[Any]]) -> list[Any]:
    with record_path(compiled), tempfile.TemporaryDirectory() as tmp:
        runner = LocalRunner(
            window(TumblingEventTimeWindows.of(10)).aggregate(WindowSum()),
            key_selector=lambda r: r[0],
            parallelism=2,
            state_backend=_backend(backend, tmp),
            key_type=str,
        )
        runner.checkpoint()
        seen: list[Any] = []
        try:
            watermark = 0
            for batch in batches:
                for i, op in enumerate(runner.subtasks):
                    mine = [r for r in batch if runner.subtask_for_key(r[0]) == i]
                    op.process_elements(
                        [r[0] for r in mine],
                        mine,
                        [r[3] + watermark for r in mine],
                        [runner.key_group_of(r[0]) for r in mine],
                    )
                    seen.append(op.drain_output())
                watermark += 15
                seen.append(sorted(runner.advance_watermark(watermark)))
            seen.append(sorted(runner.advance_watermark(1 << 40)))
        finally:
            runner.close()
    return seen


@needs_compiled
@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_windows_same_on_both_paths(backend: str) -> None:
    @_examples(backend)
    @given(batches=batches)
    def check(batches: list[list[Any]]) -> None:
        assert run_windows(True, backend, batches) == run_windows(False, backend, batches)

    check()


def _failure(compiled: bool, how: str, records: list[Any]) -> tuple[Any, ...]:
    """What a failing function leaves: the error, its notes, and the outputs before it."""
    with record_path(compiled):
        runner = LocalRunner(Mixed(fail_on=13), key_selector=lambda r: r[0], parallelism=2)
        try:
            if how == "run":
                runner.run(records[:1])
                with pytest.raises(ValueError) as info:
                    runner.run(records[1:])
                after = runner.run([(k, "dump", 0, 0) for k in "abc"])
            else:
                op = BatchKeyedProcessOperator(Mixed(fail_on=13), StrSerializer())
                op.open()
                with pytest.raises(ValueError) as info:
                    op.process_runs(["a", "b"], [None, None], [2, 2], records[:4])
                after = op.drain_output()
        finally:
            runner.close()
        return type(info.value), str(info.value), info.value.__notes__, after


@needs_compiled
@pytest.mark.parametrize("how", ["run", "runs"])
def test_a_failing_function_fails_the_same_on_both_paths(how: str) -> None:
    records = [("a", "v+", 1, 0), ("a", "v+", 2, 0), ("b", "v+", 3, 0), ("b", "v+", 13, 0)]
    records += [("c", "v+", 4, 0)]
    compiled, reference = _failure(True, how, records), _failure(False, how, records)
    assert compiled == reference
    assert "process_element of key 'b', record ('b', 'v+', 13, 0)" in compiled[2][0]


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=needs_compiled)])
def test_value_state_on_a_shared_entry_copies_as_the_reference(compiled: bool) -> None:
    """A value shared with an open snapshot, a rehash in progress, a default that is copied:
    the compiled methods' fallbacks give what the reference gives."""
    with record_path(compiled):
        runner = LocalRunner(Mixed(), key_selector=lambda r: r[0], key_type=str)
        try:
            keys = [f"k{i}" for i in range(300)]  # grows the maps through rehashes
            out = runner.run([(k, "vm", i, 0) for i, k in enumerate(keys)])
            op = runner.subtasks[0]
            snapshot = op.keyed_backend.snapshot(1)  # entries now shared with it
            out += runner.run([(k, "vm", 1, 0) for k in keys])
            out += runner.run([(k, "v+", 2, 0) for k in keys[:5]])
            assert out[300] == (keys[0], "vm", [0, 1])
            del snapshot
        finally:
            runner.close()
    assert [o[2] for o in out[:300]] == [[i] for i in range(300)]


class Color(IntEnum):
    RED = 1
    BLUE = 2


class Point:
    """A key type with a registered hash (the compiled loop leaves its key group to Python)."""

    def __init__(self, x: int) -> None:
        self.x = x

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Point) and other.x == self.x

    def __hash__(self) -> int:
        return hash(self.x)

    def __repr__(self) -> str:
        return f"Point({self.x})"


register_key_hash(Point, lambda p: p.x * 31 + 7)


class Where(KeyedProcessFunction):
    """A count per key, and the subtask and key group the record was handled in."""

    def open(self, runtime_context: Any) -> None:
        self.n = runtime_context.get_state(ValueStateDescriptor("n", int, default=0))
        self.subtask = runtime_context.index_of_this_subtask

    def process_element(self, value: Any, ctx: Any) -> Any:
        n = self.n.value() + 1
        self.n.update(n)
        yield value[0], n, self.subtask


routed_keys = (
    st.integers(-(2**63), 2**63 - 1)
    | st.text(max_size=6)
    | st.binary(max_size=4)
    | st.booleans()
    | st.floats(allow_nan=False)
    | st.sampled_from([Color.RED, Color.BLUE, Point(1), Point(2), (1, "a"), ("x", None, b"y")])
)


@needs_compiled
@settings(max_examples=25, deadline=None)
@given(
    keys=st.lists(routed_keys, min_size=1, max_size=12),
    picks=st.lists(st.integers(0, 11), max_size=60),
    parallelism=st.integers(1, 3),
)
def test_records_reach_the_same_subtask_on_both_paths(
    keys: list[Any], picks: list[int], parallelism: int
) -> None:
    """Keys of every type the compiled loop hashes itself, and of types it hands back to
    Python (an int enum, a registered hash): the same subtask, count and order on both paths."""
    records = [(keys[i % len(keys)],) for i in picks]

    def run(compiled: bool) -> list[Any]:
        with record_path(compiled):
            runner = LocalRunner(
                Where(),
                key_selector=lambda r: r[0],
                parallelism=parallelism,
                key_type=PickleSerializer(),
            )
            try:
                out = runner.run(records)
                assert all(subtask == runner.subtask_for_key(key) for key, _, subtask in out), (
                    "a record ran on a subtask that does not own its key group"
                )
                return out
            finally:
                runner.close()

    assert run(True) == run(False)


class Registers(KeyedProcessFunction):
    """A value state of immutable values and one of mutable values (a change-tracking map that
    records reads too), read, changed in place, written or cleared per record."""

    def open(self, runtime_context: Any) -> None:
        self.n = runtime_context.get_state(ValueStateDescriptor("n", int))
        self.items = runtime_context.get_state(ValueStateDescriptor("items", list[int]))

    def process_element(self, value: Any, ctx: Any) -> Any:
        _, op, arg = value
        if op == "add":
            self.n.update((self.n.value() or 0) + arg)
        elif op == "clear":
            self.n.update(None)
        elif op == "append":
            got = self.items.value()
            if got is None:
                self.items.update([arg])
            elif arg % 2:
                self.items.update([*got, arg])  # a new object: only its write's record has it
            else:
                got.append(arg)  # in place, after the read: the read's record carries it
        yield value[0], self.n.value(), self.items.value()


def _incremental_registers(tmp: str, **options: Any) -> LocalRunner:
    """A runner of :class:`Registers` on an incremental heap backend whose checkpoints after
    the first full snapshot are deltas (the change records are what they hold)."""
    return LocalRunner(
        Registers(),
        key_selector=lambda r: r[0],
        key_type=int,
        incremental_checkpoints=IncrementalPolicy(max_delta_ratio=1e9),
        checkpoint_storage=tmp,
        **options,
    )


def _read_back(runner: LocalRunner, keys: Iterable[int], **options: Any) -> list[Any]:
    """``runner``'s latest checkpoint restored into a fresh runner: a read of ``keys``."""
    restored = LocalRunner(Registers(), key_selector=lambda r: r[0], key_type=int, **options)
    try:
        restored.restore(runner.checkpoint_storage.latest_checkpoint())
        return restored.run([(k, "read", 0) for k in keys])
    finally:
        restored.close()


@needs_compiled
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.lists(
        st.lists(
            st.tuples(
                st.integers(0, 40),
                st.sampled_from(["add", "add", "append", "clear"]),
                st.integers(0, 9),
            ),
            max_size=700,
        ),
        min_size=1,
        max_size=4,
    )
)
def test_incremental_checkpoints_record_the_compiled_writes(batches: list[list[Any]]) -> None:
    """On an incremental heap backend (change-tracking maps, a Spark query's state hosts) the
    compiled value state records every write and every read of a mutable value as the
    reference does: each incremental checkpoint, restored into a fresh runner, holds the
    state the reference holds, however many records the change lists compacted."""

    def run(compiled: bool) -> list[Any]:
        seen: list[Any] = []
        with record_path(compiled), tempfile.TemporaryDirectory() as tmp:
            runner = _incremental_registers(tmp, parallelism=2)
            try:
                # a full snapshot of every key first: the checkpoints after it are deltas
                seen.append(runner.run([(k, op, 1) for k in range(41) for op in ("add", "append")]))
                runner.checkpoint()
                for batch in batches:
                    seen.append(runner.run(batch))
                    runner.checkpoint()
                    seen.append(_read_back(runner, range(41)))
            finally:
                runner.close()
        return seen

    assert run(True) == run(False)


@needs_compiled
def test_compaction_of_the_change_records_under_the_compiled_path() -> None:
    """Thousands of writes and reads of a few keys between two checkpoints: the change lists
    of their maps outgrow their limit and are compacted (the map's Python method, called from
    the compiled one); the checkpoint restores the same state on both paths."""
    base = [(k, op, 1) for k in range(3000) for op in ("add", "append")]
    batch = [(i % 3, "add" if i % 20 else "append", i % 10) for i in range(12000)]
    batches = [base, batch[:5000], batch[5000:]]
    results = []
    for compiled in (True, False):
        with record_path(compiled), tempfile.TemporaryDirectory() as tmp:
            runner = _incremental_registers(tmp)  # deltas: a full snapshot would need no record
            try:
                for b in batches:
                    runner.run(b)
                    runner.checkpoint()
                results.append(_read_back(runner, range(3000)))
                latest = runner.checkpoint_storage.latest_checkpoint().metadata
                (subtask,) = latest.operators[runner.operator_name].subtasks
                assert len(subtask.keyed) > 1, "the chain holds no delta: records untested"
            finally:
                runner.close()
    assert results[0] == results[1]
    n = 1 + sum(i % 10 for i in range(12000) if i % 3 == 0 and i % 20)
    assert results[0][0][:2] == (0, n)


@needs_compiled
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(200, 450), min_size=2, max_size=4),
    snapshot_during=st.integers(0, 3),
    again=st.lists(st.integers(0, 2000), max_size=30),
)
def test_new_keys_through_doublings_restore_the_same_on_both_paths(
    sizes: list[int], snapshot_during: int, again: list[int]
) -> None:
    """Batches of first touches in two key groups, so that each map grows through several
    doublings and incremental rehashes (the compiled value state inserts and moves entries
    itself), with keys seen before read and written in between and a full snapshot held open
    during one batch (its maps shared: the first write copies the arrays, later inserts go on
    under it). An incremental checkpoint after each batch, restored into a fresh runner: the
    same outputs and the same state on both paths."""

    def run(compiled: bool) -> list[Any]:
        seen: list[Any] = []
        with record_path(compiled), tempfile.TemporaryDirectory() as tmp:
            runner = _incremental_registers(tmp, max_parallelism=2)
            try:
                runner.run([(0, "add", 1)])
                runner.checkpoint()  # the full snapshot the deltas build on
                first = 1
                for i, n in enumerate(sizes):
                    fresh = [
                        (k, "add" if k % 3 else "append", k % 7) for k in range(first, first + n)
                    ]
                    first += n
                    old = [(k % first, "add" if k % 2 else "append", 1) for k in again]
                    snapshot = None
                    if i == snapshot_during:
                        snapshot = runner.subtasks[0].keyed_backend.snapshot(i + 100)
                    seen.append(runner.run(fresh + old))
                    if snapshot is not None:
                        snapshot.release()
                    runner.checkpoint()
                backend = runner.subtasks[0].keyed_backend
                maps = backend.state_table("n").maps[:-1]
                seen.append([(m.capacity, m.is_rehashing, m.rehash_index) for m in maps])
                seen.append(_read_back(runner, range(first), max_parallelism=2))
            finally:
                runner.close()
        return seen

    compiled = run(True)
    assert compiled == run(False)
    grown = [capacity >= 256 or rehashing for capacity, rehashing, _ in compiled[-2]]
    assert all(grown), "the maps did not grow through doublings"
