"""Nodes with their own network addresses on one Linux machine: a network namespace per cluster
process, joined by a bridge, and the faults a real network has.

:class:`NetnsNetwork` gives :class:`~streamstate.devtools.local_cluster.LocalCluster` a namespace
per node (the master, each worker), each with one end of a veth pair whose other end is on a
bridge; the bridge itself has the first address of the subnet, so the processes of the root
namespace (the test, the driver) reach every node and every node reaches them. Addresses come
from the benchmarking range 198.18.0.0/15 (RFC 2544): the first /24 that no interface of the
machine uses. Everything is named ``ssn<pid>-...`` after the process that made it, and
:meth:`NetnsNetwork.remove_leftovers` removes what a process that is gone left behind (a
crashed test run), never another live process's.

Faults, on one node's link:

* :meth:`~NetnsNetwork.cut` / :meth:`~NetnsNetwork.restore`: the veth is taken down (packets
  vanish both ways, connections stay open and retransmit) and brought back up;
* :meth:`~NetnsNetwork.blackhole`: every packet the node sends to the subnet is discarded, so
  its peers' connection attempts get no answer (the connect-timeout path) and its open
  connections stall;
* :meth:`~NetnsNetwork.slow`: a token bucket (``tc tbf``) on both directions of the link, with
  a queue so short that bursts above the rate are dropped: a slow link that loses packets under
  load (this kernel has no ``netem``: latency comes from the queue, loss from tail drops).

Needs root and ``iproute2`` (``ip``, ``tc``); :func:`unavailable` says why it cannot run here.

This module imports nothing from streamstate (like ``local_cluster``).
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

__all__ = ["Endpoint", "NetnsNetwork", "unavailable"]

_RANGE = ipaddress.ip_network("198.18.0.0/15")
_PREFIX = "ssn"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def unavailable() -> str | None:
    """Why network namespaces cannot be used here (None: they can)."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"needs iproute2's {tool!r}"
    probe = f"{_PREFIX}{os.getpid()}-probe"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as exc:
        return f"cannot create a network namespace: {exc.stderr.strip()}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


@dataclass
class Endpoint:
    """One node's place on the network."""

    name: str
    namespace: str
    address: str
    #: the veth end on the bridge (in the root namespace) and the one in the node's namespace
    outer: str
    inner: str = "eth0"

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this node's namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]


