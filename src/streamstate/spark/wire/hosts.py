"""How a state host is named, found and started, as its spawner (a task, or the driver) and the
host itself both see it: its spec (on its command line), the job it is pinned to (on its stdin),
its id and files in a node's run directory, and the start time that tells a live process from a
reused pid.
"""

from __future__ import annotations

import hashlib
import os
import sys
from typing import Any

import msgspec

from streamstate.spark.wire.network import default_bind
from streamstate.spark.wire.protocol import MAX_BODY_BYTES
from streamstate.spark.wire.security import run_dir

__all__ = [
    "DEFAULT_FRAME_TIMEOUT",
    "ZYGOTE_SWITCH",
    "ForkRequest",
    "HostSettings",
    "HostSpec",
    "JobPin",
    "host_id",
    "host_paths",
    "proc_start_time",
    "zygote_id",
]

#: the environment variable that turns the host zygote off ("0"; see
#: :mod:`streamstate.spark.host.zygote`)
ZYGOTE_SWITCH = "STREAMSTATE_HOST_ZYGOTE"
#: a state host's frame deadline, seconds (:attr:`HostSpec.frame_timeout`)
DEFAULT_FRAME_TIMEOUT = 20.0


class HostSpec(msgspec.Struct, frozen=True, kw_only=True):
    """Identity and lifecycle settings of one state host (passed on its command line)."""

    id: str
    #: the job's checkpoint URL and operator (for humans: visible in ``ps``)
    job: str
    operator: str
    subtask: int
    parallelism: int
    run_dir: str
    #: pid of the executor JVM to watch (and its start time, to detect pid reuse)
    watch_pid: int | None = None
    watch_start: int | None = None
    idle_timeout: float = 600.0
    #: seconds a connection may wait for its peer's next message (a task between two Arrow
    #: batches may be computing them)
    io_timeout: float = 600.0
    #: seconds a message has once begun, sent or received (a peer that stops inside a frame is
    #: dropped and its batch aborted), and that a batch of the subtask waits for another one
    #: of it before that one is aborted: far below ``io_timeout``, above the time the largest
    #: Arrow batch takes on the network (:mod:`streamstate.spark.host.state_host`)
    frame_timeout: float = DEFAULT_FRAME_TIMEOUT
    #: TCP address to listen on (``"127.0.0.1"``, ``"10.0.0.5:0"``, ``"[::]:0"``; port 0 or
    #: none: ephemeral); None: Unix socket only
    bind: str | None = None
    #: seconds a connection has to complete the handshake, from its accept (one deadline)
    auth_timeout: float = 5.0
    #: handshakes pending at once: of those that have sent part of an answer, from one source
    #: address (beyond: its oldest is dropped), and in all (beyond: the oldest that has sent
    #: nothing is dropped, wherever it comes from; :mod:`streamstate.spark.host.acceptor`)
    max_pending_per_address: int = 16
    max_pending: int = 256
    #: refusals logged per 10 s (beyond: one line says how many were not)
    refusal_log_limit: int = 20
    #: largest message body accepted (one Arrow batch)
    max_frame: int = MAX_BODY_BYTES
    #: the query run (for humans; the run is also part of ``id``)
    run: str = ""
    #: forked by the host zygote of its node and JVM, which it starts if needed
    #: (:mod:`streamstate.spark.host.zygote`; the hosts of query runs); False: started as a new
    #: interpreter
    zygote: bool = False


class HostSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How the tasks of one query run, and its driver, reach the state hosts of its subtasks:
    set once per run by the driver. A host's spec is derived from it where the host is
    reached (:meth:`spec`): its run directory and TCP address are that node's."""

    #: the job's checkpoint URL, operator and parallelism
    job: str
    operator: str
    parallelism: int
    #: the query run (empty: outside a query run)
    run: str = ""
    #: the node's run directory (None: ``$STREAMSTATE_RUN_DIR`` or the default, on that node)
    run_dir: str | None = None
    idle_timeout: float = 600.0
    #: as :func:`~streamstate.spark.wire.network.default_bind` (``"off"``: no TCP)
    bind: str | None = "off"
    #: the ``PYTHONPATH`` a spawned host needs to import streamstate (None: inherited)
    pythonpath: str | None = None
    #: the query run's secret (None: the node's)
    secret: bytes | None = None
    #: seconds to wait for a host to accept a connection
    connect_timeout: float = 3.0
    #: the hosts' frame deadline (:attr:`HostSpec.frame_timeout`)
    frame_timeout: float = DEFAULT_FRAME_TIMEOUT

    def spec(self, subtask: int, watch_pid: int | None = None) -> HostSpec:
        """The spec of the host of ``subtask`` on this node, watching the executor JVM
        ``watch_pid`` (None: none)."""
        return HostSpec(
            id=host_id(self.job, self.operator, subtask, self.parallelism, self.run),
            run=self.run,
            bind=default_bind(self.bind),
            job=self.job,
            operator=self.operator,
            subtask=subtask,
            parallelism=self.parallelism,
            run_dir=run_dir(self.run_dir),
            watch_pid=watch_pid,
            watch_start=proc_start_time(watch_pid) if watch_pid else None,
            idle_timeout=self.idle_timeout,
            frame_timeout=self.frame_timeout,
            zygote=True,
        )


