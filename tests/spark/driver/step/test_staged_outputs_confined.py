"""The staged outputs a committed checkpoint records are input too (SPEC §14.5): a path outside
the job's ``outputs/`` is refused when the driver delivers them again, and a staged file that is a
link is refused, not copied into the sink (no Spark needed)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamstate.checkpoint.metadata import CheckpointMetadata
from streamstate.checkpoint.storage import FileSystemCheckpointStorage
from streamstate.errors import CorruptCheckpointError
from streamstate.spark.driver.sinks import FileSink, StagedBatch
from streamstate.spark.driver.step.commit import CheckpointLog
from streamstate.spark.wire.results import StagedOutput

SCHEMA = pa.schema([("v", pa.int64())])


def _committed(storage: Any, **properties: Any) -> Any:
    metadata = CheckpointMetadata(
        checkpoint_id=1, timestamp=0, properties={"lineage": "l", "batch_id": 1, **properties}
    )
    storage.write_metadata("chk-1", metadata)
    return storage.load(1)


@pytest.mark.parametrize(
    "path", ["../../secret.parquet", "/etc/hostname", "chk-1/x.parquet", "outputs/../../x"]
)
def test_staged_outputs_outside_the_outputs_directory_are_refused(
    tmp_path: Path, path: str
) -> None:
    storage = FileSystemCheckpointStorage(str(tmp_path / "ck"), "")
    log = CheckpointLog(storage, "op", 1)
    staged = {"path": path, "size": 1, "rows": 1}
    cp = _committed(storage, outputs=[staged])
    with pytest.raises(CorruptCheckpointError, match=r"outputs\[0\] in _metadata") as err:
        log.delivery_of(cp)
    assert cp.url in str(err.value)
    storage.delete("chk-1")
    cp = _committed(storage, side_outputs={"late": [staged]})
    with pytest.raises(CorruptCheckpointError, match=r"side_outputs\['late'\]\[0\] in _metadata"):
        log.delivery_of(cp)
    log.coordinator.close()


def test_a_staged_output_that_is_a_link_is_not_copied_into_the_sink(tmp_path: Path) -> None:
    storage = FileSystemCheckpointStorage(str(tmp_path / "ck"), "")
    secret = tmp_path / "secret.parquet"
    pq.write_table(pa.table({"v": [42]}), secret)
    with storage.open_write("outputs/batch-1/part-0.parquet") as f:
        pq.write_table(pa.table({"v": [1, 2]}), f)
    os.makedirs(tmp_path / "ck" / "outputs" / "batch-2")
    os.symlink(secret, tmp_path / "ck" / "outputs" / "batch-2" / "part-0.parquet")
    sink = FileSink(str(tmp_path / "out"))

    def staged(b: int) -> StagedBatch:
        path = f"outputs/batch-{b}/part-0.parquet"
        return StagedBatch(
            b, [StagedOutput(path=path, size=1, rows=1)], storage, SCHEMA, None, None
        )

    sink.write(staged(1))
    with pytest.raises(CorruptCheckpointError, match="symbolic link"):
        sink.write(staged(2))
    with pytest.raises(CorruptCheckpointError, match="symbolic link"):
        staged(2).urls()  # what Spark would read
    assert sink.committed_batches() == [1]
    assert sink.read_arrow().column("v").to_pylist() == [1, 2]
