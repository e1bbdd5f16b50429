"""Streaming keyed queries on a standalone cluster of separate nodes (``conftest.py``):
results exact against a pandas oracle, a node lost mid-batch, a node that joins later.

Every test sends its queries to one serving driver (``server``): a driver's start, its JVM and
an executor JVM on each node, is the slow part of a test. The last test ends the driver's
application and checks that no state host outlives it.
"""

from __future__ import annotations

import glob
import os
import re
import socket
import statistics
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from streamstate.devtools.local_cluster import LocalCluster, live_processes
from support.cluster_results import (
    make_batches,
    oracle,
    restores,
    routes,
    sink_rows,
    write_batches,
)


def hot_fraction(result: dict[str, Any]) -> float:
    after_first = [kind for kinds in restores(result)[1:] for kind in kinds]
    return after_first.count("hot") / len(after_first)


def leftover_hosts(cluster: LocalCluster, timeout: float = 30) -> set[int]:
    """State hosts of the cluster's nodes still alive after ``timeout`` s (they exit with
    the executor JVM they watch)."""
    deadline = time.monotonic() + timeout
    while True:
        left = {
            pid
            for pid, (_, cmd) in live_processes().items()
            if "streamstate.spark.host.state_host" in cmd and cluster.directory in cmd
        }
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def host_ports(cluster: LocalCluster, checkpoint: str) -> list[str]:
    """The TCP addresses of the job's state hosts that started (from their logs)."""
    ready = re.compile(rf"ready: {re.escape(checkpoint)} .* tcp (\S+)$")
    found = []
    for node in cluster.nodes:
        for log in glob.glob(os.path.join(node.run_dir, "*.log")):
            with open(log, errors="replace") as f:
                found += [m.group(1) for line in f if (m := ready.search(line.strip()))]
    return found


@pytest.fixture(scope="module")
def server(cluster: LocalCluster, harness: Any, tmp_path_factory: Any) -> Iterator[Any]:
    """A driver serving one query per request (``cluster_driver.py``'s ``serve``), with an
    executor on each node of the cluster when it starts. Its application asks for no core
    limit: a node that joins gets an executor of it."""
    d = harness.Driver(
        cluster, {"serve": True}, str(tmp_path_factory.mktemp("cluster-driver") / "unused.json")
    )
    try:
        d.wait_until(lambda: "SERVING" in d.lines, "the driver to start", timeout=900)
        yield d
    finally:
        d.close()


def _touch(path: str) -> None:
    with open(path, "w"):
        pass


def _capture() -> Any:
    """A passive capture of the loopback, started (None without root)."""
    if os.geteuid() != 0:
        return None
    from support.packet_capture import Capture

    return Capture("lo").__enter__()


def test_a_node_lost_mid_batch_costs_a_reload_and_nothing_else(
    cluster: LocalCluster, server: Any, tmp_path: Any
) -> None:
    # a third node, for this test to lose (the driver waits for an executor on each of the
    # three nodes before it starts the query)
    lost = cluster.add_worker(wait=False)
    batches = make_batches(5, 2_000, users=500, seed=3)
    write_batches(str(tmp_path / "in"), batches)
    marker, go = str(tmp_path / "in-flight"), str(tmp_path / "go")
    run = {
        "input": str(tmp_path / "in"),
        "checkpoint": str(tmp_path / "ck"),
        "sink": str(tmp_path / "out"),
        "parallelism": 4,
        "backend": "rocksdb",
        # one subtask sleeps in the middle of micro-batch 2 until the node is lost (``go``):
        # the node dies with batch 2 in flight
        "pause": {"trigger": batches[2][1_000][1], "marker": marker, "seconds": 120, "go": go},
    }
    try:
        server.request(run, str(tmp_path / "r.json"), executors=3)
        server.wait_until(lambda: os.path.exists(marker), "micro-batch 2 to be in flight", 900)
        assert lost.finished_tasks() > 0  # the node ran subtasks before it was lost
        killed = cluster.kill_node(lost)
        _touch(go)
        result = server.answer(str(tmp_path / "r.json"))
    finally:
        _touch(go)  # a failure above must not leave the subtask asleep
        if lost.alive:
            cluster.kill_node(lost)
    assert lost.process.returncode is not None
    assert not killed & set(live_processes())  # worker, executor, Python workers, state hosts
    assert sink_rows(run["sink"]) == oracle(batches)  # every record counted exactly once
    assert result["state"] == dict(Counter(u for rows in batches for u, _ in rows))
    kinds = restores(result)
    assert [b["batch"] for b in result["batches"]] == list(range(5))
    # the lost node's subtasks restored the last committed checkpoint, once each, on a
    # surviving node; the others stayed hot, and after the loss everything is hot again
    assert "reload" in kinds[2] + kinds[3], routes(result)
    reloads = Counter(
        s["subtask"]
        for b in result["batches"][2:]
        for s in b["subtasks"]
        if s["restore"] == "reload"
    )
    assert max(reloads.values()) == 1, routes(result)
    assert sum(k == "hot" for ks in kinds[1:] for k in ks) == 16 - len(reloads), routes(result)
    assert kinds[4] == ["hot"] * 4, routes(result)


