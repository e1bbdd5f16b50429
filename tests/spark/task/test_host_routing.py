"""Routing records to the state: a task on one node reaches its subtask's host on another node
over TCP (hot), and falls back to a host on its own node (reload) when that one is unreachable.

Two "nodes" are simulated in one process: two run directories, hence two node ids.
"""

from __future__ import annotations

import os
import signal
import socket
from typing import Any

import msgspec
import pytest

from streamstate.spark import FileSink, keyed_process, read_state
from streamstate.spark.driver.step.host_fleet import HostFleet
from streamstate.spark.task.host_client import connect, ping, run_batch, shutdown
from streamstate.spark.wire.acks import TaskAck, TaskTimings
from streamstate.spark.wire.hosts import host_id
from streamstate.spark.wire.messages import HostLocation
from streamstate.spark.wire.network import bind_tcp, default_bind, port_range, split_address
from streamstate.spark.wire.security import new_secret, node_id
from support.spark_data import final_counts, make_batches, running_counts, write_batches
from support.spark_functions import Count
from support.state_host import Driver, step_task, user_batch, wait_gone

pytestmark = pytest.mark.subprocess


def _private(path: Any) -> str:
    os.makedirs(path, mode=0o700, exist_ok=True)
    return str(path)


class TwoNodes(Driver):
    """A 1-subtask job whose host runs on node A; tasks run on node A or node B."""

    def __init__(self, tmp_path: Any) -> None:
        super().__init__(tmp_path, Count())
        self.secret = new_secret()
        hid = host_id(self.job.checkpoint_url, "op", 0, 1, "r1")
        self.spec = msgspec.structs.replace(self.spec, bind="127.0.0.1", run="r1", id=hid)
        self.node_a = _private(tmp_path / "node-a")
        self.node_b = _private(tmp_path / "node-b")
        self.location: HostLocation | None = None

    def run(
        self, b: int, users: list[str], on: str, location: HostLocation | None = None
    ) -> tuple[Any, TaskAck]:
        """Batch ``b`` from a task on node ``on``: the subtask's result and its ack."""
        spec = msgspec.structs.replace(self.spec, run_dir=on)
        plan = self.log.plan(b)
        self.attempt += 1
        batch = user_batch(users)
        ack = run_batch(
            spec,
            step_task(self.job, plan),
            self.attempt,
            [batch],
            secret=self.secret,
            location=self.location if location is None else location,
            connect_timeout=1.0,
        )
        result = ack.result
        assert result is not None
        self.log.commit(plan, [result])
        self.location = ack.location
        return result, ack

    def close(self) -> None:
        for d in (self.node_a, self.node_b):
            shutdown(msgspec.structs.replace(self.spec, run_dir=d), "test done", self.secret)
        self.log.close()


@pytest.fixture
def nodes(tmp_path: Any) -> Any:
    n = TwoNodes(tmp_path)
    yield n
    n.close()


def test_a_task_on_another_node_streams_to_the_host_over_tcp_and_finds_it_hot(
    nodes: TwoNodes,
) -> None:
    r0, t0 = nodes.run(0, ["a", "b", "a"], on=nodes.node_a)
    assert (r0.restore, t0.timings.route) == ("empty", "unix")
    assert t0.location is not None and t0.location.tcp is not None
    assert t0.location.node == node_id(nodes.node_a) != node_id(nodes.node_b)
    assert t0.location.tcp.startswith("127.0.0.1:")
    r1, t1 = nodes.run(1, ["a", "c"], on=nodes.node_b)  # Spark moved the task to node B
    assert (r1.restore, t1.timings.route) == ("hot", "tcp")
    assert r1.stats["host_pid"] == r0.stats["host_pid"]
    assert sorted(nodes.outputs(r1)) == [("a", 3), ("c", 1)]
    # node B started no host of its own
    assert connect(msgspec.structs.replace(nodes.spec, run_dir=nodes.node_b), start=False) is None
    r2, t2 = nodes.run(2, ["a"], on=nodes.node_a)  # and back: the Unix socket again
    assert (r2.restore, t2.timings.route) == ("hot", "unix")
    assert nodes.outputs(r2) == [("a", 4)]


