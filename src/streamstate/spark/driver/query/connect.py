"""A streaming query started from a Spark Connect client: its micro-batches run on the server.

The server runs the query's ``foreachBatch`` function in a Python process of its own, which the
client cannot reach; both reach the checkpoint's storage. :class:`ConnectReports` is both ends
of the query's reports (:mod:`streamstate.spark.driver.reports`): the client makes it, pickles
it to the server with the run's parts (:class:`ServerBatches`, which makes the runner there),
and the two copies talk through files under ``connect/<start ms>-<run id>/`` of the checkpoint:

* ``batches/<checkpoint>-<n>.json``: the figures of each step (``query.batches`` on the client);
* ``memory/<sink>/...``: what a memory sink received (the client's ``MemorySink`` mirrors it);
* ``failure.json``: the error that failed a micro-batch (the client raises it).

The client writes ``stopped`` when it stops the query: the server's idle ticker then runs no
more no-data micro-batches. Each report is written once, atomically. The client adds the state
figures the server reported to Spark's progress
(:func:`~streamstate.spark.driver.monitor.progress.with_state_figures`): the server's process
has no handle on the JVM.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from streamstate.spark.driver.monitor.figures import Spans
from streamstate.spark.driver.monitor.progress import with_state_figures
from streamstate.spark.driver.reports import QueryReports, StepReports
from streamstate.spark.driver.sinks import Sink
from streamstate.spark.driver.step.micro_batches import MicroBatchRunner, RunParts
from streamstate.spark.failures import error_from_report, failure_report, parse_remote_error
from streamstate.spark.job import pickle_function

__all__ = ["CONNECT_DIR", "CONNECT_REPORTS_KEPT", "ConnectReports", "ServerBatches"]

log = logging.getLogger(__name__)

#: the directory of the checkpoint that holds the reports, one directory per query run
CONNECT_DIR = "connect"
#: the Connect query runs whose reports a checkpoint keeps: a Connect query deletes older ones
#: when it starts (the reports are the client's only copy of the figures, memory-sink outputs
#: and errors of a run; an earlier run's client may still be reading them)
CONNECT_REPORTS_KEPT = 3
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


class ServerBatches:
    """The foreachBatch function of a query started from a Spark Connect client: it runs in a
    Python process of the server, which keeps it for the life of the query; the first batch
    unpickles the run's parts and its reports and makes the runner, and every batch runs
    through it. The client pickles the parts at once, by value for modules the server cannot
    import (a notebook's or a test's functions, sinks and callbacks), like the function the
    tasks run."""

    def __init__(self, parts: RunParts, reports: ConnectReports) -> None:
        self.blob = pickle_function((parts, reports))
        self.runner: MicroBatchRunner | None = None

    def __call__(self, df: Any, batch_id: int) -> None:
        if self.runner is None:
            import cloudpickle

            parts, reports = cloudpickle.loads(self.blob)
            self.runner = MicroBatchRunner(parts, reports, Spans())
        self.runner(df, batch_id)


class ConnectReports(StepReports, QueryReports):
    """The reports of one Connect query run, in the checkpoint's ``storage`` under
    ``directory``; ``sinks``: the query's sinks by name (memory sinks mirror what they
    receive)."""

    def __init__(self, storage: Any, directory: str, sinks: dict[str, Sink]) -> None:
        self.storage = storage
        self.directory = directory
        self.sinks = sinks
        for name, sink in sinks.items():
            sink.mirror_to(storage, f"{directory}/memory/{name}")
        #: the batch reports the client read so far, by file name (each is written once)
        self._read: dict[str, Any] = {}
        #: the steps' figures as of the last sync (client)
        self._batches: list[dict[str, Any]] = []
        #: the failure the server reported (client), as raised by a call, then by idle ones
        self._failure: BaseException | None = None
        self._idle_failure: BaseException | None = None

    @classmethod
    def start_run(cls, storage: Any, run_id: str, sinks: dict[str, Sink]) -> ConnectReports:
        """The reports of a query run starting now: ``connect/<start ms>-<run id>``, after
        deleting all but the last ``CONNECT_REPORTS_KEPT - 1`` earlier runs' (their directory
        names start with their start time)."""
        runs = sorted(n.rsplit("/", 1)[-1] for n, is_dir in storage.list_dir(CONNECT_DIR) if is_dir)
        for name in runs[: max(0, len(runs) - (CONNECT_REPORTS_KEPT - 1))]:
            storage.delete(f"{CONNECT_DIR}/{name}")
        directory = f"{CONNECT_DIR}/{time.time_ns() // 1_000_000:013d}-{run_id}"
        return cls(storage, directory, sinks)

    # ---- the query's end (the client) ----------------------------------------------------------

    def foreach_batch(self, parts: Any, timings: Any, df: Any) -> tuple[Any, Any]:
        return ServerBatches(parts, self), df

    def start(self, writer: Any, where: str) -> Any:
        """``writer.start()``. The server first starts the foreachBatch Python process and
        waits a fixed 10 s for it to connect back; on a busy server that can time out before
        anything ran, so that failure is retried (``_START_ATTEMPTS`` starts in all, pausing
        ``_START_PAUSE`` s before the second, twice that before the third, ...). A Spark
        checkpoint location (``where``) on a scheme the server's Hadoop has no filesystem for
        is reported as a ValueError, as a classic session reports it before starting
        (spark_checkpoint.py)."""
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

    def sync(self, sinks: bool = True) -> None:
        self._batches = self._read_batches()
        if sinks:
            for sink in self.sinks.values():
                sink.sync()

    def batches(self) -> list[dict[str, Any]]:
        return self._batches

    def failure(self, spark_error: BaseException | None) -> BaseException | None:
        """The error the server's micro-batch reported, else the one Spark's message carries
        as a Python traceback."""
        if self._failure is None:
            try:
                self._failure = self._read_failure()
            except Exception as read_error:  # a torn or unreadable report: Spark's text instead
                log.warning("could not read the server's failure report: %r", read_error)
            if self._failure is None and spark_error is not None:
                self._failure = parse_remote_error(str(spark_error))
        return self._failure

    def idle_failure(self) -> BaseException | None:
        if self._idle_failure is None:
            self._idle_failure = self._read_failure()
        return self._idle_failure

    def progress(self, progress: list[Any]) -> list[Any]:
        if not progress:
            return progress
        self.sync(sinks=False)
        return [with_state_figures(p, self._batches) for p in progress]

    def stop(self, timeout: float | None) -> None:
        """Tell the server's idle ticker to run no no-data micro-batch from now on."""
        try:
            self.storage.put_atomic(f"{self.directory}/stopped", b"")
        except Exception as exc:
            log.warning("could not tell the server's idle ticker to stop: %r", exc)

    def log_again(self) -> None:
        pass  # the server logs to its own log

    def _read_failure(self) -> BaseException | None:
        """The error the server reported, None if it reported none (a torn or unreadable report
        raises)."""
        path = f"{self.directory}/failure.json"
        if self.storage.size(path) is None:
            return None
        return error_from_report(self.storage.read_bytes(path))

    def _read_batches(self) -> list[dict[str, Any]]:
        """The figures of every step the server reported so far, in order (only reports not
        read before are read)."""
        prefix = f"{self.directory}/batches"
        # (a report being written is a ``.json.tmp-*`` file beside them: not read)
        names = sorted(
            name
            for n, is_dir in self.storage.list_dir(prefix)
            if not is_dir and (name := n.rsplit("/", 1)[-1]).endswith(".json")
        )
        read = self._read
        for n in names:
            if n not in read:
                read[n] = json.loads(self.storage.read_bytes(f"{prefix}/{n}"))
        return [read[n] for n in names]

    # ---- the runner's end (the server) ---------------------------------------------------------

    def input(self, df: Any) -> Any:
        return df  # no observation: the server's process has no handle on the JVM

    def step(self, figures: dict[str, Any], count: int) -> None:
        self.storage.put_atomic(
            f"{self.directory}/batches/{figures['checkpoint']:012d}-{count:06d}.json",
            json.dumps(figures, default=str).encode(),
        )

    def micro_batch(self, runner: Any, session: Any, steps: list[dict[str, Any]]) -> None:
        # the client cannot start the server's idle ticker: the first micro-batch does
        runner.start_idle_ticker()

    def failed(self, failure: BaseException, batch_id: int | None, operator: str) -> None:
        """Report what failed a micro-batch; a report that cannot be written is logged: Spark's
        own error still reaches the client."""
        report = failure_report(failure, batch_id, operator)
        try:
            self.storage.put_atomic(f"{self.directory}/failure.json", report)
        except Exception as report_error:
            log.warning("could not report the failure to the client: %r", report_error)

    def running(self) -> bool:
        """The client did not stop the query (Spark ends the server's process with it)."""
        return self.storage.size(f"{self.directory}/stopped") is None

    def input_batch_starting(self) -> bool:
        return False  # unknown here: the server's process has no handle on the query

    def stop_query(self) -> None:
        pass  # the client raises the reported failure and stops the query

    def idle_session(self, last: Any) -> Any:
        return last


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
