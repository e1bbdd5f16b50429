"""One local SparkSession for every Spark test (starting one takes 5-15 s), and one local Spark
Connect server (a second JVM, started by the first test that asks for ``connect_spark`` or
``any_spark``) with a Connect client session to it.

``any_spark`` runs a test once per session kind: ``classic`` (the shared local session) and
``connect`` (the Connect client); both have two worker threads, two shuffle partitions and a
default parallelism of 2, so a test expects the same results from both.

The master is ``local[2,3]``: two worker threads like ``local[2]``, and up to three attempts per
task, so that the tests of failures see Spark retry a task (plain ``local[N]`` never retries).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from support.jvm import spark_java_conf

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    for item in items:
        if {"spark", "connect_spark", "any_spark"} & set(item.fixturenames):
            item.add_marker(pytest.mark.spark)


def _process_state() -> str:
    """This process's standard descriptors, its number of open descriptors and its directory."""
    parts = []
    for fd in (0, 1, 2):
        try:
            parts.append(f"fd {fd} -> {os.readlink(f'/proc/self/fd/{fd}')}")
        except OSError as exc:
            parts.append(f"fd {fd}: {exc.strerror}")
    try:
        parts.append(f"{len(os.listdir('/proc/self/fd'))} open descriptors")
        parts.append(f"cwd {os.getcwd()}")
    except OSError as exc:
        parts.append(f"cwd: {exc.strerror}")
    return "; ".join(parts)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pyspark_sql = pytest.importorskip("pyspark.sql")
    builder = pyspark_sql.SparkSession.builder
    for key, value in spark_java_conf().items():
        builder = builder.config(key, value)
    builder = (
        builder.master("local[2,3]")
        .appName("streamstate-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.streaming.minBatchesToRetain", "3")
        .config("spark.driver.memory", "1g")
    )
    try:
        session = builder.getOrCreate()
    except Exception as exc:
        # seen once in a full run: the JVM exited without a word in one pytest worker, and the
        # Spark Connect client of the same worker reported a bad file descriptor; say what this
        # process's descriptors and directory were, for the next time
        raise RuntimeError(f"the local Spark session did not start: {_process_state()}") from exc
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: Any) -> Iterator[Any]:
    pytest.importorskip("pyspark.sql.connect.session")
    pytest.importorskip("grpc")
    from streamstate.devtools.local_connect import LocalConnectServer

    log = str(tmp_path_factory.mktemp("connect") / "server.log")
    server = LocalConnectServer(
        master="local[2,3]",
        conf={
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.sql.streaming.minBatchesToRetain": "3",
            "spark.driver.memory": "1g",
            **spark_java_conf(),
        },
        log=log,
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def connect_spark(connect_server: Any) -> Iterator[Any]:
    session = connect_server.session()
    yield session
    session.stop()


@pytest.fixture(params=["classic", "connect"])
def any_spark(request: Any) -> Any:
    """The classic session, then the Spark Connect client session."""
    return request.getfixturevalue("spark" if request.param == "classic" else "connect_spark")
