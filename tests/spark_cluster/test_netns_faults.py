"""Nodes with their own network addresses, and the faults of a real network (marker ``netns``).

A standalone master and three workers, each in its own Linux network namespace with its own
address on a bridge (``streamstate.devtools.local_netns``); state hosts listen on their node's
address; the driver runs in the root namespace. One driver process serves the queries of every
test (its start is the slow part); the last test kills it. Each test injects one fault, and ends
with the sink equal to a pandas oracle (every record counted once) and ``read_state`` equal to
the final counts; each fault's cost in batch time is printed, and written to
``$STREAMSTATE_FAULT_REPORT`` (JSON) when that is set. The loopback cluster tests
(``test_cluster.py``) stay the fast variant.

Skipped with the reason where namespaces cannot be made (not root, no ``ip``). Namespaces,
links and processes are removed by the fixtures' finalizers, even when a test fails; what a
crashed run left behind is removed when the next one starts (by its ``ssn<pid>-`` names).
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import statistics
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from streamstate.devtools.local_cluster import LocalCluster, Node, live_processes
from streamstate.devtools.local_netns import NetnsNetwork, unavailable
from support.cluster_results import (
    make_batches,
    oracle,
    restores,
    routes,
    sink_rows,
    write_batches,
)
from support.jvm import JAVA_OPTIONS

pytestmark = pytest.mark.netns

#: Spark settings of the faults' driver: a lost executor is declared in 20 s, not 120 s
NET_CONF = {
    "spark.network.timeout": "20s",
    "spark.network.timeoutInterval": "5s",
    "spark.executor.heartbeatInterval": "2s",
    "spark.shuffle.io.maxRetries": "2",
    "spark.shuffle.io.retryWait": "1s",
    "spark.cores.max": "3",
}
BATCHES, ROWS, USERS = 4, 1_000, 300
#: what each test measured (printed at the end; $STREAMSTATE_FAULT_REPORT)
FIGURES: dict[str, dict[str, Any]] = {}


@pytest.fixture(scope="module")
def net() -> Iterator[NetnsNetwork]:
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"network namespaces: {reason}")
    network = NetnsNetwork()
    try:
        yield network
    finally:
        network.close()
        report = os.environ.get("STREAMSTATE_FAULT_REPORT")
        if report and FIGURES:
            with open(report, "w") as f:
                json.dump(FIGURES, f, indent=2)
        for name, figures in FIGURES.items():
            print(f"{name}: {figures}")


@pytest.fixture(scope="module")
def net_cluster(net: NetnsNetwork, harness: Any, tmp_path_factory: Any) -> Iterator[LocalCluster]:
    pytest.importorskip("pyspark")
    c = LocalCluster(
        workers=3,
        directory=str(tmp_path_factory.mktemp("netns-cluster")),
        env={
            "PYTHONPATH": harness.env()["PYTHONPATH"],
            # the master declares a silent worker lost in 15 s (default 60 s); the workers
            # beat every quarter of it
            "SPARK_DAEMON_JAVA_OPTS": f"-Dspark.worker.timeout=15 {JAVA_OPTIONS}",
        },
        network=net,
    )
    c.start(wait=False)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def server(net_cluster: LocalCluster, harness: Any, tmp_path_factory: Any) -> Iterator[Any]:
    d = harness.Driver(
        net_cluster,
        {"serve": True},
        str(tmp_path_factory.mktemp("netns-driver") / "unused.json"),
        conf=NET_CONF,
    )
    try:
        d.wait_until(lambda: "SERVING" in d.lines, "the driver to start", timeout=900)
        yield d
    finally:
        d.close()


@pytest.fixture
def heal(
    net: NetnsNetwork, net_cluster: LocalCluster, request: pytest.FixtureRequest
) -> Iterator[list[Node]]:
    """Nodes a test broke (appended by the test): after it, every link is healed and each of
    those nodes is replaced by a fresh worker at its address (unless no later test of this
    session uses the cluster: its workers would only start to be stopped)."""
    broken: list[Node] = []
    yield broken
    for place in list(net.endpoints):
        net.heal(place)
    items = request.session.items
    later = items[items.index(request.node) + 1 :] if request.node in items else items
    if not any("net_cluster" in getattr(item, "fixturenames", ()) for item in later):
        return
    for node in broken:
        net_cluster.replace_node(node, wait=False)
    net_cluster.wait_for_workers(3)


def _place_of(cluster: LocalCluster, run_dir: str) -> Node:
    return next(n for n in cluster.nodes if n.run_dir == run_dir.rstrip("/"))


def host_addresses(cluster: LocalCluster, checkpoint: str) -> list[tuple[Node, str]]:
    """(node, TCP address) of each state host of the job that started (from their logs)."""
    found = []
    ready = re.compile(rf"ready: {re.escape(checkpoint)} .* tcp (\S+)$")
    for node in cluster.nodes:
        for log in glob.glob(os.path.join(node.run_dir, "*.log")):
            with open(log, errors="replace") as f:
                found += [(node, m.group(1)) for line in f if (m := ready.search(line.strip()))]
    return found


def host_nodes(cluster: LocalCluster, checkpoint: str) -> Counter[str]:
    """How many of the job's state hosts each node started."""
    return Counter(node.name for node, _ in host_addresses(cluster, checkpoint))


