"""Only clients of the same query run may talk to a state host, and only about its own job.

Every attack below reaches a running host over its Unix socket and over TCP: each is refused
with a line in the host's log naming the peer, nothing it names is loaded (the "function" of
the attacker's job would create a marker file when unpickled), and the host goes on serving its
job. A man in the middle who records, changes, replays, reorders, drops or injects sealed frames
of a real client gets the same.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pwd
import shutil
import socket
import stat
import statistics
import struct
import subprocess
import threading
import time
from typing import Any

import msgspec
import pytest

from streamstate.spark.job import JobSpec
from streamstate.spark.subtask import job_storage
from streamstate.spark.task.host_client import connect, run_batch
from streamstate.spark.wire.channel import SecureChannel
from streamstate.spark.wire.hosts import host_paths
from streamstate.spark.wire.protocol import CLIENT_RECEIVES, Connection
from streamstate.spark.wire.results import BatchResult
from streamstate.spark.wire.security import MAGIC, client_handshake, new_secret, run_dir
from streamstate.spark.wire.step import Begin, StepTask
from support.hostile_peers import Peers
from support.spark_functions import Count
from support.state_host import Driver

pytestmark = pytest.mark.subprocess


def _touch(path: str) -> None:
    with open(path, "w") as f:
        f.write("the attacker's code ran")


class Trap:
    """Unpickling this runs code: it creates the marker file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (_touch, (self.marker,))


class Host(Driver):
    """A running host with a per-run secret, listening on a Unix socket and on TCP."""

    def __init__(self, tmp_path: Any, **spec: Any) -> None:
        super().__init__(tmp_path, Count())
        run = str(tmp_path / "node")
        os.makedirs(run, mode=0o700)
        self.other_node = str(tmp_path / "other-node")  # where "remote" tasks run
        os.makedirs(self.other_node, mode=0o700)
        self.secret = new_secret()
        self.spec = msgspec.structs.replace(
            self.spec,
            run_dir=run,
            bind="127.0.0.1",
            run="r1",
            **{"auth_timeout": 2.0, "refusal_log_limit": 1000, **spec},
        )
        self.marker = str(tmp_path / "attacker-code-ran")
        import cloudpickle

        blob = cloudpickle.dumps(Trap(self.marker))
        sha = hashlib.sha256(blob).hexdigest()
        self.trap_job = msgspec.structs.replace(
            self.job, function_path=f"functions/{sha}.pkl", function_sha=sha
        )
        job_storage(self.job).put_atomic(self.trap_job.function_path, blob)
        got = connect(self.spec, secret=self.secret, job=msgspec.msgpack.encode(self.job))
        assert got is not None
        got[0].close()
        self.location = got[1].location
        self.pid = self.location.pid
        self.tcp = self.location.tcp
        self.log_path = host_paths(self.spec.id, run)["log"]
        self.next_batch = 0
        #: the route each legit batch took, and why those that fell back did
        self.routes: list[str] = []
        self.fallbacks: list[str] = []

    def open_raw(self, transport: str) -> socket.socket:
        if transport == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(host_paths(self.spec.id, self.spec.run_dir)["sock"])
        else:
            host, _, port = self.tcp.rpartition(":")
            sock = socket.create_connection((host, int(port)))
        sock.settimeout(10)
        return sock

    def legit_batch(
        self, route: str = "unix", users: list[str] | None = None, via: str | None = None
    ) -> BatchResult:
        """A batch of the job itself (the host must still serve it, hot after the first): from
        this node (``unix``) or from another node over TCP (``tcp``, to ``via`` if given: a
        relay). The result's ``stats`` get the task's ``route`` and ``total_s``."""
        from support.state_host import step_task, user_batch

        users = users or ["a", "b", "a"]
        plan = self.log.plan(self.next_batch)
        self.attempt += 1
        step = step_task(self.job, plan)
        spec, location = self.spec, None
        if route == "tcp":
            spec = msgspec.structs.replace(spec, run_dir=self.other_node)
            location = msgspec.structs.replace(self.location, tcp=via or self.tcp)
        t0 = time.perf_counter()
        ack = run_batch(
            spec, step, self.attempt, [user_batch(users)], secret=self.secret, location=location
        )
        result = ack.result
        assert result is not None
        result.stats.update(total_s=time.perf_counter() - t0)
        self.log.commit(plan, [result])
        self.next_batch += 1
        self.routes.append(ack.timings.route)
        if ack.timings.fallback:
            self.fallbacks.append(ack.timings.fallback)
        return result

    def log_lines(self) -> list[str]:
        with open(self.log_path) as f:
            return f.read().splitlines()

    def close(self) -> None:
        from streamstate.spark.task.host_client import shutdown

        shutdown(self.spec, "test done", self.secret)
        shutdown(msgspec.structs.replace(self.spec, run_dir=self.other_node), "done", self.secret)
        self.log.close()


