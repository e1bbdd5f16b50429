"""The reports of a Spark Connect query's server side, read by its client (no Spark needed)."""

from __future__ import annotations

from typing import Any

from streamstate.checkpoint.storage import FileSystemCheckpointStorage
from streamstate.spark.driver.query.connect import ConnectReports


def test_the_client_reads_only_whole_batch_reports(tmp_path: Any) -> None:
    """A report being written (``put_atomic``'s temporary file beside the reports, still
    empty) is not read as a step: the client sees the reports written whole, in order."""
    storage = FileSystemCheckpointStorage(str(tmp_path / "ck"), "")
    server = ConnectReports(storage, "connect/0000000000001-run", {})
    client = ConnectReports(storage, "connect/0000000000001-run", {})
    server.step({"checkpoint": 0, "rows": 3}, 0)
    in_flight = "connect/0000000000001-run/batches/000000000001-000001.json.tmp-0123abcd"
    with open(tmp_path / "ck" / in_flight, "w"):
        pass
    client.sync()
    assert client.batches() == [{"checkpoint": 0, "rows": 3}]
    server.step({"checkpoint": 1, "rows": 2}, 1)
    client.sync()
    assert client.batches() == [{"checkpoint": 0, "rows": 3}, {"checkpoint": 1, "rows": 2}]
