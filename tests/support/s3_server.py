"""An S3-compatible server for the tests: moto's standalone server on 127.0.0.1.

:func:`start` runs moto's server (``moto_s3_main.py``: its writes atomic, as S3's are) as a
child process on a free port and waits until it answers; :meth:`S3Server.stop` ends that
process by its pid. :meth:`S3Server.bucket` creates a bucket and returns the
``storage_options`` fsspec/s3fs need to reach it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

__all__ = ["S3Server", "start"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class S3Server:
    def __init__(self, proc: subprocess.Popen[bytes], endpoint: str, log: str) -> None:
        self.proc = proc
        self.endpoint = endpoint
        self.log = log

    @property
    def storage_options(self) -> dict[str, Any]:
        """s3fs options for this server (no credentials are checked by moto)."""
        return {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": self.endpoint, "region_name": "eu-west-1"},
        }

    def bucket(self, name: str | None = None) -> str:
        """Create a new bucket; returns its name."""
        import s3fs

        name = name or f"b-{uuid.uuid4().hex[:12]}"
        fs = s3fs.S3FileSystem(**self.storage_options, skip_instance_cache=True)
        fs.mkdir(name)
        return name

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def start(log_path: str, timeout: float = 30.0) -> S3Server:
    """Start moto's server on a free loopback port and wait until it serves requests."""
    port = _free_port()
    env = dict(os.environ)
    env.setdefault("AWS_ACCESS_KEY_ID", "testing")
    env.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).with_name("moto_s3_main.py")),
                "127.0.0.1",
                str(port),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
        )
    endpoint = f"http://127.0.0.1:{port}"
    server = S3Server(proc, endpoint, log_path)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            with open(log_path, errors="replace") as f:
                tail = f.read()[-2000:]
            raise RuntimeError(f"moto server exited with {proc.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1):
                return server
        except OSError:
            if time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(f"moto server did not answer on {endpoint}") from None
            time.sleep(0.2)
