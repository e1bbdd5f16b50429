"""The state host: one long-lived process per subtask that keeps its keyed state hot.

Spark reuses Python workers but does not pin a partition to a worker, so state kept in a worker
would be found only by chance. A state host is a process per ``(job, operator, subtask,
parallelism, query run)``: the Spark task of subtask ``i`` streams its Arrow batches to host
``i`` (:mod:`streamstate.spark.wire.protocol`) and gets an acknowledgement back;
the state stays in the host's memory (heap) or local disk (RocksDB) between micro-batches and is
reloaded from checkpoint storage only when the version a batch needs is not the one the host
holds (:class:`~streamstate.spark.subtask.SubtaskRuntime`).

Where: a host lives on the node whose task first needed it. It listens on a Unix socket in the
node's run directory and, unless disabled, on TCP (``HostSpec.bind``, an ephemeral port); its
HELLO reports its location (node id, TCP address, socket path), the task puts it in its
acknowledgement, and the driver tells the next batch's task of that subtask where to send its
records, on whichever node Spark runs it (:mod:`streamstate.spark.task.host_client`). Every
connection is authenticated first (:mod:`streamstate.spark.wire.security`) by the acceptor thread,
which runs all pending handshakes at once (:mod:`streamstate.spark.host.acceptor`); each
authenticated connection is then served on a thread of its own, over sealed frames
(:mod:`streamstate.spark.wire.channel`). A refused connection or frame is logged (rate-limited) and
closed and the host goes on serving. A host serves only the job it was started for
(:class:`JobPin`).

No connection holds a host: HELLO, PING and SHUTDOWN are answered whatever another connection
does; the subtask's batches take turns (one state), and a message inside one, once begun, must
arrive whole within ``frame_timeout`` seconds (:attr:`~streamstate.spark.wire.hosts.HostSpec.
frame_timeout`), or the connection is dropped and the batch aborted as a failed batch is (the
next one reloads its base version). A batch that finds another batch of the subtask running
waits for it up to ``frame_timeout`` too, then aborts it (its connection is shut down) and runs:
a peer that stops between two messages of a batch keeps it only until the subtask's next batch
comes (a task's retry, on this node or another).

Lifecycle: the first task that cannot connect spawns the host (:mod:`streamstate.spark.task.
host_client`); the host double-forks and calls ``setsid`` (it is neither a child of the worker
nor in the PySpark daemon's process group), takes an exclusive ``flock`` on ``<id>.lock`` for its
whole life (a second host exits at once), binds ``<id>.sock`` (and its TCP port), and
reports ``READY`` or ``ERROR <reason>`` on a pipe to its spawner. It exits on SHUTDOWN (the
driver stops the query run), SIGTERM, when the executor JVM it watches exits (a thread waits on
a ``pidfd``, so even a host busy in a batch exits: no orphan survives its executor), or after
``idle_timeout`` seconds without a connection (so a host its subtask left behind on another
node does not linger; refused connections do not count as use). The socket is unlinked on
exit.

Memory: a host's memory is not accounted by Spark. On YARN or Kubernetes it counts against the
executor container, so size ``spark.executor.memoryOverhead`` for the state; if
``spark.executor.pyspark.memory`` is set, PySpark sets ``RLIMIT_AS`` in the worker and the host
inherits it (reported in HELLO).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import resource
import signal
import socket
import sys
import threading
import time
from typing import Any

import msgspec

from streamstate.spark.host.acceptor import Acceptor, RefusalLog
from streamstate.spark.host.connections import serve_connections, tag_of
from streamstate.spark.host.run_dir import SocketFile, clean_run_dir, listen_unix
from streamstate.spark.host.startup import (
    claim,
    log_line,
    read_stdin,
    report,
    warm_imports,
)
from streamstate.spark.wire.hosts import HostSpec, JobPin, host_paths
from streamstate.spark.wire.messages import (
    Begun,
    Data,
    Done,
    End,
    HostHello,
    HostLocation,
    Ok,
)
from streamstate.spark.wire.network import bind_tcp
from streamstate.spark.wire.protocol import (
    PROTOCOL_VERSION,
    Connection,
    MalformedMessage,
    ProtocolError,
)
from streamstate.spark.wire.security import node_id, node_secret
from streamstate.spark.wire.step import Begin

__all__ = ["StateHost", "serve", "warm_imports"]


class StateHost:
    """The subtask's runtime and the handling of one connection's messages."""

    def __init__(self, spec: HostSpec, pin: JobPin | None = None) -> None:
        self.spec = spec
        #: the job this host serves (None: started by a tool, it serves no batch)
        self.pin = pin
        self.runtime: Any = None
        self.job_identity: str | None = None
        self.function_sha: str | None = None
        self._function_blob: bytes | None = None
        self.batches = 0
        self.started = time.time()
        #: where clients find this host (HELLO): node id, TCP address, socket path
        self.location = HostLocation(id=spec.id, pid=os.getpid())
        #: held by the batch that runs (the subtask has one state)
        self.batch_lock = threading.Lock()
        self._lock = threading.Lock()
        #: the connection whose batch holds ``batch_lock``, and its peer
        self._batch: tuple[Connection, str] | None = None
        #: the connections being served, and when the last one ended (the idle timer)
        self._connections: set[Connection] = set()
        self.last_use = time.monotonic()

    # ---- connections ---------------------------------------------------------------------------

    def opened(self, conn: Connection) -> None:
        with self._lock:
            self._connections.add(conn)

    def closed(self, conn: Connection) -> None:
        with self._lock:
            self._connections.discard(conn)
            self.last_use = time.monotonic()

    @property
    def serving(self) -> int:
        """Connections being served."""
        return len(self._connections)

    def abort_connections(self) -> None:
        """Shut every served connection down (the host exits): their threads' next read or
        write fails, and a batch among them is aborted."""
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            _abort(conn)

    def take_batch(self, conn: Connection, peer: str, batch: int) -> bool:
        """Hold the subtask's batch turn for ``conn``'s batch ``batch``: at once if free; else
        after the running batch, which is aborted if it has not ended within the frame
        deadline. False if it still had not ended after the I/O timeout (a batch busy
        computing all along)."""
        wait = self.spec.frame_timeout
        if not self.batch_lock.acquire(timeout=wait):
            with self._lock:
                holder = self._batch
            if holder is not None:
                log_line(
                    f"batch of {holder[1]} aborted: batch {batch} of the subtask from {peer} "
                    f"waited {wait:g} s for it (the frame deadline)"
                )
                _abort(holder[0])
            if not self.batch_lock.acquire(timeout=self.spec.io_timeout):
                return False
        with self._lock:
            self._batch = (conn, peer)
        return True

    def release_batch(self) -> None:
        with self._lock:
            self._batch = None
        self.batch_lock.release()

    # ---- state ---------------------------------------------------------------------------------

    @property
    def version(self) -> int | None:
        return None if self.runtime is None else self.runtime.version

    def _runtime_for(self, job: Any) -> Any:
        """The runtime for ``job``: the current one if the job and function are unchanged."""
        from streamstate.spark.job import load_function
        from streamstate.spark.subtask import SubtaskRuntime, job_storage

        if (
            self.runtime is not None
            and self.job_identity == job.identity
            and self.function_sha == job.function_sha
        ):
            return self.runtime
        if self.runtime is not None:
            self.runtime.close()
            self.runtime = None
        storage = job_storage(job)
        if self.function_sha != job.function_sha:
            blob = storage.read_bytes(job.function_path)
            load_function(blob, job.function_sha, storage.url_of(job.function_path))
            self._function_blob, self.function_sha = blob, job.function_sha
        import cloudpickle

        blob = self._function_blob
        local = host_paths(self.spec.id, self.spec.run_dir)["local"]
        self.runtime = SubtaskRuntime(
            job,
            self.spec.subtask,
            lambda: cloudpickle.loads(blob),
            storage=storage,
            local_dir=local,
        )
        self.job_identity = job.identity
        return self.runtime

    # ---- one batch -----------------------------------------------------------------------------

    def check_begin(self, begin: Begin) -> Any:
        """The BEGIN's JobSpec, validated as plain data (msgpack and msgspec types: nothing is
        unpickled or loaded) and checked against this host before the batch touches any
        state."""
        from streamstate.spark.job import JobSpec

        try:
            job = msgspec.msgpack.decode(begin.task.job, type=JobSpec)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise MalformedMessage(f"malformed BEGIN: {exc}") from exc
        spec = self.spec
        if begin.subtask != spec.subtask:
            raise ProtocolError(
                f"BEGIN for subtask {begin.subtask} reached the host of subtask {spec.subtask}"
            )
        if (job.operator, job.parallelism) != (spec.operator, spec.parallelism):
            raise ProtocolError(
                f"BEGIN for operator {job.operator!r} at parallelism {job.parallelism} reached "
                f"the host of {spec.operator!r} at parallelism {spec.parallelism}"
            )
        if self.pin is None:
            raise ProtocolError(
                "BEGIN reached a host started without a job (by a tool): it serves no batch"
            )
        differ = self.pin.differences(JobPin.of(job))
        if job.checkpoint_url != spec.job and "checkpoint_url" not in differ:
            differ.insert(0, "checkpoint_url")
        if differ:
            raise ProtocolError(
                f"BEGIN for another job: its {', '.join(differ)} differ from the job this host "
                "was started for"
            )
        return job

    def run_batch(self, conn: Connection, begin: Begin, job: Any) -> None:
        import pyarrow as pa

        t0 = time.perf_counter()
        runtime = self._runtime_for(job)
        task = begin.task
        restore = runtime.prepare(task.base, task.lineage, begin.base_attempt)
        t_restore = time.perf_counter() - t0
        conn.send(Begun(restore=restore, restore_ms=t_restore * 1e3))
        schema = None if begin.schema is None else pa.ipc.read_schema(pa.py_buffer(begin.schema))
        try:
            runtime.begin(task.watermark, task.processing_time)
            t_proc = 0.0
            while True:
                msg, body = conn.recv()
                if isinstance(msg, End):
                    break
                if not isinstance(msg, Data):
                    raise ProtocolError(f"unexpected message {tag_of(msg)} inside a batch")
                batch = pa.ipc.read_record_batch(pa.py_buffer(body), schema)
                tp = time.perf_counter()
                runtime.process(batch)
                t_proc += time.perf_counter() - tp
                conn.send(Ok())
            result = runtime.finish(task.batch, begin.attempt, task.new_lineage)
        except BaseException:
            runtime.close()  # a half-applied batch: the next one reloads its base version
            raise
        self.batches += 1
        result.restore = restore
        result.stats.update(
            {
                "restore_ms": t_restore * 1e3,
                "process_ms": t_proc * 1e3,
                "host_ms": (time.perf_counter() - t0) * 1e3,
                "host_pid": float(os.getpid()),
            }
        )
        conn.send(Done(result=result))

    def hello(self) -> HostHello:
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        runtime = self.runtime
        return HostHello(
            proto=PROTOCOL_VERSION,
            location=self.location,
            version=self.version,
            lineage=None if runtime is None else runtime.lineage,
            rlimit_as=None if soft == resource.RLIM_INFINITY else soft,
            started=self.started,
        )

    def close(self) -> None:
        if self.runtime is not None:
            self.runtime.close()
            self.runtime = None


def _listen(
    host: StateHost, paths: dict[str, str], status: list[int | None]
) -> list[tuple[socket.socket, str]] | None:
    """The host's listeners (its Unix socket, and TCP unless off), its location set; None
    after reporting why it cannot listen."""
    spec = host.spec
    try:
        listener = listen_unix(paths["sock"], 128)
    except OSError as exc:
        report(status, f"ERROR cannot bind {paths['sock']}: {exc}")
        return None
    listeners = [(listener, "unix")]
    tcp_address = None
    if spec.bind:
        try:
            tcp, tcp_address = bind_tcp(spec.bind)
        except (OSError, ValueError) as exc:
            report(status, f"ERROR cannot listen on TCP {spec.bind!r}: {exc}")
            return None
        tcp.listen(128)
        listeners.append((tcp, "tcp"))
    host.location = msgspec.structs.replace(
        host.location, node=node_id(spec.run_dir), unix=paths["sock"], tcp=tcp_address
    )
    return listeners


def serve(
    spec: HostSpec, status_fd: int | None, secret: bytes | None = None, pin: JobPin | None = None
) -> int:
    """The host's main loop; ``status_fd`` is the pipe to the spawner (READY or ERROR);
    ``secret`` the query run's secret (default: the node's, :func:`~streamstate.spark.wire.
    security.node_secret`); ``pin`` the job it serves (None: no batch).

    Threads: the acceptor (:mod:`streamstate.spark.host.acceptor`) accepts and authenticates
    connections concurrently; this one hands each authenticated connection, Unix ones first,
    to a thread of its own (at most :data:`~streamstate.spark.host.connections.MAX_CONNECTIONS`
    at once). Only those count as use
    for ``idle_timeout``."""
    status: list[int | None] = [status_fd]
    paths = host_paths(spec.id, spec.run_dir)
    rc = claim(spec, paths, status)
    if rc:
        return rc
    if secret is None:
        secret = node_secret(spec.run_dir)
    host = StateHost(spec, pin)
    listeners = _listen(host, paths, status)
    if listeners is None:
        return 5
    socket_file = SocketFile(paths["sock"])

    import cloudpickle  # noqa: F401 - warm the imports before READY
    import pyarrow  # noqa: F401

    import streamstate.spark.subtask  # noqa: F401

    stop: dict[str, str | None] = {"why": None}

    def on_term(signum: int, frame: Any) -> None:
        stop["why"] = f"signal {signum}"

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    refusals = RefusalLog(log_line, limit=spec.refusal_log_limit)
    acceptor = _acceptor(spec, listeners, secret, refusals)
    stopping = threading.Event()
    front = threading.Thread(
        target=acceptor.run, args=(stopping,), name="streamstate-acceptor", daemon=True
    )
    front.start()
    log_line(
        f"ready: {spec.job} {spec.operator} subtask {spec.subtask}/{spec.parallelism} run "
        f"{spec.run or '-'} node {host.location.node} tcp {host.location.tcp or 'off'}"
    )
    report(status, "READY")
    threading.Thread(target=warm_imports, name="streamstate-warm-imports", daemon=True).start()
    threading.Thread(
        target=clean_run_dir, args=(spec.run_dir, log_line), name="streamstate-clean", daemon=True
    ).start()
    try:
        serve_connections(host, acceptor, socket_file, refusals, stop)
    finally:
        socket_file.unlink()
        stopping.set()
        front.join(timeout=2.0)
        _close(host, acceptor, refusals, stop["why"])
    return 0


def _acceptor(
    spec: HostSpec, listeners: list[tuple[socket.socket, str]], secret: bytes, refusals: RefusalLog
) -> Acceptor:
    """The acceptor of the host's listeners, with the spec's limits."""
    return Acceptor(
        listeners,
        secret,
        spec.id,
        refusals,
        deadline=spec.auth_timeout,
        max_pending=spec.max_pending,
        max_per_address=spec.max_pending_per_address,
        io_timeout=spec.io_timeout,
        max_frame=spec.max_frame,
        frame_timeout=spec.frame_timeout,
    )


def _close(host: StateHost, acceptor: Acceptor, refusals: RefusalLog, why: str | None) -> None:
    """The host's end once its listeners stopped: connections not served yet closed, the ones
    served aborted, the state closed after the batch that runs (if it ends in time)."""
    while not acceptor.ready.empty():
        with contextlib.suppress(queue.Empty):
            acceptor.ready.get_nowait()[2].conn.close()
    host.abort_connections()
    # a batch busy computing ends at its next read or write; its state is closed after it
    ended = host.batch_lock.acquire(timeout=host.spec.frame_timeout)
    refusals.tick(final=True)
    log_line(
        f"exit: {why}; version {host.version}, {host.batches} batches, "
        f"{refusals.total} connections or frames refused"
    )
    if ended:
        host.close()


def _abort(conn: Connection) -> None:
    """Shut ``conn`` down: the thread serving it fails at its next read or write."""
    with contextlib.suppress(OSError):
        conn.sock.shutdown(socket.SHUT_RDWR)


def main(argv: list[str]) -> int:
    """``python -m streamstate.spark.host.state_host serve <spec json> [status fd]``; the secret
    (hex) and the job pin come on stdin, never on the command line (visible to every user in
    ``ps``)."""
    if len(argv) < 2 or argv[0] != "serve":
        print(__doc__, file=sys.stderr)
        return 2
    spec = msgspec.convert(json.loads(argv[1]), HostSpec)
    fd = int(argv[2]) if len(argv) > 2 else None
    secret, pin = read_stdin()
    # double fork: the launcher exits at once (its parent reaps it) and the host is re-parented
    # to init, so it never becomes a zombie child of a long-lived Python worker
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    return serve(spec, fd, secret, pin)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
