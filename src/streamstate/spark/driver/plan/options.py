"""The options of one keyed operator on the driver: everything ``keyed_process`` was given,
resolved against the input and the checkpoint, and the :class:`~streamstate.spark.job.JobSpec`
they make. :mod:`~streamstate.spark.driver.query.keyed` builds them; the batch
(:mod:`~streamstate.spark.driver.query.batch`) and streaming
(:mod:`~streamstate.spark.driver.query.streaming`) runtimes take them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from streamstate.api.functions import KeyedProcessFunction
from streamstate.spark.driver.plan.pre_aggregation import PreAggregationPlan
from streamstate.spark.job import KEY_GROUP_COLUMN, JobSpec, arrow_schema_to_bytes

__all__ = ["KeyedOptions"]


@dataclasses.dataclass
class KeyedOptions:
    """Everything ``keyed_process`` was given, resolved against the input and the checkpoint."""

    df: Any
    key_columns: list[str]
    function: KeyedProcessFunction[Any, Any]
    output_struct: Any
    parallelism: int
    max_parallelism: int
    state_backend: str
    state_backend_options: dict[str, Any]
    checkpoint: str | None
    event_time: str | None
    watermark_delay: int | None
    operator_name: str
    storage_options: dict[str, Any]
    initial_state: str | None
    max_deltas: int
    retained_checkpoints: int
    host_idle_timeout: float
    adaptive: bool
    #: side-output tag id -> Spark schema (StructType) of the side outputs delivered
    side_output_structs: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: "batch" (sorted by key, one key's state at a time) or "streaming" (resolved)
    execution_mode: str = "streaming"
    #: whether the input is a streaming DataFrame (``df.isStreaming``, asked once)
    streaming: bool = False
    #: how micro-batches are folded before the shuffle (SPEC §13.2), or None: per record
    pre_aggregation: PreAggregationPlan | None = None
    #: :meth:`partial_schema`, once asked (the options are not changed once resolved;
    #: ``dataclasses.replace`` makes new ones, without it)
    _partial_schema: Any = dataclasses.field(default=None, init=False, repr=False, compare=False)

    @property
    def spark(self) -> Any:
        return self.df.sparkSession

    def without_input(self) -> KeyedOptions:
        """These options without their DataFrame (what a micro-batch's steps need: each gets
        the micro-batch's own input; they pickle to a Spark Connect server without the
        client's session)."""
        return dataclasses.replace(self, df=None)

    def session_time_zone(self) -> str | None:
        """The session's time zone, in which Spark hands timestamps to Arrow (one question to
        the session: ask it once and pass it on)."""
        return self.spark.conf.get("spark.sql.session.timeZone")

    def arrow_schemas(self, tz: str | None = None) -> tuple[Any, Any]:
        """(task input schema, output schema) as Arrow schemas, with timestamps in ``tz``
        (default: :meth:`session_time_zone`)."""
        from pyspark.sql.pandas.types import to_arrow_schema
        from pyspark.sql.types import IntegerType, StructField, StructType

        tz = tz or self.session_time_zone()
        if self.pre_aggregation is not None:
            inp = self.partial_schema()
        else:
            fields = [*self.df.schema.fields, StructField(KEY_GROUP_COLUMN, IntegerType())]
            inp = StructType(fields)
        return to_arrow_schema(inp, timezone=tz), to_arrow_schema(self.output_struct, timezone=tz)

    def partial_schema(self) -> Any:
        """The Spark schema of the pre-aggregated rows a subtask receives."""
        from streamstate.spark.driver.plan.pre_aggregation import pre_aggregated

        assert self.pre_aggregation is not None
        # asked by the checks before the first job and by the job's spec: one analysis of the
        # fold's plan is 0.1-0.4 s of the query's start
        if self._partial_schema is None:
            # the plan of a micro-batch without its watermark: only its schema is used
            # (analysis, nothing runs)
            self._partial_schema = pre_aggregated(
                self.df,
                self.pre_aggregation,
                parallelism=self.parallelism,
                max_parallelism=self.max_parallelism,
                watermark=None,
                fold_task=_no_fold,
            ).schema
        return self._partial_schema

    def side_output_schemas(self, tz: str | None = None) -> dict[str, Any]:
        """Side-output tag id -> Arrow schema (timestamps in ``tz``, as :meth:`arrow_schemas`)."""
        from pyspark.sql.pandas.types import to_arrow_schema

        if not self.side_output_structs:
            return {}
        tz = tz or self.session_time_zone()
        return {
            tag: to_arrow_schema(struct, timezone=tz)
            for tag, struct in self.side_output_structs.items()
        }

    def job_spec(self, checkpoint_url: str, function_path: str = "", sha: str = "") -> JobSpec:
        tz = self.session_time_zone()
        inp, out = self.arrow_schemas(tz)
        return JobSpec(
            operator=self.operator_name,
            parallelism=self.parallelism,
            max_parallelism=self.max_parallelism,
            key_columns=list(self.key_columns),
            value_columns=list(self.df.columns),
            input_schema=arrow_schema_to_bytes(inp),
            output_schema=arrow_schema_to_bytes(out),
            event_time=self.event_time,
            state_backend=self.state_backend,
            state_backend_options=dict(self.state_backend_options),
            checkpoint_url=checkpoint_url,
            storage_options=dict(self.storage_options),
            max_deltas=self.max_deltas,
            function_path=function_path,
            function_sha=sha,
            initial_state=self.initial_state,
            side_outputs={
                tag: arrow_schema_to_bytes(schema)
                for tag, schema in self.side_output_schemas(tz).items()
            },
            pre_aggregation="" if self.pre_aggregation is None else self.pre_aggregation.mode,
        )


def _no_fold(batches: Any) -> Any:  # the schema of the Python fold, never run
    return iter(())