def test_an_unreachable_host_falls_back_to_a_local_host_that_reloads(nodes: TwoNodes) -> None:
    r0, _ = nodes.run(0, ["a", "b", "a"], on=nodes.node_a)
    lost = HostLocation(id=nodes.spec.id, node="gone", tcp="127.0.0.1:1")  # nothing listens
    r1, t1 = nodes.run(1, ["a", "b"], on=nodes.node_b, location=lost)
    assert (r1.restore, t1.timings.route) == ("reload", "fallback")
    assert t1.timings.fallback is not None and "127.0.0.1:1" in t1.timings.fallback
    assert r1.stats["host_pid"] != r0.stats["host_pid"]
    assert t1.location is not None and t1.location.node == node_id(nodes.node_b)
    assert sorted(nodes.outputs(r1)) == [("a", 3), ("b", 2)]
    # node A's host still holds version 0: a plan that sends batch 2 there must not use it
    elsewhere = msgspec.structs.replace(lost, node="A", tcp=None)
    r2, t2 = nodes.run(2, ["a"], on=nodes.node_b, location=elsewhere)
    assert (r2.restore, t2.timings.route) == ("hot", "unix")
    old = HostLocation(id=nodes.spec.id, node=node_id(nodes.node_a))
    r3, t3 = nodes.run(3, ["a"], on=nodes.node_a, location=old)  # its stale host: reload
    assert (r3.restore, t3.timings.route) == ("reload", "unix")
    assert r3.stats["host_pid"] == r0.stats["host_pid"]
    assert nodes.outputs(r3) == [("a", 5)]


def test_a_host_of_another_run_is_not_reached(nodes: TwoNodes) -> None:
    """The host id (with the run) is inside the handshake's MAC: a location that names another
    run's host (or another job's secret) is refused, and the task starts its own host."""
    _, t0 = nodes.run(0, ["a"], on=nodes.node_a)
    other = msgspec.structs.replace(nodes.spec, run="r2", id=nodes.spec.id[::-1])
    nodes.spec, saved = other, nodes.spec
    try:
        r1, t1 = nodes.run(1, ["a"], on=nodes.node_b, location=t0.location)
    finally:
        nodes.spec = saved
    assert (r1.restore, t1.timings.route) == ("reload", "fallback")
    assert t1.timings.fallback is not None and "refused the handshake" in t1.timings.fallback
    shutdown(msgspec.structs.replace(other, run_dir=nodes.node_b), "test done", nodes.secret)
    assert ping(msgspec.structs.replace(nodes.spec, run_dir=nodes.node_a), nodes.secret)


def test_the_driver_retires_a_host_its_subtask_left_and_only_that_process(
    nodes: TwoNodes,
) -> None:
    """When an acknowledgement shows subtask 0 on another node, the driver tells the host it
    left to exit, naming its pid: a SHUTDOWN for another pid (a reused port) is ignored."""
    r0, t0 = nodes.run(0, ["a"], on=nodes.node_a)
    fleet = HostFleet(  # the driver's bookkeeping of the run's hosts
        nodes.job,
        msgspec.msgpack.encode(nodes.job),
        run_dir=nodes.node_b,
        bind="off",
        connect_timeout=1.0,
        idle_timeout=60.0,
    )
    fleet.run_id, fleet.secret = "r1", nodes.secret
    assert t0.location is not None
    fleet.locations = {0: msgspec.structs.replace(t0.location, pid=1)}
    moved = TaskAck(
        subtask=0, timings=TaskTimings(route="unix"), location=HostLocation(id="h", node="B")
    )
    fleet.update_locations([moved])
    assert fleet.locations[0] == HostLocation(id="h", node="B")
    assert not fleet.retire(0, msgspec.structs.replace(t0.location, pid=1), "wrong pid")
    assert ping(msgspec.structs.replace(nodes.spec, run_dir=nodes.node_a), nodes.secret)
    assert fleet.retire(0, t0.location, "moved")
    wait_gone(int(r0.stats["host_pid"]))


def _source(spark: Any, directory: str) -> Any:
    return (
        spark.readStream.schema("user string, v long")
        .option("maxFilesPerTrigger", 1)
        .parquet(directory)
    )


