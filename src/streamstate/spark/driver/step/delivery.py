"""Pre-aggregated rows delivered to the state hosts by the driver (SPEC §13.2).

After the fold before the shuffle, a micro-batch of a window aggregate is one row per (key,
window) group of each map partition: a few rows where the input had ~100k records. Shuffling
them to ``parallelism`` Spark tasks that only forward them to their subtasks' state hosts would
cost a second shuffle, a task and a Python worker per subtask, for a few kilobytes. With a
``local`` master the state hosts run on the driver's machine, so the driver collects the folded
rows (one Spark job, Arrow to the driver) and streams each subtask's share to its host itself,
in parallel, with the protocol and the checks a task uses (:func:`~streamstate.spark.task.
host_client.run_batch`: the same BEGIN, the same version, lineage and attempt checks, the same
acknowledgement).

The driver is then the host's client in every way a task is: it finds the host where the last
acknowledgement put it, starts it on this node if needed (watching the driver's JVM, which
runs the executors of a local master), and tries again (a new attempt, the host reloading the
batch's base version) when a host is lost mid-batch, as Spark would retry a task. An error the
host reports (the user's function raised) fails the micro-batch as it would fail a task, rebuilt
as the original error. Attempt numbers are the driver's own, from ``2**40`` up, apart from
Spark's task attempt ids.
"""

from __future__ import annotations

import itertools
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from streamstate.errors import StateHostError
from streamstate.spark.driver.monitor.figures import Spans
from streamstate.spark.wire.acks import TaskAck
from streamstate.spark.wire.hosts import HostSettings
from streamstate.spark.wire.messages import HostLocation
from streamstate.spark.wire.step import StepTask

__all__ = ["DRIVER_ATTEMPTS", "DriverDelivery"]

#: attempt numbers of deliveries by the driver start here (Spark's task attempt ids are small)
DRIVER_ATTEMPTS = 1 << 40
#: tries of one subtask's delivery when its host is lost (Spark's default task attempts)
_TRIES = 4


class DriverDelivery:
    """Streams pre-aggregated rows from the driver to the state hosts of one query run.

    Parameters:
        job: the operator's ``JobSpec``.
        hosts: how the query run's hosts are reached (as its tasks get it).
        jvm: the driver JVM's pid, which the hosts it starts watch.
    """

    def __init__(self, job: Any, hosts: HostSettings, jvm: int) -> None:
        self.job = job
        self.hosts = hosts
        self.jvm = jvm
        self._attempts = itertools.count(DRIVER_ATTEMPTS)

    def deliver(
        self, table: Any, step: StepTask, locations: dict[int, HostLocation]
    ) -> list[TaskAck]:
        """Send each subtask its rows of ``table`` (with ``_kg``) for ``step`` (what a task's
        closure holds; ``locations``: subtask -> where its host was); returns one
        acknowledgement per subtask, as a task makes it."""
        import numpy as np
        import pyarrow as pa

        from streamstate.spark.job import KEY_GROUP_COLUMN

        job = self.job
        p = job.parallelism
        subtasks = (
            table.column(KEY_GROUP_COLUMN).to_numpy(zero_copy_only=False).astype(np.int64)
            * p
            // job.max_parallelism
        )
        shares = [
            table.filter(pa.array(subtasks == i)).combine_chunks().to_batches() for i in range(p)
        ]
        with ThreadPoolExecutor(
            max_workers=min(8, p), thread_name_prefix="streamstate-deliver"
        ) as pool:
            return list(
                pool.map(
                    lambda i: self._deliver_one(i, shares[i], step, locations.get(i)), range(p)
                )
            )

    def _deliver_one(
        self, subtask: int, batches: list[Any], step: StepTask, location: HostLocation | None
    ) -> TaskAck:
        from streamstate.spark.failures import parse_remote_error
        from streamstate.spark.task.host_client import run_batch

        hosts = self.hosts
        spec = hosts.spec(subtask, watch_pid=self.jvm)
        for tries in range(1, _TRIES + 1):
            attempt = next(self._attempts)
            spans = Spans()
            try:
                ack = run_batch(
                    spec,
                    step,
                    attempt,
                    iter(batches),
                    pythonpath=hosts.pythonpath,
                    secret=hosts.secret,
                    location=location,
                    connect_timeout=hosts.connect_timeout,
                )
            except StateHostError as exc:
                rebuilt = parse_remote_error(str(exc))
                if rebuilt is not None:  # the host reported an error: as a failed task's
                    raise rebuilt from exc
                if tries == _TRIES:
                    raise
                # the host was lost: a new one on this node reloads the batch's base version
                location = None
                continue
            ack.timings.worker_pid = os.getpid()
            ack.timings.attempt_number = tries - 1
            ack.timings.deliver_ms = spans.elapsed()
            return ack
        raise AssertionError("unreachable")
