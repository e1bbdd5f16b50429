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
    storage.acquire_epoch(spark_checkpoint="spark")  # relative to the job directory
    assert plan_rollback(storage, 2).spark_checkpoint == storage.url_of("spark")
    # a Spark checkpoint kept outside the job directory is recorded as it is, and the rollback
    # edits it only when told to: the directory may be a copy of the job that uses it
    elsewhere = str(tmp_path / "elsewhere")
    storage.acquire_epoch(spark_checkpoint=elsewhere)
    assert spark_checkpoint_of(storage) == elsewhere
    with pytest.raises(CheckpointError, match="outside this directory"):
        plan_rollback(storage, 2)
    plan = plan_rollback(storage, 2, spark_checkpoint=elsewhere)
    assert plan.spark_checkpoint == elsewhere
    with pytest.raises(CheckpointError, match="chk-7 has no _metadata"):
        plan_rollback(storage, 7)
    storage.acquire_epoch(spark_checkpoint="../other/spark")  # never outside the directory
    with pytest.raises(CheckpointError, match="not a path inside the job directory"):
        plan_rollback(storage, 2)


def test_a_copy_of_a_job_whose_epoch_names_the_original_is_refused(tmp_path: Path) -> None:
    """A job directory whose epoch an older streamstate wrote with the absolute location of its
    Spark checkpoint, copied: rolling the copy back refuses (the recorded checkpoint is the
    original's) and touches neither; naming the copy's Spark checkpoint rolls the copy back, and
    the copy still restores."""
    import shutil

    original, at_2 = _job(tmp_path, "heap")
    original.acquire_epoch(spark_checkpoint=original.url_of("spark"))  # as older versions did
    copy_dir = tmp_path / "copy"
    shutil.copytree(tmp_path / "ck", copy_dir)
    copy = FileSystemCheckpointStorage(str(copy_dir), "")
    before = sorted(p.name for p in (tmp_path / "ck" / "spark" / "commits").iterdir())
    with pytest.raises(CheckpointError) as refused:
        rollback(copy, 2)
    message = str(refused.value)
    assert original.url_of("spark") in message and "copy or a move" in message
    assert f"--spark-checkpoint {copy.url_of('spark')}" in message
    assert copy.checkpoint_ids() == original.checkpoint_ids() == [1, 2, 3, 4, 5]
    assert sorted(p.name for p in (copy_dir / "spark" / "commits").iterdir()) == before

    rollback(copy, 2, spark_checkpoint=copy.url_of("spark"))
    assert copy.checkpoint_ids() == [1, 2] and original.checkpoint_ids() == [1, 2, 3, 4, 5]
    assert sorted(p.name for p in (tmp_path / "ck" / "spark" / "commits").iterdir()) == before
    assert sorted(p.name for p in (copy_dir / "spark" / "commits").iterdir()) == [
        ".0.crc",
        ".1.crc",
        ".2.crc",
        "0",
        "1",
        "2",
    ]
    fresh = LocalRunner(AllKinds(), key_selector=lambda r: r[0], parallelism=2, max_parallelism=128)
    fresh.restore(copy.load(2))
    assert runner_content(fresh) == at_2
    fresh.close()


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
