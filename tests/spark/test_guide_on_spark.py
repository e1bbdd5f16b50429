"""The Python examples of the documentation's pages that run on Spark (``support.guide``:
Sybil, one namespace per page, in a fresh directory) run with the tests' shared session and
print what the pages say."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.guide import SPARK_PAGES, run_page


@pytest.fixture
def working_directory(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """A fresh working directory for Python and for Spark: a job started from a directory
    reads and writes relative paths there, in the driver's Python and in its JVM (Hadoop's
    local file system resolves them against its working directory, here set for the test and
    restored after it)."""
    monkeypatch.chdir(tmp_path)
    jvm = spark._jvm
    local = jvm.org.apache.hadoop.fs.FileSystem.getLocal(spark._jsc.hadoopConfiguration())
    before = local.getWorkingDirectory()
    local.setWorkingDirectory(jvm.org.apache.hadoop.fs.Path(str(tmp_path)))
    try:
        yield tmp_path
    finally:
        local.setWorkingDirectory(before)


@pytest.mark.parametrize("page", sorted(SPARK_PAGES))
def test_the_examples_of(page: str, spark: Any, working_directory: Path) -> None:
    assert run_page(page, spark) > 0
