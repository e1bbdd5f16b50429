"""A Spark standalone cluster on one machine, started from pyspark's own launcher: on
127.0.0.1, or with a network namespace and an address per node
(:class:`~streamstate.devtools.local_netns.NetnsNetwork`).

One master and N workers, each a ``spark-class`` JVM (``org.apache.spark.deploy.master.Master``,
``org.apache.spark.deploy.worker.Worker``) with pyspark's package directory as ``SPARK_HOME``:
no separate Spark download. Every worker is a simulated **node**: it has its own work directory
and its own ``STREAMSTATE_RUN_DIR`` (the executors it launches, their Python workers and the
state hosts those start inherit the worker's environment), so state hosts of two workers never
see each other's sockets, as on two machines.

Used by the cluster tests (``tests/spark_cluster``), ``bench/spark_cluster.py`` and
``streamstate demo --cluster N``. Every process is started in a new session and stopped by its
process group; :meth:`LocalCluster.kill_node` SIGKILLs one worker with everything it started
(executor JVM, Python workers, state hosts) to simulate losing a machine.

This module imports nothing from streamstate: the benchmark loads it by file path to measure an
older streamstate on the same cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from streamstate.spark.task.spawn import log_tail

__all__ = ["LocalCluster", "Node", "descendants", "live_processes", "pyspark_home"]


def pyspark_home() -> str:
    """pyspark's package directory: it holds ``bin/spark-class`` and ``jars/``."""
    import pyspark

    return os.path.dirname(os.path.abspath(pyspark.__file__))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def live_processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every live (non-zombie) process."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if fields[0] == "Z":
                continue
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            out[int(name)] = (int(fields[1]), cmd)
        except (OSError, IndexError, ValueError):
            continue
    return out


def descendants(root: int, procs: dict[int, tuple[int, str]]) -> set[int]:
    """Every process below ``root`` in ``procs`` (from :func:`live_processes`)."""
    found, frontier = set(), [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _) in procs.items():
            if ppid == parent and pid not in found:
                found.add(pid)
                frontier.append(pid)
    return found