def _case(tmp_path: Any, seed: int, **extra: Any) -> tuple[dict[str, Any], list[Any]]:
    batches = make_batches(BATCHES, ROWS, users=USERS, seed=seed)
    write_batches(str(tmp_path / "in"), batches)
    run = {
        "input": str(tmp_path / "in"),
        "checkpoint": str(tmp_path / "ck"),
        "sink": str(tmp_path / "out"),
        "parallelism": 4,
        "backend": "heap",
        "options": {"host_connect_timeout": 3.0},
        **extra,
    }
    return run, batches


def _check_exact(run: dict[str, Any], batches: list[Any], result: dict[str, Any]) -> None:
    assert [b["batch"] for b in result["batches"]] == list(range(BATCHES)), routes(result)
    assert sink_rows(run["sink"]) == oracle(batches)  # every record counted exactly once
    assert result["state"] == dict(Counter(u for rows in batches for u, _ in rows))


def _batch_ms(result: dict[str, Any]) -> list[float]:
    return [round(float(b["batch_ms"])) for b in result["batches"]]


def _record(name: str, result: dict[str, Any], faulted: list[int], **more: Any) -> None:
    ms = _batch_ms(result)
    base = FIGURES.get("healthy", {}).get("median_batch_ms")
    FIGURES[name] = {
        "batch_ms": ms,
        "faulted_batches": faulted,
        "faulted_batch_ms": [ms[b] for b in faulted],
        "healthy_median_batch_ms": base,
        "routes": routes(result),
        **more,
    }


def test_nodes_have_their_own_addresses_and_hosts_listen_there(
    net: NetnsNetwork, net_cluster: LocalCluster, server: Any, tmp_path: Any, heal: Any
) -> None:
    run, batches = _case(tmp_path, seed=11)
    server.request(run, str(tmp_path / "r.json"), executors=3)
    result = server.answer(str(tmp_path / "r.json"))
    _check_exact(run, batches, result)
    addresses = {n.address for n in net_cluster.alive_nodes}
    assert len(addresses) == 3 and all(a.startswith("198.1") for a in addresses)
    for b in result["batches"][1:]:
        for s in b["subtasks"]:
            assert s["restore"] == "hot", routes(result)
    # every host listens on its own node's address
    listening = host_addresses(net_cluster, run["checkpoint"])
    assert len(listening) == 4 and all(
        address.rpartition(":")[0] == node.address for node, address in listening
    ), listening
    assert any(s["route"] == "tcp" for b in result["batches"] for s in b["subtasks"])
    ms = _batch_ms(result)
    FIGURES["healthy"] = {"batch_ms": ms, "median_batch_ms": statistics.median(ms[1:])}