def test_streaming_batches_follow_their_hosts_across_nodes(spark: Any, tmp_path: Any) -> None:
    """Batch 0 runs on node A; the executors then 'move' to node B: batch 1 reaches A's hosts
    over TCP (hot). Subtask 0's host is then lost (SIGKILL): in batch 2 its task starts a host
    on B that reloads, while subtask 1 stays hot on A over TCP; batch 3 is hot everywhere.
    ``stop()`` shuts down the hosts on both nodes. The sink and the state equal the oracle."""
    batches = make_batches(4, 200, users=30, seed=3)
    source = _private(tmp_path / "in")
    node_a, node_b = _private(tmp_path / "node-a"), _private(tmp_path / "node-b")
    query = keyed_process(
        _source(spark, source),
        key="user",
        function=Count(),
        output_schema="user string, n long",
        checkpoint=str(tmp_path / "ck"),
        parallelism=2,
    ).write_stream(
        "parquet",
        path=str(tmp_path / "out"),
        run_dir=node_a,
        host_connect_timeout=1.0,
        host_bind="127.0.0.1",  # a local master listens on no TCP port unless asked to
    )
    try:
        for b, rows in enumerate(batches):
            if b == 1:
                query.hosts.run_dir = node_b
            if b == 2:
                os.kill(query.host_locations[0]["pid"], signal.SIGKILL)
            write_batches(source, [rows], start=b)
            query.process_all_available()
    finally:
        query.stop()
    figures = query.batches
    per_subtask = [[(s["restore"], s["route"]) for s in f["subtasks"]] for f in figures]
    assert per_subtask == [
        [("empty", "unix"), ("empty", "unix")],
        [("hot", "tcp"), ("hot", "tcp")],
        [("reload", "fallback"), ("hot", "tcp")],
        [("hot", "unix"), ("hot", "tcp")],
    ]
    pids = {s["host_pid"] for f in figures for s in f["subtasks"]}
    assert len(pids) == 3
    assert query.host_locations[1]["node"] == node_id(node_a)
    for pid in pids:  # stop() reached the host on node A over TCP too
        wait_gone(int(pid))
    out = FileSink(str(tmp_path / "out")).read_arrow().to_pylist()
    assert sorted((r["user"], r["n"]) for r in out) == running_counts(batches)
    state = read_state(spark, str(tmp_path / "ck"), state="n").collect()
    assert {r.key: r.value for r in state} == final_counts(batches)


def test_a_local_master_opens_no_tcp_port_unless_asked(spark: Any, monkeypatch: Any) -> None:
    from streamstate.spark.driver.query.start import bind_for

    monkeypatch.delenv("STREAMSTATE_HOST_BIND", raising=False)
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")  # Spark's own address is no request
    assert bind_for(spark, None) == "off"
    assert default_bind(bind_for(spark, None)) is None
    assert bind_for(spark, "127.0.0.1") == "127.0.0.1"
    monkeypatch.setenv("STREAMSTATE_HOST_BIND", "127.0.0.1")
    assert bind_for(spark, None) is None  # each node's default_bind reads it


def test_bind_address_resolution(monkeypatch: Any) -> None:
    monkeypatch.delenv("STREAMSTATE_HOST_BIND", raising=False)
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.3")
    assert default_bind() == "127.0.0.3"
    monkeypatch.setenv("STREAMSTATE_HOST_BIND", "127.0.0.2")
    assert default_bind() == "127.0.0.2"
    assert default_bind("127.0.0.4:0") == "127.0.0.4:0"  # the option wins
    assert default_bind("off") is None
    monkeypatch.setenv("STREAMSTATE_HOST_BIND", "off")
    assert default_bind() is None
    assert split_address("127.0.0.1:4040") == ("127.0.0.1", 4040)
    assert split_address("[::1]:7") == ("::1", 7)
    assert split_address("::1") == ("::1", 0)
    assert split_address("10.0.0.5") == ("10.0.0.5", 0)
    listener, address = bind_tcp("127.0.0.1")
    try:
        assert address == f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


def test_hosts_listen_inside_a_port_range(monkeypatch: Any) -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    busy = probe.getsockname()[1]  # a taken port: the range starts there
    probe.listen(1)
    try:
        monkeypatch.setenv("STREAMSTATE_HOST_PORTS", f"{busy}-{busy + 20}")
        listener, address = bind_tcp("127.0.0.1")
        try:
            port = int(address.rpartition(":")[2])
            assert busy < port <= busy + 20
        finally:
            listener.close()
        with pytest.raises(OSError, match=f"no free port in {busy}-{busy}"):
            bind_tcp("127.0.0.1", range(busy, busy + 1))
    finally:
        probe.close()
    for bad in ("x", "10-5", "0-3", "70000"):
        with pytest.raises(ValueError, match="STREAMSTATE_HOST_PORTS"):
            port_range(bad)
    assert port_range("4000") == range(4000, 4001)
