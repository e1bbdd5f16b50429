"""Streaming mode: a keyed function over a Structured Streaming query, exactly-once.

The query is driven by ``foreachBatch``. Micro-batch ``b`` on the driver
(:meth:`KeyedStream._run_batch`) runs one *step* that ends with checkpoint ``c`` (``c == b``
until the query's first no-data micro-batch):

1. :meth:`~streamstate.spark.driver.commit.CheckpointLog.plan`: the state version to start from
   (``chk-(c-1)``), its lineage, the watermark; if ``b``'s step is already committed (the
   driver died after our commit, before Spark's), skip to step 4 with each checkpoint of ``b``.
2. One Spark job (:class:`~streamstate.spark.driver.step_tasks.StepTasks`): placement by key
   group, ``repartitionById``, ``mapInArrow`` with
   :func:`~streamstate.spark.task.tasks.micro_batch_task`: each task streams its partition to
   its subtask's state host, which applies it, writes the incremental checkpoint ``chk-c`` of
   the subtask and stages the outputs, and the task yields one acknowledgement row. The
   acknowledgement says where the host lives; the next step's tasks get these locations
   (:class:`~streamstate.spark.driver.host_fleet.HostFleet`), so the task of subtask ``i``
   reaches the same host from whichever node Spark runs it on
   (:mod:`streamstate.spark.task.host_client`).
3. Commit: ``chk-c/_metadata`` is written only when all subtasks acknowledged version ``c``.
4. The sink gets the staged outputs (idempotent per checkpoint id), each side sink its side
   output's.
5. While the committed checkpoint owes a no-data micro-batch (the next watermark passes a
   pending event-time timer; :mod:`streamstate.spark.driver.no_data`), steps 1-4 again without
   input, as checkpoint ``c + 1``, ...; Spark then commits its own log. In a running query an
   :class:`~streamstate.spark.driver.no_data.IdleTicker` runs the no-data micro-batches that
   processing-time timers call for while no input arrives.

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
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from typing import Any

import msgspec

from streamstate.spark.driver.commit import BatchPlan, CheckpointLog, spark_batch_of
from streamstate.spark.driver.host_fleet import HostFleet
from streamstate.spark.driver.locations import spark_checkpoint_location
from streamstate.spark.driver.no_data import (
    MAX_NO_DATA_BATCHES,
    MIN_IDLE_INTERVAL,
    IdleTicker,
    trigger_interval,
)
from streamstate.spark.driver.options import KeyedOptions
from streamstate.spark.driver.progress import (
    ProgressPublisher,
    micro_batch_figures,
    observe_state,
    with_state_figures,
)
from streamstate.spark.driver.session import conf, is_connect, is_local
from streamstate.spark.driver.sinks import MemorySink, Sink, StagedBatch, sink_from
from streamstate.spark.driver.step_tasks import StepTasks
from streamstate.spark.failures import (
    error_from_report,
    failure_report,
    is_function_error,
    original_error,
    parse_remote_error,
    quiet_query_failure_log,
)
from streamstate.spark.job import (
    FUNCTIONS_DIR,
    JobSpec,
    arrow_schema_from_bytes,
    pickle_function,
)
from streamstate.spark.subtask import (
    OUTPUTS_DIR,
    StagedOutput,
    job_storage,
)

__all__ = ["KeyedStream", "KeyedStreamingQuery"]

log = logging.getLogger(__name__)

SPARK_CHECKPOINT_DIR = "spark"
#: where the server side of a Spark Connect query reports to its client: one directory per
#: query run, ``<start ms>-<run id>``
CONNECT_DIR = "connect"
#: the Connect query runs whose reports a checkpoint keeps: a Connect query deletes older ones
#: when it starts (the reports are the client's only copy of the figures, memory-sink outputs
#: and errors of a run; an earlier run's client may still be reading them)
CONNECT_REPORTS_KEPT = 3
#: Spark's switch for its own no-data micro-batches: ``write_stream(no_data_batches=None)``
#: follows it
NO_DATA_CONF = "spark.sql.streaming.noDataMicroBatches.enabled"
#: the idle ticker looks at least this often (s) whether a no-data micro-batch is due
_IDLE_LOOK_S = 1.0


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
                127.0.0.1 with a ``local`` master).
            host_connect_timeout: seconds a task waits for the TCP connection to a host on
                another node before it starts one on its own node (which reloads).
            spark_checkpoint: where Spark keeps its own streaming checkpoint (offsets and
                commit logs), a path or URL Hadoop can write (default
                ``<checkpoint>/spark``). Use it when the state checkpoint is on storage Spark
                has no connector for (``s3://`` without ``hadoop-aws``). It must stay with the
                state checkpoint for the life of the query.
            no_data_batches: run micro-batches without input when the watermark would fire a
                pending event-time timer, or a processing-time timer is due
                (:mod:`streamstate.spark.driver.no_data`): the last windows close at the end of an
                ``availableNow`` run, and within a trigger interval when the input pauses.
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
    """A running keyed query: the Spark ``StreamingQuery`` plus the state it drives."""

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
    ) -> None:
        t_init = time.perf_counter()
        #: where the query's fixed costs went, in ms: ``ship_ms`` (pickling and storing the
        #: function), ``epoch_ms`` (taking the checkpoint over), ``spark_start_ms`` (Spark's
        #: ``start()``), ``init_ms`` (all of the constructor), ``first_batch_at_ms`` (from
        #: the constructor's start to the first micro-batch's), then at stop
        #: ``stop_ms`` (Spark's ``stop()``) and ``shutdown_ms`` (the state hosts')
        self.timings: dict[str, float] = {}
        self._t_created = t_init
        self.options = options
        self.sink = sink
        #: side-output tag id -> its sink
        self.side_sinks = dict(side_sinks or {})
        self.spark = options.spark
        checkpoint = options.checkpoint
        assert checkpoint is not None
        t = time.perf_counter()
        self.job = self._ship_function(options)
        self.timings["ship_ms"] = (time.perf_counter() - t) * 1e3
        #: the job as every step's task carries it (encoded once)
        self._job_bytes = msgspec.msgpack.encode(self.job)
        #: the run's state hosts: identity, secret, where each subtask's is
        self.hosts = HostFleet(
            self.job,
            self._job_bytes,
            run_dir=run_dir,
            bind=_bind_for(self.spark, host_bind),
            connect_timeout=host_connect_timeout,
            idle_timeout=options.host_idle_timeout,
        )
        self.storage = job_storage(self.job)
        self.output_schema = arrow_schema_from_bytes(self.job.output_schema)
        self.spark_checkpoint = spark_checkpoint_location(
            self.spark, self.storage.url_of(SPARK_CHECKPOINT_DIR), spark_checkpoint, checkpoint
        )
        t = time.perf_counter()
        #: this query's epoch: starting takes the job over from any earlier query
        self.epoch = self.storage.acquire_epoch(
            operator=options.operator_name, spark_checkpoint=self.spark_checkpoint
        )
        self.log = CheckpointLog(
            self.storage,
            options.operator_name,
            options.parallelism,
            watermark_delay=options.watermark_delay,
            retained=options.retained_checkpoints,
            epoch=self.epoch,
        )
        self.timings["epoch_ms"] = (time.perf_counter() - t) * 1e3
        #: with a local master, the driver JVM's pid: the driver delivers pre-aggregated rows
        #: to the state hosts itself (SPEC §13.2; None: the tasks do)
        delivery_jvm = self._local_jvm() if options.pre_aggregation is not None else None
        #: how each step's subtasks run: the Spark job of its tasks, or the driver's delivery
        self.steps = StepTasks(
            options, self.job, self._job_bytes, self._function, self.hosts, delivery_jvm
        )
        #: starts this run's state hosts while Spark plans the first micro-batch (local master)
        self._prespawn = self._prespawn_hosts()
        #: one dict of figures per step run by this query object: ``batch`` (Spark's
        #: micro-batch), ``checkpoint``, ``no_data`` (with ``due`` and ``idle``), ``replayed``,
        #: rows, outputs, watermark, restores, routes and timings (docs/spark.md)
        self.batches: list[dict[str, Any]] = []
        self._hosts_stopped = False
        #: what made a micro-batch fail, as raised (see streamstate.spark.failures)
        self._failure: BaseException | None = None
        #: restores Spark's query-failure loggers silenced while a function error stops the
        #: query (failures.quiet_query_failure_log)
        self._restore_logs: Any = None
        #: a no-data micro-batch of the idle ticker failed: the query was stopped with it
        self._idle_failure: BaseException | None = None
        #: guards ``batches``
        self._lock = threading.Lock()
        #: one step at a time: Spark's foreachBatch calls and the idle ticker
        self._step_lock = threading.Lock()
        if no_data_batches is None:
            no_data_batches = (conf(self.spark, NO_DATA_CONF, "true") or "true").lower() != "false"
        #: run no-data micro-batches (streamstate.spark.driver.no_data)
        self.no_data_batches = bool(no_data_batches)
        #: seconds between micro-batches of a running query (None: the run ends by itself)
        self._idle_interval = trigger_interval(trigger) if self.no_data_batches else None
        self._ticker: IdleTicker | None = None
        #: this run delivered again what a no-data micro-batch of an earlier run may not have
        #: delivered (see _recover)
        self._recovered = False
        self._last_step_end = time.monotonic()
        #: the session a Spark Connect server's idle ticker runs its jobs with
        self._idle_spark: Any = None
        #: the state figures of the steps the current foreachBatch call ran (None outside one)
        self._call_steps: list[dict[str, Any]] | None = None
        #: puts each micro-batch's state figures into Spark's progress (classic session)
        self._publisher = ProgressPublisher()
        #: Spark's id of the query (asked once: each ask is a py4j call)
        self._query_id: str | None = None
        #: set once Spark's query exists (a first micro-batch may end before start() returns)
        self._started = threading.Event()
        sink.open(query_name or options.operator_name)
        self.side_schemas = options.side_output_schemas()
        for tag, side_sink in self.side_sinks.items():
            side_sink.open(f"{query_name or options.operator_name}.{tag}")
        #: Spark Connect: runs the batches in a Python process on the server, which reports
        #: each batch's figures (and memory sinks their outputs) under this directory of the
        #: checkpoint for the client (:meth:`_sync_from_server`); None for a classic session
        self._report_dir: str | None = None
        #: the server's batch reports the client read so far, by file name
        self._reports_read: dict[str, Any] = {}
        if is_connect(self.spark):
            self._report_dir = (
                f"{CONNECT_DIR}/{time.time_ns() // 1_000_000:013d}-{self.hosts.run_id}"
            )
            self._prune_reports()
            for name, s in [("main", sink), *self.side_sinks.items()]:
                if isinstance(s, MemorySink):
                    s.mirror_to(self.storage, f"{self._report_dir}/memory/{name}")
        run_batch: Any = self._run_batch
        df = options.df
        if self._report_dir:
            # pickled now, by value for modules the server cannot import (a notebook's or a
            # test's functions, sinks and callbacks), like the function the tasks run
            run_batch = _ServerBatches(pickle_function(self))
        else:
            # each micro-batch's state figures go into Spark's progress (spark/driver/progress.py)
            df = observe_state(df)
        writer = df.writeStream.foreachBatch(run_batch).option(
            "checkpointLocation", self.spark_checkpoint
        )
        if trigger:
            writer = writer.trigger(**trigger)
        if query_name:
            writer = writer.queryName(query_name)
        t = time.perf_counter()
        self.query = _start(
            writer, connect=self._report_dir is not None, where=self.spark_checkpoint
        )
        self.timings["spark_start_ms"] = (time.perf_counter() - t) * 1e3
        self._started.set()
        if not self._report_dir:
            self._start_idle_ticker()  # Spark Connect: the server's process starts its own
        self.timings["init_ms"] = (time.perf_counter() - t_init) * 1e3

    # ---- Spark Connect -------------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        """A Spark Connect client pickles the foreachBatch function (this query's ``_run_batch``)
        to a Python process on the server, which runs every micro-batch (plan, tasks, commit,
        sinks) with the batch DataFrame's session there; the client's session, input DataFrame,
        Spark query and lock stay behind."""
        state = dict(self.__dict__)
        state["options"] = dataclasses.replace(self.options, df=None)
        for name in (
            "spark",
            "query",
            "_lock",
            "_step_lock",
            "_prespawn",
            "_restore_logs",
            "_ticker",
            "_started",
        ):
            state.pop(name, None)
        state["_idle_spark"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.spark = None
        self._prespawn = None
        self._restore_logs = None
        self._ticker = None
        self._idle_spark = None
        self._lock = threading.Lock()
        self._step_lock = threading.Lock()
        self._started = threading.Event()

    def _prune_reports(self) -> None:
        """Delete the reports of all but the last ``CONNECT_REPORTS_KEPT - 1`` earlier Connect
        query runs on this checkpoint (their directory names start with their start time)."""
        runs = sorted(
            n.rsplit("/", 1)[-1] for n, is_dir in self.storage.list_dir(CONNECT_DIR) if is_dir
        )
        for name in runs[: max(0, len(runs) - (CONNECT_REPORTS_KEPT - 1))]:
            self.storage.delete(f"{CONNECT_DIR}/{name}")

    def _server_failure(self, exc: BaseException) -> BaseException | None:
        """Spark Connect client: the error the server's micro-batch reported (its
        ``failure.json``), else the one Spark's message carries as a Python traceback."""
        if not self._report_dir:
            return None
        path = f"{self._report_dir}/failure.json"
        try:
            if self.storage.size(path) is not None:
                return error_from_report(self.storage.read_bytes(path))
        except Exception as read_error:  # a torn or unreadable report: Spark's text instead
            log.warning("could not read the server's failure report %s: %r", path, read_error)
        return parse_remote_error(str(exc))

    # ---- set-up --------------------------------------------------------------------------------

    def _ship_function(self, options: KeyedOptions) -> JobSpec:
        """Pickle the function once per query run into ``<checkpoint>/functions/<sha>.pkl``."""
        import hashlib

        blob = pickle_function(options.function)
        sha = hashlib.sha256(blob).hexdigest()
        #: the pickled function, for a fold before the shuffle (SPEC §13.2)
        self._function = (blob, sha)
        path = f"{FUNCTIONS_DIR}/{sha}.pkl"
        job = options.job_spec(options.checkpoint or "", path, sha)
        storage = job_storage(job)
        storage.ensure_writable()
        if storage.size(path) != len(blob):
            storage.put_atomic(path, blob)
        return job

    def _prespawn_hosts(self) -> threading.Thread | None:
        """With a ``local`` master the tasks run on this node and would each start their host
        in the first micro-batch (an interpreter start and imports, ~0.5-2 s, after Spark's
        planning): start them now, in parallel with the rest of the set-up and Spark's
        planning. A task that finds its host starting waits for it (the spawn lock); one that
        finds none starts it as before, so a failure here only costs the head start.
        Skipped when the workers run another Python than this one, or with
        ``STREAMSTATE_PRESPAWN=0``."""

        if os.environ.get("STREAMSTATE_PRESPAWN", "1") == "0":
            return None
        jvm = self._local_jvm()
        if jvm is None:
            return None
        thread = threading.Thread(
            target=self._spawn_local_hosts, args=(jvm,), name="streamstate-prespawn", daemon=True
        )
        thread.start()
        return thread

    def _local_jvm(self) -> int | None:
        """The driver JVM's pid when it runs the tasks (a ``local`` master of a classic session)
        with this interpreter as their Python: then this process can start, and reach, the
        hosts the tasks would use. None otherwise."""
        import shutil
        import sys

        sc = getattr(self.spark, "sparkContext", None)
        if sc is None or not str(sc.master).startswith("local"):
            return None
        worker = shutil.which(getattr(sc, "pythonExec", None) or "python3")
        if worker is None or os.path.abspath(worker) != os.path.abspath(sys.executable):
            return None
        try:
            # the driver's JVM runs the tasks in local mode: the hosts watch it, as theirs do
            return int(self.spark._jvm.java.lang.ProcessHandle.current().pid())
        except Exception:  # no JVM handle (e.g. Spark Connect)
            return None

    def _spawn_local_hosts(self, jvm: int) -> None:
        t0 = time.perf_counter()
        self.hosts.spawn_local(jvm)
        self.timings["spawn_ms"] = (time.perf_counter() - t0) * 1e3

    # ---- one micro-batch -----------------------------------------------------------------------

    def _run_batch(self, df: Any, batch_id: int) -> None:
        try:
            with self._step_lock:
                if self._idle_failure is not None:  # the query is being stopped with it
                    raise self._idle_failure
                self._call_steps = []
                try:
                    self._run_micro_batch(df, batch_id)
                    steps = self._call_steps
                finally:
                    self._call_steps = None
                self._publish(df.sparkSession, steps)
        except BaseException as exc:
            self._record_failure(exc, batch_id, df.sparkSession)
            raise

    def _publish(self, session: Any, steps: list[dict[str, Any]]) -> None:
        """Put the micro-batch's state figures into Spark's progress (a classic session; the
        client of a Spark Connect query adds them to the progress it reads)."""
        figures = micro_batch_figures(steps)
        if figures is None or self._report_dir:
            return
        self._started.wait(timeout=30.0)
        query = self._spark_query()
        if query is not None:
            if self._query_id is None:
                self._query_id = str(query.id)
            # the session that started the query: the micro-batch's own is a clone, whose
            # query manager does not list it
            self._publisher.publish(self.spark or session, self._query_id, figures)

    def _record_failure(self, exc: BaseException, batch_id: int | None, session: Any) -> None:
        """Spark turns what a micro-batch raised into a StreamingQueryException with Java
        traces; keep what was raised, for await_termination() and process_all_available() to
        raise instead."""
        self._failure = original_error(exc)
        if is_function_error(self._failure) and self._restore_logs is None:
            # raised once, by this driver: Spark need not log it with its Java frames
            self._restore_logs = quiet_query_failure_log(session)
        if self._report_dir:  # Spark Connect: the client reads it (_server_failure)
            try:
                self.storage.put_atomic(
                    f"{self._report_dir}/failure.json",
                    failure_report(self._failure, batch_id, self.options.operator_name),  # type: ignore[arg-type]
                )
            except Exception as report_error:
                log.warning("could not report the failure to the client: %r", report_error)

    def _run_micro_batch(self, df: Any, batch_id: int) -> None:
        t0 = time.perf_counter()
        if not self.batches:
            self.timings.setdefault("first_batch_at_ms", (t0 - self._t_created) * 1e3)
        session = df.sparkSession
        if self._report_dir:
            self._idle_spark = session
        plan = self.log.plan(batch_id)
        plan_ms = (time.perf_counter() - t0) * 1e3
        if plan.replay:
            # the driver died after committing this micro-batch's step (and perhaps no-data
            # micro-batches after it): Spark hands the micro-batch over again, and so do we
            # with each of its checkpoints (the sinks keep one copy)
            self._recovered = True
            for delivery in self.log.deliveries(batch_id):
                self._deliver_again(session, delivery, t0, plan_ms)
                t0, plan_ms = time.perf_counter(), 0.0
        else:
            self._recover(session)
            if self.no_data_batches and self.log.due(processing_time=False):
                # the state owes an event-time no-data micro-batch from before this input (a
                # rollback to the checkpoint before it, or the bound stopped an earlier call):
                # run it first, so that each checkpoint id holds the step it held before
                self._run_no_data_batches(session, batch_id, processing_time=False)
                t0 = time.perf_counter()
                plan = self.log.plan(batch_id)
                plan_ms = (time.perf_counter() - t0) * 1e3
            self._run_step(session, df, plan, t0, plan_ms)
        if self.no_data_batches:
            # processing time too when no idle ticker fires due timers between micro-batches
            # (availableNow, once): the run ends only when nothing more is due
            self._run_no_data_batches(
                session, batch_id, processing_time=self._idle_interval is None
            )
        if self._report_dir and self._idle_interval is not None and self._ticker is None:
            self._start_idle_ticker()

    def _run_no_data_batches(
        self, session: Any, during_batch: int | None, *, processing_time: bool
    ) -> int:
        """Run no-data micro-batches while one is due (at most ``MAX_NO_DATA_BATCHES``);
        returns how many ran."""
        for n in range(MAX_NO_DATA_BATCHES):
            reason = self.log.due(processing_time=processing_time)
            if reason is None:
                return n
            t0 = time.perf_counter()
            plan = self.log.plan_no_data(during_batch)
            self._run_step(session, None, plan, t0, (time.perf_counter() - t0) * 1e3, reason)
        if self.log.due(processing_time=processing_time):
            log.warning(
                "%d no-data micro-batches in a row and another is due (a timer that fires "
                "again at once?): the next micro-batch goes on",
                MAX_NO_DATA_BATCHES,
            )
        return MAX_NO_DATA_BATCHES

    def _recover(self, session: Any) -> None:
        """Once per query run, before its first step: a no-data micro-batch that ran outside
        the foreachBatch call of the Spark micro-batch it follows (by the idle ticker, or before
        a micro-batch's input) is not covered by Spark's commit of that micro-batch; if it is the
        latest checkpoint, its delivery may not have happened: deliver it again (the
        ``parquet`` and ``memory`` sinks keep one copy)."""
        if self._recovered:
            return
        self._recovered = True
        latest = self.log.latest()
        if latest is None:
            return
        props = latest.metadata.properties
        if props.get("no_data") and props.get("during_batch") != spark_batch_of(latest):
            t0 = time.perf_counter()
            plan = self.log.delivery_of(latest)
            self._deliver_again(session, plan, t0, (time.perf_counter() - t0) * 1e3)

    def _deliver_again(self, session: Any, plan: BatchPlan, t0: float, plan_ms: float) -> None:
        figures = self._figures(plan, plan_ms)
        self._deliver(session, plan, plan.outputs, plan.side_outputs, figures)
        self._finish(figures, t0)

    def _figures(self, plan: BatchPlan, plan_ms: float, due: str | None = None) -> dict[str, Any]:
        figures: dict[str, Any] = {
            "batch": plan.spark_batch,
            "checkpoint": plan.batch,
            "no_data": plan.no_data,
            "replayed": plan.replay,
            "plan_ms": plan_ms,
        }
        if plan.no_data and not plan.replay:
            figures["due"] = due
            figures["idle"] = plan.during_batch is None
        return figures

    def _run_step(
        self,
        session: Any,
        df: Any,
        plan: BatchPlan,
        t0: float,
        plan_ms: float,
        due: str | None = None,
    ) -> None:
        """Run, commit and deliver one step: ``df``'s records, or none (``plan.no_data``)."""
        figures = self._figures(plan, plan_ms, due)
        results = self.steps.run(session, df, plan, figures)
        t_commit = time.perf_counter()
        completed = self.log.commit(plan, results)
        figures["commit_ms"] = (time.perf_counter() - t_commit) * 1e3
        figures["state"]["checkpointDurationMs"] += int(figures["commit_ms"])
        files: list[Any] = [r.outputs for r in results if r.outputs is not None]
        side_files: dict[str, list[Any]] = {}
        for r in sorted(results, key=lambda r: r.subtask):
            for tag, staged in r.side_outputs.items():
                side_files.setdefault(tag, []).append(staged)
        if completed.metadata.properties.get("lineage") != plan.new_lineage:
            # an older run committed this step just before this query took over: its
            # outputs are the step's (commit.CheckpointLog._adopt)
            props = completed.metadata.properties
            files = [msgspec.convert(o, StagedOutput) for o in props.get("outputs", [])]
            side_files = {
                tag: [msgspec.convert(o, StagedOutput) for o in staged]
                for tag, staged in props.get("side_outputs", {}).items()
            }
        self._deliver(session, plan, files, side_files, figures)
        self._finish(figures, t0)

    def _deliver(
        self,
        session: Any,
        plan: BatchPlan,
        files: list[Any],
        side_files: dict[str, list[Any]],
        figures: dict[str, Any],
    ) -> None:
        """Hand a committed step's staged outputs to the sink and each side sink."""
        t_sink = time.perf_counter()
        checkpoint_id = plan.batch
        self.sink.write(
            StagedBatch(
                checkpoint_id,
                files,
                self.storage,
                self.output_schema,
                self.options.output_struct,
                session,
                plan.spark_batch,
                plan.no_data,
            )
        )
        for tag, side_sink in self.side_sinks.items():
            side_sink.write(
                StagedBatch(
                    checkpoint_id,
                    side_files.get(tag, []),
                    self.storage,
                    self.side_schemas[tag],
                    self.options.side_output_structs[tag],
                    session,
                    plan.spark_batch,
                    plan.no_data,
                )
            )
        figures["side_output_rows"] = {
            tag: sum(f.rows for f in side_files.get(tag, [])) for tag in self.side_sinks
        }
        figures["sink_ms"] = (time.perf_counter() - t_sink) * 1e3
        self._delete_old_outputs(checkpoint_id)

    def _finish(self, figures: dict[str, Any], t0: float) -> None:
        figures["batch_ms"] = (time.perf_counter() - t0) * 1e3
        if self._call_steps is not None and figures.get("state") is not None:
            self._call_steps.append(figures["state"])
        with self._lock:
            self.batches.append(figures)
            count = len(self.batches)
        if self._report_dir:
            self.storage.put_atomic(
                f"{self._report_dir}/batches/{figures['checkpoint']:012d}-{count:06d}.json",
                json.dumps(figures, default=str).encode(),
            )
        self._last_step_end = time.monotonic()
        if self._ticker is not None:
            self._ticker.wake()  # a new checkpoint may bring a nearer processing-time timer

    # ---- the idle ticker -----------------------------------------------------------------------

    def _start_idle_ticker(self) -> None:
        """A running query (``processingTime`` or the default trigger) gets a ticker that runs
        the no-data micro-batches due while no input comes; ``availableNow`` and ``once`` runs
        end by themselves and run theirs inside their last micro-batch."""
        if self._idle_interval is None or self._ticker is not None:
            return
        self._ticker = IdleTicker(self._idle_tick, f"streamstate-idle-{self.hosts.run_id[:8]}")
        self._ticker.start()

    def _stop_idle_ticker(self) -> None:
        if self._ticker is not None:
            self._ticker.stop()

    def _idle_tick(self) -> float | None:
        """One look of the idle ticker: if a no-data micro-batch is due, the last step ended at
        least one trigger interval ago and Spark is not running a micro-batch with input, run
        one. Returns the seconds until the next look (None: the ticker ends)."""
        interval = max(self._idle_interval or 0.0, MIN_IDLE_INTERVAL)
        failed: BaseException | None = None
        with self._step_lock:
            ticker = self._ticker
            if ticker is None or ticker.stopped or self._failure is not None:
                return None
            session = self.spark if self.spark is not None else self._idle_spark
            if session is None:
                return _IDLE_LOOK_S
            now = time.time_ns() // 1_000_000
            reason = self.log.due(now)
            if reason is None and self._recovered:
                timer = self.log.next_processing_timer()
                if timer is None:
                    return _IDLE_LOOK_S
                return min(_IDLE_LOOK_S, max(0.0, (timer - now) / 1e3))
            if reason is not None:
                wait = self._last_step_end + interval - time.monotonic()
                if wait > 0:
                    return min(wait, _IDLE_LOOK_S)
            if not self._still_running():
                return None
            if reason is not None and self._input_batch_starting():
                log.debug("idle ticker: %s due, but Spark runs a micro-batch with input", reason)
                return interval  # its step fires what is due, before its records
            try:
                # the run's first look: the delivery of an earlier run's last no-data
                # micro-batch may not have happened, and no input may come to do it
                self._recover(session)
                if reason is not None:
                    t0 = time.perf_counter()
                    plan = self.log.plan_no_data(None)
                    plan_ms = (time.perf_counter() - t0) * 1e3
                    self._run_step(session, None, plan, t0, plan_ms, reason)
            except BaseException as exc:
                self._record_failure(exc, None, session)
                self._idle_failure = failed = self._failure or exc
        if failed is None:
            return 0.0
        log.error("a no-data micro-batch of the idle ticker failed; stopping the query: %r", failed)
        # outside the step lock: Spark's streaming thread may be waiting for it
        query = self._spark_query()
        for attempt in (1, 2):
            if query is None:
                break
            try:
                query.stop()
                break
            except Exception as stop_error:
                log.warning(
                    "could not stop the query after the failure (attempt %d): %s",
                    attempt,
                    str(stop_error)[:2000],
                )
                time.sleep(1.0)
        return None

    def _spark_query(self) -> Any:
        """The Spark query of this run; None in a Spark Connect server's foreachBatch process
        (its session is a clone of the client's, which does not see the client's queries)."""
        return getattr(self, "query", None)

    def _still_running(self) -> bool:
        """The query is active (in a Spark Connect server's process: the client did not stop
        it; Spark ends the process with the query)."""
        if self._report_dir and self.storage.size(f"{self._report_dir}/stopped") is not None:
            return False
        query = self._spark_query()
        return query is None or bool(query.isActive)

    def _input_batch_starting(self) -> bool:
        """Spark is running a trigger that found new input (unknown in a Spark Connect
        server's process: no)."""
        query = self._spark_query()
        if query is None:
            return False
        try:
            status = query.status
        except Exception:
            return False
        return bool(status.get("isTriggerActive") and status.get("isDataAvailable"))

    def _sync_from_server(self, sinks: bool = True) -> None:
        """Spark Connect client: load what the server's batches reported (figures into
        :attr:`batches`; with ``sinks``, memory sinks' outputs). A report is written once:
        only new ones are read."""
        if not self._report_dir or self.spark is None:
            return
        prefix = f"{self._report_dir}/batches"
        names = sorted(
            n.rsplit("/", 1)[-1] for n, is_dir in self.storage.list_dir(prefix) if not is_dir
        )
        read = self._reports_read
        for n in names:
            if n not in read:
                read[n] = json.loads(self.storage.read_bytes(f"{prefix}/{n}"))
        with self._lock:
            self.batches[:] = [read[n] for n in names]
        if not sinks:
            return
        for s in [self.sink, *self.side_sinks.values()]:
            if isinstance(s, MemorySink):
                s.sync()

    def _delete_old_outputs(self, batch_id: int) -> None:
        """Staged outputs are needed until their step is delivered and no replay can ask for
        them (a replay delivers the latest checkpoint only: steps are delivered in order, one
        after the other): keep the last few."""
        old = batch_id - max(2, self.options.retained_checkpoints)
        if old >= 0:
            self.storage.delete(f"{OUTPUTS_DIR}/batch-{old}")

    # ---- control -------------------------------------------------------------------------------

    @property
    def id(self) -> str:
        """Spark's query id."""
        return str(self.query.id)

    @property
    def host_locations(self) -> dict[int, dict[str, Any]]:
        """Subtask -> where its state host was at the end of the last step (node, TCP address,
        socket, pid)."""
        return self.hosts.locations

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
        (:mod:`streamstate.spark.driver.progress`, docs/spark.md "Monitoring")."""
        progress = self.query.lastProgress
        if self._report_dir and progress is not None:
            self._sync_from_server(sinks=False)
            return with_state_figures(progress, self.batches)
        return progress

    @property
    def recent_progress(self) -> Any:
        """Spark's recent ``StreamingQueryProgress`` es, each with its micro-batch's state
        figures (see :attr:`last_progress`)."""
        progress = self.query.recentProgress
        if self._report_dir and progress:
            self._sync_from_server(sinks=False)
            return [with_state_figures(p, self.batches) for p in progress]
        return progress

    def process_all_available(self) -> None:
        """Wait until the query has processed everything available. If a micro-batch failed,
        raise its error (the function's or streamstate's), with Spark's exception chained."""
        try:
            self.query.processAllAvailable()
        except Exception as exc:
            self._raise_failure(exc)
        finally:
            self._sync_from_server()
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
            self._sync_from_server()
            if not self.query.isActive:
                self.shutdown_hosts()
        self._raise_idle_failure()
        return done

    def _raise_idle_failure(self) -> None:
        """Spark raised nothing: if a no-data micro-batch of the idle ticker failed, stop the
        query (the ticker of a classic session did already; a Spark Connect server's ticker
        cannot: it reported the error) and raise that error."""
        failure = self._idle_failure
        if failure is None and self._report_dir:
            path = f"{self._report_dir}/failure.json"
            if self.storage.size(path) is not None:
                failure = self._idle_failure = error_from_report(self.storage.read_bytes(path))
        if failure is None:
            return
        if self.query.isActive:
            self.stop()
        raise failure

    def _raise_failure(self, exc: BaseException) -> None:
        self._loud_again()
        if self._failure is None and self._report_dir:
            self._failure = self._server_failure(exc)
        failure = self._failure
        if failure is None or failure is exc:
            raise exc
        if is_function_error(failure):
            # the function's own error, once: Spark's exception (query.exception()) only
            # repeats it with Java frames
            raise failure.with_traceback(None) from None
        raise failure from exc

    def _loud_again(self) -> None:
        """Give Spark's query-failure loggers their levels back (once the query stopped)."""
        restore, self._restore_logs = self._restore_logs, None
        if restore is not None and not self.query.isActive:
            restore()
        elif restore is not None:
            self._restore_logs = restore

    def stop(self) -> None:
        """Stop the query and shut this job's state hosts down."""
        t = time.perf_counter()
        if self._ticker is not None:
            self._ticker.stop(timeout=0)  # no new no-data micro-batch; one running finishes
        if self._report_dir:
            # the server's idle ticker runs no no-data micro-batch after this
            try:
                self.storage.put_atomic(f"{self._report_dir}/stopped", b"")
            except Exception as exc:
                log.warning("could not tell the server's idle ticker to stop: %r", exc)
        try:
            self.query.stop()
        finally:
            self._loud_again()
            self.timings.setdefault("stop_ms", (time.perf_counter() - t) * 1e3)
            self._sync_from_server()
            self.shutdown_hosts()

    def shutdown_hosts(self, reason: str = "query stopped") -> int:
        """Tell the state hosts of this query run to exit: those on this node through their
        sockets, those elsewhere at the locations the last acknowledgements gave (hosts that
        cannot be reached exit with their executor or when idle). Hosts of other runs on the
        same checkpoint (another driver's) are not touched."""
        if self._hosts_stopped:
            return 0
        self._hosts_stopped = True
        t = time.perf_counter()
        self._stop_idle_ticker()  # its no-data micro-batches would start hosts again
        if self._prespawn is not None:
            self._prespawn.join()  # a host it is starting must be found and stopped too
        self.log.close()
        stopped = self.hosts.shutdown(reason)
        self.timings["shutdown_ms"] = (time.perf_counter() - t) * 1e3
        return stopped

    def __enter__(self) -> KeyedStreamingQuery:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (
            f"KeyedStreamingQuery({self.options.operator_name!r}, p={self.job.parallelism}, "
            f"checkpoint={self.job.checkpoint_url!r}, active={self.is_active})"
        )


