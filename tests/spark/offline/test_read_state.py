"""The state formats in Spark: ``read_state`` and ``spark.read.format("streamstate")`` give the
same rows; records come back as structs in Spark tasks that cannot import the job's record
types (heap and RocksDB, classic and Spark Connect); a filter on ``key`` reads only the key
groups of its keys; an error in a task reaches the user as the error it is. The formats'
logic is tested without Spark in tests/spark/offline/."""

from __future__ import annotations

import struct
import sys
import textwrap
from pathlib import Path
from typing import Any

import msgspec
import pytest

from streamstate import KeyedProcessFunction, LocalRunner, ValueStateDescriptor
from streamstate.checkpoint.storage import FileSystemCheckpointStorage
from streamstate.errors import CheckpointError, CorruptCheckpointError
from streamstate.keygroups import assign_to_key_group

MODULE = "read_state_job_types"


class LastVisit(KeyedProcessFunction):
    """The last visit of each user, a record of a module only the job imports, and a count."""

    def __init__(self, visit: type) -> None:
        self.visit = visit

    def open(self, ctx: Any) -> None:
        self.last = ctx.get_state(ValueStateDescriptor("last", self.visit))
        self.n = ctx.get_state(ValueStateDescriptor("n", int, default=0))

    def process_element(self, value: Any, ctx: Any) -> Any:
        _, page = value
        self.n.update(self.n.value() + 1)
        self.last.update(self.visit(page=page, clicks=self.n.value()))
        return None


def _job(tmp_path: Path, backend: str) -> str:
    """A checkpoint of ``LastVisit`` whose record type lives in a module of ``tmp_path`` that
    only this process can import (Spark's Python workers cannot)."""
    types_dir = tmp_path / "types"
    types_dir.mkdir()
    (types_dir / f"{MODULE}.py").write_text(
        textwrap.dedent(
            """
            import msgspec

            class Visit(msgspec.Struct):
                page: str
                clicks: int
                referrer: str | None = None
            """
        )
    )
    sys.path.insert(0, str(types_dir))
    try:
        visit = __import__(MODULE).Visit
        runner = LocalRunner(
            LastVisit(visit),
            key_selector=lambda r: r[0],
            parallelism=2,
            state_backend=backend,
            checkpoint_storage=str(tmp_path / "ck"),
        )
        runner.run([(f"u{i % 7}", f"/p{i}") for i in range(40)], final_watermark=False)
        runner.checkpoint()
        runner.close()
    finally:
        sys.path.remove(str(types_dir))
    return str(tmp_path / "ck" / "job")


EXPECTED = {
    f"u{k}": (f"/p{max(i for i in range(40) if i % 7 == k)}", 6 if k < 5 else 5) for k in range(7)
}


def test_records_of_a_rocksdb_checkpoint_in_tasks_that_cannot_import_them(
    spark: Any, tmp_path: Path
) -> None:
    path = _job(tmp_path, "rocksdb")
    del sys.modules[MODULE]  # the driver does not hold the class either
    state = read_state_rows(spark, path)
    assert {r.key: (r.value.page, r.value.clicks) for r in state} == EXPECTED
    assert all(r.value.referrer is None and r.namespace is None for r in state)


def read_state_rows(spark: Any, path: str) -> list[Any]:
    from streamstate.spark import read_state

    df = read_state(spark, path, state="last")
    assert df.schema.simpleString() == (
        "struct<key:string,namespace:string,value:struct<page:string,clicks:bigint,"
        "referrer:string>>"
    )
    rows = df.collect()
    assert sorted(rows) == sorted(
        spark.read.format("streamstate").option("state", "last").load(path).collect()
    )
    return rows


def test_the_formats_from_a_connect_client_with_a_filter(any_spark: Any, tmp_path: Path) -> None:
    from streamstate.spark import original_error, register

    spark = any_spark
    path = _job(tmp_path, "heap")
    sys.modules.pop(MODULE, None)
    register(spark)
    register(spark)  # again: nothing changes
    df = spark.read.format("streamstate").option("state", "last").load(path)
    picked = df.filter("key in ('u1', 'u4')").select("key", "value.clicks").collect()
    assert sorted((r.key, r.clicks) for r in picked) == [("u1", 6), ("u4", 6)]
    meta = spark.read.format("streamstate-metadata").load(path)
    assert {(r.state, r.kind) for r in meta.collect()} >= {("last", "value"), ("n", "value")}
    feed = (
        spark.read.format("streamstate")
        .option("state", "n")
        .option("readChangeFeed", "true")
        .option("changeStartCheckpointId", 1)
        .load(path)
    )
    assert sorted((r.checkpoint_id, r.change_type, r.key, r.value) for r in feed.collect()) == [
        (1, "update", f"u{k}", 6 if k < 5 else 5) for k in range(7)
    ]
    # a state the checkpoint does not hold fails the plan (Spark's AnalysisException), and
    # original_error gives streamstate's error
    with pytest.raises(Exception) as failed:
        spark.read.format("streamstate").option("state", "nope").load(path).collect()
    error = original_error(failed.value)
    assert isinstance(error, CheckpointError)
    assert "no keyed state 'nope'" in str(error) and "'last'" in str(error)


def _damage_all_blocks_but(path: str, keep: int) -> None:
    """Flip a byte in every key-group block of the latest checkpoint's keyed files except key
    group ``keep``'s (the footer index gives their offsets: docs/formats.md)."""
    cp = FileSystemCheckpointStorage(path, "").load()
    for handle in cp.metadata.files():
        if handle.kind != "full":
            continue
        file = Path(path) / cp.resolve(handle.path)
        data = bytearray(file.read_bytes())
        _crc, footer_len, _magic = struct.unpack(">II4s", data[-12:])
        footer = msgspec.msgpack.decode(bytes(data[-12 - footer_len : -12]))
        for i, (offset, size) in enumerate(zip(footer["offsets"], footer["sizes"], strict=True)):
            if size and footer["first_key_group"] + i != keep:
                data[offset + size - 5] ^= 0xFF
        file.write_bytes(bytes(data))


def test_a_filter_reads_only_its_key_groups_and_a_task_error_is_the_users(
    spark: Any, tmp_path: Path
) -> None:
    from streamstate.spark import original_error, read_state

    path = _job(tmp_path, "heap")
    _damage_all_blocks_but(path, assign_to_key_group("u3", 128))
    one = read_state(spark, path, state="n").filter("key = 'u3'").collect()
    assert [(r.key, r.value) for r in one] == [("u3", 6)]
    with pytest.raises(Exception) as failed:
        read_state(spark, path, state="n").collect()
    error = original_error(failed.value)
    assert isinstance(error, CorruptCheckpointError)
    assert "block checksum mismatch" in str(error) and "key group" in str(error)
    assert "\tat org.apache" not in str(failed.value)  # Spark's message: no Java frames
