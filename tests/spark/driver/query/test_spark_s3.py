"""The Spark runtime with its state checkpoints on an S3-compatible server (moto on 127.0.0.1):
checkpoint, restore, rescale and ``read_state`` there, heap and RocksDB. Spark's own streaming
checkpoint cannot use ``s3a://`` here (no hadoop-aws jar): it lives in ``spark_checkpoint=``."""

from __future__ import annotations

from typing import Any

import pytest

from streamstate.checkpoint.storage import FileSystemCheckpointStorage
from streamstate.spark import FileSink, keyed_process, read_state
from support.spark_data import final_counts, make_batches, running_counts, write_batches
from support.spark_functions import CountWithRecordLog

pytestmark = pytest.mark.spark


def _source(spark: Any, directory: str) -> Any:
    return (
        spark.readStream.schema("user string, v long")
        .option("maxFilesPerTrigger", 1)
        .parquet(directory)
    )


@pytest.mark.parametrize("state_backend", ["heap", "rocksdb"])
def test_streaming_state_on_s3_checkpoints_restores_rescales_and_reads(
    spark: Any, tmp_path: Any, s3_bucket: Any, state_backend: str
) -> None:
    url, options = s3_bucket
    checkpoint = f"{url}/jobs/counts"
    batches = make_batches(6, 200, users=30, seed=5)
    sink = str(tmp_path / "out")
    for phase, parallelism in enumerate((2, 3)):
        write_batches(str(tmp_path / "in"), batches[3 * phase : 3 * phase + 3], start=3 * phase)
        query = keyed_process(
            _source(spark, str(tmp_path / "in")),
            key="user",
            function=CountWithRecordLog(),
            output_schema="user string, n long, seen long",
            checkpoint=checkpoint,
            storage_options=options,
            parallelism=parallelism,
            state_backend=state_backend,
        ).write_stream(
            FileSink(sink),
            trigger={"availableNow": True},
            spark_checkpoint=str(tmp_path / "spark-ck"),
        )
        query.await_termination()
        restores = [b["restore"] for b in query.batches]
        assert restores[0] == (["empty"] if phase == 0 else ["reload"]), restores
        assert restores[1:] == [["hot"]] * (len(restores) - 1)
    out = FileSink(sink).read_arrow().to_pylist()
    assert sorted((r["user"], r["n"]) for r in out) == running_counts(batches)
    state = read_state(spark, checkpoint, state="n", storage_options=options).collect()
    assert {r.key: r.value for r in state} == final_counts(batches)
    storage = FileSystemCheckpointStorage(checkpoint, "", storage_options=options)
    latest = storage.latest_checkpoint(deep=True)
    assert latest.checkpoint_id == 5 and latest.url.startswith("s3://")
    assert (tmp_path / "spark-ck" / "offsets" / "5").exists()  # Spark's log stayed local
    assert storage.list_dir("spark") == []
    if state_backend == "rocksdb":
        # the last batch (hot) uploaded only its own new SST files and references the ones an
        # earlier checkpoint uploaded to S3, by the same paths (the batch after the rescale
        # may rewrite everything: RocksDB compacts the restored files with its first flush)
        chk4 = storage.load(4)
        earlier = {f.path for f in chk4.metadata.files() if f.kind == "rocksdb-sst"}
        for sub in latest.metadata.operators["keyed-process"].subtasks:
            ssts = [f for f in sub.keyed if f.kind == "rocksdb-sst"]
            reused = {f.path for f in ssts if f.checkpoint_id < 5}
            assert reused and reused <= earlier, sub.keyed