def test_a_node_that_joins_later_gets_tasks(
    cluster: LocalCluster, server: Any, tmp_path: Any
) -> None:
    batches = make_batches(5, 2_000, users=500, seed=4)
    write_batches(str(tmp_path / "in"), batches)
    go = str(tmp_path / "go")
    run = {
        "input": str(tmp_path / "in"),
        "checkpoint": str(tmp_path / "ck"),
        "sink": str(tmp_path / "out"),
        "parallelism": 4,
        "backend": "heap",
        "wait_after": {"batch": 1, "go": go},
    }
    joined = None
    try:
        since = server.request(run, str(tmp_path / "r.json"), executors=2)
        server.wait_for_line("WAITING 1", since, "micro-batch 1 to be delivered")
        joined = cluster.add_worker()
        # the running application gets an executor on the new node (it asked for no core limit)
        server.wait_until(
            lambda: "Successfully registered with driver" in _executor_logs(joined),
            "an executor on the new node",
        )
    finally:
        _touch(go)  # a failure above must not leave the driver waiting
    try:
        result = server.answer(str(tmp_path / "r.json"))
        assert joined.finished_tasks() > 0
    finally:
        cluster.kill_node(joined)
    assert sink_rows(run["sink"]) == oracle(batches)
    assert result["state"] == dict(Counter(u for rows in batches for u, _ in rows))
    # its tasks stream to the hosts where the state already is: nothing reloads
    assert hot_fraction(result) == 1.0, routes(result)


def _executor_logs(node: Any) -> str:
    out = []
    for root, _dirs, files in os.walk(node.work_dir):
        if "stderr" in files:
            with open(os.path.join(root, "stderr"), errors="replace") as f:
                out.append(f.read())
    return "".join(out)


def test_host_traffic_is_sealed_and_hostile_peers_cost_no_batch_time(
    cluster: LocalCluster, server: Any, tmp_path: Any
) -> None:
    """From micro-batch 5 on, 30 silent and 5 trickling connections are kept open on every
    state host's port, from 127.0.0.1 (the address the tasks use too): the median batch time
    moves by at most 1.5x, and no batch falls back or fails because of them.

    And a passive capture of the loopback during the whole query holds none of the records'
    keys on the hosts' ports, though they carried the records of every subtask-batch routed
    over TCP (it does hold a marker sent in clear on another port: the capture sees what
    crosses)."""
    from support.hostile_peers import Peers

    prefix = "sealed-user-key-"  # long: no chance of appearing in ciphertext by accident
    batches = make_batches(12, 2_000, users=500, seed=5, prefix=prefix)
    write_batches(str(tmp_path / "in"), batches)
    go = str(tmp_path / "go")
    run = {
        "input": str(tmp_path / "in"),
        "checkpoint": str(tmp_path / "ck"),
        "sink": str(tmp_path / "out"),
        "parallelism": 4,
        "backend": "heap",
        "wait_after": {"batch": 5, "go": go},
    }
    capture = _capture()
    peers = None
    try:
        try:
            since = server.request(run, str(tmp_path / "r.json"), executors=2)
            # (generous waits: on a machine shared with other jobs a batch took minutes)
            server.wait_for_line("WAITING 5", since, "micro-batch 5")
            addresses = host_ports(cluster, run["checkpoint"])
            assert len(addresses) == 4, addresses
            peers = Peers(addresses, silent=30, trickling=5)
            deadline = time.monotonic() + 30
            while peers.open_now() < 4 * 16 and time.monotonic() < deadline:
                time.sleep(0.1)
            # and until the hosts dropped them once (their handshake deadline, 5 s): on a quiet
            # machine the six batches after this one take less than that
            deadline = time.monotonic() + 60
            while peers.reconnects <= 100 and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            _touch(go)  # a failure above must not leave the driver waiting
        result = server.answer(str(tmp_path / "r.json"))
        reconnects = peers.reconnects
        if capture is not None:
            probe = socket.create_server(("127.0.0.1", 0))
            with socket.create_connection(probe.getsockname()) as c:
                c.sendall(b"capture-probe-in-clear")
            probe.close()
            time.sleep(0.5)
    finally:
        if peers is not None:
            peers.close()
        if capture is not None:
            capture.stop()
    assert sink_rows(run["sink"]) == oracle(batches)
    ms = [float(b["batch_ms"]) for b in result["batches"]]
    before, during = statistics.median(ms[1:6]), statistics.median(ms[6:])
    print(
        f"median batch_ms {before:.0f} before, {during:.0f} with 140 hostile peers "
        f"({during / before:.2f}x); {reconnects} reconnects"
    )
    assert during <= 1.5 * before, ms
    fell_back = [b["batch"] for b in result["batches"] if "fallback" in b["routes"]]
    assert not fell_back, routes(result)
    assert all(k == "hot" for ks in restores(result)[1:] for k in ks), routes(result)
    assert reconnects > 100  # the hosts kept dropping them (deadline, per-address cap)
    if capture is not None:
        host_bytes = capture.payload({int(a.rpartition(":")[2]) for a in addresses})
        tcp_batches = sum(s["route"] == "tcp" for b in result["batches"] for s in b["subtasks"])
        assert tcp_batches >= 8 and len(host_bytes) > 100_000, (tcp_batches, len(host_bytes))
        everything = b"".join(b"".join(v) for v in capture.by_port.values())
        assert b"capture-probe-in-clear" in everything
        keys = {u.encode() for rows in batches for u, _ in rows}
        assert prefix.encode() not in host_bytes
        assert not [k for k in keys if k in host_bytes]


