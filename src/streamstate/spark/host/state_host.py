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
which runs all pending handshakes at once (:mod:`streamstate.spark.host.acceptor`); the main thread
serves authenticated connections one at a time, Unix ones first, over sealed frames
(:mod:`streamstate.spark.wire.channel`). A refused connection or frame is logged (rate-limited) and
closed and the host goes on serving. A host serves only the job it was started for
(:class:`JobPin`).

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
import fcntl
import json
import os
import queue
import resource
import select
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any

import msgspec

from streamstate.spark.host.acceptor import Acceptor, RefusalLog
from streamstate.spark.wire.hosts import HostSpec, JobPin, host_paths, proc_start_time
from streamstate.spark.wire.network import bind_tcp
from streamstate.spark.wire.protocol import (
    PROTOCOL_VERSION,
    Connection,
    ProtocolError,
)
from streamstate.spark.wire.security import node_id, node_secret
from streamstate.spark.wire.step import Begin

__all__ = [
    "StateHost",
    "clean_stale_host_files",
    "hold_lock",
    "listen_unix",
    "serve",
    "warm_imports",
]


#: files of a host that exited are removed once this old (seconds since last written)...
STALE_AFTER_S = 3600.0
#: ... and its log once this old (it tells what happened to a run, for a while)
KEEP_LOGS_S = 7 * 86400.0


def clean_stale_host_files(
    directory: str,
    *,
    stale_after: float = STALE_AFTER_S,
    keep_logs: float = KEEP_LOGS_S,
    now: float | None = None,
) -> list[str]:
    """Remove what hosts that no longer run left in a node's run directory: the ``.lock``,
    ``.spawn`` and ``.sock`` files and the ``.d`` working directory (RocksDB) of every host
    whose lock is free and whose files were last written ``stale_after`` seconds ago or
    earlier, and its ``.log`` once ``keep_logs`` seconds old. A host that runs holds its lock
    (and a task that starts one holds the spawn lock), so neither is touched. Returns the paths
    removed."""
    import shutil

    now = time.time() if now is None else now
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    ids = {n.rsplit(".", 1)[0] for n in names if n.endswith((".lock", ".spawn", ".log"))}
    for hid in sorted(ids):
        paths = host_paths(hid, directory)
        try:
            newest = max(
                os.stat(paths[k]).st_mtime
                for k in ("lock", "spawn", "log")
                if os.path.exists(paths[k])
            )
        except (OSError, ValueError):
            continue
        if now - newest < stale_after:
            continue
        held = []
        try:
            for k in ("spawn", "lock"):
                if not os.path.exists(paths[k]):
                    continue
                f = open(paths[k], "a")  # noqa: SIM115 - closed below
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    f.close()
                    raise
                held.append(f)
            for k in ("sock", "lock", "spawn"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(paths[k])
                    removed.append(paths[k])
            if os.path.isdir(paths["local"]):
                shutil.rmtree(paths["local"], ignore_errors=True)
                removed.append(paths["local"])
            if os.path.exists(paths["log"]) and now - newest >= keep_logs:
                os.unlink(paths["log"])
                removed.append(paths["log"])
        except BlockingIOError:
            continue  # a host runs, or a task is starting it
        finally:
            for f in held:
                f.close()
    return removed


def _log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} host[{os.getpid()}] {msg}", flush=True)


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
        self.location: dict[str, Any] = {"id": spec.id, "node": None, "tcp": None, "unix": None}

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

    def check_begin(self, header: dict[str, Any]) -> tuple[Begin, Any]:
        """The BEGIN message and its JobSpec, validated as plain data (msgpack and msgspec
        types: nothing is unpickled or loaded) before the batch touches any state."""
        from streamstate.spark.job import JobSpec

        try:
            begin = msgspec.convert(header, Begin)
            job = msgspec.msgpack.decode(begin.task.job, type=JobSpec)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise ProtocolError(f"malformed BEGIN: {exc}") from exc
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
        return begin, job

    def run_batch(self, conn: Connection, begin: Begin, job: Any) -> None:
        import pyarrow as pa

        t0 = time.perf_counter()
        runtime = self._runtime_for(job)
        task = begin.task
        restore = runtime.prepare(task.base, task.lineage, begin.base_attempt)
        t_restore = time.perf_counter() - t0
        conn.send({"t": "BEGUN", "restore": restore, "restore_ms": t_restore * 1e3})
        schema = None if begin.schema is None else pa.ipc.read_schema(pa.py_buffer(begin.schema))
        try:
            runtime.begin(task.watermark, task.processing_time)
            t_proc = 0.0
            while True:
                msg, body = conn.recv()
                kind = msg["t"]
                if kind == "DATA":
                    batch = pa.ipc.read_record_batch(pa.py_buffer(body), schema)
                    tp = time.perf_counter()
                    runtime.process(batch)
                    t_proc += time.perf_counter() - tp
                    conn.send({"t": "OK"})
                elif kind == "END":
                    break
                else:
                    raise ProtocolError(f"unexpected message {kind} inside a batch")
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
        conn.send({"t": "DONE", "result": msgspec.msgpack.encode(result)})

    def hello(self) -> dict[str, Any]:
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        runtime = self.runtime
        return {
            "t": "HELLO",
            "proto": PROTOCOL_VERSION,
            "pid": os.getpid(),
            "version": self.version,
            "lineage": None if runtime is None else runtime.lineage,
            "rlimit_as": None if soft == resource.RLIM_INFINITY else soft,
            "started": self.started,
            **self.location,
        }

    def close(self) -> None:
        if self.runtime is not None:
            self.runtime.close()
            self.runtime = None


