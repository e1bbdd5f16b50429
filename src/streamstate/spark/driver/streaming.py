"""Streaming mode: a keyed function over a Structured Streaming query, exactly-once.

The query is driven by ``foreachBatch``. Micro-batch ``b`` on the driver
(:class:`~streamstate.spark.driver.micro_batches.MicroBatchRunner`) runs one *step* that ends
with checkpoint ``c`` (``c == b`` until the query's first no-data micro-batch):

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

import logging
import os
import threading
import time
from typing import Any

import msgspec

from streamstate.errors import CheckpointMismatchError
from streamstate.spark.driver.commit import CheckpointLog
from streamstate.spark.driver.connect_reports import ConnectReports
from streamstate.spark.driver.host_fleet import HostFleet
from streamstate.spark.driver.locations import (
    DEFAULT_SPARK_CHECKPOINT,
    recorded_spark_checkpoint,
    spark_checkpoint_location,
)
from streamstate.spark.driver.micro_batches import MicroBatchRunner
from streamstate.spark.driver.no_data import trigger_interval
from streamstate.spark.driver.options import KeyedOptions
from streamstate.spark.driver.progress import observe_state, with_state_figures
from streamstate.spark.driver.session import conf, is_connect, is_local
from streamstate.spark.driver.sinks import MemorySink, Sink, sink_from
from streamstate.spark.driver.step_tasks import StepTasks
from streamstate.spark.failures import is_function_error, parse_remote_error
from streamstate.spark.job import (
    FUNCTIONS_DIR,
    JobSpec,
    arrow_schema_from_bytes,
    pickle_function,
)
from streamstate.spark.subtask import job_storage

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
    """A running keyed query: the Spark ``StreamingQuery`` plus the state it drives. Its
    micro-batches run in a :class:`~streamstate.spark.driver.micro_batches.MicroBatchRunner`
    (:attr:`runner`): Spark's ``foreachBatch`` function, here or on a Spark Connect server."""

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
        job_bytes = msgspec.msgpack.encode(self.job)
        #: the run's state hosts: identity, secret, where each subtask's is
        self.hosts = HostFleet(
            self.job,
            job_bytes,
            run_dir=run_dir,
            bind=_bind_for(self.spark, host_bind),
            connect_timeout=host_connect_timeout,
            idle_timeout=options.host_idle_timeout,
        )
        self.storage = job_storage(self.job)
        self.spark_checkpoint = spark_checkpoint_location(
            self.spark, self.storage.url_of(DEFAULT_SPARK_CHECKPOINT), spark_checkpoint, checkpoint
        )
        t = time.perf_counter()
        self._check_progress(options, spark_checkpoint is None)
        #: this query's epoch: starting takes the job over from any earlier query. The Spark
        #: checkpoint is recorded relative to the job directory when inside it, so that a copy
        #: of the directory never names the original's
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
        self.timings["epoch_ms"] = (time.perf_counter() - t) * 1e3
        #: with a local master, the driver JVM's pid: the driver delivers pre-aggregated rows
        #: to the state hosts itself (SPEC §13.2; None: the tasks do)
        delivery_jvm = self._local_jvm() if options.pre_aggregation is not None else None
        steps = StepTasks(options, self.job, job_bytes, self._function, self.hosts, delivery_jvm)
        #: starts this run's state hosts while Spark plans the first micro-batch (local master)
        self._prespawn = self._prespawn_hosts()
        self._hosts_stopped = False
        if no_data_batches is None:
            no_data_batches = (conf(self.spark, NO_DATA_CONF, "true") or "true").lower() != "false"
        name = query_name or options.operator_name
        sink.open(name)
        for tag, side_sink in self.side_sinks.items():
            side_sink.open(f"{name}.{tag}")
        #: Spark Connect: the server's process reports each step's figures (and memory sinks
        #: their outputs) to this client through the checkpoint; None for a classic session
        self.reports: ConnectReports | None = None
        if is_connect(self.spark):
            self.reports = ConnectReports.start(self.storage, self.hosts.run_id)
            self.reports.mirror_memory_sinks({"main": sink, **self.side_sinks})
        #: runs the micro-batches (Spark's foreachBatch function) and the idle ticker
        self.runner = MicroBatchRunner(
            options,
            self.log,
            steps,
            sink,
            self.side_sinks,
            arrow_schema_from_bytes(self.job.output_schema),
            options.side_output_schemas(),
            self.hosts.run_id,
            self.spark,
            no_data_batches=bool(no_data_batches),
            idle_interval=trigger_interval(trigger) if no_data_batches else None,
            reports=self.reports,
            timings=self.timings,
            created=t_init,
        )
        run_batch: Any = self.runner
        df = options.df
        if self.reports is not None:
            # pickled now, by value for modules the server cannot import (a notebook's or a
            # test's functions, sinks and callbacks), like the function the tasks run
            run_batch = _ServerBatches(pickle_function(self.runner))
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
        self.query = _start(writer, connect=self.reports is not None, where=self.spark_checkpoint)
        self.timings["spark_start_ms"] = (time.perf_counter() - t) * 1e3
        self.runner.query = self.query
        self.runner.started.set()
        if self.reports is None:
            self.runner.start_idle_ticker()  # Spark Connect: the server's process starts its own
        self.timings["init_ms"] = (time.perf_counter() - t_init) * 1e3

    @property
    def batches(self) -> list[dict[str, Any]]:
        """One dict of figures per step this query run ran: ``batch`` (Spark's micro-batch),
        ``checkpoint``, ``no_data`` (with ``due`` and ``idle``), ``replayed``, rows, outputs,
        watermark, restores, routes and timings (docs/spark/monitoring.md)."""
        return self.runner.batches

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

    def _check_progress(self, options: KeyedOptions, default_location: bool) -> None:
        """Compare the state checkpoint with Spark's offset and commit logs before the query
        starts (and before it takes the job over): a state behind Spark's log (a lost latest
        ``_metadata``) raises :class:`CheckpointError` with the rollback command now, whether
        or not input is waiting; otherwise Spark would run nothing (no input) or fail inside
        its first micro-batch.

        The driver reads Spark's logs through fsspec. Where it cannot (a scheme fsspec does not
        reach from here, or a Spark Connect server's local ``spark_checkpoint`` that this
        client does not see), the first micro-batch makes the same check."""
        from streamstate.spark.driver.spark_log import SparkLog

        try:
            # the state checkpoint's storage options are for its filesystem: a Spark checkpoint
            # put elsewhere (a local or HDFS path) is read without them
            storage_options = options.storage_options if default_location else None
            spark_log = SparkLog(self.spark_checkpoint, storage_options)
            visible = spark_log.exists()
            if not visible and is_connect(self.spark) and not default_location:
                return  # perhaps a path on the Connect server's machine
            next_batch = spark_log.next_batch()
        except Exception as exc:  # no fsspec filesystem for it here: the first batch checks
            log.info("could not read Spark's checkpoint %s: %r", self.spark_checkpoint, exc)
            return
        CheckpointLog(
            self.storage,
            options.operator_name,
            options.parallelism,
            spark_checkpoint=self.spark_checkpoint,
        ).check_start(spark_log, next_batch)

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

    # ---- Spark Connect -------------------------------------------------------------------------

    def _sync_from_server(self, sinks: bool = True) -> None:
        """Spark Connect client: load what the server's steps reported (figures into
        :attr:`batches`; with ``sinks``, memory sinks' outputs)."""
        if self.reports is None:
            return
        reported = self.reports.batches()
        with self.runner.lock:
            self.runner.batches[:] = reported
        if not sinks:
            return
        for s in [self.sink, *self.side_sinks.values()]:
            if isinstance(s, MemorySink):
                s.sync()

    def _server_failure(self, exc: BaseException) -> BaseException | None:
        """Spark Connect client: the error the server's micro-batch reported, else the one
        Spark's message carries as a Python traceback."""
        assert self.reports is not None
        try:
            reported = self.reports.failure()
            if reported is not None:
                return reported
        except Exception as read_error:  # a torn or unreadable report: Spark's text instead
            log.warning("could not read the server's failure report: %r", read_error)
        return parse_remote_error(str(exc))

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
        (:mod:`streamstate.spark.driver.progress`, docs/spark/monitoring.md)."""
        progress = self.query.lastProgress
        if self.reports is not None and progress is not None:
            self._sync_from_server(sinks=False)
            return with_state_figures(progress, self.batches)
        return progress

    @property
    def recent_progress(self) -> Any:
        """Spark's recent ``StreamingQueryProgress`` es, each with its micro-batch's state
        figures (see :attr:`last_progress`)."""
        progress = self.query.recentProgress
        if self.reports is not None and progress:
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
        runner = self.runner
        failure = runner.idle_failure
        if failure is None and self.reports is not None:
            failure = runner.idle_failure = self.reports.failure()
        if failure is None:
            return
        if self.query.isActive:
            self.stop()
        raise failure

    def _raise_failure(self, exc: BaseException) -> None:
        self._loud_again()
        runner = self.runner
        if runner.failure is None and self.reports is not None:
            runner.failure = self._server_failure(exc)
        failure = runner.failure
        if failure is None or failure is exc:
            raise exc
        if is_function_error(failure) or isinstance(failure, CheckpointMismatchError):
            # the function's own error, once (or the refusal of a state that does not match
            # Spark's progress, which says all there is): Spark's exception (query.exception())
            # only repeats it with Java frames and the query's plan
            raise failure.with_traceback(None) from None
        raise failure from exc

    def _loud_again(self) -> None:
        """Give Spark's query-failure loggers their levels back (once the query stopped)."""
        runner = self.runner
        restore, runner.restore_logs = runner.restore_logs, None
        if restore is not None and not self.query.isActive:
            restore()
        elif restore is not None:
            runner.restore_logs = restore

    def stop(self) -> None:
        """Stop the query and shut this job's state hosts down."""
        t = time.perf_counter()
        self.runner.stop_idle_ticker(timeout=0)  # no new no-data micro-batch; one running ends
        if self.reports is not None:
            self.reports.mark_stopped()  # nor on the server
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
        self.runner.stop_idle_ticker()  # its no-data micro-batches would start hosts again
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
    unpickles the query's :class:`~streamstate.spark.driver.micro_batches.MicroBatchRunner` and
    every batch runs through it."""

    def __init__(self, blob: bytes) -> None:
        self.blob = blob
        self.runner: MicroBatchRunner | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"blob": self.blob}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.blob = state["blob"]
        self.runner = None

    def __call__(self, df: Any, batch_id: int) -> None:
        if self.runner is None:
            import cloudpickle

            self.runner = cloudpickle.loads(self.blob)
        self.runner(df, batch_id)


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
