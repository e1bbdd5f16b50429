"""How a state host starts, before it serves: what its spawner hands it (the secret and the job
pin on stdin, :func:`read_stdin`; the status pipe, :func:`report`), its lock and the executor
JVM it must not outlive (:func:`claim`, :func:`watch_executor`), and the modules its first
batch needs (:func:`warm_imports`, which the host zygote runs before it forks hosts,
:mod:`streamstate.spark.host.zygote`).
Everything a host logs is one line of its log file (:func:`log_line`).
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time

import msgspec

from streamstate.spark.host.run_dir import hold_lock
from streamstate.spark.wire.hosts import HostSpec, JobPin, proc_start_time

__all__ = ["claim", "log_line", "read_stdin", "report", "warm_imports", "watch_executor"]


def log_line(msg: str) -> None:
    """One line of the host's log (its stdout)."""
    print(f"{time.strftime('%H:%M:%S')} host[{os.getpid()}] {msg}", flush=True)


def report(status_fd: list[int | None], msg: str) -> None:
    """Write the status line ``msg`` (``READY``, ``ERROR <reason>``) on the spawner's pipe
    ``status_fd[0]``, once: the pipe is closed and forgotten."""
    fd = status_fd[0]
    if fd is None:
        return
    status_fd[0] = None
    try:
        os.write(fd, (msg + "\n").encode())
        os.close(fd)
    except OSError:
        pass


def watch_executor(pid: int, sock_path: str) -> None:
    """Exit as soon as the executor JVM ``pid`` exits, even in the middle of a batch (a thread
    waiting on a pidfd): a host must never outlive its executor."""
    pidfd = os.pidfd_open(pid)

    def watch() -> None:
        select.select([pidfd], [], [])
        log_line(f"exit: the executor JVM {pid} exited")
        with contextlib.suppress(OSError):
            os.unlink(sock_path)
        os._exit(0)

    threading.Thread(target=watch, name="streamstate-executor-watch", daemon=True).start()


def read_stdin() -> tuple[bytes | None, JobPin | None]:
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
            log_line(f"warming {name} failed: {exc!r}")


def claim(spec: HostSpec, paths: dict[str, str], status: list[int | None]) -> int:
    """Take the host's lock and watch its executor; 0, or the exit status after reporting
    why the host cannot run."""
    lock, holder = hold_lock(paths["lock"])
    if lock is None:
        report(
            status,
            f"ERROR another host (pid {holder or '?'}) holds {paths['lock']} but its socket "
            "does not accept connections",
        )
        return 3
    if spec.watch_pid:
        if proc_start_time(spec.watch_pid) != spec.watch_start:
            report(status, f"ERROR the executor process {spec.watch_pid} is already gone")
            return 4
        watch_executor(spec.watch_pid, paths["sock"])
    return 0
