"""A passive capture of the TCP traffic on a network interface, with a raw ``AF_PACKET``
socket (root; no tcpdump needed): what anyone who can read the wire sees."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections import defaultdict

ETH_P_ALL = 0x0003
ETH_P_IP = 0x0800


class Capture:
    """Every TCP payload seen on ``interface`` from start to :meth:`stop`, by port: use as a
    context manager. Each segment is kept once per direction it was seen in (the loopback shows
    a packet twice: going out and coming in)."""

    def __init__(self, interface: str = "lo") -> None:
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
        self.sock.bind((interface, 0))
        self.sock.settimeout(0.2)
        #: port -> the payloads of segments to or from it, in order
        self.by_port: dict[int, list[bytes]] = defaultdict(list)
        self.packets = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Capture:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()

    def _run(self) -> None:
        buf = bytearray(1 << 18)
        while not self._stop.is_set():
            try:
                n = self.sock.recv_into(buf)
            except TimeoutError:
                continue
            except OSError:
                return
            with contextlib.suppress(struct.error, IndexError):
                self._segment(bytes(buf[:n]))

    def _segment(self, frame: bytes) -> None:
        if struct.unpack_from("!H", frame, 12)[0] != ETH_P_IP:
            return
        ip = frame[14:]
        ihl = (ip[0] & 0x0F) * 4
        if ip[9] != socket.IPPROTO_TCP:
            return
        total = struct.unpack_from("!H", ip, 2)[0] or len(ip)  # 0: a GSO super-packet
        tcp = ip[ihl:total] if total <= len(ip) else ip[ihl:]
        sport, dport = struct.unpack_from("!HH", tcp, 0)
        payload = tcp[(tcp[12] >> 4) * 4 :]
        self.packets += 1
        if payload:
            self.by_port[sport].append(payload)
            self.by_port[dport].append(payload)

    def payload(self, ports: set[int]) -> bytes:
        """Every payload byte to or from ``ports``, concatenated per segment."""
        return b"".join(b"".join(self.by_port.get(p, [])) for p in ports)
