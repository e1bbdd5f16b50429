"""A filter on ``key`` reads only the key groups that can hold the keys: the other partitions are
dropped and, in the partitions left, no other key group's block is read. Shown on canonical
files by damaging every other key group's blocks (a read of them would fail its checksum), and
on RocksDB by recording which key groups are scanned."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import msgspec
import pytest
from offline_reads import read_rows, state_reader
from pyspark.sql.datasource import EqualTo, GreaterThan, In

from streamstate import KeyedProcessFunction, LocalRunner, ValueStateDescriptor
from streamstate.checkpoint.storage import FileSystemCheckpointStorage
from streamstate.errors import CorruptCheckpointError
from streamstate.keygroups import assign_to_key_group
from support.checkpoint import placement_1_savepoint, strip_key_group_placement

MAX_P = 128
USERS = [f"user-{i}" for i in range(200)]


class Count(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.n = ctx.get_state(ValueStateDescriptor("n", int, default=0))

    def process_element(self, value: Any, ctx: Any) -> Any:
        self.n.update(self.n.value() + 1)
        return None


def _job(root: Path, backend: str, incremental: bool) -> str:
    runner = LocalRunner(
        Count(),
        key_selector=lambda r: r,
        parallelism=4,
        max_parallelism=MAX_P,
        state_backend=backend,
        incremental_checkpoints=incremental,
        checkpoint_storage=str(root),
    )
    runner.run(USERS, final_watermark=False)
    runner.checkpoint()
    runner.run(USERS[::3], final_watermark=False)
    runner.checkpoint()
    runner.close()
    return str(root / "job")


def _damage_other_key_groups(job: str, keep: set[int]) -> int:
    """Flip a byte in every block of every keyed file of the latest checkpoint whose key group
    is not in ``keep`` (docs/formats.md: the footer index gives each block's offset)."""
    storage = FileSystemCheckpointStorage(job, "")
    cp = storage.load()
    damaged = 0
    for handle in cp.metadata.files():
        if handle.kind not in ("full", "delta"):
            continue
        path = Path(job) / cp.resolve(handle.path)
        data = bytearray(path.read_bytes())
        _crc, footer_len, _magic = struct.unpack(">II4s", data[-12:])
        footer = msgspec.msgpack.decode(bytes(data[-12 - footer_len : -12]))
        first = footer["first_key_group"]
        for i, (offset, size) in enumerate(zip(footer["offsets"], footer["sizes"], strict=True)):
            if size and first + i not in keep:
                data[offset + size - 5] ^= 0xFF  # inside the stored bytes: the CRC fails
                damaged += 1
        path.write_bytes(bytes(data))
    return damaged


@pytest.mark.parametrize("incremental", [False, True], ids=["full", "incremental"])
def test_canonical_files_read_only_the_key_groups_of_the_keys(
    tmp_path: Path, incremental: bool
) -> None:
    job = _job(tmp_path, "heap", incremental)
    keys = ["user-7", "user-150"]
    groups = {assign_to_key_group(k, MAX_P) for k in keys}
    assert _damage_other_key_groups(job, groups) > 50
    rows = read_rows(job, state="n", keys=keys)
    by_key = {r["key"]: r["value"] for r in rows}
    assert by_key["user-7"] == 1 and by_key["user-150"] == 2  # 150 % 3 == 0: counted twice
    assert {assign_to_key_group(k, MAX_P) for k in by_key} == groups
    with pytest.raises(CorruptCheckpointError, match="block checksum mismatch"):
        read_rows(job, state="n")  # without the filter every block is read


def test_partitions_without_the_keys_are_dropped(tmp_path: Path) -> None:
    job = _job(tmp_path, "heap", False)
    reader = state_reader(job, state="n")
    assert len(reader.partitions()) == 4
    remaining = list(reader.pushFilters([EqualTo(("key",), "user-7")]))
    assert len(remaining) == 1  # Spark still filters the rows
    (partition,) = reader.partitions()
    from streamstate.spark.offline.plan import ReadPartition

    part = msgspec.msgpack.decode(partition.value, type=ReadPartition)
    assert part.only == [assign_to_key_group("user-7", MAX_P)]
    # filters that cannot narrow the read leave every partition
    for filters in ([GreaterThan(("key",), "a")], [EqualTo(("value",), 3)], [EqualTo(("key",), 7)]):
        other = state_reader(job, state="n")
        list(other.pushFilters(filters))
        assert len(other.partitions()) == 4
    # IN and = together: the keys of both
    both = state_reader(job, state="n")
    list(both.pushFilters([In(("key",), ("user-1", "user-2")), EqualTo(("key",), "user-2")]))
    assert [
        msgspec.msgpack.decode(p.value, type=ReadPartition).only for p in both.partitions()
    ] == [[assign_to_key_group("user-2", MAX_P)]]


def test_rocksdb_scans_only_the_key_groups_of_the_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streamstate.backends.rocksdb.snapshot import RocksDBKeyedStateSnapshot

    job = _job(tmp_path, "rocksdb", True)
    scanned: list[int] = []
    # every read of a key group's entries goes through raw_columns (raw_entries too)
    raw_columns = RocksDBKeyedStateSnapshot.raw_columns

    def recording(self: Any, state_name: str, key_group: int) -> Any:
        scanned.append(key_group)
        return raw_columns(self, state_name, key_group)

    monkeypatch.setattr(RocksDBKeyedStateSnapshot, "raw_columns", recording)
    keys = ["user-7", "user-150"]
    rows = read_rows(job, state="n", keys=keys)
    assert {r["key"]: r["value"] for r in rows if r["key"] in keys} == {"user-7": 1, "user-150": 2}
    assert set(scanned) == {assign_to_key_group(k, MAX_P) for k in keys}
    scanned.clear()
    assert len(read_rows(job, state="n")) == len(USERS)
    assert set(scanned) == set(range(MAX_P))


def test_int_keys_of_an_older_placement_narrow_the_read_unless_misplaced(tmp_path: Path) -> None:
    """A checkpoint without a key group placement narrows a filter on an int key when its keys
    are where they belong; one whose int keys a Spark job put all in one key group (placement 1
    of an INT column) is read whole, and the key is found."""
    runner = LocalRunner(
        Count(),
        key_selector=lambda r: r,
        parallelism=4,
        max_parallelism=MAX_P,
        checkpoint_storage=str(tmp_path),
    )
    runner.run([*range(200), 7], final_watermark=False)
    checkpoint = runner.checkpoint()
    runner.close()
    job = str(tmp_path / "job")
    strip_key_group_placement(job)
    reader = state_reader(job, state="n")
    list(reader.pushFilters([EqualTo(("key",), 7)]))
    assert len(reader.partitions()) == 1  # placed right: narrowed
    legacy = str(tmp_path / "legacy")
    placement_1_savepoint(checkpoint, legacy)
    reader = state_reader(legacy, state="n")
    list(reader.pushFilters([EqualTo(("key",), 7)]))
    assert len(reader.partitions()) == 4  # every key in one key group: the whole read
    rows = read_rows(legacy, state="n", keys=[7])
    assert [(r["key"], r["value"]) for r in rows if r["key"] == 7] == [(7, 2)]
