"""Micro-batches of a keyed window job without Spark: the driver's loop of
``streamstate.spark.driver.query.streaming`` (plan, one :class:`SubtaskRuntime` per subtask, commit)
with the records routed by key group in Python, per record or pre-aggregated by the Python
fold the Spark task runs (:class:`~streamstate.spark.partial_fold.PartialFold`)
over random map partitions.

It runs the very code of a state host's batch (prepare, begin, process, finish) and of the
pre-shuffle stage; only Spark's shuffle is replaced by routing rows on ``_kg``. Runtimes stay
hot between batches unless a test reloads them from the last checkpoint or rescales.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

import cloudpickle
import pyarrow as pa
import pyarrow.parquet as pq

from streamstate.keygroups import assign_key_groups, compute_operator_index_for_key_group
from streamstate.spark.driver.step.commit import CheckpointLog
from streamstate.spark.job import JobSpec, arrow_schema_to_bytes
from streamstate.spark.partial_fold import PartialFold
from streamstate.spark.partials import partial_schema
from streamstate.spark.subtask import MIN_WATERMARK, SubtaskRuntime, job_storage
from streamstate.windows.pre_aggregation import PreAggregation

#: the records of the tests: key, event time (ms), value
INPUT = pa.schema([("k", pa.string()), ("ts", pa.int64()), ("v", pa.int64())])
VALUE_COLUMNS = ["k", "ts", "v"]
MAX_P = 128


def _output_schema(width: int) -> pa.Schema:
    return pa.schema([(f"c{i}", pa.string()) for i in range(width)])


class MicroBatches:
    """A keyed window job run micro-batch by micro-batch.

    Parameters:
        function: the window operator (pre-aggregated when ``pre`` is given).
        pre: its pre-aggregation (None: every record is shuffled and processed).
        checkpoint: the job's checkpoint directory.
        parallelism, backend: subtasks and state backend.
        delay: the watermark delay (ms), as ``keyed_process(watermark_delay=...)``.
        late_tag: the tag id of the late side output, if the window has one.
        output_width: outputs are tuples of this many values (stored as strings).
        seed: for the random map partitions of the pre-aggregation.
        defer_lateness: the fold gets no watermark and the subtasks decide lateness (what Spark
            SQL's fold does without a late side output).
    """

    def __init__(
        self,
        function: Any,
        pre: PreAggregation | None,
        checkpoint: str,
        *,
        parallelism: int,
        backend: str,
        delay: int,
        late_tag: str | None = None,
        output_width: int = 5,
        seed: int = 0,
        defer_lateness: bool = False,
    ) -> None:
        self.blob = cloudpickle.dumps(function)
        self.pre = pre
        self.checkpoint = checkpoint
        self.backend = backend
        self.delay = delay
        self.late_tag = late_tag
        self.output_width = output_width
        self.rng = random.Random(seed)
        self.defer_lateness = defer_lateness
        self.runtimes: list[SubtaskRuntime] = []
        self.batch = 0
        self.attempt = 0
        self._set_parallelism(parallelism)

    def _job(self, parallelism: int) -> JobSpec:
        inp = INPUT.append(pa.field("_kg", pa.int32()))
        if self.pre is not None:
            inp = partial_schema(INPUT, ["k"], VALUE_COLUMNS, self.pre.late_output)
        side = {}
        if self.late_tag is not None:
            side[self.late_tag] = arrow_schema_to_bytes(INPUT)
        return JobSpec(
            operator="windows",
            parallelism=parallelism,
            max_parallelism=MAX_P,
            key_columns=["k"],
            value_columns=VALUE_COLUMNS,
            input_schema=arrow_schema_to_bytes(inp),
            output_schema=arrow_schema_to_bytes(_output_schema(self.output_width)),
            event_time="ts",
            state_backend=self.backend,
            checkpoint_url=self.checkpoint,
            side_outputs=side,
            pre_aggregation="" if self.pre is None else "python",
        )

    def _set_parallelism(self, parallelism: int) -> None:
        self.close()
        self.parallelism = parallelism
        self.job = self._job(parallelism)
        self.log = CheckpointLog(
            job_storage(self.job), "windows", parallelism, watermark_delay=self.delay
        )
        self.runtimes = [
            SubtaskRuntime(
                self.job,
                i,
                lambda: cloudpickle.loads(self.blob),
                local_dir=f"{self.checkpoint}-local",
            )
            for i in range(parallelism)
        ]

    def reload(self) -> None:
        """Drop the hot state: the next batch restores every subtask from the checkpoint."""
        self._set_parallelism(self.parallelism)

    def rescale(self, parallelism: int) -> None:
        """Continue at another parallelism (the next batch restores by key group)."""
        self._set_parallelism(parallelism)

    def close(self) -> None:
        for r in self.runtimes:
            r.close()
        self.runtimes = []
        if getattr(self, "log", None) is not None:
            self.log.close()

    # ---- one micro-batch -------------------------------------------------------------------

    def _route(self, table: pa.Table) -> list[list[pa.RecordBatch]]:
        kgs = table.column("_kg").to_numpy()
        out: list[list[pa.RecordBatch]] = [[] for _ in range(self.parallelism)]
        subtasks = [
            compute_operator_index_for_key_group(MAX_P, self.parallelism, int(kg)) for kg in kgs
        ]
        for i in range(self.parallelism):
            rows = [j for j, s in enumerate(subtasks) if s == i]
            if rows:
                out[i].append(
                    table.take(pa.array(rows, pa.int64())).combine_chunks().to_batches()[0]
                )
        return out

    def _placed(self, records: list[tuple[str, int, int]], watermark: int | None) -> Any:
        table = pa.table(
            [pa.array([r[i] for r in records], f.type) for i, f in enumerate(INPUT)],
            schema=INPUT,
        )
        if self.pre is None:
            kg = pa.array(assign_key_groups(table.column("k"), MAX_P), pa.int32())
            return self._route(table.append_column("_kg", kg))
        # the pre-shuffle stage: a fold per random map partition, then the shuffle by _kg
        cuts = sorted(self.rng.sample(range(len(records) + 1), min(2, len(records) + 1)))
        parts = [
            table.slice(a, b - a) for a, b in zip([0, *cuts], [*cuts, len(records)], strict=True)
        ]
        folded = []
        schema = partial_schema(INPUT, ["k"], VALUE_COLUMNS, self.pre.late_output)
        for part in parts:
            fold = PartialFold(
                cloudpickle.loads(self.blob),
                self.pre,
                key_columns=["k"],
                value_columns=VALUE_COLUMNS,
                event_time="ts",
                watermark=None if self.defer_lateness else watermark,
                output_schema=schema,
                max_parallelism=MAX_P,
            )
            # Spark hands a partition over in Arrow batches of a bounded size
            for batch in part.to_batches(max_chunksize=7):
                fold.add(batch)
            folded.extend(fold.batches())
        if not folded:
            return [[] for _ in range(self.parallelism)]
        return self._route(pa.Table.from_batches(folded, schema=schema))

    def run(
        self, records: Iterable[tuple[str, int, int]], processing_time: int = 0
    ) -> dict[str, Any]:
        """One micro-batch: what it emitted (outputs, late side output, late elements dropped,
        records, latest event time)."""
        records = list(records)
        plan = self.log.plan(self.batch)
        watermark = None if plan.watermark <= MIN_WATERMARK else plan.watermark
        placed = self._placed(records, watermark)
        results = []
        for i, runtime in enumerate(self.runtimes):
            runtime.prepare(plan.base, plan.lineage, plan.base_attempts.get(i))
            runtime.begin(plan.watermark, processing_time)
            for batch in placed[i]:
                runtime.process(batch)
            self.attempt += 1
            results.append(runtime.finish(plan.batch, self.attempt, plan.new_lineage))
        self.log.commit(plan, results)
        self.batch += 1
        storage = job_storage(self.job)
        outputs: list[Any] = []
        late: list[Any] = []
        for r in results:
            if r.outputs is not None:
                outputs += _rows(storage, r.outputs.path)
            if self.late_tag is not None and self.late_tag in r.side_outputs:
                late += _rows(storage, r.side_outputs[self.late_tag].path)
        return {
            "outputs": outputs,
            "late": late,
            "dropped": sum(r.late_records_dropped for r in results),
            "records": sum(r.rows for r in results),
            "max_event_time": max(
                (r.max_event_time for r in results if r.max_event_time is not None),
                default=None,
            ),
            "watermark": plan.watermark,
        }

    def bounded(self, records: Iterable[tuple[str, int, int]]) -> list[Any]:
        """Batch mode (``keyed_process`` on a static DataFrame): every record, then the end
        of the input fires everything; the outputs."""
        placed = self._placed(list(records), None)
        out: list[Any] = []
        for i, runtime in enumerate(self.runtimes):
            runtime.prepare(-1, "empty")
            runtime.begin(None, 0)
            for batch in placed[i]:
                runtime.process(batch)
            runtime.end_of_input()
            for b in runtime.output_batches():
                out += [tuple(r.values()) for r in b.to_pylist()]
        return out


def _rows(storage: Any, path: str) -> list[tuple[Any, ...]]:
    with storage.open_read(path) as f:
        table = pq.read_table(f)
    return [tuple(r.values()) for r in table.to_pylist()]