def test_streaming_count_on_two_nodes_equals_a_pandas_oracle(
    cluster: LocalCluster, server: Any, tmp_path: Any
) -> None:
    """The module's last test: it ends the serving driver's application after its queries,
    and no state host outlives it."""
    batches = make_batches(6, 2_000, users=500, seed=1)
    more = make_batches(2, 2_000, users=500, seed=2)
    write_batches(str(tmp_path / "in"), batches)
    write_batches(str(tmp_path / "more"), more, start=len(batches))
    runs = [
        {
            "input": str(tmp_path / "in"),
            "checkpoint": str(tmp_path / f"ck-{backend}"),
            "sink": str(tmp_path / f"out-{backend}"),
            "parallelism": 4,
            "backend": backend,
        }
        for backend in ("heap", "rocksdb")
    ]
    # the RocksDB job restarts with parallelism 3 and two more files: rescaled on the cluster
    runs.append({**runs[1], "add_files": str(tmp_path / "more"), "parallelism": 3})
    nodes = cluster.alive_nodes
    assert len(nodes) == 2
    tasks_before = [node.finished_tasks() for node in nodes]
    results = []
    for i, run in enumerate(runs):
        server.request(run, str(tmp_path / f"r{i}.json"), executors=2)
        results.append(server.answer(str(tmp_path / f"r{i}.json")))
    heap, rocks, rescaled = results
    # the driver's application ends (stdin closed: it stops its SparkContext and exits)
    assert server.proc.stdin is not None
    server.proc.stdin.close()
    assert server.proc.wait(300) == 0, server.tail()
    expected = oracle(batches)
    final = dict(Counter(u for rows in batches for u, _ in rows))
    for run, result in zip(runs[:2], (heap, rocks), strict=True):
        assert [b["batch"] for b in result["batches"]] == list(range(6))
        assert restores(result)[0] == ["empty"] * 4
        # (the RocksDB job's sink also holds the rescaled run's batches 6 and 7)
        assert [r for r in sink_rows(run["sink"]) if r[2] < 6] == expected, run["backend"]
        assert result["state"] == final, run["backend"]
        # after the first batch, each subtask's task reaches the host that holds its state,
        # from whichever node Spark runs it on (a stable run: nothing reloads)
        assert hot_fraction(result) >= 0.95, (run["backend"], routes(result))
    assert [b["batch"] for b in rescaled["batches"]] == [6, 7]
    assert restores(rescaled)[0] == ["reload"] * 3
    assert sink_rows(runs[1]["sink"]) == oracle(batches + more)
    assert rescaled["state"] == dict(Counter(u for rows in batches + more for u, _ in rows))
    # both nodes ran tasks of these queries; no state host outlives the application
    tasks_after = [node.finished_tasks() for node in nodes]
    assert all(a > b for a, b in zip(tasks_after, tasks_before, strict=True)), tasks_after
    assert not leftover_hosts(cluster)