def test_a_link_cut_mid_batch_and_restored(
    net: NetnsNetwork, net_cluster: LocalCluster, server: Any, tmp_path: Any, heal: Any
) -> None:
    """A worker's link goes down while micro-batch 2 is in flight (a subtask sleeps in it) and
    comes back 6 s later: connections stall and retransmit, and the batch completes."""
    marker = str(tmp_path / "in-flight")
    run, batches = _case(tmp_path, seed=12)
    run["pause"] = {"trigger": batches[2][ROWS // 2][1], "marker": marker, "seconds": 3}
    server.request(run, str(tmp_path / "r.json"), executors=3)
    server.wait_until(lambda: os.path.exists(marker), "micro-batch 2 to be in flight", 900)
    with open(marker) as f:
        _pid, run_dir = f.read().split(" ", 1)
    node = _place_of(net_cluster, run_dir)
    net.cut(node.place)
    time.sleep(6)
    net.restore(node.place)
    result = server.answer(str(tmp_path / "r.json"))
    _check_exact(run, batches, result)
    _record("link cut 6 s mid-batch", result, [2], node=node.name)


def test_a_node_whose_packets_vanish(
    net: NetnsNetwork, net_cluster: LocalCluster, server: Any, tmp_path: Any, heal: Any
) -> None:
    """After batch 1, every packet of the node holding the most hosts vanishes (a blackhole
    route): tasks of its subtasks on other nodes get no answer, fall back after
    ``host_connect_timeout`` and reload from the checkpoint; Spark loses its executor."""
    go = str(tmp_path / "go")
    run, batches = _case(tmp_path, seed=13, wait_after={"batch": 1, "go": go})
    try:
        since = server.request(run, str(tmp_path / "r.json"), executors=3)
        server.wait_for_line("WAITING 1", since, "micro-batch 1")
        name, hosts = host_nodes(net_cluster, run["checkpoint"]).most_common(1)[0]
        node = next(n for n in net_cluster.nodes if n.name == name)
        heal.append(node)
        net.blackhole(node.place)
    finally:
        _touch(go)  # a failure above must not leave the driver waiting
    result = server.answer(str(tmp_path / "r.json"))
    _check_exact(run, batches, result)
    moved = [s for b in result["batches"][2:] for s in b["subtasks"] if s.get("fallback")]
    assert len({s["subtask"] for s in moved}) >= hosts, routes(result)
    assert all("timed out" in s["fallback"] for s in moved), [s["fallback"] for s in moved]
    assert restores(result)[-1] == ["hot"] * 4, routes(result)
    _record("node blackholed between batches 1 and 2", result, [2], node=name, hosts=hosts)


def test_a_slow_lossy_link_to_one_node(
    net: NetnsNetwork, net_cluster: LocalCluster, server: Any, tmp_path: Any, heal: Any
) -> None:
    """From batch 2 on, the link of the node holding the most hosts runs at 4 Mbit/s with a
    12 kB queue (bursts beyond it are dropped): batches are slower, nothing falls back."""
    go = str(tmp_path / "go")
    run, batches = _case(tmp_path, seed=14, wait_after={"batch": 1, "go": go})
    try:
        since = server.request(run, str(tmp_path / "r.json"), executors=3)
        server.wait_for_line("WAITING 1", since, "micro-batch 1")
        name, _ = host_nodes(net_cluster, run["checkpoint"]).most_common(1)[0]
        node = next(n for n in net_cluster.nodes if n.name == name)
        net.slow(node.place)
    finally:
        _touch(go)
    result = server.answer(str(tmp_path / "r.json"))
    drops = net.drops(node.place)
    _check_exact(run, batches, result)
    assert all(k == "hot" for ks in restores(result)[1:] for k in ks), routes(result)
    assert drops > 0  # the link lost packets, and TCP recovered them
    _record("slow lossy link (4 Mbit/s, 12 kB queue)", result, [2, 3], node=name, drops=drops)


def test_a_node_killed_mid_batch(
    net: NetnsNetwork, net_cluster: LocalCluster, server: Any, tmp_path: Any, heal: Any
) -> None:
    """A machine lost while batch 2 is in flight: every process of the node is killed and its
    link goes down (its address stops answering, as a vanished machine's does). The query goes
    on on the two other nodes; the lost node's subtasks reload once."""
    marker = str(tmp_path / "in-flight")
    run, batches = _case(tmp_path, seed=15)
    run["pause"] = {"trigger": batches[2][ROWS // 2][1], "marker": marker, "seconds": 5}
    server.request(run, str(tmp_path / "r.json"), executors=3)
    server.wait_until(lambda: os.path.exists(marker), "micro-batch 2 to be in flight", 900)
    with open(marker) as f:
        _pid, run_dir = f.read().split(" ", 1)
    node = _place_of(net_cluster, run_dir)
    heal.append(node)
    net.cut(node.place)
    killed = net_cluster.kill_node(node)
    result = server.answer(str(tmp_path / "r.json"))
    _check_exact(run, batches, result)
    assert not killed & set(live_processes())
    after = [s for b in result["batches"][2:] for s in b["subtasks"]]
    reloads = Counter(s["subtask"] for s in after if s["restore"] == "reload")
    assert reloads and max(reloads.values()) == 1, routes(result)
    _record("node killed mid-batch (link down)", result, [2, 3], node=node.name)


def test_the_driver_killed_while_a_node_is_partitioned(
    net: NetnsNetwork,
    net_cluster: LocalCluster,
    server: Any,
    harness: Any,
    tmp_path: Any,
    heal: Any,
) -> None:
    """After batch 1 a node is cut off and the driver is SIGKILLed; a new driver takes the
    query over on the other nodes and finishes it exactly once. When the link comes back, no
    state host of the killed driver's run is left on any node.

    The killed driver is the module's serving driver (the module's last test): its executors
    already run on every node, so no other driver JVM starts and waits for them."""
    go = str(tmp_path / "go")
    run, batches = _case(tmp_path, seed=16, wait_after={"batch": 1, "go": go})
    try:
        since = server.request(run, str(tmp_path / "r.json"), executors=3)
        server.wait_for_line("WAITING 1", since, "micro-batch 1")
        name, _ = host_nodes(net_cluster, run["checkpoint"]).most_common(1)[0]
        node = next(n for n in net_cluster.nodes if n.name == name)
        heal.append(node)  # its worker gave up on the master meanwhile: replaced after
        net.cut(node.place)
        os.kill(server.proc.pid, signal.SIGKILL)  # our own child, by its Popen handle
        server.proc.wait()
    finally:
        server.close()  # its application's cores go back to the master
    t0 = time.monotonic()
    run.pop("wait_after")
    # the partitioned node's worker cannot take part: two executors, on the others
    second = harness.Driver(
        net_cluster, {"runs": [run], "executors": 2}, str(tmp_path / "d2.json"), conf=NET_CONF
    )
    (result,) = second.result(timeout=900)
    took = time.monotonic() - t0
    net.restore(node.place)
    # the first driver died in batch 1's sink, before Spark committed it: batch 1 runs again
    assert [b["batch"] for b in result["batches"]] == list(range(1, BATCHES))
    assert sink_rows(run["sink"]) == oracle(batches)  # and every record counts once
    assert result["state"] == dict(Counter(u for rows in batches for u, _ in rows))
    # the killed run's hosts exit with their executors, on the partitioned node too
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and _hosts_of(net_cluster, run["checkpoint"]):
        time.sleep(1)
    assert not _hosts_of(net_cluster, run["checkpoint"])
    FIGURES["driver killed while a node is partitioned"] = {
        "takeover_to_end_s": round(took, 1),
        "batch_ms": _batch_ms(result),
        "node": name,
    }


def _hosts_of(cluster: LocalCluster, checkpoint: str) -> set[int]:
    return {
        pid
        for pid, (_, cmd) in live_processes().items()
        if "streamstate.spark.host.state_host" in cmd and checkpoint in cmd
    }


def _touch(path: str) -> None:
    with open(path, "w"):
        pass
