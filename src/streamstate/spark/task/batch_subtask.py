"""One subtask of a keyed operator in batch execution, inside a Spark task (SPEC §13.3).

The driver sorts each subtask's partition by key and event time (``sortWithinPartitions``,
Spark's external sort; ``spark/driver/batch.py``), so the task receives its Arrow batches with each
key's records together. :class:`BatchSubtaskRuntime` finds where the key changes on the
Arrow columns (vectorized: one comparison of each key column with itself shifted by one row),
converts only the first row's key of each run to Python, builds the records column by column,
and hands each run to :meth:`~streamstate.runtime.operator.KeyedProcessOperator.process_runs` of a
:class:`~streamstate.runtime.batch.BatchKeyedProcessOperator`, whose backend keeps one key's state
at a time and fires a key's timers when its run ends. Memory is that of one key and one Arrow
batch, whatever the number of keys.

With a savepoint, finished keys are spooled as they end (``backends/batch/snapshot.py``) and
:meth:`~streamstate.spark.subtask.SubtaskRuntime.finish` writes the canonical savepoint file from
the spool, key group by key group.
"""

from __future__ import annotations

from itertools import repeat
from typing import Any

from streamstate.errors import UnsupportedKeyTypeError
from streamstate.spark.columns import column_values, event_time_ms
from streamstate.spark.job import KEY_GROUP_COLUMN, JobSpec
from streamstate.spark.subtask import SubtaskRuntime

__all__ = ["BatchSubtaskRuntime", "run_starts"]

#: outputs are converted to Arrow whenever this many are pending (bounds Python memory)
_OUTPUT_CHUNK = 65536


def run_starts(columns: list[Any]) -> Any:
    """Row indices where a run of equal keys starts (always 0 first), as a numpy array.

    ``columns`` are Arrow arrays of the same length (the key columns and the key group): a run
    ends where any of them changes.

    >>> import pyarrow as pa
    >>> run_starts([pa.array(["a", "a", "b", "b", "b", "c"]), pa.array([3, 3, 3, 3, 3, 7])])
    array([0, 2, 5])
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(columns[0])
    if n <= 1:
        return np.zeros(n, dtype=np.int64)
    changed: Any = None
    for column in columns:
        head, tail = column.slice(0, n - 1), column.slice(1)
        if pa.types.is_integer(column.type) and not column.null_count:
            ne = column.to_numpy()
            step = ne[1:] != ne[:-1]
        else:
            step = pc.not_equal(tail, head).to_numpy(zero_copy_only=False)
        changed = step if changed is None else changed | step
    starts = np.flatnonzero(changed)
    starts += 1
    return np.concatenate((np.zeros(1, dtype=np.int64), starts))


class BatchSubtaskRuntime(SubtaskRuntime):
    """Subtask ``index`` of ``job`` in batch execution (see the module docstring).

    Parameters (besides :class:`~streamstate.spark.subtask.SubtaskRuntime`'s):
        savepoint: spool finished keys for a savepoint written by ``finish(savepoint=...)``.
        spool_directory: where the spool file lives (default: the temporary directory).
    """

    def __init__(
        self,
        job: JobSpec,
        index: int,
        function_factory: Any,
        *,
        storage: Any = None,
        savepoint: bool = False,
        spool_directory: str | None = None,
        clock: Any = None,
    ) -> None:
        super().__init__(
            job, index, function_factory, storage=storage, incremental=False, clock=clock
        )
        self.savepoint = savepoint
        self.spool_directory = spool_directory
        names = [*job.key_columns, KEY_GROUP_COLUMN]
        #: the key columns and the key group, whose changes end a run
        self._run_columns = names

    def _new_operator(self) -> Any:
        from streamstate.backends.batch import BatchExecutionStateBackend
        from streamstate.runtime.batch import BatchKeyedProcessOperator

        job = self.job
        options = job.state_backend_options
        backend = BatchExecutionStateBackend(
            latency_tracking=bool(options.get("latency_tracking", False)),
            size_tracking=bool(options.get("size_tracking", False)),
            savepoint=self.savepoint,
            spool_directory=self.spool_directory,
        )
        return BatchKeyedProcessOperator(
            self.function_factory(),
            self.key_serializer,
            operator_name=job.operator,
            subtask_index=self.index,
            parallelism=job.parallelism,
            max_parallelism=job.max_parallelism,
            state_backend=backend,
            clock=self.clock,
        )

    def prepare(
        self, base: int = -1, lineage: str = "empty", base_attempt: int | None = None
    ) -> str:
        """Build the operator over empty state (a batch run restores nothing)."""
        if base >= 0 or self.job.initial_state:
            raise ValueError(
                "batch execution starts from no state: initial_state (or a checkpoint) needs "
                "execution_mode='streaming'"
            )
        return super().prepare(base, lineage, base_attempt)

    def process(self, batch: Any) -> None:
        """Process one Arrow batch of sorted records (value columns plus ``_kg``)."""
        n = batch.num_rows
        if not n:
            return
        if self.op is None:
            raise RuntimeError("prepare() must run before a batch is processed")
        job = self.job
        self._rows += n
        run_columns = [batch.column(c) for c in self._run_columns]
        for name, column in zip(self._run_columns, run_columns, strict=True):
            if column.null_count:
                raise UnsupportedKeyTypeError(
                    f"key column {name!r} has a null: every record needs a key (a null key has "
                    "no key group)"
                )
        starts = run_starts(run_columns)
        first_keys = [c.take(starts).to_pylist() for c in run_columns[:-1]]
        keys = first_keys[0] if len(first_keys) == 1 else list(zip(*first_keys, strict=True))
        key_groups = run_columns[-1].take(starts).to_pylist()
        lengths = [*(starts[1:] - starts[:-1]).tolist(), n - int(starts[-1])]
        columns = [column_values(batch.column(c)) for c in job.value_columns]
        # rows built in C (map over tuple.__new__), consumed run by run
        rows = map(tuple.__new__, repeat(self.row_type), zip(*columns, strict=True))
        stamps = None
        if job.event_time is not None:
            import pyarrow.compute as pc

            ts = event_time_ms(batch.column(job.event_time))
            top = pc.max(ts).as_py()
            if top is not None and (self._max_event_time is None or top > self._max_event_time):
                self._max_event_time = int(top)
            stamps = ts.to_pylist()
        self.op.process_runs(keys, key_groups, lengths, rows, stamps)
        if len(self.op.output) >= _OUTPUT_CHUNK:
            self._collect()

    def end_of_input(self) -> None:
        """The input ended: the last key's timers fire and its state is dropped (or spooled)."""
        self.op.end_of_input()
        self._collect()
