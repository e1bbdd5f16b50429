"""Streaming mode: a keyed function over a Structured Streaming query, exactly-once.

The query is driven by ``foreachBatch``. Micro-batch ``b`` on the driver
(:class:`~streamstate.spark.driver.step.micro_batches.MicroBatchRunner`) runs one *step* that
ends with checkpoint ``c`` (``c == b`` until the query's first no-data micro-batch):

1. :meth:`~streamstate.spark.driver.step.commit.CheckpointLog.plan`: the state version to start
   from (``chk-(c-1)``), its lineage, the watermark; if ``b``'s step is already committed (the
   driver died after our commit, before Spark's), skip to step 4 with each checkpoint of ``b``.
2. One Spark job (:class:`~streamstate.spark.driver.step.step_tasks.StepTasks`): placement by
   key group, ``repartitionById``, ``mapInArrow`` with
   :func:`~streamstate.spark.task.tasks.micro_batch_task`: each task streams its partition to
   its subtask's state host, which applies it, writes the incremental checkpoint ``chk-c`` of
   the subtask and stages the outputs, and the task yields one acknowledgement row. The
   acknowledgement says where the host lives; the next step's tasks get these locations
   (:class:`~streamstate.spark.driver.step.host_fleet.HostFleet`), so the task of subtask ``i``
   reaches the same host from whichever node Spark runs it on
   (:mod:`streamstate.spark.task.host_client`).
3. Commit: ``chk-c/_metadata`` is written only when all subtasks acknowledged version ``c``.
4. The sink gets the staged outputs (idempotent per checkpoint id), each side sink its side
   output's (:mod:`streamstate.spark.driver.step.outputs`).
5. While the committed checkpoint owes a no-data micro-batch (the next watermark passes a
   pending event-time timer; :mod:`streamstate.spark.driver.step.no_data`), steps 1-4 again
   without input, as checkpoint ``c + 1``, ...; Spark then commits its own log. In a running
   query an :class:`~streamstate.spark.driver.step.no_data.IdleTicker` runs the no-data
   micro-batches that processing-time timers call for while no input arrives.

A function error (the user's function raised; streamstate's errors about what the job
declares) is data: the host drops the half-applied batch, the task returns the error in its
acknowledgement, and the driver raises it once, uncommitted
(:mod:`streamstate.spark.failures`). A task that fails (host killed, worker lost, storage) is
retried by Spark; its host has dropped the half-applied batch and reloads ``chk-(b-1)``. Old
staged outputs and checkpoints are deleted behind the retained ones.

A query takes an epoch in the checkpoint directory when it starts (fencing: an older query on
the same directory stops before its next batch or commit, and leaves the hosts to the newer
one). Spark's own streaming checkpoint is ``<checkpoint>/spark`` unless ``spark_checkpoint=``
puts it elsewhere (e.g. a local or HDFS path when Spark cannot write the checkpoint's object
store).

A classic session runs the micro-batches in this driver, a Spark Connect server in a Python
process of its own: the query learns of their figures, failures and progress through the
interface of :mod:`streamstate.spark.driver.reports`, chosen once when it starts
(:mod:`streamstate.spark.driver.query.classic`, :mod:`streamstate.spark.driver.query.connect`).
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec

from streamstate.errors import CheckpointMismatchError
from streamstate.spark.driver.monitor.figures import Spans
from streamstate.spark.driver.plan.options import KeyedOptions
from streamstate.spark.driver.query.start import (
    Prespawn,
    bind_for,
    check_progress,
    local_jvm,
    reports_for,
    ship_function,
)
from streamstate.spark.driver.reports import QueryReports
from streamstate.spark.driver.session import conf
from streamstate.spark.driver.sinks import Sink, sink_from
from streamstate.spark.driver.spark_checkpoint import (
    DEFAULT_SPARK_CHECKPOINT,
    recorded_spark_checkpoint,
    spark_checkpoint_location,
)
from streamstate.spark.driver.step.commit import CheckpointLog
from streamstate.spark.driver.step.host_fleet import HostFleet
from streamstate.spark.driver.step.micro_batches import RunParts
from streamstate.spark.driver.step.no_data import trigger_interval
from streamstate.spark.driver.step.outputs import OutputDelivery
from streamstate.spark.driver.step.step_tasks import StepTasks
from streamstate.spark.failures import is_function_error
from streamstate.spark.job import arrow_schema_from_bytes
from streamstate.spark.subtask import job_storage
from streamstate.spark.wire.hosts import DEFAULT_FRAME_TIMEOUT

__all__ = ["KeyedStream", "KeyedStreamingQuery"]

log = logging.getLogger(__name__)

#: Spark's switch for its own no-data micro-batches: ``write_stream(no_data_batches=None)``
#: follows it
NO_DATA_CONF = "spark.sql.streaming.noDataMicroBatches.enabled"


class KeyedStream:
    """A keyed function over a streaming DataFrame; start it with
    :meth:`KeyedStream.write_stream`."""

    def __init__(self, options: KeyedOptions) -> None:
        self.options = options

    def write_stream(
        self,
        sink: Any = "memory",
        *,
        path: str | None = None,
        callback: Any = None,
        trigger: dict[str, Any] | None = None,
        query_name: str | None = None,
        run_dir: str | None = None,
        storage_options: dict[str, Any] | None = None,
        side_sinks: dict[Any, Any] | None = None,
        host_bind: str | None = None,
        host_connect_timeout: float = 3.0,
        spark_checkpoint: str | None = None,
        no_data_batches: bool | None = None,
        host_frame_timeout: float = DEFAULT_FRAME_TIMEOUT,
    ) -> KeyedStreamingQuery:
        """Start the query, writing outputs to ``sink`` (see :mod:`streamstate.spark.driver.sinks`).

        Parameters:
            sink: ``"parquet"`` (with ``path=``), ``"memory"``, ``"console"``,
                ``"foreach_batch"`` (with ``callback=``) or a ``Sink`` instance.
            trigger: keyword arguments of ``DataStreamWriter.trigger`` (e.g.
                ``{"availableNow": True}`` or ``{"processingTime": "10 seconds"}``).
            query_name: the Spark query name.
            run_dir: where state hosts keep sockets and logs (default
                ``$STREAMSTATE_RUN_DIR`` or ``/tmp/streamstate-<uid>``).
            storage_options: fsspec options of the ``"parquet"`` sink's ``path`` (default: the
                checkpoint's ``storage_options``).
            side_sinks: ``{OutputTag: sink}`` for every side output declared with
                ``keyed_process(side_outputs=...)``: a ``Sink``, ``"memory"``, ``"console"``
                or ``("parquet", path)``. Each gets its side output's committed values of
                every micro-batch after the main sink, exactly-once like it.
            host_bind: the address state hosts listen on for tasks of other nodes
                (``"10.0.0.5"``, ``"0.0.0.0"``, ``"off"`` for none; default
                ``$STREAMSTATE_HOST_BIND``, else ``$SPARK_LOCAL_IP``, else the node's address;
                with a ``local`` master ``"off"``, hosts on Unix sockets only, unless
                ``$STREAMSTATE_HOST_BIND`` is set).
            host_connect_timeout: seconds a task waits for the TCP connection to a host on
                another node before it starts one on its own node (which reloads).
            host_frame_timeout: seconds a state host gives a message once it has begun (one
                Arrow batch of records over the network); a connection that stops inside one
                is dropped and its batch aborted, and a batch of a subtask waits this long for
                another batch of the same subtask before aborting it. Far below the hosts'
                600 s I/O timeout; above the time the largest Arrow batch takes to cross the
                network.
            spark_checkpoint: where Spark keeps its own streaming checkpoint (offsets and
                commit logs), a path or URL Hadoop can write (default
                ``<checkpoint>/spark``). Use it when the state checkpoint is on storage Spark
                has no connector for (``s3://`` without ``hadoop-aws``). It must stay with the
                state checkpoint for the life of the query.
            no_data_batches: run micro-batches without input when the watermark would fire a
                pending event-time timer, or a processing-time timer is due
                (:mod:`streamstate.spark.driver.step.no_data`): the last windows close at the end
                of an ``availableNow`` run, and within a trigger interval when the input pauses.
                Default (None): Spark's ``spark.sql.streaming.noDataMicroBatches.enabled``
                (on unless the session turns it off). ``False``: timers fire only when input
                arrives.
        """
        if storage_options is None:
            storage_options = self.options.storage_options
        return KeyedStreamingQuery(
            self.options,
            sink_from(sink, path, callback, storage_options),
            trigger,
            query_name,
            run_dir,
            _side_sinks(self.options, side_sinks, storage_options),
            host_bind,
            host_connect_timeout,
            spark_checkpoint,
            no_data_batches,
            host_frame_timeout,
        )

    start = write_stream


def _side_sinks(
    options: KeyedOptions, side_sinks: dict[Any, Any] | None, storage_options: Any
) -> dict[str, Sink]:
    """``{tag id: Sink}``, one for every declared side output and no other."""
    from streamstate.api.functions import OutputTag

    out: dict[str, Sink] = {}
    for tag, sink in (side_sinks or {}).items():
        tag_id = tag.tag_id if isinstance(tag, OutputTag) else tag
        if tag_id not in options.side_output_structs:
            raise ValueError(
                f"side_sinks names side output {tag_id!r}, which keyed_process(side_outputs=...) "
                f"does not declare (declared: {sorted(options.side_output_structs)})"
            )
        if isinstance(sink, tuple):
            name, path = sink
            out[tag_id] = sink_from(name, path, None, storage_options)
        else:
            out[tag_id] = sink_from(sink, None, None, storage_options)
    missing = sorted(set(options.side_output_structs) - set(out))
    if missing:
        raise ValueError(
            f"side outputs {missing} are declared in keyed_process(side_outputs=...) but have "
            "no sink: pass write_stream(side_sinks={tag: sink})"
        )
    return out


class KeyedStreamingQuery:
    """A running keyed query: the Spark ``StreamingQuery`` plus the state it drives. Its
    micro-batches run in a
    :class:`~streamstate.spark.driver.step.micro_batches.MicroBatchRunner`: Spark's
    ``foreachBatch`` function, here or on a Spark Connect server, whose figures, failures and
    progress the query learns of through ``reports``."""

    def __init__(
        self,
        options: KeyedOptions,
        sink: Sink,
        trigger: dict[str, Any] | None,
        query_name: str | None,
        run_dir: str | None,
        side_sinks: dict[str, Sink] | None = None,
        host_bind: str | None = None,
        host_connect_timeout: float = 3.0,
        spark_checkpoint: str | None = None,
        no_data_batches: bool | None = None,
        host_frame_timeout: float = DEFAULT_FRAME_TIMEOUT,
    ) -> None:
        self._spans = Spans()
        #: where the query's fixed costs went, in ms: ``ship_ms`` (pickling and storing the
        #: function), ``epoch_ms`` (taking the checkpoint over), ``spark_start_ms`` (Spark's
        #: ``start()``), ``init_ms`` (all of the constructor), ``first_batch_at_ms`` (from
        #: the constructor's start to the first micro-batch's), ``spawn_ms`` (the hosts started
        #: ahead, local master), then at stop ``stop_ms`` (Spark's ``stop()``) and
        #: ``shutdown_ms`` (the state hosts')
        self.timings: dict[str, float] = self._spans.ms
        self.options = options
        self.sink = sink
        #: side-output tag id -> its sink
        self.side_sinks = dict(side_sinks or {})
        self.spark = options.spark
        if no_data_batches is None:
            no_data_batches = (conf(self.spark, NO_DATA_CONF, "true") or "true").lower() != "false"
        idle_interval = trigger_interval(trigger) if no_data_batches else None
        parts = self._set_up(
            run_dir, host_bind, host_connect_timeout, spark_checkpoint, host_frame_timeout
        )
        parts = parts.with_no_data(no_data_batches, idle_interval)
        name = query_name or options.operator_name
        sink.open(name)
        for tag, side_sink in self.side_sinks.items():
            side_sink.open(f"{name}.{tag}")
        #: how the query learns of its micro-batches (Spark Connect: through the checkpoint)
        self.reports: QueryReports = reports_for(
            self.spark, self.storage, self.hosts.run_id, {"main": sink, **self.side_sinks}
        )
        run_batch, df = self.reports.foreach_batch(parts, self._spans, options.df)
        writer = df.writeStream.foreachBatch(run_batch).option(
            "checkpointLocation", self.spark_checkpoint
        )
        if trigger:
            writer = writer.trigger(**trigger)
        if query_name:
            writer = writer.queryName(query_name)
        with self._spans.span("spark_start"):
            self.query = self.reports.start(writer, self.spark_checkpoint)
        self._spans.mark("init")

    def _set_up(
        self,
        run_dir: str | None,
        host_bind: str | None,
        host_connect_timeout: float,
        spark_checkpoint: str | None,
        host_frame_timeout: float = DEFAULT_FRAME_TIMEOUT,
    ) -> RunParts:
        """Ship the function, take the checkpoint over, start the hosts ahead (local master);
        returns what runs the steps (without no-data micro-batches: the caller says)."""
        options = self.options
        checkpoint = options.checkpoint
        assert checkpoint is not None
        with self._spans.span("ship"):
            self.job, function = ship_function(options)
        #: the job as every step's task carries it (encoded once)
        job_bytes = msgspec.msgpack.encode(self.job)
        #: the run's state hosts: identity, secret, where each subtask's is
        self.hosts = HostFleet(
            self.job,
            job_bytes,
            run_dir=run_dir,
            bind=bind_for(self.spark, host_bind),
            connect_timeout=host_connect_timeout,
            idle_timeout=options.host_idle_timeout,
            frame_timeout=host_frame_timeout,
        )
        self.storage = job_storage(self.job)
        self.spark_checkpoint = spark_checkpoint_location(
            self.spark, self.storage.url_of(DEFAULT_SPARK_CHECKPOINT), spark_checkpoint, checkpoint
        )
        with self._spans.span("epoch"):
            check_progress(
                self.spark, self.storage, options, self.spark_checkpoint, spark_checkpoint
            )
            #: this query's epoch: starting takes the job over from any earlier query. The
            #: Spark checkpoint is recorded relative to the job directory when inside it, so
            #: that a copy of the directory never names the original's
            self.epoch = self.storage.acquire_epoch(
                operator=options.operator_name,
                spark_checkpoint=recorded_spark_checkpoint(
                    self.spark_checkpoint, self.storage.url_of("")
                ),
            )
            self.log = CheckpointLog(
                self.storage,
                options.operator_name,
                options.parallelism,
                watermark_delay=options.watermark_delay,
                retained=options.retained_checkpoints,
                epoch=self.epoch,
                spark_checkpoint=self.spark_checkpoint,
            )
        delivery_jvm = self._delivery_jvm()
        plain = options.without_input()
        spans = Spans()
        steps = StepTasks(plain, self.job, job_bytes, function, self.hosts, delivery_jvm, spans)
        #: starts this run's state hosts while Spark plans the first micro-batch (local master)
        self._prespawn = Prespawn(self.spark, self.hosts, self._spans)
        self._hosts_stopped = False
        outputs = OutputDelivery(
            plain,
            self.storage,
            self.sink,
            self.side_sinks,
            arrow_schema_from_bytes(self.job.output_schema),
            options.side_output_schemas(),
        )
        return RunParts(
            options=plain,
            log=self.log,
            steps=steps,
            outputs=outputs,
            run_id=self.hosts.run_id,
            no_data_batches=False,
            idle_interval=None,
            spans=spans,
        )

    def _delivery_jvm(self) -> int | None:
        """With a local master and pre-aggregation, the driver JVM's pid: the driver delivers
        pre-aggregated rows to the state hosts itself (SPEC §13.2; None: the tasks do)."""
        return local_jvm(self.spark) if self.options.pre_aggregation is not None else None

    @property
    def batches(self) -> list[dict[str, Any]]:
        """One dict of figures per step this query run ran: ``batch`` (Spark's micro-batch),
        ``checkpoint``, ``no_data`` (with ``due`` and ``idle``), ``replayed``, rows, outputs,
        watermark, restores, routes and timings (docs/spark/monitoring.md)."""
        return self.reports.batches()

    # ---- control -------------------------------------------------------------------------------

    @property
    def id(self) -> str:
        """Spark's query id."""
        return str(self.query.id)

    @property
    def host_locations(self) -> dict[int, dict[str, Any]]:
        """Subtask -> where its state host was at the end of the last step (node, TCP address,
        socket, pid)."""
        return {i: msgspec.to_builtins(where) for i, where in self.hosts.locations.items()}

    @property
    def is_active(self) -> bool:
        """Whether Spark's query runs."""
        return bool(self.query.isActive)

    def exception(self) -> Any:
        """Spark's ``StreamingQueryException`` of a failed query (``await_termination()`` raises
        the original error instead)."""
        return self.query.exception()

    @property
    def last_progress(self) -> Any:
        """Spark's last ``StreamingQueryProgress`` (a dict), whose
        ``observedMetrics["streamstate"]`` holds the micro-batch's state figures
        (:mod:`streamstate.spark.driver.monitor.progress`, docs/spark/monitoring.md)."""
        progress = self.query.lastProgress
        return None if progress is None else self.reports.progress([progress])[0]

    @property
    def recent_progress(self) -> Any:
        """Spark's recent ``StreamingQueryProgress`` es, each with its micro-batch's state
        figures (see :attr:`last_progress`)."""
        progress = self.query.recentProgress
        return self.reports.progress(progress) if progress else progress

    def process_all_available(self) -> None:
        """Wait until the query has processed everything available. If a micro-batch failed,
        raise its error (the function's or streamstate's), with Spark's exception chained."""
        try:
            self.query.processAllAvailable()
        except Exception as exc:
            self._raise_failure(exc)
        finally:
            self.reports.sync()
        self._raise_idle_failure()

    def await_termination(self, timeout: float | None = None) -> bool | None:
        """Wait for the query to end (an ``availableNow`` trigger ends by itself); then shut
        this job's state hosts down. If a micro-batch failed, raise its error (the function's
        or streamstate's), with Spark's ``StreamingQueryException`` chained."""
        try:
            if timeout is None:
                self.query.awaitTermination()
                done: bool | None = True
            else:
                done = self.query.awaitTermination(timeout)
        except Exception as exc:
            self._raise_failure(exc)
        finally:
            self.reports.sync()
            if not self.query.isActive:
                self.shutdown_hosts()
        self._raise_idle_failure()
        return done

    def _raise_idle_failure(self) -> None:
        """Spark raised nothing: if a no-data micro-batch of the idle ticker failed, stop the
        query (the ticker of a classic session did already; a Spark Connect server's ticker
        cannot: it reported the error) and raise that error."""
        failure = self.reports.idle_failure()
        if failure is None:
            return
        if self.query.isActive:
            self.stop()
        raise failure

    def _raise_failure(self, exc: BaseException) -> None:
        self.reports.log_again()
        failure = self.reports.failure(exc)
        if failure is None or failure is exc:
            raise exc
        if is_function_error(failure) or isinstance(failure, CheckpointMismatchError):
            # the function's own error, once (or the refusal of a state that does not match
            # Spark's progress, which says all there is): Spark's exception (query.exception())
            # only repeats it with Java frames and the query's plan
            raise failure.with_traceback(None) from None
        raise failure from exc

    def stop(self) -> None:
        """Stop the query and shut this job's state hosts down."""
        start = self._spans.elapsed()
        # no new no-data micro-batch here or on a Connect server; one running ends
        self.reports.stop(timeout=0)
        try:
            self.query.stop()
        finally:
            self.reports.log_again()
            self.timings.setdefault("stop_ms", self._spans.elapsed() - start)
            self.reports.sync()
            self.shutdown_hosts()

    def shutdown_hosts(self, reason: str = "query stopped") -> int:
        """Tell the state hosts of this query run to exit: those on this node through their
        sockets, those elsewhere at the locations the last acknowledgements gave (hosts that
        cannot be reached exit with their executor or when idle). Hosts of other runs on the
        same checkpoint (another driver's) are not touched."""
        if self._hosts_stopped:
            return 0
        self._hosts_stopped = True
        with self._spans.span("shutdown"):
            self.reports.stop(timeout=120.0)  # its no-data micro-batches would start hosts again
            self._prespawn.join()  # a host it is starting must be found and stopped too
            self.log.close()
            return self.hosts.shutdown(reason)

    def __enter__(self) -> KeyedStreamingQuery:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (
            f"KeyedStreamingQuery({self.options.operator_name!r}, p={self.job.parallelism}, "
            f"checkpoint={self.job.checkpoint_url!r}, active={self.is_active})"
        )
