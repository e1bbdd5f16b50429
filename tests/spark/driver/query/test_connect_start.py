"""Starting a query through Spark Connect: a foreachBatch process that is slow to connect back
is started again, with pauses, up to ``_START_ATTEMPTS`` starts; any other failure is raised at
once (no Spark needed: a writer that fails as the server does)."""

from __future__ import annotations

from typing import Any

import pytest

from streamstate.checkpoint.storage import FileSystemCheckpointStorage
from streamstate.spark.driver.query import connect
from streamstate.spark.driver.query.classic import ClassicReports
from streamstate.spark.driver.query.connect import ConnectReports

SLOW = "Python worker failed to connect back."


class FailingWriter:
    def __init__(self, failures: int, message: str = SLOW) -> None:
        self.failures = failures
        self.message = message
        self.starts = 0

    def start(self) -> str:
        self.starts += 1
        if self.starts <= self.failures:
            raise RuntimeError(self.message)
        return "query"


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(connect.time, "sleep", slept.append)
    return slept


@pytest.fixture
def reports(tmp_path: Any) -> ConnectReports:
    storage = FileSystemCheckpointStorage(str(tmp_path / "ck"), "")
    return ConnectReports.start_run(storage, "run", {})


def test_a_slow_start_is_retried_with_growing_pauses(
    pauses: list[float], reports: ConnectReports
) -> None:
    writer = FailingWriter(failures=connect._START_ATTEMPTS - 1)
    assert reports.start(writer, "spark") == "query"
    assert writer.starts == connect._START_ATTEMPTS
    assert pauses == [connect._START_PAUSE * 2**i for i in range(connect._START_ATTEMPTS - 1)]


def test_the_last_slow_start_is_raised(pauses: list[float], reports: ConnectReports) -> None:
    writer = FailingWriter(failures=connect._START_ATTEMPTS)
    with pytest.raises(RuntimeError, match="failed to connect back"):
        reports.start(writer, "spark")
    assert writer.starts == connect._START_ATTEMPTS


def test_another_failure_is_raised_at_once(pauses: list[float], reports: ConnectReports) -> None:
    writer = FailingWriter(failures=1, message="AnalysisException: no such column")
    with pytest.raises(RuntimeError, match="no such column"):
        reports.start(writer, "spark")
    assert writer.starts == 1 and pauses == []


def test_a_classic_session_starts_once(pauses: list[float]) -> None:
    writer: Any = FailingWriter(failures=1)
    with pytest.raises(RuntimeError):
        ClassicReports(spark=None).start(writer, "spark")
    assert writer.starts == 1 and pauses == []
