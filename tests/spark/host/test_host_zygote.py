"""The host zygote (streamstate.spark.host.zygote): hosts forked from one process that imported
everything, their batches, the zygote's lifetime, the switch, and a zygote that died."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from streamstate.spark.wire.hosts import ZYGOTE_SWITCH, host_paths, proc_start_time, zygote_id
from support.spark_functions import Count
from support.state_host import Driver, wait_gone

pytestmark = pytest.mark.subprocess


@pytest.fixture
def jvm() -> Iterator[subprocess.Popen[bytes]]:
    """A stand-in for the executor JVM the hosts (and so the zygote) watch."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait()


def _driver(tmp_path: Any, name: str, run_dir: str, jvm: subprocess.Popen[bytes]) -> Driver:
    (tmp_path / name).mkdir()
    d = Driver(tmp_path / name, Count())
    d.spec = msgspec.structs.replace(
        d.spec,
        run_dir=run_dir,
        watch_pid=jvm.pid,
        watch_start=proc_start_time(jvm.pid),
        zygote=True,
    )
    os.makedirs(run_dir, exist_ok=True)
    return d


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode()


def _zygote_of(d: Driver) -> str:
    env = dict(os.environ)
    from streamstate.spark.job import src_path

    env["PYTHONPATH"] = os.pathsep.join(p for p in (src_path(), env.get("PYTHONPATH", "")) if p)
    assert d.spec.watch_pid is not None
    return host_paths(zygote_id(env, d.spec.watch_pid, d.spec.watch_start), d.spec.run_dir)["sock"]


def test_hosts_forked_by_one_zygote_serve_and_go_with_its_jvm(
    tmp_path: Any, jvm: subprocess.Popen[bytes]
) -> None:
    run_dir = str(tmp_path / "run")
    a = _driver(tmp_path, "a", run_dir, jvm)
    b = _driver(tmp_path, "b", run_dir, jvm)
    ra = a.batch(0, ["a", "b", "a"])
    rb = b.batch(0, ["c"])
    assert sorted(a.outputs(ra)) == [("a", 1), ("a", 2), ("b", 1)]
    assert b.outputs(rb) == [("c", 1)]
    ra = a.batch(1, ["a"])
    assert ra.restore == "hot"
    assert a.outputs(ra) == [("a", 3)]
    host_a, host_b = int(ra.stats["host_pid"]), int(rb.stats["host_pid"])
    zygote = _parent(host_a)
    assert host_a != host_b and _parent(host_b) == zygote
    assert "streamstate.spark.host.zygote" in _cmdline(zygote)
    assert os.getsid(host_a) == host_a and os.getsid(host_b) == host_b  # sessions of their own
    # ps shows a host's own command line (its checkpoint), never the secret
    for d, pid in ((a, host_a), (b, host_b)):
        cmd = _cmdline(pid)
        assert "streamstate.spark.host.state_host serve" in cmd and d.spec.job in cmd
        assert d.spec.id in cmd and "secret" not in cmd
    sock = _zygote_of(a)
    assert os.path.exists(sock) and os.stat(sock).st_mode & 0o777 == 0o600
    # a request without the two descriptors is refused, and the zygote serves on
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as bogus:
        bogus.settimeout(10)
        bogus.connect(sock)
        bogus.sendall(b"\0\0\0\x10")
        assert bogus.recv(256).startswith(b"REFUSED 4 header bytes and 0 descriptors")
    # a killed host is started again (forked again) and reloads its checkpoint
    os.kill(host_a, signal.SIGKILL)
    wait_gone(host_a)
    ra = a.batch(2, ["b"])
    assert ra.restore == "reload" and a.outputs(ra) == [("b", 2)]
    assert _parent(int(ra.stats["host_pid"])) == zygote
    # the JVM exits: so do the zygote and every host
    jvm.kill()
    jvm.wait()
    for pid in (zygote, host_b, int(ra.stats["host_pid"])):
        wait_gone(pid, timeout=10)
    assert not os.path.exists(sock)


def test_the_switch_and_a_zygote_that_died(
    tmp_path: Any, jvm: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = str(tmp_path / "run")
    monkeypatch.setenv(ZYGOTE_SWITCH, "0")
    off = _driver(tmp_path, "off", run_dir, jvm)
    pid = int(off.batch(0, ["a"]).stats["host_pid"])
    assert "streamstate.spark.host.zygote" not in _cmdline(_parent(pid))  # a new interpreter
    off.close()
    monkeypatch.delenv(ZYGOTE_SWITCH)
    first = _driver(tmp_path, "first", run_dir, jvm)
    host = int(first.batch(0, ["a"]).stats["host_pid"])
    zygote = _parent(host)
    assert "streamstate.spark.host.zygote" in _cmdline(zygote)
    os.kill(zygote, signal.SIGKILL)  # its socket file stays behind, its lock is free
    wait_gone(zygote)
    assert os.path.exists(_zygote_of(first))
    second = _driver(tmp_path, "second", run_dir, jvm)
    again = int(second.batch(0, ["b"]).stats["host_pid"])
    assert _parent(again) not in (zygote, 1)
    assert "streamstate.spark.host.zygote" in _cmdline(_parent(again))
    # the host of the dead zygote serves on
    assert first.batch(1, ["a"]).restore == "hot"
    for d in (first, second):
        d.close()
