"""A local Spark Connect server for tests, benchmarks and the demo: one ``spark-submit`` JVM
running ``org.apache.spark.sql.connect.service.SparkConnectServer`` from the pyspark wheel's own
jars (``spark-connect_*.jar`` ships in ``pyspark/jars``), listening on 127.0.0.1.

    with LocalConnectServer(master="local[2]") as server:
        spark = server.session()   # a pyspark.sql.connect SparkSession

The server's Python workers (and the ``foreachBatch`` process of a streaming query) run
``python`` = this interpreter, so they import the same streamstate. Stopped by its process
group id (never by name).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

__all__ = ["LocalConnectServer", "connect_session"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def connect_session(url: str) -> Any:
    """A Spark Connect client session for ``url`` (``sc://host:port``). Built with the Connect
    builder itself, so it coexists with a classic SparkSession in the same process (the generic
    ``SparkSession.builder.remote`` refuses when a classic session runs). Always a new client:
    ``getOrCreate`` would hand back the process's default Connect session, whatever server it
    talks to, and stopping it would close another caller's session."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    return ConnectSession.builder.remote(url).create()


class LocalConnectServer:
    def __init__(
        self,
        master: str = "local[2]",
        conf: dict[str, str] | None = None,
        log: str | None = None,
        python: str | None = None,
    ) -> None:
        self.master = master
        self.conf = dict(conf or {})
        self.log = log
        self.python = python or sys.executable
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> LocalConnectServer:
        import pyspark

        home = os.path.dirname(pyspark.__file__)
        self.port = _free_port()
        conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            **self.conf,
        }
        cmd = [
            os.path.join(home, "bin", "spark-submit"),
            "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--master",
            self.master,
        ]
        for k, v in conf.items():
            cmd += ["--conf", f"{k}={v}"]
        cmd.append("spark-internal")
        env = dict(os.environ)
        env.update(SPARK_HOME=home, PYSPARK_PYTHON=self.python, PYSPARK_DRIVER_PYTHON=self.python)
        env.pop("SPARK_REMOTE", None)
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the Spark Connect server exited with {self.process.returncode} "
                    f"(log: {self.log or 'not kept'})"
                )
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"the Spark Connect server did not listen on {self.port} in {timeout}s")

    def session(self) -> Any:
        return connect_session(self.url)

    def stop(self) -> None:
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        except ProcessLookupError:
            pass
        self.process = None

    def __enter__(self) -> LocalConnectServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