class NetnsNetwork:
    """A bridge and a namespace per node; see the module docstring. ``close()`` removes all."""

    def __init__(self) -> None:
        self.tag = f"{_PREFIX}{os.getpid()}"
        self.remove_leftovers()
        self.subnet = self._free_subnet()
        hosts = self.subnet.hosts()
        #: the bridge's address: where processes of the root namespace are seen from
        self.address = str(next(hosts))
        self._hosts = hosts
        self.bridge = f"{self.tag}-br"
        self.endpoints: dict[str, Endpoint] = {}
        self._created: list[str] = []
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            self._created.append(self.bridge)
            _ip("addr", "add", f"{self.address}/{self.subnet.prefixlen}", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise

    # ---- nodes -------------------------------------------------------------------------------

    def endpoint(self, name: str) -> Endpoint:
        """The node ``name``'s endpoint, created on first use: a namespace with loopback up and
        one veth to the bridge, with the next address of the subnet."""
        if name in self.endpoints:
            return self.endpoints[name]
        i = len(self.endpoints)
        ep = Endpoint(
            name=name,
            namespace=f"{self.tag}-{i}",
            address=str(next(self._hosts)),
            outer=f"{self.tag}-{i}o",
        )
        _ip("netns", "add", ep.namespace)
        self._created.append(f"netns:{ep.namespace}")
        _ip("link", "add", ep.outer, "type", "veth", "peer", "name", f"{self.tag}-{i}i")
        self._created.append(ep.outer)
        _ip("link", "set", f"{self.tag}-{i}i", "netns", ep.namespace)
        ns = ["-n", ep.namespace]
        _ip(*ns, "link", "set", f"{self.tag}-{i}i", "name", ep.inner)
        _ip(*ns, "addr", "add", f"{ep.address}/{self.subnet.prefixlen}", "dev", ep.inner)
        _ip(*ns, "link", "set", ep.inner, "up")
        _ip(*ns, "link", "set", "lo", "up")
        _ip("link", "set", ep.outer, "master", self.bridge)
        _ip("link", "set", ep.outer, "up")
        self.endpoints[name] = ep
        return ep

    # ---- faults ------------------------------------------------------------------------------

    def cut(self, name: str) -> None:
        """Take node ``name``'s link down: its packets vanish both ways (a partition)."""
        _ip("link", "set", self.endpoints[name].outer, "down")

    def restore(self, name: str) -> None:
        _ip("link", "set", self.endpoints[name].outer, "up")

    def blackhole(self, name: str, on: bool = True) -> None:
        """Discard every packet node ``name`` sends to the subnet (or stop doing so)."""
        ep = self.endpoints[name]
        ns = ["-n", ep.namespace]
        net = str(self.subnet)
        if on:
            _ip(*ns, "route", "replace", "blackhole", net)
        else:
            _ip(*ns, "route", "del", "blackhole", net, check=False)
            _ip(*ns, "route", "replace", net, "dev", ep.inner, "src", ep.address)

    def slow(self, name: str, rate: str = "4mbit", queue_bytes: int = 12_000) -> None:
        """Rate-limit node ``name``'s link both ways to ``rate`` with a queue of
        ``queue_bytes``: bursts beyond it are dropped (a slow, lossy link)."""
        ep = self.endpoints[name]
        args = ["root", "tbf", "rate", rate, "burst", "3000", "limit", str(queue_bytes)]
        subprocess.run(["tc", "qdisc", "replace", "dev", ep.outer, *args], check=True)
        subprocess.run(
            ["tc", "-n", ep.namespace, "qdisc", "replace", "dev", ep.inner, *args], check=True
        )

    def drops(self, name: str) -> int:
        """Packets the rate limit of :meth:`slow` dropped on node ``name``'s link so far."""
        ep = self.endpoints[name]
        total = 0
        for cmd in (
            ["tc", "-s", "qdisc", "show", "dev", ep.outer],
            ["tc", "-n", ep.namespace, "-s", "qdisc", "show", "dev", ep.inner],
        ):
            out = subprocess.run(cmd, capture_output=True, text=True, check=False).stdout
            total += sum(int(n) for n in re.findall(r"dropped (\d+)", out))
        return total

    def heal(self, name: str) -> None:
        """Undo every fault on node ``name``'s link."""
        ep = self.endpoints[name]
        subprocess.run(["tc", "qdisc", "del", "dev", ep.outer, "root"], capture_output=True)
        subprocess.run(
            ["tc", "-n", ep.namespace, "qdisc", "del", "dev", ep.inner, "root"],
            capture_output=True,
        )
        self.blackhole(name, on=False)
        self.restore(name)

    # ---- cleanup -----------------------------------------------------------------------------

    def close(self) -> None:
        """Remove the namespaces, veths and the bridge (processes inside must be gone)."""
        for item in reversed(self._created):
            if item.startswith("netns:"):
                _ip("netns", "del", item[6:], check=False)
            else:
                _ip("link", "del", item, check=False)
        self._created.clear()
        self.endpoints.clear()

    def __enter__(self) -> NetnsNetwork:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def remove_leftovers() -> list[str]:
        """Remove namespaces and links named ``ssn<pid>-...`` whose process ``pid`` is gone
        (a test run that crashed); returns what was removed."""
        removed = []
        names = [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line]
        links = [
            m.group(1)
            for m in re.finditer(r"^\d+: ([^:@\s]+)", _ip("-o", "link").stdout, re.MULTILINE)
        ]
        for name in [*names, *links]:
            m = re.match(rf"{_PREFIX}(\d+)-", name)
            if m is None or _alive(int(m.group(1))):
                continue
            if name in names:
                _ip("netns", "del", name, check=False)
            else:
                _ip("link", "del", name, check=False)
            removed.append(name)
        return removed

    def _free_subnet(self) -> ipaddress.IPv4Network:
        used = []
        for line in _ip("-o", "addr").stdout.splitlines():
            m = re.search(r"inet (\S+)", line)
            if m:
                used.append(ipaddress.ip_interface(m.group(1)).network)
        for subnet in _RANGE.subnets(new_prefix=24):
            if not any(subnet.overlaps(u) for u in used):
                return subnet  # type: ignore[return-value]
        raise RuntimeError(f"no free /24 in {_RANGE}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
