"""What a user sees when the function of a streaming job raises on one record: the error,
once, as the first error line of the whole console output (driver stdout and stderr), no Java
frame, no failed Spark task or retry, at most 60 lines; the batch is not committed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from support.jvm import JAVA_OPTIONS

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.subprocess]

DRIVER = textwrap.dedent(
    """
    import os, sys
    import pyarrow as pa, pyarrow.parquet as pq
    from pyspark.sql import SparkSession
    from streamstate import KeyedProcessFunction, ValueStateDescriptor
    from streamstate.spark import keyed_process

    class FailOnBob(KeyedProcessFunction):
        def open(self, ctx):
            self.n = ctx.get_state(ValueStateDescriptor("n", int, default=0))

        def process_element(self, row, ctx):
            if row.user == "bob":
                raise ValueError(f"cannot count {row.v}")
            self.n.update(self.n.value() + 1)
            yield row.user, self.n.value()

    d = sys.argv[1]
    os.makedirs(f"{d}/in", exist_ok=True)
    pq.write_table(pa.table({"user": ["ann", "bob", "cy"], "v": [1, 2, 3]}), f"{d}/in/p.parquet")
    spark = (SparkSession.builder.master("local[2,3]").config("spark.ui.enabled", "false")
             .config("spark.driver.extraJavaOptions", sys.argv[2])
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    stream = spark.readStream.schema("user string, v long").parquet(f"{d}/in")
    query = keyed_process(stream, key="user", function=FailOnBob(),
                          output_schema="user string, n long", checkpoint=f"{d}/ck",
                          parallelism=2).write_stream("memory", trigger={"availableNow": True})
    query.await_termination()
    """
)


def test_a_failing_function_prints_its_error_once_in_a_short_clean_output(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(DRIVER)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    done = subprocess.run(
        # the driver's JVM with the tests' options (tests/support/jvm.py)
        [sys.executable, str(script), str(tmp_path / "job"), JAVA_OPTIONS],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = done.stdout + done.stderr
    lines = output.splitlines()
    assert done.returncode == 1, output[-3000:]
    assert len(lines) <= 60, output
    assert not [line for line in lines if re.match(r"\s+at [\w$.]+\(", line)], output  # Java
    errors = [line for line in lines if re.search(r"(Error|Exception)\b", line)]
    assert errors[0] == "ValueError: cannot count 2", output
    assert output.count("ValueError: cannot count 2") == 1, output
    assert "raised in process_element of key 'bob', record Row(user='bob', v=2)" in output
    for retried in ("Exception in task", "Lost task", "TaskSetManager", "Task failed"):
        assert retried not in output, output
    # the batch was not committed: a restart runs it again from the empty state
    assert not (tmp_path / "job" / "ck" / "chk-0" / "_metadata").exists()