@pytest.fixture(scope="module")
def host(tmp_path_factory: Any) -> Any:
    h = Host(tmp_path_factory.mktemp("security"))
    assert h.legit_batch().restore == "empty"
    yield h
    h.close()


def _begin(job: JobSpec) -> Begin:
    task = StepTask(job=msgspec.msgpack.encode(job), batch=0, base=-1, lineage="x", new_lineage="y")
    return Begin(task=task, subtask=0, attempt=1)


def _begin_frame(job: JobSpec) -> bytes:
    """A BEGIN framed as protocol version 2 did: in clear."""
    head = msgspec.msgpack.encode(_begin(job))
    return struct.pack("<II", len(head), 0) + head


def _no_secret(h: Host, sock: socket.socket) -> None:
    """A client that does not know the handshake: the old protocol's BEGIN at once."""
    sock.sendall(_begin_frame(h.trap_job) + os.urandom(64))


def _wrong_secret(h: Host, sock: socket.socket) -> None:
    client_handshake(sock, new_secret(), h.spec.id)


def _truncated_handshake(h: Host, sock: socket.socket) -> None:
    sock.recv(40)
    sock.sendall(MAGIC + os.urandom(10))
    sock.shutdown(socket.SHUT_WR)


def _unauthenticated_huge_prefix(h: Host, sock: socket.socket) -> None:
    sock.sendall(struct.pack("<II", 0xFFFFFFFF, 0xFFFFFFFF) + os.urandom(64))


def _random_bytes(h: Host, sock: socket.socket) -> None:
    sock.sendall(os.urandom(4096))


def _huge_header(h: Host, sock: socket.socket) -> None:
    client_handshake(sock, h.secret, h.spec.id)  # even a client holding the secret
    sock.sendall(struct.pack("<I", 0xFFFFFFFF))


def _huge_body(h: Host, sock: socket.socket) -> None:
    keys = client_handshake(sock, h.secret, h.spec.id)
    SecureChannel(sock, keys)._send_record(struct.pack("<I", 0xFFFFFFF0) + b"\x81\xa1t\xa4DATA")