class JobPin(msgspec.Struct, frozen=True, kw_only=True):
    """The job a host serves, fixed when it starts (its spawner writes it on the host's stdin
    with the secret): every field of a BEGIN's ``JobSpec`` that names something the host loads
    or restores is here, and a BEGIN that differs in one of them is refused, even from a client
    holding the secret. So a peer holding the secret of one query run cannot make a host load
    another job's checkpoint, savepoint, function or local database. (The step's own
    references, its base version, lineage and task attempts, name files inside the pinned
    checkpoint, through :mod:`streamstate.format.names`.)"""

    #: the job's checkpoint directory, and the operator whose files the host reads in it
    checkpoint_url: str
    operator: str
    #: the pickled function: its sha256 and its path (relative to the checkpoint, or absolute)
    function_sha: str
    function_path: str
    #: sha256 of the storage options (msgpack, keys sorted): compared, never kept
    storage_options: str
    #: the savepoint or checkpoint the first step starts from (None: none)
    initial_state: str | None
    #: the state backend that restores the state, and sha256 of its options (RocksDB's
    #: ``working_dir`` names a local directory the host opens)
    state_backend: str
    state_backend_options: str

    @classmethod
    def of(cls, job: Any) -> JobPin:
        """The pin of a :class:`~streamstate.spark.job.JobSpec`."""
        return cls(
            checkpoint_url=job.checkpoint_url,
            operator=job.operator,
            function_sha=job.function_sha,
            function_path=job.function_path,
            storage_options=_digest(job.storage_options),
            initial_state=job.initial_state,
            state_backend=job.state_backend,
            state_backend_options=_digest(job.state_backend_options),
        )

    def differences(self, other: JobPin) -> list[str]:
        """The fields in which ``other`` differs (names only: values may hold credentials)."""
        return [f for f in self.__struct_fields__ if getattr(self, f) != getattr(other, f)]


def _digest(options: dict[str, Any]) -> str:
    """sha256 of ``options`` (msgpack, keys sorted)."""
    encoded = msgspec.msgpack.Encoder(order="sorted").encode(options)
    return hashlib.sha256(encoded).hexdigest()


def host_id(job: str, operator: str, subtask: int, parallelism: int, run: str = "") -> str:
    """The host of one subtask of one query run (``run`` empty: outside a query run)."""
    ident = f"{job}\0{operator}\0{subtask}\0{parallelism}"
    if run:
        ident += f"\0{run}"
    return hashlib.sha1(ident.encode()).hexdigest()[:20]


def host_paths(hid: str, directory: str) -> dict[str, str]:
    base = os.path.join(directory, hid)
    return {
        "sock": base + ".sock",
        "lock": base + ".lock",
        "spawn": base + ".spawn",
        "log": base + ".log",
        "local": base + ".d",
    }


#: environment variables read when an interpreter or a library starts (a forked host keeps the
#: zygote's) or when a streamstate module is imported: spawners that differ in one of them get
#: zygotes of their own (the others reach the host with the request)
_ZYGOTE_ENV_PREFIXES = (
    "STREAMSTATE_",
    "PYTHON",
    "LD_",
    "MALLOC_",
    "ARROW_",
    "OMP_",
    "OPENBLAS_",
    "MKL_",
)


def zygote_id(env: dict[str, str], watch_pid: int, watch_start: int | None) -> str:
    """The host zygote that may fork the hosts of a spawner with environment ``env`` watching
    the JVM ``watch_pid`` (:mod:`streamstate.spark.host.zygote`): one per interpreter, JVM,
    address-space limit (a forked host keeps the zygote's) and the environment variables read
    at start or import (``PYTHONPATH``, ``STREAMSTATE_*``, ...). Its files are
    :func:`host_paths` of this id."""
    import resource

    parts = [os.path.realpath(sys.executable), str(watch_pid), str(watch_start)]
    parts.append(repr(resource.getrlimit(resource.RLIMIT_AS)))
    parts += sorted(f"{k}={v}" for k, v in env.items() if k.startswith(_ZYGOTE_ENV_PREFIXES))
    # as long as a host's id: a run directory short enough for hosts' sockets fits it too
    return "z" + hashlib.sha1("\0".join(parts).encode()).hexdigest()[:19]


class ForkRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What a spawner sends the host zygote to get a host forked (with its status pipe and the
    host's log file as file descriptors)."""

    spec: HostSpec
    #: the query run's secret (None: the node's)
    secret: bytes | None
    #: the job pin, JSON (empty: none)
    pin: bytes
    #: the environment the host would get from the spawner
    env: dict[str, str]


def proc_start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None