#: how the server reports that its foreachBatch Python process did not connect back within
#: the fixed 10 s (``PythonWorkerFactory.createSimpleWorker``: a ``SocketTimeoutException``
#: wrapped in ``SparkException("Python worker failed to connect back.")``). Spark raises it
#: while planning the start, before any query exists, so starting again is safe.
_SLOW_FOREACH_BATCH_START = (
    "failed to connect back",
    "Timed out while waiting for the Python worker to connect back",
)


#: starts of a Connect query before a slow foreachBatch process start is raised
_START_ATTEMPTS = 5
#: seconds to wait before the second start, doubled before each later one (a busy server's
#: load comes in bursts: a pause gives the next process its 10 s on a quieter machine)
_START_PAUSE = 1.0


def _start(writer: Any, connect: bool, where: str = "") -> Any:
    """``writer.start()``. Through Spark Connect, the server first starts the foreachBatch
    Python process and waits a fixed 10 s for it to connect back; on a busy server that can time
    out before anything ran, so that failure is retried (``_START_ATTEMPTS`` starts in all,
    pausing ``_START_PAUSE`` s before the second, twice that before the third, ...). A
    Spark checkpoint location (``where``) on a scheme the server's Hadoop has no filesystem for
    is reported as a ValueError, as a classic session reports it before starting
    (locations.py)."""
    if not connect:
        return writer.start()
    for attempt in range(1, _START_ATTEMPTS + 1):
        try:
            return _start_once(writer, where)
        except Exception as exc:
            slow = any(m in str(exc) for m in _SLOW_FOREACH_BATCH_START)
            if not slow or attempt == _START_ATTEMPTS:
                raise
            log.warning(
                "the Spark Connect server's foreachBatch process was slow to start "
                "(attempt %d of %d): starting again",
                attempt,
                _START_ATTEMPTS,
            )
            time.sleep(_START_PAUSE * 2 ** (attempt - 1))
    raise AssertionError("unreachable")


