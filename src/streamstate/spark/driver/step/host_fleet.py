"""The state hosts of one streaming query run, as its driver knows them (SPEC §13.1).

A query run has one state host per subtask (:mod:`streamstate.spark.host.state_host`), started
by the task that first needs it on its node. The driver does not run them, but it keeps their
bookkeeping: the run's identity and secret and how its tasks reach the hosts
(:class:`~streamstate.spark.wire.hosts.HostSettings`), where each subtask's host was at the end
of the last step (from the acknowledgements: the next step's tasks go there), a host its
subtask left behind on another node (asked to exit), the hosts started ahead of the first
micro-batch with a ``local`` master, and stopping them all when the query stops.
"""

from __future__ import annotations

import logging
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

from streamstate.spark.job import JobSpec, src_path
from streamstate.spark.task.host_client import connect, shutdown, shutdown_remote
from streamstate.spark.wire.acks import TaskAck
from streamstate.spark.wire.hosts import DEFAULT_FRAME_TIMEOUT, HostSettings, HostSpec
from streamstate.spark.wire.messages import HostLocation
from streamstate.spark.wire.security import new_secret, node_id

__all__ = ["HostFleet"]

log = logging.getLogger(__name__)


class HostFleet:
    """The state hosts of one query run.

    Parameters:
        job: the operator's ``JobSpec`` (``job_bytes``: encoded, as a host is given it).
        run_dir: the run directory of host sockets, locks and logs on every node (None:
            ``$STREAMSTATE_RUN_DIR`` or the default, on each node).
        bind: the TCP address hosts listen on (as
            :func:`~streamstate.spark.wire.network.default_bind`).
        connect_timeout: seconds a task (or the driver) waits for a host's TCP connection.
        idle_timeout: seconds a host lives without a connection.
        frame_timeout: the hosts' frame deadline (seconds a message has once begun, and that
            a batch waits for another batch of its subtask).
    """

    def __init__(
        self,
        job: JobSpec,
        job_bytes: bytes,
        *,
        run_dir: str | None,
        bind: str | None,
        connect_timeout: float,
        idle_timeout: float,
        frame_timeout: float = DEFAULT_FRAME_TIMEOUT,
    ) -> None:
        self.job = job
        self.job_bytes = job_bytes
        self.run_dir = run_dir
        self.bind = bind
        self.connect_timeout = connect_timeout
        self.idle_timeout = idle_timeout
        self.frame_timeout = frame_timeout
        #: this query run: part of its hosts' identity; the secret authenticates their clients
        self.run_id = uuid.uuid4().hex
        self.secret = new_secret()
        #: subtask -> where its host was at the end of the last step (from the acks)
        self.locations: dict[int, HostLocation] = {}

    def settings(self) -> HostSettings:
        """How the run's tasks, and this driver, reach its hosts (made where the steps run:
        the ``PYTHONPATH`` is that process's, a Spark Connect server's)."""
        job = self.job
        return HostSettings(
            job=job.checkpoint_url,
            operator=job.operator,
            parallelism=job.parallelism,
            run=self.run_id,
            run_dir=self.run_dir,
            idle_timeout=self.idle_timeout,
            bind=self.bind,
            pythonpath=src_path(),
            secret=self.secret,
            connect_timeout=self.connect_timeout,
            frame_timeout=self.frame_timeout,
        )

    def spec(self, subtask: int) -> HostSpec:
        """The spec of the host of ``subtask`` on this node, as this driver reaches it."""
        return self.settings().spec(subtask)

    def update_locations(self, acks: list[TaskAck]) -> None:
        """Remember where each subtask's host is (from the acknowledgements, for the next
        step); a host the subtask left on another node is asked to exit."""
        for ack in acks:
            where = ack.location
            if where is None:
                continue
            old = self.locations.get(ack.subtask)
            self.locations[ack.subtask] = where
            if old is not None and old.node != where.node:
                # its host on the other node holds an old version: nothing will use it
                threading.Thread(
                    target=self.retire,
                    args=(ack.subtask, old, "the subtask moved to another host"),
                    name="streamstate-retire-host",
                    daemon=True,
                ).start()

    def retire(self, subtask: int, where: HostLocation, reason: str) -> bool:
        """Ask the host at ``where`` to exit if it is still the process the acknowledgement
        named (best effort: an unreachable one exits with its executor or when idle)."""
        if where.tcp:
            return shutdown_remote(
                where.tcp,
                self.spec(subtask),
                self.secret,
                reason,
                timeout=self.connect_timeout,
                pid=where.pid,
            )
        return False

    def spawn_local(self, jvm: int) -> None:
        """Start every subtask's host on this node, watching the JVM ``jvm`` (a ``local``
        master's, which runs the tasks), in parallel; a failure only costs the head start."""
        settings = self.settings()

        def start(subtask: int) -> None:
            # the spec a task of this subtask computes (tasks.micro_batch_task)
            spec = settings.spec(subtask, watch_pid=jvm)
            got = connect(
                spec, pythonpath=settings.pythonpath, secret=self.secret, job=self.job_bytes
            )
            if got is not None:
                got[0].close()

        try:
            with ThreadPoolExecutor(max_workers=min(8, self.job.parallelism)) as pool:
                list(pool.map(start, range(self.job.parallelism)))
        except Exception as exc:  # the tasks start their hosts themselves
            log.warning("starting the state hosts ahead of the first micro-batch failed: %r", exc)

    def shutdown(self, reason: str) -> int:
        """Stop the run's hosts: those on other nodes over TCP (named by pid), then this
        node's one by one. Returns how many answered."""
        here = node_id(self.spec(0).run_dir)
        remote = {
            i: where for i, where in self.locations.items() if where.node != here and where.tcp
        }
        with ThreadPoolExecutor(max_workers=8) as pool:
            far = list(pool.map(lambda it: self.retire(it[0], it[1], reason), remote.items()))
        # host by host: one that does not answer (busy, gone) costs its timeout, not the rest
        near = sum(
            shutdown(self.spec(i), reason, secret=self.secret) for i in range(self.job.parallelism)
        )
        return near + sum(far)