def hold_lock(path: str) -> tuple[Any, str]:
    """Take the ``flock`` of ``path`` for the life of the process and write this pid into it:
    (the open file, ""), or (None, what the holder wrote: its pid) if another process holds it."""
    lock = open(path, "a+")  # noqa: SIM115 - held for the life of the process
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip()
        lock.close()
        return None, holder
    lock.seek(0)
    lock.truncate()
    lock.write(str(os.getpid()))
    lock.flush()
    return lock, ""


def listen_unix(path: str, backlog: int) -> socket.socket:
    """A listening Unix socket at ``path``, the file the owner's only (0600); a socket file left
    there by a dead process is replaced (the caller holds the lock that says so). Raises
    OSError if it cannot bind."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        listener.bind(path)
    except OSError:
        listener.close()
        raise
    finally:
        os.umask(old_umask)
    listener.listen(backlog)
    return listener


def _report(status_fd: list[int | None], msg: str) -> None:
    fd = status_fd[0]
    if fd is None:
        return
    status_fd[0] = None
    try:
        os.write(fd, (msg + "\n").encode())
        os.close(fd)
    except OSError:
        pass


def _watch_executor(pid: int, sock_path: str) -> None:
    """Exit as soon as the executor JVM ``pid`` exits, even in the middle of a batch (a thread
    waiting on a pidfd): a host must never outlive its executor."""
    pidfd = os.pidfd_open(pid)

    def watch() -> None:
        select.select([pidfd], [], [])
        _log(f"exit: the executor JVM {pid} exited")
        with contextlib.suppress(OSError):
            os.unlink(sock_path)
        os._exit(0)

    threading.Thread(target=watch, name="streamstate-executor-watch", daemon=True).start()


def serve(
    spec: HostSpec, status_fd: int | None, secret: bytes | None = None, pin: JobPin | None = None
) -> int:
    """The host's main loop; ``status_fd`` is the pipe to the spawner (READY or ERROR);
    ``secret`` the query run's secret (default: the node's, :func:`~streamstate.spark.wire.
    security.node_secret`); ``pin`` the job it serves (None: no batch).

    Two threads: the acceptor (:mod:`streamstate.spark.host.acceptor`) accepts and authenticates
    connections concurrently; this one serves authenticated connections one at a time, Unix
    ones first. Only those count as use for ``idle_timeout``."""
    status: list[int | None] = [status_fd]
    paths = host_paths(spec.id, spec.run_dir)
    lock, holder = hold_lock(paths["lock"])
    if lock is None:
        _report(
            status,
            f"ERROR another host (pid {holder or '?'}) holds {paths['lock']} but its socket "
            "does not accept connections",
        )
        return 3
    if spec.watch_pid:
        if proc_start_time(spec.watch_pid) != spec.watch_start:
            _report(status, f"ERROR the executor process {spec.watch_pid} is already gone")
            return 4
        _watch_executor(spec.watch_pid, paths["sock"])
    if secret is None:
        secret = node_secret(spec.run_dir)
    try:
        listener = listen_unix(paths["sock"], 128)
    except OSError as exc:
        _report(status, f"ERROR cannot bind {paths['sock']}: {exc}")
        return 5
    sock_inode = os.stat(paths["sock"]).st_ino
    host = StateHost(spec, pin)
    host.location.update(node=node_id(spec.run_dir), unix=paths["sock"])
    listeners = [(listener, "unix")]
    if spec.bind:
        try:
            tcp, host.location["tcp"] = bind_tcp(spec.bind)
        except (OSError, ValueError) as exc:
            _report(status, f"ERROR cannot listen on TCP {spec.bind!r}: {exc}")
            return 5
        tcp.listen(128)
        listeners.append((tcp, "tcp"))

    import cloudpickle  # noqa: F401 - warm the imports before READY
    import pyarrow  # noqa: F401

    import streamstate.spark.subtask  # noqa: F401

    stop: dict[str, str | None] = {"why": None}

    def on_term(signum: int, frame: Any) -> None:
        stop["why"] = f"signal {signum}"

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    refusals = RefusalLog(_log, limit=spec.refusal_log_limit)
    acceptor = Acceptor(
        listeners,
        secret,
        spec.id,
        refusals,
        deadline=spec.auth_timeout,
        max_pending=spec.max_pending,
        max_per_address=spec.max_pending_per_address,
        io_timeout=spec.io_timeout,
        max_frame=spec.max_frame,
    )
    stopping = threading.Event()
    front = threading.Thread(
        target=acceptor.run, args=(stopping,), name="streamstate-acceptor", daemon=True
    )
    front.start()
    last = time.monotonic()
    _log(
        f"ready: {spec.job} {spec.operator} subtask {spec.subtask}/{spec.parallelism} run "
        f"{spec.run or '-'} node {host.location['node']} tcp {host.location['tcp'] or 'off'}"
    )
    _report(status, "READY")
    threading.Thread(target=warm_imports, name="streamstate-warm-imports", daemon=True).start()
    threading.Thread(
        target=_clean_run_dir, args=(spec.run_dir,), name="streamstate-clean", daemon=True
    ).start()

    def unlink_socket() -> None:
        try:
            if os.stat(paths["sock"]).st_ino == sock_inode:
                os.unlink(paths["sock"])
        except FileNotFoundError:
            pass

    try:
        while stop["why"] is None:
            left = spec.idle_timeout - (time.monotonic() - last)
            if left <= 0:
                stop["why"] = "idle timeout"
                break
            try:
                _, _, ready = acceptor.ready.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            try:
                reason = _handle(host, ready.conn, unlink_socket, ready.peer, refusals)
            finally:
                ready.conn.close()
                last = time.monotonic()
            if reason is not None:
                stop["why"] = reason
    finally:
        unlink_socket()
        stopping.set()
        front.join(timeout=2.0)
        while not acceptor.ready.empty():
            with contextlib.suppress(queue.Empty):
                acceptor.ready.get_nowait()[2].conn.close()
        refusals.tick(final=True)
        _log(
            f"exit: {stop['why']}; version {host.version}, {host.batches} batches, "
            f"{refusals.total} connections or frames refused"
        )
        host.close()
    return 0


def _handle(
    host: StateHost, conn: Connection, unlink_socket: Any, peer: str, refusals: RefusalLog
) -> str | None:
    """Serve one authenticated connection; returns a reason to stop the host, or None."""
    while True:
        try:
            msg, _ = conn.recv()
        except ProtocolError as exc:
            refusals(peer, "frame", exc)
            return None
        except (EOFError, ConnectionError, TimeoutError, OSError):
            return None
        kind = msg.get("t")
        if kind == "HELLO":
            if msg.get("proto") != PROTOCOL_VERSION:
                refusals(peer, "client", f"protocol {msg.get('proto')!r}")
                _send_error(conn, ProtocolError(f"protocol {msg.get('proto')!r} is not mine"))
                return None
            conn.send(host.hello())
        elif kind == "PING":
            conn.send({"t": "PONG", "version": host.version})
        elif kind == "SHUTDOWN":
            pid = msg.get("pid")
            if pid is not None and pid != os.getpid():
                # meant for an earlier host of this subtask at this address (a reused port)
                conn.send({"t": "BYE", "ignored": True})
                return None
            unlink_socket()  # no new connection reaches a host that is going away
            conn.send({"t": "BYE"})
            return "shutdown: " + str(msg.get("reason", ""))
        elif kind == "BEGIN":
            try:
                begin, job = host.check_begin(msg)
            except ProtocolError as exc:
                refusals(peer, "frame", exc)
                _send_error(conn, exc)
                return None
            try:
                host.run_batch(conn, begin, job)
            except ProtocolError as exc:  # a frame inside the batch: the channel is not safe
                refusals(peer, "frame", f"in batch {begin.task.batch}: {exc}")
                return None
            except (EOFError, ConnectionError, TimeoutError) as exc:
                _log(f"batch {begin.task.batch} aborted by the task ({exc!r})")
                return None
            except Exception as exc:
                _log(f"batch {begin.task.batch} failed: {exc!r}")
                spec = host.spec
                _send_error(
                    conn,
                    exc,
                    f"in the state host of {spec.operator!r} subtask {spec.subtask} "
                    f"(micro-batch {begin.task.batch})",
                )
                return None
        else:
            refusals(peer, "frame", f"unknown message {str(kind)[:40]!r}")
            _send_error(conn, ProtocolError(f"unknown message {str(kind)[:40]!r}"))
            return None


def _send_error(conn: Connection, exc: BaseException, where: str = "") -> None:
    """Report ``exc`` to the client. A function error (:func:`~streamstate.spark.failures.
    is_function_error`) carries its ``report`` as plain data: the task hands it to the driver
    instead of failing (Spark does not retry a deterministic error)."""
    from streamstate.spark.failures import is_function_error, task_error_report

    message: dict[str, Any] = {
        "t": "ERROR",
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": traceback.format_exc(),
    }
    if where and is_function_error(exc):
        message["report"] = task_error_report(exc, where)
    with contextlib.suppress(OSError, ProtocolError):
        conn.send(message)


def _read_stdin() -> tuple[bytes | None, JobPin | None]:
    """What the spawner writes on stdin: the secret (hex, one line; none: the node's) and the
    job this host serves (its :class:`JobPin` as JSON, one line; none: no batch)."""
    data = b""
    while True:
        chunk = os.read(0, 4096)
        if not chunk or len(data) > 1 << 20:
            break
        data += chunk
    lines = data.decode().split("\n")
    secret = bytes.fromhex(lines[0].strip()) if lines[0].strip() else None
    pin = None
    if len(lines) > 1 and lines[1].strip():
        pin = msgspec.json.decode(lines[1].strip().encode(), type=JobPin)
    return secret, pin


#: what the first micro-batch would otherwise import (about 1 s on a busy node): the state
#: backends, the checkpoint writer and reader, Parquet staging, Arrow compute
_FIRST_BATCH_MODULES = (
    "pyarrow.compute",
    "pyarrow.parquet",
    # the checkpoint storage's file systems: opened by the first restore
    "fsspec",
    "fsspec.implementations.local",
    "streamstate.runtime.operator",
    "streamstate.backends.heap.backend",
    "streamstate.checkpoint.writer",
    "streamstate.checkpoint.restore",
)

#: imported after the others when pandas is installed: pyarrow imports pandas (0.3-0.7 s) the
#: first time it converts Python values (``pa.array``, any type), which is the first step that
#: emits outputs, often the first window firing: a latency spike in the middle of a run
_FIRST_OUTPUT_MODULES = ("pandas", "pyarrow.pandas_compat")


def _clean_run_dir(directory: str) -> None:
    """What hosts that exited long ago left in this node's run directory goes (every host
    start sweeps it: the directory does not grow with every query run)."""
    try:
        removed = clean_stale_host_files(directory)
    except Exception as exc:  # never worth failing a host for
        _log(f"cleaning {directory} failed: {exc!r}")
        return
    if removed:
        _log(f"removed {len(removed)} files of hosts that exited in {directory}")


def warm_imports() -> None:
    """Import the first micro-batch's modules: a host does it after READY, while the task
    connects and streams (it answers at once, and a batch that needs a module still loading
    waits for it, on the import lock, instead of loading it itself); the host zygote before it
    forks hosts (:mod:`streamstate.spark.host.zygote`)."""
    import importlib
    import importlib.util

    names = list(_FIRST_BATCH_MODULES)
    if importlib.util.find_spec("pandas") is not None:  # pyarrow goes without it too
        names += _FIRST_OUTPUT_MODULES
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # the batch imports it again and reports why
            _log(f"warming {name} failed: {exc!r}")


def main(argv: list[str]) -> int:
    """``python -m streamstate.spark.host.state_host serve <spec json> [status fd]``; the secret
    (hex) and the job pin come on stdin, never on the command line (visible to every user in
    ``ps``)."""
    if len(argv) < 2 or argv[0] != "serve":
        print(__doc__, file=sys.stderr)
        return 2
    spec = msgspec.convert(json.loads(argv[1]), HostSpec)
    fd = int(argv[2]) if len(argv) > 2 else None
    secret, pin = _read_stdin()
    # double fork: the launcher exits at once (its parent reaps it) and the host is re-parented
    # to init, so it never becomes a zombie child of a long-lived Python worker
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    return serve(spec, fd, secret, pin)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
