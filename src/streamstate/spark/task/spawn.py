"""Starting a state host on this node, from a task (or the driver): its spawner's side.

A host is started by the first client that cannot reach it, under the host's spawn ``flock``
(:func:`~streamstate.spark.task.host_client.connect`): :func:`spawn` has the host zygote of
this node and executor JVM fork it (:mod:`streamstate.spark.host.zygote`; the zygote is started
first if there is none), or else starts ``python -m streamstate.spark.host.state_host serve
...`` as a new interpreter, and waits for its ``READY`` line. The host's spec goes on its
command line, the secret and the job it serves (:class:`~streamstate.spark.wire.hosts.JobPin`)
on its stdin. A host that cannot start says why (``ERROR <reason>`` plus the tail of its log)
in a :class:`~streamstate.errors.StateHostError`, which fails the Spark task (and Spark
retries it).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import selectors
import socket
import subprocess
import sys
import time

import msgspec

from streamstate.errors import StateHostError
from streamstate.spark.wire.hosts import (
    ZYGOTE_SWITCH,
    ForkRequest,
    HostSpec,
    JobPin,
    host_paths,
    zygote_id,
)
from streamstate.spark.wire.security import node_secret, peer_uid

__all__ = ["find_jvm_pid", "log_tail", "spawn"]

log = logging.getLogger(__name__)


def find_jvm_pid() -> int | None:
    """The nearest ancestor process named ``java`` (the executor JVM; the driver's in local
    mode), or None."""
    pid = os.getppid()
    for _ in range(10):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "java":
                    return pid
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            return None
        if pid <= 1:
            return None
    return None


def log_tail(path: str, limit: int = 3000) -> str:
    """The last ``limit`` bytes of a log file as text (empty if it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def spawn(
    spec: HostSpec,
    timeout: float = 120.0,
    pythonpath: str | None = None,
    secret: bytes | None = None,
    job: bytes | None = None,
) -> float:
    """Start the host of ``spec`` and wait until it is ready; returns the seconds it took.

    ``pythonpath`` is put first on the host's PYTHONPATH (default: the directory this
    ``streamstate`` was imported from). ``secret`` (default: the node's) and the pin of
    ``job`` (an encoded :class:`~streamstate.spark.job.JobSpec`: the only job the host will
    serve; None: it serves no batch) reach the host on its stdin."""
    from streamstate.spark.job import JobSpec, src_path

    paths = host_paths(spec.id, spec.run_dir)
    env = dict(os.environ)
    # the host imports the same streamstate as this process (a source checkout included)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (pythonpath or src_path(), env.get("PYTHONPATH", "")) if p
    )
    secret = secret or node_secret(spec.run_dir)
    pin = b""
    if job is not None:
        pin = msgspec.json.encode(JobPin.of(msgspec.msgpack.decode(job, type=JobSpec)))
    read_fd, write_fd = os.pipe()
    t0 = time.perf_counter()
    try:
        if not _fork_from_zygote(spec, env, write_fd, secret, pin, timeout):
            _launch(spec, env, write_fd, secret, pin)
    finally:
        os.close(write_fd)
    line = _read_status(read_fd, timeout)
    if line is None:
        raise StateHostError(
            f"the state host of {spec.operator!r} subtask {spec.subtask} did not start "
            f"within {timeout:.0f} s; see {paths['log']}"
        )
    if line != "READY":
        raise StateHostError(
            f"the state host of {spec.operator!r} subtask {spec.subtask} (job {spec.job}) failed "
            f"to start: {line or 'it exited without a status'}\n--- {paths['log']} (tail) ---\n"
            f"{log_tail(paths['log'])}"
        )
    return time.perf_counter() - t0


def _launch(spec: HostSpec, env: dict[str, str], status_fd: int, secret: bytes, pin: bytes) -> None:
    """Start the host as a new interpreter (it double-forks; its status comes on
    ``status_fd``); the secret and the pin go on its stdin."""
    launcher = _start_detached(
        "streamstate.spark.host.state_host",
        ["serve", json.dumps(msgspec.to_builtins(spec)), str(status_fd)],
        host_paths(spec.id, spec.run_dir)["log"],
        status_fd,
        env,
        stdin=secret.hex().encode() + b"\n" + pin + b"\n",
    )
    launcher.wait()  # it exits right after forking the host


def _start_detached(
    module: str,
    args: list[str],
    log_path: str,
    status_fd: int,
    env: dict[str, str],
    stdin: bytes | None = None,
) -> subprocess.Popen[bytes]:
    """``python -m module args...`` in a session of its own, in ``/``, its output appended to
    ``log_path``, the pipe ``status_fd`` its only inherited descriptor, ``stdin`` written to it
    (None: no stdin)."""
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=log_file,
            stderr=log_file,
            pass_fds=(status_fd,),
            close_fds=True,
            start_new_session=True,
            cwd="/",
            env=env,
        )
    if proc.stdin is not None:
        try:
            proc.stdin.write(stdin or b"")
            proc.stdin.close()
        except BrokenPipeError:
            pass  # it died at once: the status pipe says why
    return proc


