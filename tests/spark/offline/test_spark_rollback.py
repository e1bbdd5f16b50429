"""Recovery: the latest ``_metadata`` is corrupt, the query refuses to start, ``streamstate
checkpoints rollback --to N`` rolls the state and Spark's logs back, and the restarted query
re-runs the later batches exactly once (sink and state equal the oracle)."""

from __future__ import annotations

import os
from typing import Any

import pytest
from typer.testing import CliRunner

from streamstate.checkpoint.storage import FileSystemCheckpointStorage
from streamstate.cli import app
from streamstate.errors import CheckpointError
from streamstate.spark import FileSink, keyed_process, read_state
from support.spark_data import final_counts, make_batches, running_counts, write_batches
from support.spark_functions import Count

pytestmark = pytest.mark.spark


def _query(spark: Any, tmp_path: Any, state_backend: str, inputs: Any = None) -> Any:
    return keyed_process(
        spark.readStream.schema("user string, v long")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(inputs or tmp_path / "in")),
        key="user",
        function=Count(),
        output_schema="user string, n long",
        checkpoint=str(tmp_path / "ck"),
        parallelism=2,
        state_backend=state_backend,
    ).write_stream("parquet", path=str(tmp_path / "out"), trigger={"availableNow": True})


# each setting once: the classic session on RocksDB without rolling the sink back (the parquet
# sink skips a batch whose marker exists), the Spark Connect client on the heap with the sink
# rolled back too (the rollback is the CLI's: it works on the files, whichever session wrote them)
@pytest.mark.parametrize(
    ("session", "state_backend", "with_sink"),
    [("spark", "rocksdb", False), ("connect_spark", "heap", True)],
)
def test_rollback_after_a_corrupt_latest_metadata_reruns_later_batches_once(
    request: Any, tmp_path: Any, session: str, state_backend: str, with_sink: bool
) -> None:
    spark = request.getfixturevalue(session)  # a classic session or a Spark Connect client
    batches = make_batches(6, 150, users=20, seed=21)
    write_batches(str(tmp_path / "in"), batches[:4])
    _query(spark, tmp_path, state_backend).await_termination()
    ck = tmp_path / "ck"
    (ck / "chk-3" / "_metadata").write_bytes(b"{ not json")  # the latest commit is corrupt
    write_batches(str(tmp_path / "in"), batches[4:], start=4)
    with pytest.raises(CheckpointError, match=r"is chk-2.*checkpoints rollback .* --to 2"):
        _query(spark, tmp_path, state_backend).await_termination()

    args = ["checkpoints", "rollback", str(ck), "--to", "2", "--yes"]
    if with_sink:
        args += ["--sink", str(tmp_path / "out")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "rolled back to chk-2" in result.output

    def last(log: str) -> int:
        return max(int(n) for n in os.listdir(ck / "spark" / log) if n.isdigit())

    # Spark re-runs batch 3 on the input it had (offsets/3 kept); batch 4's plan is gone
    assert last("commits") == 2 and last("offsets") == 3 and last("sources/0") == 3
    assert not (ck / "chk-3").exists()

    query = _query(spark, tmp_path, state_backend)
    query.await_termination()
    assert [b["batch"] for b in query.batches] == [3, 4, 5]  # batch 3 runs again, from chk-2
    assert query.batches[0]["restore"] == ["reload"]
    out = FileSink(str(tmp_path / "out")).read_arrow().to_pylist()
    assert sorted((r["user"], r["n"]) for r in out) == running_counts(batches)  # once each
    assert sorted({r["batch"] for r in out}) == list(range(6))
    state = read_state(spark, str(ck), state="n").collect()
    assert {r.key: r.value for r in state} == final_counts(batches)
    storage = FileSystemCheckpointStorage(str(ck), "")
    assert storage.latest_checkpoint(deep=True).checkpoint_id == 5
    result = CliRunner().invoke(app, ["checkpoints", "verify", str(ck)])
    assert result.exit_code == 0, result.output


def test_rollback_refuses_a_checkpoint_that_is_not_intact(tmp_path: Any) -> None:
    result = CliRunner().invoke(app, ["checkpoints", "rollback", str(tmp_path), "--to", "3"])
    assert result.exit_code == 1
    assert "chk-3 has no _metadata" in " ".join(result.output.split())


def _spark_log(ck: Any, log: str) -> list[int]:
    return sorted(int(n) for n in os.listdir(ck / "spark" / log) if n.isdigit())


def test_a_copied_job_directory_rolls_back_and_resumes_on_its_own(
    spark: Any, tmp_path: Any
) -> None:
    """Copy the job directory and its sink, roll the copy back and restart it: the copy's sink
    ends equal to the original's, and the original's Spark log and checkpoints are untouched."""
    import shutil

    batches = make_batches(6, 100, users=15, seed=5)
    write_batches(str(tmp_path / "in"), batches)
    _query(spark, tmp_path, "rocksdb").await_termination()
    ck, copy = tmp_path / "ck", tmp_path / "copy"
    copy.mkdir()
    shutil.copytree(ck, copy / "ck")
    shutil.copytree(tmp_path / "out", copy / "out")
    original_commits = _spark_log(ck, "commits")
    original_checkpoints = sorted(os.listdir(ck))

    args = ["checkpoints", "rollback", str(copy / "ck"), "--to", "3", "--yes"]
    result = CliRunner().invoke(app, [*args, "--sink", str(copy / "out")])
    assert result.exit_code == 0, result.output
    assert _spark_log(ck, "commits") == original_commits and original_commits[-1] == 5
    assert sorted(os.listdir(ck)) == original_checkpoints
    assert _spark_log(copy / "ck", "commits") == [b for b in original_commits if b <= 3]

    query = _query(spark, copy, "rocksdb", inputs=tmp_path / "in")
    query.await_termination()
    assert [b["batch"] for b in query.batches] == [4, 5]
    rows = FileSink(str(copy / "out")).read_arrow().to_pylist()
    assert sorted((r["user"], r["n"]) for r in rows) == running_counts(batches)
    original = FileSink(str(tmp_path / "out")).read_arrow().to_pylist()
    assert sorted((r["batch"], r["user"], r["n"]) for r in rows) == sorted(
        (r["batch"], r["user"], r["n"]) for r in original
    )
    assert _spark_log(ck, "commits") == original_commits


def test_a_state_behind_sparks_log_refuses_to_start(spark: Any, tmp_path: Any) -> None:
    """The latest ``_metadata`` is lost: the query refuses to start, with or without input
    waiting, with the short error naming the checkpoint, Spark's micro-batch and the rollback
    command (no Spark plan), before Spark runs anything. (Both on one job: a refused start
    leaves the checkpoint and Spark's logs as they were, which the first one checks.)"""
    batches = make_batches(5, 50, users=10, seed=8)
    write_batches(str(tmp_path / "in"), batches[:4])
    _query(spark, tmp_path, "heap").await_termination()
    ck = tmp_path / "ck"
    (ck / "chk-3" / "_metadata").unlink()  # a lost upload, a manual cleanup
    for new_input in (False, True):
        if new_input:
            write_batches(str(tmp_path / "in"), batches[4:], start=4)
        offsets = _spark_log(ck, "offsets")
        checkpoints = sorted(os.listdir(ck))
        with pytest.raises(CheckpointError) as raised:
            _query(spark, tmp_path, "heap")
        message = str(raised.value)
        assert "committed micro-batch 3" in message and "is chk-2" in message, new_input
        assert f"streamstate checkpoints rollback {ck} --to 2" in message
        assert "Plan" not in message and len(message.splitlines()) == 1
        assert raised.value.__cause__ is None
        assert _spark_log(ck, "offsets") == offsets  # Spark did not start
        assert sorted(os.listdir(ck)) == checkpoints  # nor did the state's next checkpoint
