"""Where state hosts listen and how clients dial them: the bind address, the TCP listener and
the socket options of a host connection."""

from __future__ import annotations

import os
import socket

__all__ = ["bind_tcp", "default_bind", "port_range", "split_address", "tcp_tune"]


def default_bind(option: str | None = None) -> str | None:
    """The TCP address a host started here listens on: ``option`` (``"off"``: none), else
    ``$STREAMSTATE_HOST_BIND``, else ``$SPARK_LOCAL_IP``, else the address this node's name
    resolves to (127.0.0.1 if it does not resolve)."""
    for value in (
        option,
        os.environ.get("STREAMSTATE_HOST_BIND"),
        os.environ.get("SPARK_LOCAL_IP"),
    ):
        if value:
            return None if value.lower() in ("off", "none", "unix") else value
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def split_address(address: str) -> tuple[str, int]:
    """``"h"``, ``"h:p"``, ``"[v6]:p"`` or a bare IPv6 address -> (host, port)."""
    if address.startswith("["):
        host, _, rest = address[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else 0
    if address.count(":") == 1:
        host, port = address.split(":")
        return host, int(port)
    return address, 0


def port_range(value: str | None = None) -> range | None:
    """The ports hosts may listen on: ``value`` or ``$STREAMSTATE_HOST_PORTS`` (``"lo-hi"``,
    inclusive, for a firewall that opens only those), None for any ephemeral port."""
    value = value if value is not None else os.environ.get("STREAMSTATE_HOST_PORTS")
    if not value:
        return None
    try:
        lo, _, hi = value.partition("-")
        ports = range(int(lo), int(hi or lo) + 1)
    except ValueError:
        ports = range(0)
    if not ports or ports.start < 1 or ports.stop > 65536:
        raise ValueError(f"STREAMSTATE_HOST_PORTS must be 'low-high' (1..65535), got {value!r}")
    return ports


def bind_tcp(address: str, ports: range | None = None) -> tuple[socket.socket, str]:
    """A TCP listener on ``address`` and the address clients should dial. Without a port in
    ``address`` it takes the first free one of ``ports`` (default :func:`port_range`), else an
    ephemeral one."""
    host, port = split_address(address)
    if ports is None:
        ports = port_range()
    info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, addr = info[0]
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        if port or ports is None:
            listener.bind(addr)
        else:
            for candidate in ports:
                try:
                    listener.bind((addr[0], candidate, *addr[2:]))
                    break
                except OSError:
                    continue
            else:
                raise OSError(f"no free port in {ports.start}-{ports.stop - 1} on {host}")
    except BaseException:
        listener.close()
        raise
    bound = listener.getsockname()
    advertised = bound[0]
    if advertised in ("0.0.0.0", "::"):
        # a wildcard bind: others dial the node's address
        advertised = os.environ.get("STREAMSTATE_HOST_ADVERTISE") or socket.gethostbyname(
            socket.gethostname()
        )
    return listener, (
        f"[{advertised}]:{bound[1]}" if ":" in advertised else f"{advertised}:{bound[1]}"
    )


def tcp_tune(sock: socket.socket) -> None:
    """No Nagle delay (lock-step messages), and keepalive probes so that a peer whose node
    vanished without closing the connection is noticed in about 30 s, not after the I/O
    timeout (the kernel answers probes even while the peer process is busy)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 15), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
