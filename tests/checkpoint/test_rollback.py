"""``rollback``: later checkpoints, their shared files and staged outputs go; Spark's logs are
cut so that batch N+1 re-runs on its own input; a compacted source log is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from streamstate.checkpoint.storage import FileSystemCheckpointStorage
from streamstate.errors import CheckpointError
from streamstate.runtime.local import LocalRunner
from streamstate.spark.offline.rollback import plan_rollback, rollback, spark_checkpoint_of
from support.checkpoint import AllKinds, all_kinds_records, runner_content


def _job(tmp_path: Path, backend: str) -> tuple[FileSystemCheckpointStorage, dict[str, Any]]:
    storage = FileSystemCheckpointStorage(str(tmp_path / "ck"), "")
    storage.retained_checkpoints = 10
    runner = LocalRunner(
        AllKinds(),
        key_selector=lambda r: r[0],
        parallelism=2,
        max_parallelism=128,
        checkpoint_storage=storage,
        state_backend=backend,
        incremental_checkpoints=backend == "heap",
    )
    records = all_kinds_records(100, per_key=1)
    at_2: dict[str, Any] = {}
    for i in range(5):  # chk-1 .. chk-5
        runner.run(records[i * 20 : (i + 1) * 20], final_watermark=False)
        runner.checkpoint()
        if i == 1:
            at_2 = runner_content(runner)
    runner.close()
    spark = tmp_path / "ck" / "spark"
    for log, last in (("offsets", 6), ("commits", 5), ("sources/0", 6)):
        (spark / log).mkdir(parents=True)
        for b in range(last + 1):
            (spark / log / str(b)).write_text("v1")
            (spark / log / f".{b}.crc").write_text("crc")
    for b in range(6):
        (tmp_path / "ck" / "outputs" / f"batch-{b}").mkdir(parents=True)
    return storage, at_2


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_rollback_removes_later_checkpoints_and_cuts_sparks_logs(
    tmp_path: Path, backend: str
) -> None:
    storage, at_2 = _job(tmp_path, backend)
    later_shared = [p for p in storage.walk_files("shared") if "-3-" in p or "-4-" in p]
    assert later_shared or backend == "heap"
    plan = rollback(storage, 2)
    assert plan.checkpoints == ["chk-3", "chk-4", "chk-5"]
    assert storage.checkpoint_ids() == [1, 2]
    assert storage.latest_checkpoint(deep=True).checkpoint_id == 2
    assert not any(storage.size(p) is not None for p in later_shared)
    spark = tmp_path / "ck" / "spark"

    def names(log: str) -> list[str]:
        return sorted(p.name for p in (spark / log).iterdir())

    assert names("commits") == [".0.crc", ".1.crc", ".2.crc", "0", "1", "2"]
    assert names("offsets") == [".0.crc", ".1.crc", ".2.crc", ".3.crc", "0", "1", "2", "3"]
    assert names("sources/0") == names("offsets")
    assert sorted(p.name for p in (tmp_path / "ck" / "outputs").iterdir()) == [
        "batch-0",
        "batch-1",
        "batch-2",
    ]
    assert len(storage.epoch_numbers()) == 1  # the rollback fenced any running driver
    fresh = LocalRunner(AllKinds(), key_selector=lambda r: r[0], parallelism=3, max_parallelism=128)
    fresh.restore(storage.load(2))
    assert runner_content(fresh) == at_2
    fresh.close()


def test_rollback_refuses_a_compacted_source_log_and_changes_nothing(tmp_path: Path) -> None:
    storage, _ = _job(tmp_path, "heap")
    (tmp_path / "ck" / "spark" / "sources" / "0" / "5.compact").write_text("v1")
    with pytest.raises(CheckpointError, match=r"5\.compact is a compaction"):
        rollback(storage, 2)
    assert storage.checkpoint_ids() == [1, 2, 3, 4, 5]
    assert (tmp_path / "ck" / "spark" / "commits" / "5").exists()


def test_rollback_uses_the_spark_checkpoint_the_query_recorded(tmp_path: Path) -> None:
    storage, _ = _job(tmp_path, "heap")
    assert spark_checkpoint_of(storage) == storage.url_of("spark")
    storage.acquire_epoch(spark_checkpoint=str(tmp_path / "elsewhere"))
    assert plan_rollback(storage, 2).spark_checkpoint == str(tmp_path / "elsewhere")
    with pytest.raises(CheckpointError, match="chk-7 has no _metadata"):
        plan_rollback(storage, 7)


def test_rollback_refuses_when_spark_no_longer_has_the_batch_to_rerun(tmp_path: Path) -> None:
    storage, _ = _job(tmp_path, "heap")
    offsets = tmp_path / "ck" / "spark" / "offsets"
    for name in ("1", ".1.crc", "2", ".2.crc"):  # purged by Spark's retention
        (offsets / name).unlink()
    with pytest.raises(CheckpointError, match=r"no longer has batch\(es\) \[1, 2\]"):
        rollback(storage, 1)
    assert storage.checkpoint_ids() == [1, 2, 3, 4, 5]
    rollback(storage, 3)  # offsets/3 and /4 are there
    assert storage.checkpoint_ids() == [1, 2, 3]
