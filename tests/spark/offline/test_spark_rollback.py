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


def _query(spark: Any, tmp_path: Any, state_backend: str) -> Any:
    return keyed_process(
        spark.readStream.schema("user string, v long")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(tmp_path / "in")),
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
