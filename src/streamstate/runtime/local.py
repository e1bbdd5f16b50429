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

Checkpoints, restore and rescale (SPEC §6, §7):

>>> runner = LocalRunner(Count(), key_selector=lambda r: r, parallelism=2)
>>> _ = runner.run(["a", "b", "a"])
>>> cp = runner.rescale(3)                 # checkpoint, rebuild 3 subtasks, restore
>>> runner.run(["a"])
[('a', 3)]
>>> runner.restore(cp.checkpoint_id)       # back to the checkpoint (at parallelism 3)
>>> runner.run(["a"])
[('a', 3)]
"""

from __future__ import annotations

import copy as _copy
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import wait
from typing import Any

from streamstate.api.functions import KeyedProcessFunction, OutputTag
from streamstate.backends.base import Clock
from streamstate.backends.factory import StateBackend
from streamstate.backends.registry import state_backend_from
from streamstate.backends.snapshot_strategy import AsyncSnapshotWriter
from streamstate.checkpoint.writer import SubtaskCheckpointer
from streamstate.errors import CheckpointError, MaxParallelismMismatchError
from streamstate.keygroups import (
    assign_to_key_group,
    compute_default_max_parallelism,
    compute_operator_index_for_key_group,
)
from streamstate.runtime.operator import (
    KeyedProcessOperator,
    RecordRoute,
    note_failed_record,
    process_records,
    record_loop,
)
from streamstate.runtime.stream_task import StreamTask
from streamstate.runtime.undeclared import merge_counts, warn_undeclared_states
from streamstate.serializers import TypeSerializer, serializer_for
from streamstate.timers import MIN_WATERMARK

__all__ = ["LocalRunner"]

MAX_WATERMARK = (1 << 63) - 1

#: key types whose key group is cached per distinct key. Only exact types: ``1``, ``1.0`` and
#: ``True`` are equal dict keys but serialize, and so hash to key groups, differently.
_CACHED_KEY_TYPES = frozenset({str, int, bytes})
#: distinct keys remembered before the cache starts over (bounds its memory on unbounded keys)
KEY_GROUP_CACHE_LIMIT = 1 << 20


class LocalRunner:
    """Runs a :class:`~streamstate.api.functions.KeyedProcessFunction` with ``parallelism``
    subtasks in this process.

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
        checkpoint_storage: where :meth:`checkpoint` writes (a ``CheckpointStorage``, a path or
            URL; default: a new in-memory storage).
        incremental_checkpoints: write deltas after the first checkpoint (heap backend; True
            or an ``IncrementalPolicy``).
        checkpoint_compression: block codec of keyed snapshot files ("none", "lz4", "zstd").
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
        checkpoint_storage: Any = None,
        incremental_checkpoints: Any = False,
        checkpoint_compression: str = "lz4",
    ) -> None:
        if parallelism < 1:
            raise ValueError(f"parallelism must be >= 1, got {parallelism}")
        self.function = function
        self.key_selector = key_selector
        self.parallelism = parallelism
        self._explicit_max_parallelism = max_parallelism is not None
        self.max_parallelism = max_parallelism or compute_default_max_parallelism(parallelism)
        if parallelism > self.max_parallelism:
            raise ValueError(
                f"parallelism {parallelism} exceeds max_parallelism {self.max_parallelism}"
            )
        self.state_backend = state_backend_from(state_backend)
        if incremental_checkpoints:
            self.state_backend = self.state_backend.with_change_tracking()
        self.incremental_checkpoints = incremental_checkpoints
        self.checkpoint_compression = checkpoint_compression
        self._storage_ref = checkpoint_storage
        self._storage: Any = None
        self._writer: AsyncSnapshotWriter | None = None
        self._coordinator: Any = None
        self.key_serializer: TypeSerializer[Any] | None = (
            serializer_for(key_type) if key_type is not None else None
        )
        self.timestamp_assigner = timestamp_assigner
        self.watermark_delay = watermark_delay
        self.clock = clock or Clock()
        self.operator_name = operator_name
        self.subtasks: list[KeyedProcessOperator] = []
        #: the lifecycle of each subtask (``tasks[i].operator is subtasks[i]``)
        self.tasks: list[StreamTask] = []
        self.watermark = MIN_WATERMARK
        self._max_timestamp = MIN_WATERMARK
        self._side_outputs: dict[OutputTag, list[Any]] = {}
        # the murmur hash of a key costs more than the state access: compute it once per key
        self._key_groups: dict[Any, int] = {}
        self._key_groups_of: int = self.max_parallelism
        self._subtask_of_kg: list[KeyedProcessOperator] = []
        # run()'s routes: per key group (built on first use), and per distinct key
        self._route_of_kg: list[RecordRoute] = []
        self._routes: dict[Any, RecordRoute] = {}

    # ---- set-up --------------------------------------------------------------------------------

    def _ensure_started(self, first_key: Any) -> None:
        if self.subtasks:
            return
        if self.key_serializer is None:
            self.key_serializer = serializer_for(type(first_key))
        self._start(self.parallelism)

    def _start(self, parallelism: int) -> None:
        self._create_subtasks(parallelism)
        for op in self.subtasks:
            op.open()

    def _create_subtasks(self, parallelism: int) -> None:
        assert self.key_serializer is not None
        self._close_checkpointers()
        self.parallelism = parallelism
        if self._writer is None:
            self._writer = AsyncSnapshotWriter()
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
        self.tasks = [
            StreamTask(
                op,
                lambda: self.checkpoint_storage,
                compression=self.checkpoint_compression,
                incremental=self.incremental_checkpoints,
                writer=self._writer,
            )
            for op in self.subtasks
        ]
        mp = self.max_parallelism
        self._subtask_of_kg = [
            self.subtasks[compute_operator_index_for_key_group(mp, parallelism, kg)]
            for kg in range(mp)
        ]
        self._route_of_kg = []
        self._routes = {}
        if self._key_groups_of != mp:
            self._key_groups = {}
            self._key_groups_of = mp

    def subtask_for_key(self, key: Any) -> int:
        """The subtask that owns ``key``'s key group."""
        return compute_operator_index_for_key_group(
            self.max_parallelism, self.parallelism, self.key_group_of(key)
        )

    # ---- processing ----------------------------------------------------------------------------

    def key_group_of(self, key: Any) -> int:
        """The key group of ``key``, computed once per distinct key of a cached type."""
        if type(key) in _CACHED_KEY_TYPES:
            kg = self._key_groups.get(key)
            if kg is None:
                if len(self._key_groups) >= KEY_GROUP_CACHE_LIMIT:
                    self._key_groups.clear()
                kg = self._key_groups[key] = assign_to_key_group(key, self.max_parallelism)
            return kg
        return assign_to_key_group(key, self.max_parallelism)

    def process(self, record: Any) -> list[Any]:
        """Process one record; returns the outputs it (and any timers it made due) produced."""
        out: list[Any] = []
        self._process_into(record, out)
        return out

    def _process_into(self, record: Any, out: list[Any]) -> None:
        key = self.key_selector(record)
        self._ensure_started(key)
        kg = self.key_group_of(key)
        op = self._subtask_of_kg[kg]
        ts = None
        if self.timestamp_assigner is not None:
            ts = int(self.timestamp_assigner(record))
        op.process_element(key, record, ts, kg)
        self._drain(op, out)
        if ts is not None and self.watermark_delay is not None and ts > self._max_timestamp:
            self._max_timestamp = ts
            out.extend(self.advance_watermark(ts - self.watermark_delay - 1))

    def _drain(self, op: KeyedProcessOperator, out: list[Any]) -> None:
        if op.output:
            out.extend(op.output)
            op.output.clear()
        if op.side_outputs:
            self._collect_side_outputs(op)

    def run(self, records: Iterable[Any], *, final_watermark: bool = True) -> list[Any]:
        """Process every record; with ``final_watermark`` fire all event-time timers at the end
        (as Flink does when a bounded input ends). Returns all outputs in order."""
        out: list[Any] = []
        it = iter(records)
        if not self.subtasks:
            for record in it:
                self._process_into(record, out)  # starts the subtasks
                break
        if self.timestamp_assigner is not None:
            for record in it:
                self._process_into(record, out)
        elif self.subtasks:
            self._run_fast(it, out)
        if final_watermark and self.subtasks:
            # also without timestamps: Flink's bounded sources end with the final watermark
            out.extend(self.advance_watermark(MAX_WATERMARK))
        return out

    def _routes_of_key_groups(self) -> list[RecordRoute]:
        """Per key group, the route of its subtask (``KeyedProcessOperator.route``)."""
        return [op.route(kg) for kg, op in enumerate(self._subtask_of_kg)]

    def _run_fast(self, it: Iterator[Any], out: list[Any]) -> None:
        """The common path of :meth:`run` (no event time): records go through the record loop
        (``process_records``) with their routes: the compiled loop computes each record's key
        group (``_java_hash.h``), the reference finds the route in a cache per distinct key of
        a cached type. Operators'
        outputs are not drained per record: while the loop runs, every operator appends to
        ``out`` and to the runner's side outputs directly, so the order is the one records and
        emits happened in.
        """
        ops = self.subtasks
        for op in ops:
            if op.output:  # left over from a failed record: it comes first, as before
                out.extend(op.output)
            self._collect_side_outputs(op)
        if not self._route_of_kg:
            self._route_of_kg = self._routes_of_key_groups()
        for op in ops:
            op.output = out
            op.side_outputs = self._side_outputs
        module = record_loop().module
        try:
            if module is None:
                process_records(self._routed(it), out)
            else:
                failed: list[tuple[Any, Any]] = []
                try:
                    module.run_selected(
                        it,
                        self.key_selector,
                        self._route_of_kg,
                        self.max_parallelism,
                        self._route_of,
                        out,
                        failed,
                    )
                except Exception as exc:
                    note_failed_record(exc, failed)
                    raise
        finally:
            for op in ops:
                op.output = []
                op.side_outputs = {}

    def _route_of(self, key: Any) -> RecordRoute:
        """The route of a key whose key group the compiled loop leaves to
        :func:`~streamstate.keygroups.assign_to_key_group`'s reference (a type with a registered
        hash, an int subclass, ...)."""
        return self._route_of_kg[self.key_group_of(key)]

    def _routed(self, it: Iterator[Any]) -> Iterator[tuple[Any, Any, None, RecordRoute]]:
        """``(key, record, None, route)`` of each record (no event time on this path)."""
        route_of_kg = self._route_of_kg
        routes = self._routes
        selector = self.key_selector
        cached_types = _CACHED_KEY_TYPES
        key_group_of = self.key_group_of
        key_groups = self._key_groups
        max_parallelism = self.max_parallelism
        for record in it:
            key = selector(record)
            if type(key) in cached_types:
                route = routes.get(key)
                if route is None:
                    if len(routes) >= KEY_GROUP_CACHE_LIMIT:
                        routes.clear()
                    # the route holds the key group: not cached twice (memory per key)
                    kg = key_groups.get(key)
                    if kg is None:
                        kg = assign_to_key_group(key, max_parallelism)
                    route = routes[key] = route_of_kg[kg]
            else:
                route = route_of_kg[key_group_of(key)]
            yield key, record, None, route

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

    # ---- checkpoints ---------------------------------------------------------------------------

    @property
    def checkpoint_storage(self) -> Any:
        """The storage :meth:`checkpoint` writes to (created on first use)."""
        if self._storage is None:
            from streamstate.checkpoint.storage import checkpoint_storage_from

            self._storage = checkpoint_storage_from(self._storage_ref)
        return self._storage

    def _use_storage(self, storage_or_url: Any) -> Any:
        if storage_or_url is not None:
            from streamstate.checkpoint.storage import checkpoint_storage_from

            storage = checkpoint_storage_from(storage_or_url)
            if storage is not self._storage:
                # the backends' strategies reference earlier files only in the same storage
                self._close_checkpointers()
                self._close_coordinator()
                self._storage = storage
        return self.checkpoint_storage

    @property
    def checkpoint_coordinator(self) -> Any:
        """Commits this runner's checkpoints (retention runs in its background thread)."""
        if self._coordinator is None:
            from streamstate.checkpoint.coordinator import CheckpointCoordinator

            self._coordinator = CheckpointCoordinator(self.checkpoint_storage)
        return self._coordinator

    def _close_coordinator(self) -> None:
        if self._coordinator is not None:
            self._coordinator.close()
            self._coordinator = None

    def _started_tasks(self) -> list[StreamTask]:
        if not self.subtasks:
            if self.key_serializer is None:
                raise CheckpointError(
                    "nothing to checkpoint yet: no record was processed and no key_type was "
                    "given, so the subtasks do not exist"
                )
            self._start(self.parallelism)
        return self.tasks

    def _subtask_checkpointers(self) -> list[SubtaskCheckpointer]:
        """Each subtask's checkpointer (created with the backend's snapshot strategy)."""
        return [t.checkpointer for t in self._started_tasks()]

    def _properties(self) -> dict[str, Any]:
        return {"watermark": self.watermark, "max_timestamp": self._max_timestamp}

    def checkpoint(self, storage_or_url: Any = None) -> Any:
        """Checkpoint every subtask and commit; returns the ``CompletedCheckpoint``.

        The synchronous phase runs here; the files are written by a background thread, and
        ``_metadata`` is committed once every subtask's files are written.
        """
        storage = self._use_storage(storage_or_url)
        tasks = self._started_tasks()
        checkpoint_id = storage.next_checkpoint_id()
        futures = [t.checkpoint(checkpoint_id) for t in tasks]
        try:
            handles = [f.result() for f in futures]
            completed = self.checkpoint_coordinator.commit(
                checkpoint_id,
                handles,
                expected={self.operator_name: self.parallelism},
                properties=self._properties(),
            )
        except BaseException:
            # the checkpoint will never commit: its uploads must not be referenced later
            wait(futures)
            for t in tasks:
                t.notify_checkpoint_aborted(checkpoint_id)
            raise
        for t in tasks:
            t.notify_checkpoint_complete(checkpoint_id)
        return completed

    def savepoint(self, storage_or_url: Any = None) -> Any:
        """A self-contained savepoint under ``<job>/savepoints/sp-<id>``; returns it."""
        storage = self._use_storage(storage_or_url)
        tasks = self._started_tasks()
        savepoint_id = storage.next_savepoint_id()
        directory = storage.savepoint_directory(savepoint_id)
        futures = [t.savepoint(directory, savepoint_id) for t in tasks]
        handles = [f.result() for f in futures]
        return self.checkpoint_coordinator.commit(
            savepoint_id,
            handles,
            expected={self.operator_name: self.parallelism},
            properties=self._properties(),
            savepoint_directory=directory,
        )

    def restore(self, checkpoint: Any = None) -> None:
        """Replace all state with a checkpoint's or savepoint's, at this runner's parallelism.

        ``checkpoint``: None (the latest complete checkpoint of the runner's storage), an id, a
        ``CompletedCheckpoint``, or the path/URL of a checkpoint or savepoint directory.
        """
        from streamstate.checkpoint.placement import check_placement
        from streamstate.checkpoint.restore import operator_metadata
        from streamstate.checkpoint.storage import resolve_checkpoint
        from streamstate.serializers import serializer_from_snapshot

        cp = resolve_checkpoint(checkpoint, self.checkpoint_storage)
        op_meta = operator_metadata(cp, self.operator_name)
        check_placement(cp, self.operator_name, "this runner")
        if op_meta.max_parallelism != self.max_parallelism:
            if self._explicit_max_parallelism:
                raise MaxParallelismMismatchError(
                    f"{cp.url} was written with max_parallelism={op_meta.max_parallelism}; this "
                    f"runner has max_parallelism={self.max_parallelism}"
                )
            self.max_parallelism = op_meta.max_parallelism
        if self.key_serializer is None and op_meta.key_serializer is not None:
            self.key_serializer = serializer_from_snapshot(op_meta.key_serializer)
        for t in self.tasks:
            t.dispose()
        self._create_subtasks(self.parallelism)
        properties = cp.metadata.properties
        self.watermark = max(self.watermark, properties.get("watermark", MIN_WATERMARK))
        self._max_timestamp = max(
            self._max_timestamp, properties.get("max_timestamp", MIN_WATERMARK)
        )
        same_storage = not cp.is_savepoint and cp.storage.url == self.checkpoint_storage.url
        for t in self.tasks:
            # late timer services start at the watermark too
            t.restore(cp, claim=same_storage, watermark=self.watermark)
        for t in self.tasks:
            t.open()
        warn_undeclared_states(
            self.operator_name,
            merge_counts(t.operator.keyed_backend.undeclared_states() for t in self.tasks),
        )

    def rescale(self, new_parallelism: int) -> Any:
        """Checkpoint, rebuild the subtasks at ``new_parallelism`` and restore them; returns
        the checkpoint used."""
        if not 1 <= new_parallelism <= self.max_parallelism:
            raise ValueError(
                f"new parallelism must be between 1 and max_parallelism={self.max_parallelism}, "
                f"got {new_parallelism}"
            )
        cp = self.checkpoint()
        self.parallelism = new_parallelism
        self.restore(cp)
        return cp

    def _close_checkpointers(self) -> None:
        for t in self.tasks:
            t.close_checkpointer()

    def close(self) -> None:
        """Dispose of the subtasks' backends and stop background checkpoint writing."""
        self._close_coordinator()
        for t in self.tasks:
            t.dispose()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self.tasks = []
        self.subtasks = []

    def __enter__(self) -> LocalRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
