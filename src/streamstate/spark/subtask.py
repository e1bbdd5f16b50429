"""One subtask of a keyed operator on Spark: operator, checkpointer and the state version it holds.

A :class:`SubtaskRuntime` lives in a state host (streaming) or inside one Spark task (batch
mode). Its state is always one *version*: ``-1`` (empty, or the initial savepoint) or the id
``b`` of the micro-batch whose checkpoint ``chk-b`` it equals, together with the checkpoint's
*lineage* (a uuid the driver commits with it) and the Spark task *attempt* whose files the
checkpoint lists. :meth:`SubtaskRuntime.prepare` brings the state to the version a batch needs:

* ``hot``: it already holds that version (the common case: nothing is read);
* ``reload``: anything else (a new host, a failed or uncommitted batch, a rescale, another
  attempt's files committed): restore ``chk-base`` from checkpoint storage, only the key
  groups this subtask owns (full snapshot plus deltas, ``streamstate.checkpoint.restore``);
* ``empty`` / ``initial``: the first batch, with no state or from the initial savepoint.

A batch then runs: the watermark and processing time advance (firing due timers), records are
processed one by one, and :meth:`SubtaskRuntime.finish` writes the incremental checkpoint
``chk-b`` (a delta of the entries changed in the batch) and stages the outputs as Parquet. The
runtime holds version ``b`` afterwards, tentatively: the driver commits ``chk-b`` only when
every subtask finished, and the next batch says which version it expects.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from itertools import repeat
from typing import Any

from streamstate.spark.columns import column_values, event_time_ms
from streamstate.spark.job import (
    KEY_GROUP_COLUMN,
    JobSpec,
    arrow_schema_from_bytes,
    key_serializer_for,
)
from streamstate.spark.record_batches import check_columns, check_key_groups, check_well_formed
from streamstate.spark.records import OutputConverter, row_class
from streamstate.spark.staging import side_output_directory, write_staged
from streamstate.spark.wire.results import BatchResult, StagedOutput

__all__ = [
    "OUTPUTS_DIR",
    "SubtaskRuntime",
    "job_storage",
    "resident_bytes",
]

OUTPUTS_DIR = "outputs"
#: outputs are converted to Arrow whenever this many are pending (bounds Python memory)
_OUTPUT_CHUNK = 65536
MIN_WATERMARK = -(1 << 63)


def job_storage(job: JobSpec) -> Any:
    """The checkpoint storage of a job (its directory is the storage root)."""
    from streamstate.checkpoint.storage import FileSystemCheckpointStorage

    return FileSystemCheckpointStorage(
        job.checkpoint_url, "", storage_options=dict(job.storage_options)
    )


def _state_backend(job: JobSpec, index: int, local_dir: str | None, incremental: bool) -> Any:
    from streamstate.backends.heap.factory import HeapStateBackend
    from streamstate.backends.registry import state_backend_from
    from streamstate.backends.rocksdb.factory import RocksDBStateBackend

    backend = state_backend_from(job.state_backend)
    options = dict(job.state_backend_options)
    if isinstance(backend, HeapStateBackend) and backend.table_kind == "copy_on_write":
        # state hosts and Python workers run nothing but subtasks: keep CPython's full
        # collections from walking millions of long-lived entries (seconds per collection)
        # unless the job says otherwise
        options.setdefault("gc_freeze", True)
    if options:
        backend = dataclasses.replace(backend, **options)
    if isinstance(backend, HeapStateBackend) and incremental:
        backend = dataclasses.replace(backend, incremental=True)
    elif isinstance(backend, RocksDBStateBackend) and local_dir is not None:
        backend = dataclasses.replace(backend, working_dir=f"{local_dir}/rocksdb-{index}")
    return backend


class SubtaskRuntime:
    """Subtask ``index`` of ``job`` (see the module docstring).

    Parameters:
        job: the operator's spec.
        index: the subtask index (== the Spark partition id).
        function_factory: returns a fresh copy of the user's ``KeyedProcessFunction`` (one per
            operator the runtime builds: a reload starts from a clean function object).
        storage: checkpoint storage (default: the job's checkpoint directory).
        local_dir: a local directory for RocksDB working files.
        incremental: checkpoints write deltas (streaming); batch mode writes at most one
            savepoint and needs no change tracking.
        clock: the operators' processing-time clock (default: the system clock; tests inject
            one).
    """

    def __init__(
        self,
        job: JobSpec,
        index: int,
        function_factory: Any,
        *,
        storage: Any = None,
        local_dir: str | None = None,
        incremental: bool = True,
        clock: Any = None,
    ) -> None:
        self.job = job
        self.clock = clock
        self.incremental = incremental
        self.index = index
        self.function_factory = function_factory
        self.local_dir = local_dir
        if storage is None and job.checkpoint_url:
            storage = job_storage(job)
        self.storage = storage
        self.input_schema = arrow_schema_from_bytes(job.input_schema)
        self.converter = OutputConverter(arrow_schema_from_bytes(job.output_schema))
        #: side-output tag id -> converter, for the side outputs the job delivers
        self.side_converters = {
            tag: OutputConverter(arrow_schema_from_bytes(schema))
            for tag, schema in job.side_outputs.items()
        }
        self.key_serializer = key_serializer_for(self.input_schema, job.key_columns)
        self.row_type = row_class(job.value_columns)
        self.op: Any = None
        #: the subtask's lifecycle (runtime/stream_task.py) around ``op``
        self.task: Any = None
        #: the state version held (None: nothing usable), its lineage and attempt
        self.version: int | None = None
        self.lineage: str | None = None
        self.attempt: int | None = None
        self._pending: list[Any] = []
        self._pending_side: dict[str, list[Any]] = {}
        self._side_dropped = 0
        self._late_dropped_before = 0
        self._max_event_time: int | None = None
        self._rows = 0
        self._output_rows = 0
        self._partials = 0
        #: reads pre-aggregated rows for the current operator (SPEC §13.2)
        self._reader: Any = None
        self._timers_fired = 0

    # ---- versions ------------------------------------------------------------------------------

    def holds(self, base: int, lineage: str, base_attempt: int | None) -> bool:
        return (
            self.op is not None
            and self.version == base
            and self.lineage == lineage
            and (base_attempt is None or self.attempt is None or base_attempt == self.attempt)
        )

    def prepare(self, base: int, lineage: str, base_attempt: int | None = None) -> str:
        """Bring the state to version ``base`` of ``lineage``; returns how (see module doc)."""
        if self.holds(base, lineage, base_attempt):
            if base_attempt is not None and base_attempt == self.attempt:
                # chk-<base> was committed with this runtime's files (the driver starts batch
                # base + 1 only after committing it): the next checkpoint may build on them
                self.task.notify_checkpoint_complete(base)
            elif self.attempt is not None:
                # another attempt's files may have been committed as chk-<base> (the batch this
                # runtime checkpointed was superseded): never build on this runtime's uploads
                self.task.notify_checkpoint_aborted(base)
            return "hot"
        self._discard()
        op = self._new_operator()
        task = self._new_task(op)
        how = "empty"
        checkpoint = None
        try:
            if base >= 0:
                checkpoint = self._committed(base, lineage)
                how = "reload"
            elif self.job.initial_state:
                from streamstate.checkpoint.storage import resolve_checkpoint

                checkpoint = resolve_checkpoint(self.job.initial_state, self._storage())
                how = "initial"
            if checkpoint is not None:
                # a reload claims its checkpoint: the next one may build on its files
                task.restore(checkpoint, claim=how == "reload")
            # the watermark is not advanced here: begin() advances it to the batch's watermark
            # (never below the checkpoint's), and that fires any due timer with its outputs
            task.open()
        except BaseException:
            task.dispose()
            raise
        self.op, self.task = op, task
        self.version, self.lineage = base, lineage
        self.attempt = base_attempt
        return how

    def _committed(self, base: int, lineage: str) -> Any:
        storage = self._storage()
        checkpoint = storage.load(base)
        found = checkpoint.metadata.properties.get("lineage")
        if found != lineage:
            from streamstate.errors import CheckpointError

            raise CheckpointError(
                f"{checkpoint.url} has lineage {found!r} but the driver expects {lineage!r}: "
                "another run of this job committed it (two queries share the checkpoint "
                "directory?)"
            )
        return checkpoint

    def _storage(self) -> Any:
        if self.storage is None:
            from streamstate.checkpoint.storage import MemoryCheckpointStorage

            self.storage = MemoryCheckpointStorage()
        return self.storage

    def _new_operator(self) -> Any:
        from streamstate.runtime.operator import KeyedProcessOperator

        job = self.job
        self._reader = None
        return KeyedProcessOperator(
            self.function_factory(),
            self.key_serializer,
            operator_name=job.operator,
            subtask_index=self.index,
            parallelism=job.parallelism,
            max_parallelism=job.max_parallelism,
            state_backend=_state_backend(job, self.index, self.local_dir, self.incremental),
            clock=self.clock,
        )

    def _new_task(self, op: Any) -> Any:
        from streamstate.checkpoint.writer import IncrementalPolicy
        from streamstate.runtime.stream_task import StreamTask

        incremental: Any = False
        if op.keyed_backend.incremental:  # change tracking (an incremental heap backend)
            incremental = IncrementalPolicy(max_deltas=self.job.max_deltas)
        return StreamTask(
            op,
            self._storage,
            compression=self.job.compression,
            incremental=incremental,
            unique_names=True,
        )

    def _discard(self) -> None:
        if self.task is not None:
            self.task.dispose()
        self.op = self.task = None
        self.version = self.lineage = self.attempt = None

    def close(self) -> None:
        self._discard()

    # ---- one batch -----------------------------------------------------------------------------

    def begin(self, watermark: int | None, processing_time: int | None) -> None:
        """Start a batch: the watermark and processing time advance (due timers fire)."""
        if self.op is None:
            raise RuntimeError("prepare() must run before a batch begins")
        self.version = None  # the state is being changed: no version until finish()
        self._pending = []
        self._pending_side = {}
        self._side_dropped = 0
        self._late_dropped_before = self._late_records_dropped()
        self._max_event_time = None
        self._rows = self._output_rows = self._partials = 0
        fired = 0
        if watermark is not None and watermark > MIN_WATERMARK:
            fired += self.op.advance_watermark(watermark)
        if processing_time is not None:
            fired += self.op.advance_processing_time(processing_time)
        self._timers_fired = fired
        self._collect()

    def process(self, batch: Any) -> None:
        """Process one Arrow batch of this subtask's records (value columns plus ``_kg``).

        The batch is checked first (:mod:`streamstate.spark.record_batches`): it crossed a
        process boundary. A malformed one raises ``ProtocolError``, records of key groups this
        subtask does not own ``KeyGroupOutOfRangeError``."""
        job = self.job
        n = batch.num_rows
        if not n:
            return
        check_well_formed(batch)
        if job.pre_aggregation:
            self._process_partials(batch)
            return
        check_columns(batch, job, self.input_schema)
        kg_column = batch.column(KEY_GROUP_COLUMN)
        check_key_groups(kg_column, self.op.key_group_range, self.index, job.operator)
        self._rows += n
        if len(job.key_columns) == 1:
            keys: Any = batch.column(job.key_columns[0]).to_pylist()
        else:
            keys = list(zip(*(batch.column(c).to_pylist() for c in job.key_columns), strict=True))
        kgs = kg_column.to_pylist()
        timestamps: Any = repeat(None)
        if job.event_time is not None:
            ts = event_time_ms(batch.column(job.event_time))
            timestamps = ts.to_pylist()
            top = _max(ts)
            if top is not None and (self._max_event_time is None or top > self._max_event_time):
                self._max_event_time = top
        cls = self.row_type
        columns = [column_values(batch.column(c)) for c in job.value_columns]
        # rows built in C (map over tuple.__new__), then one loop in the operator
        rows = map(tuple.__new__, repeat(cls), zip(*columns, strict=True))
        self.op.process_elements(keys, rows, timestamps, kgs)
        if len(self.op.output) >= _OUTPUT_CHUNK:
            self._collect()

    def _process_partials(self, batch: Any) -> None:
        """One Arrow batch of pre-aggregated rows (:mod:`streamstate.spark.partials`)."""
        reader = self._reader
        if reader is None:
            from streamstate.spark.partials import PartialReader
            from streamstate.windows.pre_aggregation import pre_aggregation_of

            function = self.op.function
            job = self.job
            reader = self._reader = PartialReader(
                function,
                pre_aggregation_of(function),
                job.pre_aggregation,
                job.key_columns,
                job.value_columns,
            )
        keys, kgs, items, folded, records, top = reader.read(batch)
        self._partials += batch.num_rows
        self._rows += records
        if top is not None and (self._max_event_time is None or top > self._max_event_time):
            self._max_event_time = top
        op = self.op
        function = op.function
        op.process_keyed(
            keys, kgs, items, function.process_folded if folded else function.process_partial
        )
        if len(op.output) >= _OUTPUT_CHUNK:
            self._collect()

    def _collect(self) -> None:
        out = self.op.drain_output()
        side = self.op.side_outputs
        if side:
            for tag, values in side.items():
                converter = self.side_converters.get(tag.tag_id)
                if converter is None:
                    self._side_dropped += len(values)  # the job does not deliver this tag
                elif values:
                    self._pending_side.setdefault(tag.tag_id, []).append(converter.to_batch(values))
            side.clear()
        if out:
            self._output_rows += len(out)
            self._pending.append(self.converter.to_batch(out))

    def _late_records_dropped(self) -> int:
        """The operator's ``num_late_records_dropped`` counter (windows count late elements
        they drop there; it lives as long as the operator)."""
        return self.op.metric_group.counter("num_late_records_dropped").value()  # type: ignore[no-any-return]

    def output_batches(self) -> Iterator[Any]:
        """Take the outputs produced so far as Arrow batches (batch mode streams them out)."""
        self._collect()
        pending, self._pending = self._pending, []
        return iter(pending)

    def end_of_input(self) -> None:
        """Bounded input ends (batch mode): the watermark jumps to the end of time."""
        self.op.advance_watermark((1 << 63) - 1)
        self._collect()

    def finish(
        self, batch_id: int, attempt: int, new_lineage: str, *, savepoint: str | None = None
    ) -> BatchResult:
        """End the batch: write ``chk-<batch_id>`` (or a savepoint into the directory
        ``savepoint``, relative to the storage root) and stage the outputs."""
        t0 = time.perf_counter()
        self._collect()
        self.task.checkpointer.attempt = attempt
        if savepoint is None:
            future = self.task.checkpoint(batch_id)
        else:
            future = self.task.savepoint(savepoint, batch_id)
        outputs = self._stage(batch_id, attempt, savepoint)
        side_outputs = self._stage_side(batch_id, attempt, savepoint)
        t1 = time.perf_counter()
        try:
            handle = future.result()
        except BaseException:
            self.task.notify_checkpoint_aborted(batch_id)  # the batch is dropped
            raise
        t2 = time.perf_counter()
        self.version, self.lineage, self.attempt = batch_id, new_lineage, attempt
        event_timer, processing_timer = self.op.earliest_timers()
        files = handle.files()
        return BatchResult(
            subtask=self.index,
            batch=batch_id,
            version=batch_id,
            attempt=attempt,
            handle=handle,
            outputs=outputs,
            rows=self._rows,
            output_rows=self._output_rows,
            max_event_time=self._max_event_time,
            stats={"stage_ms": (t1 - t0) * 1e3, "checkpoint_wait_ms": (t2 - t1) * 1e3},
            side_outputs=side_outputs,
            side_outputs_dropped=self._side_dropped,
            late_records_dropped=self._late_records_dropped() - self._late_dropped_before,
            event_timer=event_timer,
            processing_timer=processing_timer,
            partials=self._partials,
            state=self.op.keyed_backend.state_figures(),
            timers=self.op.num_timers(),
            timers_fired=self._timers_fired,
            checkpoint_bytes=sum(f.size for f in files if f.checkpoint_id == batch_id),
            checkpoint_full_bytes=sum(f.size for f in files),
            memory_bytes=resident_bytes(),
            state_metrics=self._state_metrics(),
        )

    def _state_metrics(self) -> list[dict[str, Any]]:
        """The histograms of the state metrics decorators (SPEC §8), when the backend has them
        on: each keeps its last samples, so a micro-batch reports their current statistics."""
        backend = self.op.keyed_backend
        if not (backend.latency_tracking or backend.size_tracking):
            return []
        from streamstate.metrics import report_rows

        return [r for r in report_rows(self.op.metric_group) if r["type"] == "histogram"]

    def _stage(self, batch_id: int, attempt: int, savepoint: str | None) -> StagedOutput | None:
        pending, self._pending = self._pending, []
        directory = f"{savepoint}/{OUTPUTS_DIR}" if savepoint else f"{OUTPUTS_DIR}/batch-{batch_id}"
        return self._write_staged(pending, self.converter.schema, directory, attempt)

    def _write_staged(
        self, batches: list[Any], schema: Any, directory: str, attempt: int
    ) -> StagedOutput | None:
        return write_staged(self._storage(), batches, schema, directory, self.index, attempt)

    def _stage_side(
        self, batch_id: int, attempt: int, savepoint: str | None
    ) -> dict[str, StagedOutput]:
        """Each declared side output's values of the batch, staged as its own Parquet file
        under the batch's outputs (deleted with them)."""
        pending, self._pending_side = self._pending_side, {}
        base = f"{savepoint}/{OUTPUTS_DIR}" if savepoint else f"{OUTPUTS_DIR}/batch-{batch_id}"
        staged = {}
        for tag, batches in pending.items():
            directory = side_output_directory(base, tag)
            out = self._write_staged(batches, self.side_converters[tag].schema, directory, attempt)
            if out is not None:
                staged[tag] = out
        return staged


def resident_bytes() -> int | None:
    """This process's resident memory (Linux ``/proc/self/statm``: one read, no walk of the
    heap); None where there is no such file."""
    try:
        with open("/proc/self/statm", "rb") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def _max(column: Any) -> int | None:
    import pyarrow.compute as pc

    value = pc.max(column).as_py()
    return None if value is None else int(value)
