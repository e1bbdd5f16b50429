"""Record types defined in the job script (``__main__``) as state values, map keys and values,
list elements, window accumulators and outputs, on Spark: a script run as ``__main__`` in a
process of its own (``tests/support/record_types_job.py``), on a classic session with both
backends and as a client of the Spark Connect server, compared with an oracle."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support.jvm import JAVA_OPTIONS
from support.killed_driver import driver_env

pytestmark = [pytest.mark.spark, pytest.mark.subprocess]

JOB = os.path.join(os.path.dirname(__file__), os.pardir, "support", "record_types_job.py")


def _run(base: Path, *args: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, JOB, str(base), *args],
        env=driver_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-6000:]
    out: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return out


def test_record_types_of_the_job_script_on_spark(tmp_path: Path) -> None:
    out = _run(tmp_path, "classic", JAVA_OPTIONS)
    oracle = out["oracle"]
    assert len(oracle["alerts"]) == 71 and len(oracle["windows"]) == 25
    assert out["alerts-heap"] == oracle["alerts"]
    assert out["alerts-rocksdb"] == oracle["alerts"]
    assert out["windows-batch"] == oracle["windows"]  # accumulators folded in Spark's workers
    assert out["windows-streaming"] == oracle["windows"]


def test_record_types_of_the_job_script_through_spark_connect(
    connect_server: Any, tmp_path: Path
) -> None:
    out = _run(tmp_path, "connect", connect_server.url)
    oracle = out["oracle"]
    assert out["alerts-rocksdb"] == oracle["alerts"]
    assert out["windows-streaming"] == oracle["windows"]