def _kill(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@dataclass
class Node:
    """One worker process: a simulated machine with its own run and work directories."""

    name: str
    process: subprocess.Popen[bytes]
    webui_port: int
    run_dir: str
    work_dir: str
    log: str
    alive: bool = True
    killed_pids: set[int] = field(default_factory=set)
    #: its network address, and where it is on the network (the endpoint's name)
    address: str = "127.0.0.1"
    place: str = ""

    @property
    def pid(self) -> int:
        return self.process.pid

    def executor_pids(self) -> list[int]:
        """The executor JVMs this worker launched (its ``java`` children)."""
        procs = live_processes()
        return [
            pid
            for pid, (ppid, cmd) in procs.items()
            if ppid == self.pid and "CoarseGrainedExecutorBackend" in cmd
        ]

    def processes(self) -> set[int]:
        """Every live process of this node: the worker JVM, its descendants (executor JVMs,
        Python daemons and workers) and the state hosts that run in its run directory (they
        start their own session, so they are not descendants)."""
        procs = live_processes()
        pids = {self.pid} | descendants(self.pid, procs)
        pids |= {pid for pid, (_, cmd) in procs.items() if self.run_dir in cmd}
        return {p for p in pids if p in procs}

    def finished_tasks(self) -> int:
        """Tasks this node's executors finished, counted from their logs (Spark logs
        ``Finished task`` at INFO to the executor's stderr in the work directory)."""
        n = 0
        for root, _dirs, files in os.walk(self.work_dir):
            if "stderr" in files:
                with open(os.path.join(root, "stderr"), errors="replace") as f:
                    n += sum("Finished task" in line for line in f)
        return n


class LocalCluster:
    """A standalone master and ``workers`` workers on 127.0.0.1, or each in its own network
    namespace of ``network`` (a :class:`~streamstate.devtools.local_netns.NetnsNetwork`: the
    master is its endpoint ``master``, worker ``nodeI`` its endpoint ``nodeI``, and drivers
    run in the root namespace at the bridge's address).

    >>> with LocalCluster(workers=2) as cluster:            # doctest: +SKIP
    ...     spark = cluster.session_builder("app").getOrCreate()
    """

    def __init__(
        self,
        workers: int = 2,
        *,
        cores: int = 1,
        memory: str = "1g",
        directory: str | None = None,
        env: dict[str, str] | None = None,
        python: str | None = None,
        start_timeout: float = 120.0,
        network: Any = None,
    ) -> None:
        self.initial_workers = workers
        self.cores = cores
        self.memory = memory
        self._own_dir = directory is None
        self.directory = directory or tempfile.mkdtemp(prefix="streamstate-cluster-")
        os.makedirs(self.directory, exist_ok=True)
        self.python = python or sys.executable
        self.start_timeout = start_timeout
        self.home = pyspark_home()
        self.extra_env = dict(env or {})
        self.network = network
        self.master: subprocess.Popen[bytes] | None = None
        self.master_port = 0
        self.master_webui_port = 0
        self.nodes: list[Node] = []

    # ---- lifecycle ---------------------------------------------------------------------------

    def address(self, place: str) -> str:
        """The address of the process at ``place`` (``master``, a node's name)."""
        return "127.0.0.1" if self.network is None else self.network.endpoint(place).address

    @property
    def driver_address(self) -> str:
        """Where a driver of this cluster listens (the root namespace's bridge address)."""
        return "127.0.0.1" if self.network is None else str(self.network.address)

    @property
    def master_url(self) -> str:
        return f"spark://{self.address('master')}:{self.master_port}"

    def _env(self, place: str = "master", **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        here = self.address(place)
        env.update(
            SPARK_HOME=self.home,
            SPARK_LOCAL_IP=here,
            SPARK_LOCAL_HOSTNAME=here,
            # the daemons themselves need little; executors get spark.executor.memory
            SPARK_DAEMON_MEMORY="256m",
            PYSPARK_PYTHON=self.python,
        )
        # a SPARK_CONF_DIR or master URL of the caller's environment must not leak in
        env.pop("SPARK_CONF_DIR", None)
        env.pop("MASTER", None)
        env.update(self.extra_env)
        env.update(extra)
        return env

    def _spawn(
        self, args: list[str], log: str, env: dict[str, str], place: str = "master"
    ) -> subprocess.Popen[bytes]:
        argv = [os.path.join(self.home, "bin", "spark-class"), *args]
        if self.network is not None:
            argv = self.network.endpoint(place).command(argv)
        with open(log, "ab") as out:
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopped by killpg
                cwd=self.directory,
                env=env,
            )

    def start(self, *, wait: bool = True) -> LocalCluster:
        """Start the master, then the workers; with ``wait``, until the master lists every
        worker. Without it the workers register while the caller goes on (a driver's JVM
        starts meanwhile); :meth:`wait_for_workers` waits for them later."""
        self.master_port, self.master_webui_port = _free_port(), _free_port()
        self.master = self._spawn(
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                self.address("master"),
                "--port",
                str(self.master_port),
                "--webui-port",
                str(self.master_webui_port),
            ],
            os.path.join(self.directory, "master.log"),
            self._env(),
        )
        try:
            self._wait(lambda s: s is not None, "the master to answer")
            for _ in range(self.initial_workers):
                self.add_worker(wait=False)
            if wait:
                self.wait_for_workers(self.initial_workers)
        except BaseException:
            self.stop()
            raise
        return self

    def add_worker(
        self, *, wait: bool = True, env: dict[str, str] | None = None, place: str | None = None
    ) -> Node:
        """Start one more worker (a new node); with ``wait``, until the master lists it.
        ``place``: the network endpoint it runs at (default its own, ``nodeI``; a replacement
        takes the place of a node it replaces)."""
        i = len(self.nodes)
        name = f"node{i}"
        place = place or name
        run_dir = os.path.join(self.directory, name, "run")
        work_dir = os.path.join(self.directory, name, "work")
        os.makedirs(run_dir, mode=0o700)
        os.makedirs(work_dir)
        port = _free_port()
        log = os.path.join(self.directory, f"{name}.log")
        process = self._spawn(
            [
                "org.apache.spark.deploy.worker.Worker",
                self.master_url,
                "--cores",
                str(self.cores),
                "--memory",
                self.memory,
                "--host",
                self.address(place),
                "--webui-port",
                str(port),
                "--work-dir",
                work_dir,
            ],
            log,
            # executors are children of the worker and inherit its environment: this is what
            # gives each node its own state-host directory (and address: SPARK_LOCAL_IP)
            self._env(place, STREAMSTATE_RUN_DIR=run_dir, **(env or {})),
            place,
        )
        node = Node(
            name, process, port, run_dir, work_dir, log, address=self.address(place), place=place
        )
        self.nodes.append(node)
        if wait:
            self.wait_for_workers(len(self.alive_nodes))
        return node

    @property
    def alive_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.alive]

    def status(self) -> dict[str, Any] | None:
        """The master's JSON status page, or None while it does not answer."""
        url = f"http://{self.address('master')}:{self.master_webui_port}/json/"
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return dict(json.load(r))
        except (OSError, ValueError):
            return None

    def alive_workers(self) -> list[dict[str, Any]]:
        status = self.status() or {}
        return [w for w in status.get("workers", []) if w.get("state") == "ALIVE"]

    def wait_for_workers(self, n: int) -> None:
        self._wait(
            lambda s: (
                s is not None and sum(w.get("state") == "ALIVE" for w in s.get("workers", [])) >= n
            ),
            f"{n} workers to register",
        )

    def _wait(self, ok: Any, what: str) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            if ok(self.status()):
                return
            for proc, log in self._processes_and_logs():
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"a Spark process exited (code {proc.returncode}) while waiting for "
                        f"{what}; log {log}:\n{log_tail(log)}"
                    )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"timed out after {self.start_timeout:.0f} s waiting for {what}; logs in "
                    f"{self.directory}"
                )
            time.sleep(0.3)

    def _processes_and_logs(self) -> list[tuple[subprocess.Popen[bytes], str]]:
        out = []
        if self.master is not None:
            out.append((self.master, os.path.join(self.directory, "master.log")))
        out += [(n.process, n.log) for n in self.alive_nodes]
        return out

    def kill_node(self, node: Node) -> set[int]:
        """Lose a machine: SIGKILL the executor JVMs of ``node`` first (by pid, children of
        the worker this cluster started), then the worker and every other process of the node
        (Python workers, state hosts). Returns the pids killed."""
        executors = set(node.executor_pids())
        _kill(executors)
        pids = node.processes()
        _kill(pids)
        node.process.wait()
        node.alive = False
        node.killed_pids = executors | pids
        return node.killed_pids

    def replace_node(self, node: Node, *, wait: bool = True) -> Node:
        """Kill ``node`` if it is alive and start a fresh worker at its place (its address),
        with new run and work directories."""
        if node.alive:
            self.kill_node(node)
        return self.add_worker(wait=wait, place=node.place)

    def stop(self) -> None:
        """Stop every process this cluster started (by process group and pid), then remove
        its directory if the cluster created it."""
        for node in self.nodes:
            if node.alive:
                pids = node.processes()
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.pid, signal.SIGKILL)
                _kill(pids)
                node.process.wait()
                node.alive = False
        if self.master is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.master.pid, signal.SIGKILL)
            self.master.wait()
            self.master = None
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- drivers -----------------------------------------------------------------------------

    def spark_conf(self, executor_memory: str = "512m") -> dict[str, str]:
        """Settings of a driver connected to this cluster: executors of one core, tasks retried
        (a lost node must not fail the query), the driver on :attr:`driver_address`."""
        return {
            "spark.master": self.master_url,
            "spark.executor.cores": str(self.cores),
            "spark.executor.memory": executor_memory,
            "spark.task.maxFailures": "4",
            "spark.driver.host": self.driver_address,
            "spark.driver.bindAddress": self.driver_address,
            "spark.pyspark.python": self.python,
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
        }

    def session_builder(self, app_name: str = "streamstate", **conf: str) -> Any:
        """A ``SparkSession.builder`` connected to this cluster (the caller sets the rest and
        calls ``getOrCreate()``; one SparkContext per Python process)."""
        from pyspark.sql import SparkSession

        builder = SparkSession.builder.appName(app_name)
        for key, value in {**self.spark_conf(), **conf}.items():
            builder = builder.config(key, value)
        return builder


def wait_for_executors(spark: Any, n: int, timeout: float = 120.0) -> None:
    """Block until ``n`` executors registered with the driver of ``spark`` (a standalone app
    starts its first job as soon as one executor is up: the hot-state figures need all)."""
    sc = spark.sparkContext
    deadline = time.monotonic() + timeout
    while True:
        # the driver counts itself as one "executor" in this map
        got = sc._jsc.sc().getExecutorMemoryStatus().size() - 1
        if got >= n:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {got} of {n} executors registered after {timeout:.0f} s")
        time.sleep(0.2)


__all__ += ["wait_for_executors"]
