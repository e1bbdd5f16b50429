"""Peers that open connections to a state host and never complete a handshake: the load a port
scan, a misconfigured client or an attacker puts on a host."""

from __future__ import annotations

import os
import select
import socket
import threading

from streamstate.spark.wire.security import MAGIC


class Peers:
    """``silent`` connections that send nothing and ``trickling`` ones that send a byte of a
    plausible handshake every ``every`` seconds, to each of ``addresses`` (``host:port``). A
    peer the host closes comes back (the pressure is kept up), at most once per ``every``."""

    def __init__(
        self, addresses: list[str], silent: int, trickling: int, every: float = 0.5
    ) -> None:
        self.every = every
        self.stop = threading.Event()
        self.socks: list[socket.socket] = []
        self.reconnects = 0
        self._lock = threading.Lock()
        self._threads = []
        for address in addresses:
            host, _, port = address.rpartition(":")
            target = (host.strip("[]"), int(port))
            for kind in ["silent"] * silent + ["trickling"] * trickling:
                self._threads.append(
                    threading.Thread(target=self._run, args=(target, kind), daemon=True)
                )
        for t in self._threads:
            t.start()

    def _run(self, target: tuple[str, int], kind: str) -> None:
        while not self.stop.is_set():
            try:
                sock = socket.create_connection(target, timeout=5)
                with self._lock:
                    self.socks.append(sock)
                sock.settimeout(self.every)
                payload = iter(MAGIC + os.urandom(100))
                while not self.stop.is_set():
                    if kind == "trickling":
                        sock.sendall(bytes([next(payload)]))
                    try:
                        if sock.recv(4096, socket.MSG_PEEK) == b"":
                            break  # closed by the host: come back
                        sock.recv(4096)  # the challenge
                    except TimeoutError:
                        pass
            except (OSError, StopIteration):
                pass
            with self._lock:
                self.reconnects += 1
            self.stop.wait(self.every)

    def open_now(self) -> int:
        """How many of the peers' connections the host has not closed."""
        n = 0
        with self._lock:
            socks = [s for s in self.socks if s.fileno() >= 0]
        for sock in socks:
            try:
                readable, _, _ = select.select([sock], [], [], 0)
                if not readable or sock.recv(1, socket.MSG_PEEK) != b"":
                    n += 1
            except (OSError, ValueError):
                pass
        return n

    def close(self) -> None:
        self.stop.set()
        for t in self._threads:
            t.join()
        for sock in self.socks:
            sock.close()
