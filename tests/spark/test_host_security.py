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
import struct
import subprocess
import time
from typing import Any

import msgspec
import pytest
from functions import Count

from streamstate.spark.channel import SecureChannel
from streamstate.spark.host_client import connect, run_batch
from streamstate.spark.job import JobSpec
from streamstate.spark.protocol import Connection
from streamstate.spark.security import MAGIC, client_handshake, new_secret, run_dir
from streamstate.spark.state_host import host_paths
from streamstate.spark.subtask import BatchResult, job_storage
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

    def __init__(self, tmp_path: Any) -> None:
        super().__init__(tmp_path, Count())
        run = str(tmp_path / "node")
        os.makedirs(run, mode=0o700)
        self.secret = new_secret()
        self.spec = msgspec.structs.replace(
            self.spec,
            run_dir=run,
            bind="127.0.0.1",
            run="r1",
            auth_timeout=2.0,
            refusal_log_limit=1000,
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
        self.pid = got[1]["pid"]
        self.tcp = got[1]["tcp"]
        self.log_path = host_paths(self.spec.id, run)["log"]
        self.next_batch = 0

    def open_raw(self, transport: str) -> socket.socket:
        if transport == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(host_paths(self.spec.id, self.spec.run_dir)["sock"])
        else:
            host, _, port = self.tcp.rpartition(":")
            sock = socket.create_connection((host, int(port)))
        sock.settimeout(10)
        return sock

    def legit_batch(self) -> BatchResult:
        """A batch of the job itself (the host must still serve it, hot after the first)."""
        from test_state_host import begin_header, user_batch

        b = self.next_batch
        self.next_batch += 1
        plan = self.log.plan(b)
        self.attempt += 1
        begin = begin_header(self.job, plan, self.attempt)
        batch = user_batch(["a", "b", "a"])
        raw, _ = run_batch(self.spec, begin, [batch], secret=self.secret)
        result = msgspec.msgpack.decode(raw, type=BatchResult)
        self.log.commit(plan, [result])
        return result

    def log_lines(self) -> list[str]:
        with open(self.log_path) as f:
            return f.read().splitlines()

    def close(self) -> None:
        from streamstate.spark.host_client import shutdown

        shutdown(self.spec, "test done", self.secret)
        self.log.close()


@pytest.fixture(scope="module")
def host(tmp_path_factory: Any) -> Any:
    h = Host(tmp_path_factory.mktemp("security"))
    assert h.legit_batch().restore == "empty"
    yield h
    h.close()


def _begin(job: JobSpec) -> dict[str, Any]:
    return {
        "t": "BEGIN",
        "job": msgspec.msgpack.encode(job),
        "batch": 0,
        "base": -1,
        "lineage": "x",
        "new_lineage": "y",
        "attempt": 1,
    }


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
    Connection(recorder, keys).send(_begin(h.trap_job))  # type: ignore[arg-type]
    sock.sendall(recorder.data[: len(recorder.data) // 2])
    sock.shutdown(socket.SHUT_WR)


def _malformed_begin(h: Host, sock: socket.socket) -> None:
    keys = client_handshake(sock, h.secret, h.spec.id)
    Connection(sock, keys).send({"t": "BEGIN", "job": b"\x93not a job", "batch": "zero"})


def _plaintext_after_auth(h: Host, sock: socket.socket) -> None:
    """A relay that let a real handshake through, then speaks for the task in clear."""
    client_handshake(sock, h.secret, h.spec.id)
    sock.sendall(_begin_frame(h.trap_job))


def _another_function(h: Host, sock: socket.socket) -> None:
    """A client holding the secret asks the host to run another function on its job."""
    keys = client_handshake(sock, h.secret, h.spec.id)
    Connection(sock, keys).send(_begin(h.trap_job))


def _another_checkpoint(h: Host, sock: socket.socket) -> None:
    keys = client_handshake(sock, h.secret, h.spec.id)
    job = msgspec.structs.replace(h.job, checkpoint_url=h.job.checkpoint_url + "-theirs")
    Connection(sock, keys).send(_begin(job))


def _other_storage_options(h: Host, sock: socket.socket) -> None:
    keys = client_handshake(sock, h.secret, h.spec.id)
    job = msgspec.structs.replace(h.job, storage_options={"key": "theirs"})
    Connection(sock, keys).send(_begin(job))


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
    "another function": (_another_function, "BEGIN for another job: its function_sha differ"),
    "another checkpoint": (_another_checkpoint, "its checkpoint_url differ"),
    "other storage options": (_other_storage_options, "its storage_options differ"),
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
