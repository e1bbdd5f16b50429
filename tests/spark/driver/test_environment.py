"""A driver whose Spark workers would run a Python without streamstate's dependencies fails at
once with one clear error (the usual cause: ``.venv/bin/python job.py`` without activating)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from support.jvm import JAVA_OPTIONS, spark_java_conf

pytestmark = pytest.mark.spark

DRIVER = textwrap.dedent(
    """
    import sys
    from pyspark.sql import SparkSession
    from streamstate import KeyedProcessFunction
    from streamstate.spark import WorkerPythonError, keyed_process

    class Echo(KeyedProcessFunction):
        def process_element(self, value, ctx):
            yield value.user, value.v

    spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
             .config("spark.driver.extraJavaOptions", sys.argv[1]).getOrCreate())
    df = spark.createDataFrame([("ann", 1)], "user string, v long")
    try:
        keyed_process(df, key="user", function=Echo(), output_schema="user string, v long")
    except WorkerPythonError as exc:
        print("ERROR", exc)
        sys.exit(3)
    finally:
        spark.stop()
    print("NO ERROR")
    """
)


def test_workers_without_pyarrow_are_reported_naming_pyspark_python(tmp_path: Path) -> None:
    # `python3` on PATH is the base interpreter without any site-packages: no pyarrow
    base = os.path.join(sys.base_prefix, "bin", f"python{sys.version_info[0]}")
    if not os.path.exists(base):
        pytest.skip(f"no base interpreter at {base}")
    shims = tmp_path / "bin"
    shims.mkdir()
    shim = shims / "python3"
    shim.write_text(f'#!/bin/sh\nexec {base} -S "$@"\n')
    shim.chmod(0o755)
    script = tmp_path / "job.py"
    script.write_text(DRIVER)
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
    }
    env["PATH"] = f"{shims}{os.pathsep}{env.get('PATH', '')}"
    done = subprocess.run(
        [sys.executable, str(script), JAVA_OPTIONS],  # the tests' JVM options (support.jvm)
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 3, done.stdout + done.stderr[-3000:]
    message = done.stdout.split("ERROR ", 1)[1]
    assert "Spark's Python workers run 'python3'" in message
    assert "PYSPARK_PYTHON is not set" in message
    assert "No module named 'pyarrow'" in message
    assert f"Set PYSPARK_PYTHON={sys.executable}" in message


@pytest.mark.slow
def test_a_connect_server_whose_python_lacks_the_dependencies_is_reported(tmp_path: Path) -> None:
    """The natural ``start-connect-server.sh`` without a ``PYSPARK_PYTHON`` that has
    streamstate: ``keyed_process`` says so at once, naming the server's Python, instead of
    retrying a foreachBatch process that never connects back."""
    pytest.importorskip("grpc")
    from streamstate import KeyedProcessFunction
    from streamstate.devtools.local_connect import LocalConnectServer
    from streamstate.spark import WorkerPythonError, keyed_process

    base = os.path.join(sys.base_prefix, "bin", f"python{sys.version_info[0]}")
    if not os.path.exists(base):
        pytest.skip(f"no base interpreter at {base}")
    shim = tmp_path / "python3"
    shim.write_text(f'#!/bin/sh\nexec {base} -S "$@"\n')
    shim.chmod(0o755)

    class Echo(KeyedProcessFunction):
        def process_element(self, value, ctx):  # type: ignore[no-untyped-def]
            yield value.user, value.v

    with LocalConnectServer(
        master="local[1]",
        python=str(shim),
        conf=spark_java_conf(),
        log=str(tmp_path / "server.log"),
    ) as server:
        spark = server.session()
        try:
            df = spark.createDataFrame([("ann", 1)], "user string, v long")
            with pytest.raises(WorkerPythonError) as e:
                keyed_process(df, key="user", function=Echo(), output_schema="user string, v long")
        finally:
            spark.stop()
    message = str(e.value)
    assert "the Spark Connect server's Python workers" in message
    assert "run '" in message and "cannot import what streamstate needs: pyarrow" in message
    assert "No module named 'pyarrow'" in message
    assert "PYSPARK_PYTHON" in message and "start-connect-server.sh" in message