def _read_status(read_fd: int, timeout: float) -> str | None:
    """The status line a starting process writes on the pipe ``read_fd`` (closed here): READY,
    ERROR <reason>, or empty if it exited without one; None if none came within ``timeout``."""
    selector = selectors.DefaultSelector()
    selector.register(read_fd, selectors.EVENT_READ)
    msg = b""
    deadline = time.monotonic() + timeout
    try:
        while not msg.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                return None
            chunk = os.read(read_fd, 4096)
            if not chunk:
                break
            msg += chunk
    finally:
        selector.close()
        os.close(read_fd)
    return msg.decode(errors="replace").strip()


# ---- the host zygote (streamstate.spark.host.zygote) -------------------------------------------


def _fork_from_zygote(
    spec: HostSpec, env: dict[str, str], status_fd: int, secret: bytes, pin: bytes, timeout: float
) -> bool:
    """Have the host zygote of this node, JVM and interpreter fork the host of ``spec``
    (starting the zygote if there is none); False if it cannot, or the spec does not ask for it,
    and the host is started as a new interpreter. Only hosts that watch a JVM: the zygote lives
    no longer than that JVM."""
    if (
        not spec.zygote
        or spec.watch_pid is None
        or spec.watch_start is None
        or os.environ.get(ZYGOTE_SWITCH) == "0"
    ):
        return False
    zid = zygote_id(env, spec.watch_pid, spec.watch_start)
    request = msgspec.msgpack.encode(
        ForkRequest(
            spec=spec,
            secret=secret,
            pin=pin,
            env=env,
        )
    )
    log_path = host_paths(spec.id, spec.run_dir)["log"]
    if _request_fork(spec.run_dir, zid, request, status_fd, log_path):
        return True
    return _start_zygote(spec, env, zid, min(timeout, 60.0)) and _request_fork(
        spec.run_dir, zid, request, status_fd, log_path
    )


def _request_fork(run_dir: str, zid: str, request: bytes, status_fd: int, log_path: str) -> bool:
    """Send the zygote ``zid`` the request; False if it could not be sent (no zygote) or the
    zygote refused it, and the spawner starts the host itself. Once the zygote took it, the
    status pipe decides, never a second host (a zygote that died before forking closed its copy
    of the pipe, and the spawner reads that the host exited without a status)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10.0)
    try:
        sock.connect(host_paths(zid, run_dir)["sock"])
        if peer_uid(sock) != os.getuid():
            return False
        with open(log_path, "ab") as log_file:
            socket.send_fds(sock, [len(request).to_bytes(4, "big")], [status_fd, log_file.fileno()])
        sock.sendall(request)
        reply = b""
        with contextlib.suppress(OSError):
            while not reply.endswith(b"\n"):
                chunk = sock.recv(256)
                if not chunk:
                    break
                reply += chunk
        if reply.startswith(b"REFUSED"):
            log.warning("the state-host zygote %s refused a host: %s", zid, reply.decode().strip())
            return False
        return True
    except OSError:
        return False
    finally:
        sock.close()


def _start_zygote(spec: HostSpec, env: dict[str, str], zid: str, timeout: float) -> bool:
    """Start the zygote ``zid`` unless one runs (or another spawner started it meanwhile);
    True once it is READY."""
    paths = host_paths(zid, spec.run_dir)
    with open(paths["spawn"], "a") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # a spawner starting it holds this
        if _lock_held(paths["lock"]):
            return True  # a zygote runs
        read_fd, write_fd = os.pipe()
        try:
            launcher = _start_detached(
                "streamstate.spark.host.zygote",
                [
                    spec.run_dir,
                    zid,
                    str(spec.watch_pid),
                    str(spec.watch_start),
                    str(spec.idle_timeout),
                    str(write_fd),
                ],
                paths["log"],
                write_fd,
                env,
            )
        finally:
            os.close(write_fd)
        launcher.wait()  # it exits right after forking the zygote
        status = _read_status(read_fd, timeout)
        if status != "READY":
            log.warning(
                "the state-host zygote %s did not start (%s; see %s): hosts start as new "
                "interpreters",
                zid,
                f"no answer within {timeout:.0f} s" if status is None else status or "no status",
                paths["log"],
            )
        return status == "READY"


def _lock_held(path: str) -> bool:
    """True if a live process holds the ``flock`` of ``path``."""
    try:
        f = open(path, "a")  # noqa: SIM115 - closed below
    except OSError:
        return False
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False