def _truncated_frame(h: Host, sock: socket.socket) -> None:
    keys = client_handshake(sock, h.secret, h.spec.id)
    recorder = _Recorder()
    Connection(recorder, keys, CLIENT_RECEIVES).send(_begin(h.trap_job))  # type: ignore[arg-type]
    sock.sendall(recorder.data[: len(recorder.data) // 2])
    sock.shutdown(socket.SHUT_WR)


def _malformed_begin(h: Host, sock: socket.socket) -> None:
    keys = client_handshake(sock, h.secret, h.spec.id)
    Connection(sock, keys, CLIENT_RECEIVES).send(
        {"t": "BEGIN", "job": b"\x93not a job", "batch": "zero"}
    )


def _plaintext_after_auth(h: Host, sock: socket.socket) -> None:
    """A relay that let a real handshake through, then speaks for the task in clear."""
    client_handshake(sock, h.secret, h.spec.id)
    sock.sendall(_begin_frame(h.trap_job))


def _another_function(h: Host, sock: socket.socket) -> None:
    """A client holding the secret asks the host to run another function on its job."""
    keys = client_handshake(sock, h.secret, h.spec.id)
    Connection(sock, keys, CLIENT_RECEIVES).send(_begin(h.trap_job))


def _another_checkpoint(h: Host, sock: socket.socket) -> None:
    keys = client_handshake(sock, h.secret, h.spec.id)
    job = msgspec.structs.replace(h.job, checkpoint_url=h.job.checkpoint_url + "-theirs")
    Connection(sock, keys, CLIENT_RECEIVES).send(_begin(job))


def _other_storage_options(h: Host, sock: socket.socket) -> None:
    keys = client_handshake(sock, h.secret, h.spec.id)
    job = msgspec.structs.replace(h.job, storage_options={"key": "theirs"})
    Connection(sock, keys, CLIENT_RECEIVES).send(_begin(job))


def _another(**fields: Any) -> Any:
    """A client holding the secret sends a BEGIN of the host's job with ``fields`` changed:
    each names something a host would load or restore (another job's savepoint, function
    file or local database)."""

    def attack(h: Host, sock: socket.socket) -> None:
        keys = client_handshake(sock, h.secret, h.spec.id)
        job = msgspec.structs.replace(h.job, **fields)
        Connection(sock, keys, CLIENT_RECEIVES).send(_begin(job))

    return attack


class _Recorder:
    def __init__(self) -> None:
        self.data = bytearray()

    def sendall(self, data: Any) -> None:
        self.data += bytes(data)


ATTACKS = {
    "no secret": (_no_secret, "is not a streamstate peer"),
    "wrong secret": (_wrong_secret, "wrong HMAC"),
    "truncated handshake": (_truncated_handshake, "truncated the client's handshake"),
    "oversized length prefix": (_unauthenticated_huge_prefix, "is not a streamstate peer"),
    "random bytes": (_random_bytes, "is not a streamstate peer"),
    "oversized header after auth": (_huge_header, "a sealed record of 4294967295 bytes"),
    "oversized body after auth": (_huge_body, "body length 4294967280 exceeds the limit"),
    "truncated frame after auth": (_truncated_frame, "truncated frame"),
    "malformed BEGIN after auth": (_malformed_begin, "malformed BEGIN"),
    "plaintext frame after auth": (_plaintext_after_auth, "did not verify"),
    "another function": (
        _another_function,
        "BEGIN for another job: its function_sha, function_path differ",
    ),
    "another checkpoint": (_another_checkpoint, "its checkpoint_url differ"),
    "other storage options": (_other_storage_options, "its storage_options differ"),
    "another function file": (
        _another(function_path="../theirs/functions/f.pkl"),
        "its function_path differ",
    ),
    "another initial state": (
        _another(initial_state="/elsewhere/theirs/savepoint-1"),
        "its initial_state differ",
    ),
    "another state backend": (_another(state_backend="rocksdb"), "its state_backend differ"),
    "another local database": (
        _another(state_backend_options={"working_dir": "/elsewhere/theirs"}),
        "its state_backend_options differ",
    ),
}


@pytest.mark.parametrize("transport", ["unix", "tcp"])
@pytest.mark.parametrize("attack", list(ATTACKS))
def test_an_attack_is_refused_logged_and_the_host_keeps_serving(
    host: Host, transport: str, attack: str
) -> None:
    run, expected = ATTACKS[attack]
    before = len(host.log_lines())
    sock = host.open_raw(transport)
    try:
        with contextlib.suppress(ConnectionError, OSError):  # the host may close first
            run(host, sock)
        sock.settimeout(10)
        with pytest.raises((ConnectionError, OSError, EOFError)):
            _drain_to_eof(sock)  # the host closes the connection
    finally:
        sock.close()
    new = host.log_lines()[before:]
    refused = [line for line in new if "refused" in line]
    assert refused and expected in refused[0], new
    assert ("tcp 127.0.0.1" if transport == "tcp" else "unix uid") in refused[0]
    assert not os.path.exists(host.marker), "the attacker's function was loaded"
    result = host.legit_batch()
    assert result.restore == "hot" and result.stats["host_pid"] == host.pid


def _drain_to_eof(sock: socket.socket) -> None:
    while True:
        if not sock.recv(65536):
            raise EOFError("closed")


def test_the_secret_is_not_on_the_command_line_and_node_files_are_private(host: Host) -> None:
    with open(f"/proc/{host.pid}/cmdline", "rb") as f:
        cmdline = f.read()
    assert host.secret.hex().encode() not in cmdline and host.secret not in cmdline
    node = host.spec.run_dir
    for name in ("node-id", "secret", f"{host.spec.id}.sock"):
        path = os.path.join(node, name)
        if os.path.exists(path):
            assert os.stat(path).st_mode & 0o077 == 0, name


def test_a_run_dir_open_to_others_is_refused(tmp_path: Any) -> None:
    d = tmp_path / "open"
    d.mkdir()
    os.chmod(d, 0o777)
    with pytest.raises(PermissionError, match=rf"{d} has mode 0777: group/other permission"):
        run_dir(str(d))
    os.chmod(d, 0o750)
    with pytest.raises(PermissionError, match="mode 0750"):
        run_dir(str(d))
    os.chmod(d, 0o700)
    assert run_dir(str(d)) == str(d)
    fresh = tmp_path / "new" / "run"
    assert run_dir(str(fresh)) == str(fresh)
    assert os.stat(fresh).st_mode & 0o777 == 0o700


@pytest.mark.skipif(os.getuid() != 0, reason="chown to another user needs root")
def test_a_run_dir_owned_by_another_user_is_refused(tmp_path: Any) -> None:
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    os.chown(d, 65534, 65534)
    with pytest.raises(PermissionError, match=rf"{d} is owned by uid 65534"):
        run_dir(str(d))
    link = tmp_path / "link"
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    os.symlink(mine, link)
    os.lchown(link, 65534, 65534)
    with pytest.raises(PermissionError, match="symlink owned by uid 65534"):
        run_dir(str(link))


USER = "streamstate-peer-test"


@pytest.fixture
def other_user() -> Any:
    if os.getuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root and useradd to create a second local user")
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/false", USER], check=False)
    try:
        yield pwd.getpwnam(USER)
    finally:
        subprocess.run(["userdel", USER], check=False)


def test_a_unix_socket_peer_of_another_uid_is_refused(
    host: Host, other_user: Any, tmp_path: Any
) -> None:
    """Even when the socket is reachable (someone opened the directory and socket modes),
    a peer that is not the host's uid gets nothing: not even the challenge."""
    sock_path = host_paths(host.spec.id, host.spec.run_dir)["sock"]
    modes = {p: stat.S_IMODE(os.stat(p).st_mode) for p in (host.spec.run_dir, sock_path)}
    parents = []  # the directories above it that others cannot search (the test's tmp dirs)
    p = os.path.dirname(host.spec.run_dir)
    while p not in ("/", ""):
        mode = stat.S_IMODE(os.stat(p).st_mode)
        if not mode & 0o001:
            parents.append((p, mode))
        p = os.path.dirname(p)
    client = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "s.settimeout(10)\n"
        "s.connect(sys.argv[1])\n"
        "print(len(s.recv(100)))\n"
    )
    before = len(host.log_lines())
    try:
        for path, mode in parents:
            os.chmod(path, mode | 0o001)
        os.chmod(host.spec.run_dir, 0o711)
        os.chmod(sock_path, 0o666)
        out = subprocess.run(
            ["/usr/bin/env", "python3", "-c", client, sock_path],
            capture_output=True,
            text=True,
            timeout=30,
            user=other_user.pw_uid,
            group=other_user.pw_gid,
            env={"PATH": "/usr/bin:/bin"},
            cwd="/",
        )
    finally:
        for path, mode in [*parents, *modes.items()]:
            os.chmod(path, mode)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0"  # closed without a byte
    time.sleep(0.2)
    refused = [line for line in host.log_lines()[before:] if "refused" in line]
    assert refused and f"peer uid {other_user.pw_uid} is not the host's uid 0" in refused[0]
    assert host.legit_batch().restore == "hot"


# ---- a man in the middle ------------------------------------------------------------------------


class Relay:
    """A man in the middle on the path between a task and the host's TCP port: it passes the
    handshake on, then hands every sealed record the client sends to ``edit(i, record)`` and
    forwards what that returns (it holds no key: it can only copy, change, drop or reorder
    bytes). Every record it saw is kept per connection in ``records``."""

    def __init__(self, target: str, edit: Any) -> None:
        from streamstate.spark.wire.security import REPLY_BYTES

        self.reply_bytes = REPLY_BYTES
        self.target = target
        self.edit = edit
        self.records: list[list[bytes]] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self._threads: list[Any] = []
        self._accept = threading.Thread(target=self._serve, daemon=True)
        self._accept.start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            host, _, port = self.target.rpartition(":")
            upstream = socket.create_connection((host, int(port)))
            seen: list[bytes] = []
            self.records.append(seen)
            for t in (
                threading.Thread(target=self._pump, args=(upstream, client), daemon=True),
                threading.Thread(
                    target=self._client_side, args=(client, upstream, seen), daemon=True
                ),
            ):
                t.start()
                self._threads.append(t)

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def _client_side(
        self, client: socket.socket, upstream: socket.socket, seen: list[bytes]
    ) -> None:
        def read(n: int) -> bytes:
            buf = b""
            while len(buf) < n:
                chunk = client.recv(n - len(buf))
                if not chunk:
                    raise EOFError
                buf += chunk
            return buf

        with contextlib.suppress(OSError, EOFError):
            upstream.sendall(read(self.reply_bytes))  # the handshake: passed on as it is
            i = 0
            while True:
                prefix = read(4)
                record = prefix + read(struct.unpack("<I", prefix)[0])
                seen.append(record)
                upstream.sendall(self.edit(i, record))
                i += 1
        with contextlib.suppress(OSError):
            upstream.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.listener.close()


# the records a task sends in a batch of one Arrow batch: HELLO, BEGIN, DATA head, DATA body,
# END
DATA_BODY = 3


def _flip(record: bytes) -> bytes:
    bad = bytearray(record)
    bad[len(bad) // 2] ^= 0x04
    return bytes(bad)


def test_a_recorded_changed_replayed_or_dropped_frame_is_refused(host: Host) -> None:
    """Done when: a recorded-and-injected or modified frame is refused. A relay on the path
    of a real task's connection records one batch, then changes, replays, drops or injects
    (from the recorded connection) one sealed record of the next: the host refuses the frame
    (a log line naming the peer), the task's batch fails (Spark would retry it), nothing of the
    relay's is used, and the next batch is exact."""
    from streamstate.errors import StateHostError

    recorded: list[bytes] = []
    edits = {
        "changed": lambda i, r: _flip(r) if i == DATA_BODY else r,
        "replayed": lambda i, r: r + r if i == DATA_BODY else r,
        "dropped": lambda i, r: b"" if i == DATA_BODY - 1 else r,
        "injected from a recorded connection": (
            lambda i, r: recorded[DATA_BODY] if i == DATA_BODY else r
        ),
    }
    mode = {"edit": None}
    relay = Relay(host.tcp, lambda i, r: r if mode["edit"] is None else mode["edit"](i, r))
    try:
        ok = host.legit_batch("tcp", ["x", "y"], via=relay.address)  # recorded, untouched
        assert host.routes[-1] == "tcp" and ok.restore in ("hot", "reload")
        recorded.extend(relay.records[-1])
        assert len(recorded) == 5
        for name, edit in edits.items():
            before = len(host.log_lines())
            mode["edit"] = edit
            with pytest.raises(StateHostError, match="lost the state host"):
                host.legit_batch("tcp", ["x", "y"], via=relay.address)
            mode["edit"] = None
            refused = [line for line in host.log_lines()[before:] if "refused frame" in line]
            assert refused, (name, host.log_lines()[before:])
            assert "(tcp 127.0.0.1:" in refused[0] and "did not verify" in refused[0], name
            # the batch the relay broke was not applied: the next one reloads its base, exact
            again = host.legit_batch("tcp", ["x"], via=relay.address)
            assert sorted(host.outputs(again))[-1][0] == "x", name
        final = host.legit_batch()
        assert final.restore == "hot"
        counts = dict(host.outputs(host.legit_batch(users=["x", "y"])))
        # x: 1 (recorded) + 4 (one per retried batch) + 1; y: 1 + 1: no refused batch counted
        assert counts == {"x": 6, "y": 2}, counts
    finally:
        relay.close()
    assert not os.path.exists(host.marker)


# ---- availability -------------------------------------------------------------------------------


def test_unauthenticated_peers_cost_a_host_no_batch_time(tmp_path: Any) -> None:
    """30 silent and 5 trickling connections on the host's port (from the address the task
    uses too): batches over TCP and over the Unix socket go on at the speed they had, none
    falls back, a PING answers at once; the handshakes stay pending until their one deadline,
    then each is closed with one log line."""
    from streamstate.spark.task.host_client import ping

    h = Host(tmp_path, max_pending_per_address=64)
    peers = None
    try:
        h.legit_batch()
        before = [h.legit_batch(route).stats["total_s"] for route in ("tcp", "unix") * 3]
        peers = Peers([h.tcp], silent=30, trickling=5)
        deadline = time.monotonic() + 10
        while peers.open_now() < 35 and time.monotonic() < deadline:
            time.sleep(0.05)
        pending_at_start = peers.open_now()
        during = [h.legit_batch(route).stats["total_s"] for route in ("tcp", "unix") * 3]
        t0 = time.perf_counter()
        assert ping(h.spec, h.secret) is not None
        ping_s = time.perf_counter() - t0
        time.sleep(h.spec.auth_timeout + 1.0)  # every peer's deadline passed at least once
        reconnects = peers.reconnects
        lines = h.log_lines()
    finally:
        if peers is not None:
            peers.close()
        h.close()
    assert pending_at_start == 35  # all of them were pending while the batches ran
    assert h.routes[-6:] == ["tcp", "unix"] * 3  # no batch fell back to another host
    ratio = statistics.median(during) / statistics.median(before)
    print(
        f"median batch {statistics.median(before) * 1e3:.0f} ms -> "
        f"{statistics.median(during) * 1e3:.0f} ms ({ratio:.2f}x), ping {ping_s * 1e3:.0f} ms"
    )
    # the old host served one handshake at a time: each silent peer cost a batch 2 s here
    assert max(during) < h.spec.auth_timeout, during
    assert statistics.median(during) <= 1.5 * statistics.median(before) + 0.05, (before, during)
    assert ping_s < 1.0
    timed_out = [line for line in lines if "no complete handshake within 2 s" in line]
    assert reconnects >= 35 and len(timed_out) >= 35, lines[-5:]
    assert all("(tcp 127.0.0.1:" in line for line in timed_out)


def _stall(h: Host, between_frames: bool) -> socket.socket:
    """A client holding the secret that starts the subtask's next batch over TCP (BEGIN, its
    records' schema) and stalls: inside a DATA frame (half of it sent), or between frames (one
    whole DATA frame sent and answered) -- a relay that holds, a task wedged mid-batch, a
    partition without RST. Its records are users ``stalled``."""
    from streamstate.spark.wire.messages import Begun, Data, Ok
    from support.state_host import step_task, user_batch

    sock = h.open_raw("tcp")
    conn = Connection(sock, client_handshake(sock, h.secret, h.spec.id), CLIENT_RECEIVES)
    records = user_batch(["stalled"] * 3)
    step = step_task(h.job, h.log.plan(h.next_batch))
    conn.send(Begin(task=step, subtask=0, attempt=10_000, schema=bytes(records.schema.serialize())))
    assert isinstance(conn.recv()[0], Begun)
    if between_frames:
        conn.send(Data(), records.serialize())
        assert isinstance(conn.recv()[0], Ok)
    else:
        recorder = _Recorder()
        conn.channel.sock = recorder  # type: ignore[assignment]
        conn.send(Data(), records.serialize())
        conn.channel.sock = sock
        sock.sendall(recorder.data[: len(recorder.data) // 2])
    return sock


@pytest.mark.parametrize("where", ["inside a frame", "between frames"])
def test_a_stalled_batch_holds_no_host(tmp_path: Any, where: str) -> None:
    """A connection that stalls in a batch holds the host for the frame deadline at most: a
    PING and a batch of the same subtask over the Unix socket are served within the deadline
    plus a second, the stalled batch is aborted (its connection closed, its records never
    counted) and the batches after it are exact."""
    from streamstate.spark.task.host_client import ping

    h = Host(tmp_path, frame_timeout=2.0, io_timeout=60.0)
    try:
        h.legit_batch()  # a: 2, b: 1
        stalled = _stall(h, between_frames=where == "between frames")
        t0 = time.perf_counter()
        pong = ping(h.spec, h.secret)
        ping_s = time.perf_counter() - t0
        served = h.legit_batch("unix", ["a", "b"])
        stalled.settimeout(10)
        with pytest.raises((ConnectionError, OSError, EOFError)):
            _drain_to_eof(stalled)  # the host dropped it
        stalled.close()
        after = h.legit_batch("tcp", ["stalled", "a"])
        lines = h.log_lines()
    finally:
        h.close()
    deadline = h.spec.frame_timeout
    assert pong is not None and ping_s < deadline + 1.0, ping_s
    assert served.stats["total_s"] < deadline + 1.0, served.stats["total_s"]
    assert h.routes[-2:] == ["unix", "tcp"]
    assert sorted(h.outputs(served)) == [("a", 3), ("b", 2)]
    assert sorted(h.outputs(after)) == [("a", 4), ("stalled", 1)]  # nothing of the stalled batch
    assert [line for line in lines if "(the frame deadline" in line], lines[-5:]


class _Flood:
    """Idle connections opened to ``address`` as fast as ``threads`` threads can, from the
    address the real tasks use too; each thread keeps its newest 200 open (the host drops the
    others first)."""

    def __init__(self, address: str, threads: int = 4) -> None:
        host, _, port = address.rpartition(":")
        self.target = (host, int(port))
        self.stop = threading.Event()
        self.opened = 0
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]
        for t in self.threads:
            t.start()

    def _run(self) -> None:
        import collections

        socks: collections.deque[socket.socket] = collections.deque()
        try:
            while not self.stop.is_set():
                with contextlib.suppress(OSError):
                    socks.append(socket.create_connection(self.target, timeout=5))
                    self.opened += 1
                if len(socks) > 200:
                    socks.popleft().close()
        finally:
            for sock in socks:
                sock.close()

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


BATCHES = 20


def test_a_flood_of_idle_connections_drops_its_own_and_no_real_client(tmp_path: Any) -> None:
    """A flood of connections that send nothing, from the address the tasks use too, far
    beyond the per-address cap: the host drops the oldest idle ones, never a real client's
    handshake (its answer arrived, even if not read yet), so no batch over TCP falls back to a
    host of its own node."""
    h = Host(tmp_path)
    flood = None
    try:
        h.legit_batch()
        flood = _Flood(h.tcp)
        start, batches = time.monotonic(), 0
        # from the flood's first burst on, until it has been far over the cap for a while
        while batches < BATCHES or (flood.opened < 600 and time.monotonic() - start < 15):
            h.legit_batch("tcp", ["a"])
            batches += 1
        opened = flood.opened
        lines = h.log_lines()
    finally:
        if flood is not None:
            flood.close()
        h.close()
    assert h.routes[1:] == ["tcp"] * batches, (h.routes, h.fallbacks)
    dropped = [line for line in lines if "handshakes pending, the most allowed" in line]
    assert opened > 300 and dropped, (opened, lines[-5:])
    assert all("the oldest that sent nothing is dropped" in line for line in dropped), dropped[:3]


def test_a_flood_of_refusals_is_capped_rate_limited_and_does_not_keep_a_host_alive(
    tmp_path: Any,
) -> None:
    """The host's idle timer runs through refusals; at most 16 handshakes that have sent part
    of an answer are pending per source address (the oldest is dropped); the log holds at most
    20 refusal lines per 10 s and then says how many it left out."""
    h = Host(tmp_path, idle_timeout=3.0, refusal_log_limit=20)
    h.legit_batch()
    start = time.monotonic()
    socks: list[socket.socket] = []
    garbage = 0
    try:
        for _ in range(20):  # part of an answer each, over the per-address cap
            socks.append(h.open_raw("tcp"))
            socks[-1].sendall(MAGIC[:3])
            time.sleep(0.02)  # in this order
        while time.monotonic() - start < 8.0:
            try:
                s = h.open_raw("tcp")
            except OSError:
                break  # the host is gone
            with contextlib.suppress(OSError):
                s.sendall(b"GET / HTTP/1.0\r\n\r\n" * 50)
            s.close()
            garbage += 1
            time.sleep(0.01)
        gone_after = time.monotonic() - start
        closed_early = sum(1 for s in socks[:4] if _closed(s))
    finally:
        for s in socks:
            s.close()
        h.log.close()
    lines = h.log_lines()
    refused = [line for line in lines if "refused connection" in line]
    assert gone_after < 3.0 + 3.0, gone_after  # idle timeout 3 s, refusals or not
    assert garbage > 40
    assert closed_early == 4  # the 4 oldest of the 20 talking peers were dropped for newer ones
    assert any(
        "16 handshakes with part of an answer pending from tcp 127.0.0.1" in line
        for line in refused
    )
    assert len(refused) <= 20
    assert any("more refusals not logged (limit 20 per 10 s)" in line for line in lines)
    assert "exit: idle timeout" in lines[-1]
    assert all(len(line) < 320 for line in lines)


def _closed(sock: socket.socket) -> bool:
    sock.settimeout(2)
    try:
        while sock.recv(4096):
            pass
        return True
    except TimeoutError:
        return False
    except OSError:
        return True


def test_ping_and_shutdown_return_false_when_a_host_does_not_answer(tmp_path: Any) -> None:
    """A socket that accepts and never speaks (a host stuck or busy): ``ping`` gives None and
    ``shutdown`` False after their timeout, so ``shutdown_hosts`` goes on with the next host."""
    from streamstate.spark.task.host_client import ping, shutdown
    from streamstate.spark.wire.hosts import HostSpec

    run = str(tmp_path / "run")
    os.makedirs(run, mode=0o700)
    spec = HostSpec(
        id="stuck", job="j", operator="op", subtask=0, parallelism=1, run_dir=run, io_timeout=1.0
    )
    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stuck.bind(host_paths("stuck", run)["sock"])
    stuck.listen(8)
    try:
        t0 = time.perf_counter()
        assert ping(spec) is None
        assert shutdown(spec, "test", timeout=1.0) is False
        assert time.perf_counter() - t0 < 8
    finally:
        stuck.close()


def test_a_run_dir_below_a_parent_others_may_write_is_refused(tmp_path: Any) -> None:
    """OpenSSH's safe-path rule: whoever can write a parent can swap the run directory."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    d = shared / "run"
    with pytest.raises(PermissionError, match=rf"{shared}, a parent of .* has mode 0777"):
        run_dir(str(d))
    os.chmod(shared, 0o1777)  # sticky, like /tmp: entries only their owner may move
    if os.getuid() == 0:
        assert run_dir(str(d)) == str(d)
    os.chmod(shared, 0o775)
    with pytest.raises(PermissionError, match="mode 0775"):
        run_dir(str(d))
    os.chmod(shared, 0o755)
    assert run_dir(str(d)) == str(d)
    link = tmp_path / "link"
    os.symlink(shared, link)
    os.chmod(shared, 0o757)
    with pytest.raises(PermissionError, match=rf"{shared}, a parent"):  # checked after resolving
        run_dir(str(link / "run"))
    os.chmod(shared, 0o755)
    if os.getuid() == 0:
        os.chown(shared, 65534, 65534)
        with pytest.raises(PermissionError, match="is owned by uid 65534: that user could"):
            run_dir(str(d))
