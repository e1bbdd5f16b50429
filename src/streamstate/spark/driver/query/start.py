"""What a streaming query does once, when it starts, before Spark runs its first micro-batch.

* :func:`ship_function`: the function pickled once per query run into
  ``<checkpoint>/functions/<sha>.pkl`` (a host loads it from there once per run);
* :func:`bind_for`: where the run's state hosts listen;
* :func:`local_jvm` and :class:`Prespawn`: with a ``local`` master, the hosts started ahead of
  the first micro-batch, and the driver's own delivery of pre-aggregated rows;
* :func:`check_progress`: the state checkpoint compared with Spark's offset and commit logs
  before the query takes the job over;
* :func:`reports_for`: how the query and its micro-batches learn of each other, chosen once
  for the session's kind (:mod:`streamstate.spark.driver.reports`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
import threading
from typing import Any

from streamstate.spark.driver.monitor.figures import Spans
from streamstate.spark.driver.plan.options import KeyedOptions
from streamstate.spark.driver.session import is_connect, is_local
from streamstate.spark.driver.sinks import Sink
from streamstate.spark.driver.spark_checkpoint import SparkLog
from streamstate.spark.driver.step.commit import CheckpointLog
from streamstate.spark.driver.step.host_fleet import HostFleet
from streamstate.spark.job import FUNCTIONS_DIR, JobSpec, pickle_function
from streamstate.spark.subtask import job_storage

__all__ = ["Prespawn", "bind_for", "check_progress", "local_jvm", "reports_for", "ship_function"]

log = logging.getLogger(__name__)


def ship_function(options: KeyedOptions) -> tuple[JobSpec, tuple[bytes, str]]:
    """Pickle the function once per query run into ``<checkpoint>/functions/<sha>.pkl``;
    returns the job and the pickled function with its sha256 (for a fold before the shuffle,
    SPEC §13.2)."""
    blob = pickle_function(options.function)
    sha = hashlib.sha256(blob).hexdigest()
    path = f"{FUNCTIONS_DIR}/{sha}.pkl"
    job = options.job_spec(options.checkpoint or "", path, sha)
    storage = job_storage(job)
    storage.ensure_writable()
    if storage.size(path) != len(blob):
        storage.put_atomic(path, blob)
    return job, (blob, sha)


def bind_for(spark: Any, option: str | None) -> str | None:
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


def local_jvm(spark: Any) -> int | None:
    """The driver JVM's pid when it runs the tasks (a ``local`` master of a classic session)
    with this interpreter as their Python: then this process can start, and reach, the
    hosts the tasks would use. None otherwise."""
    sc = getattr(spark, "sparkContext", None)
    if sc is None or not str(sc.master).startswith("local"):
        return None
    worker = shutil.which(getattr(sc, "pythonExec", None) or "python3")
    if worker is None or os.path.abspath(worker) != os.path.abspath(sys.executable):
        return None
    try:
        # the driver's JVM runs the tasks in local mode: the hosts watch it, as theirs do
        return int(spark._jvm.java.lang.ProcessHandle.current().pid())
    except Exception:  # no JVM handle (e.g. Spark Connect)
        return None


class Prespawn:
    """With a ``local`` master the tasks run on this node and would each start their host
    in the first micro-batch (an interpreter start and imports, ~0.5-2 s, after Spark's
    planning): start them now, in parallel with the rest of the set-up and Spark's
    planning (``timings``: ``spawn_ms``). A task that finds its host starting waits for it
    (the spawn lock); one that finds none starts it as before, so a failure here only costs
    the head start. Nothing starts when the workers run another Python than this one, or with
    ``STREAMSTATE_PRESPAWN=0``."""

    def __init__(self, spark: Any, hosts: HostFleet, timings: Spans) -> None:
        self.thread: threading.Thread | None = None
        if os.environ.get("STREAMSTATE_PRESPAWN", "1") == "0":
            return
        jvm = local_jvm(spark)
        if jvm is None:
            return
        self.thread = threading.Thread(
            target=self._spawn,
            args=(hosts, jvm, timings),
            name="streamstate-prespawn",
            daemon=True,
        )
        self.thread.start()

    @staticmethod
    def _spawn(hosts: HostFleet, jvm: int, timings: Spans) -> None:
        with timings.span("spawn"):
            hosts.spawn_local(jvm)

    def join(self) -> None:
        """Wait for the hosts being started (they must be found and stopped too)."""
        if self.thread is not None:
            self.thread.join()


def reports_for(spark: Any, storage: Any, run_id: str, sinks: dict[str, Sink]) -> Any:
    """How the query run ``run_id`` and its micro-batches learn of each other: through report
    files in the checkpoint's ``storage`` with a Spark Connect session (its ``sinks`` by name
    mirrored there), in this process with a classic one."""
    if is_connect(spark):
        from streamstate.spark.driver.query.connect import ConnectReports

        return ConnectReports.start_run(storage, run_id, sinks)
    from streamstate.spark.driver.query.classic import ClassicReports

    return ClassicReports(spark)


def check_progress(
    spark: Any, storage: Any, options: KeyedOptions, location: str, given: str | None
) -> None:
    """Compare the state checkpoint in ``storage`` with the offset and commit logs of Spark's
    checkpoint at ``location`` (``given``: what ``spark_checkpoint=`` said, None for the
    default) before the query starts, and before it takes the job over: a state behind Spark's
    log (a lost latest ``_metadata``) raises :class:`~streamstate.errors.CheckpointMismatchError`
    with the rollback command now, whether or not input is waiting; otherwise Spark would run
    nothing (no input) or fail inside its first micro-batch.

    The driver reads Spark's logs through fsspec. Where it cannot (a scheme fsspec does not
    reach from here, or a Spark Connect server's local ``spark_checkpoint`` that this client
    does not see), the first micro-batch makes the same check."""
    default_location = given is None
    try:
        # the state checkpoint's storage options are for its filesystem: a Spark checkpoint
        # put elsewhere (a local or HDFS path) is read without them
        storage_options = options.storage_options if default_location else None
        spark_log = SparkLog(location, storage_options)
        visible = spark_log.exists()
        if not visible and is_connect(spark) and not default_location:
            return  # perhaps a path on the Connect server's machine
        next_batch = spark_log.next_batch()
    except Exception as exc:  # no fsspec filesystem for it here: the first batch checks
        log.info("could not read Spark's checkpoint %s: %r", location, exc)
        return
    CheckpointLog(
        storage, options.operator_name, options.parallelism, spark_checkpoint=location
    ).check_start(spark_log, next_batch)