def _start_once(writer: Any, where: str) -> Any:
    try:
        return writer.start()
    except Exception as exc:
        text = str(exc)
        if "No FileSystem for scheme" not in text:
            raise
        first = text.strip().splitlines()[0][:200]
        raise ValueError(
            f"Spark cannot write its streaming checkpoint to {where}: the Spark Connect "
            f"server's Hadoop has no filesystem for it ({first}). Add the connector on the "
            "server (for s3a:// the hadoop-aws jar matching Spark's Hadoop) or pass "
            "write_stream(..., spark_checkpoint=<a local or HDFS path the server can write>)"
        ) from exc


class _ServerBatches:
    """The foreachBatch function of a query started from a Spark Connect client: it runs in a
    Python process of the server, which keeps it for the life of the query; the first batch
    unpickles the :class:`KeyedStreamingQuery` (its :meth:`~KeyedStreamingQuery.__getstate__`)
    and every batch runs through it."""

    def __init__(self, blob: bytes) -> None:
        self.blob = blob
        self.query: KeyedStreamingQuery | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"blob": self.blob}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.blob = state["blob"]
        self.query = None

    def __call__(self, df: Any, batch_id: int) -> None:
        if self.query is None:
            import cloudpickle

            self.query = cloudpickle.loads(self.blob)
        self.query._run_batch(df, batch_id)


def _bind_for(spark: Any, option: str | None) -> str | None:
    """The ``bind`` host setting: the option, else with a ``local`` master ``"off"`` (every
    task runs on this machine and reaches its host's Unix socket: a TCP port would only let
    other local users reach it, past the socket's uid check) unless ``STREAMSTATE_HOST_BIND``
    asks for one; None leaves it to each node (:func:`~streamstate.spark.wire.network.
    default_bind`)."""
    if option is not None:
        return option
    if is_local(spark) and not os.environ.get("STREAMSTATE_HOST_BIND"):
        return "off"
    return None
