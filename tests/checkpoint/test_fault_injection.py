"""Faults never cost the last complete checkpoint (SPEC §12: a failed snapshot never replaces
the last good checkpoint)."""

from __future__ import annotations

import os
import textwrap
import uuid
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from streamstate import ValueStateDescriptor
from streamstate.checkpoint.storage import FileSystemCheckpointStorage, MemoryCheckpointStorage
from streamstate.errors import CheckpointError, CheckpointNotFoundError, CorruptCheckpointError
from streamstate.format.keyed_file import KeyedSnapshotReader
from streamstate.namespace import VOID_NAMESPACE
from streamstate.runtime.local import LocalRunner
from support.checkpoint import AllKinds, all_kinds_records, runner_content, sigkill_when

SRC = str(Path(__file__).resolve().parents[2] / "src")
TESTS = str(Path(__file__).resolve().parents[1])


def _runner(storage: Any, p: int = 2) -> LocalRunner:
    return LocalRunner(
        AllKinds(),
        key_selector=lambda r: r[0],
        parallelism=p,
        max_parallelism=128,
        checkpoint_storage=storage,
    )


def _two_checkpoints(storage: Any) -> dict[Any, Any]:
    """Checkpoint 1 and 2 of a runner; returns the content at checkpoint 1."""
    runner = _runner(storage)
    runner.run(all_kinds_records(60), final_watermark=False)
    content = runner_content(runner)
    runner.checkpoint()
    runner.run(all_kinds_records(80, per_key=2), final_watermark=False)
    runner.checkpoint()
    runner.close()
    return content


def _assert_restores_checkpoint_1(storage: Any, expected: dict[Any, Any]) -> None:
    runner = _runner(storage, p=3)
    runner.restore()
    assert runner_content(runner) == expected
    assert storage.latest_checkpoint().checkpoint_id == 1
    cp1 = storage.load(1)
    assert storage.problems(cp1, deep=True) == []  # intact, byte for byte
    runner.close()


CHILD = textwrap.dedent(
    """
    import sys, time
    sys.path[:0] = [{src!r}, {tests!r}]
    from support.checkpoint import AllKinds, all_kinds_records
    import streamstate.backends.snapshot_strategy as writer
    from streamstate.checkpoint.storage import FileSystemCheckpointStorage
    from streamstate.runtime.local import LocalRunner

    root, marker = sys.argv[1], sys.argv[2]
    runner = LocalRunner(AllKinds(), key_selector=lambda r: r[0], parallelism=2,
                         max_parallelism=128, checkpoint_storage=FileSystemCheckpointStorage(root))
    runner.run(all_kinds_records(300), final_watermark=False)
    runner.checkpoint()
    runner.run(all_kinds_records(3000, per_key=1), final_watermark=False)
    blocks = [0]

    def slow_yield():
        blocks[0] += 1
        if blocks[0] == 30:
            open(marker, "w").close()
        time.sleep(0.005)

    writer.yield_gil = slow_yield
    futures = [c.checkpoint(2) for c in runner._subtask_checkpointers()]
    i = 0
    while True:  # processing goes on while the background thread writes checkpoint 2
        runner.process((f"key-{{i % 50}}", 10**6 + i))
        i += 1
    """
)


@pytest.mark.subprocess
def test_sigkill_during_an_asynchronous_write(tmp_path: Path) -> None:
    marker = tmp_path / "writing"
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(src=SRC, tests=TESTS))
    sigkill_when(script, [str(tmp_path / "ck"), str(marker)], marker, "writing checkpoint 2")
    storage = FileSystemCheckpointStorage(str(tmp_path / "ck"))
    partial = list((tmp_path / "ck" / "job" / "chk-2").rglob("*.state"))
    assert partial and not (tmp_path / "ck" / "job" / "chk-2" / "_metadata").exists()
    reference = _runner(MemoryCheckpointStorage())
    reference.run(all_kinds_records(300), final_watermark=False)
    _assert_restores_checkpoint_1(storage, runner_content(reference))
    # the next commit removes the failed attempt
    runner = _runner(storage)
    runner.restore()
    runner.checkpoint()
    runner.checkpoint_coordinator.wait_for_retention()  # retention runs in the background
    assert storage.checkpoint_ids() == [1, 3]


def test_flipped_byte_in_a_state_file(tmp_path: Path) -> None:
    storage = FileSystemCheckpointStorage(str(tmp_path))
    expected = _two_checkpoints(storage)
    cp2 = storage.load(2)
    handle = cp2.metadata.operators["keyed-process"].subtasks[0].keyed[0]
    path = tmp_path / "job" / "chk-2" / handle.path
    with path.open("rb") as f:
        reader = KeyedSnapshotReader(f, str(path))
        kg = reader.key_groups()[3]
        offset = reader._offsets[kg - reader.key_group_range.start]
    data = bytearray(path.read_bytes())
    data[offset + 20] ^= 0x10
    path.write_bytes(bytes(data))
    runner = _runner(storage, p=1)
    with pytest.raises(CorruptCheckpointError, match=rf"{path} \(key group {kg}\)"):
        runner.restore()
    runner.restore(1)  # the previous checkpoint is untouched
    assert runner_content(runner) == expected


@pytest.mark.parametrize("where", ["header", "block", "index"])
def test_a_corrupt_delta_file_names_its_key_groups(tmp_path: Path, where: str) -> None:
    storage = FileSystemCheckpointStorage(str(tmp_path))

    def runner(p: int) -> LocalRunner:
        return LocalRunner(
            AllKinds(),
            key_selector=lambda r: r[0],
            parallelism=p,
            max_parallelism=128,
            checkpoint_storage=storage,
            incremental_checkpoints=True,
        )

    first = runner(2)
    first.run(all_kinds_records(60), final_watermark=False)
    first.checkpoint()
    first.run(all_kinds_records(80, per_key=2), final_watermark=False)
    first.checkpoint()
    first.close()
    chain = storage.load(2).metadata.operators["keyed-process"].subtasks[1].keyed
    assert [h.kind for h in chain] == ["full", "delta"]
    path = next((tmp_path / "job").rglob(Path(chain[1].path).name))
    with path.open("rb") as f:
        reader = KeyedSnapshotReader(f, str(path))
        kg = reader.key_groups()[2]
        block = reader._offsets[kg - reader.key_group_range.start]
    data = bytearray(path.read_bytes())
    data[{"header": 10, "block": block + 20, "index": len(data) - 20}[where]] ^= 0x10
    path.write_bytes(bytes(data))
    # subtask 1 of 2 held key groups 64-127; restoring at parallelism 1 reads all of them
    expected = rf"key group {kg}\)" if where == "block" else r"key groups 64-127\)"
    with pytest.raises(CorruptCheckpointError, match=rf"delta\.state \({expected}"):
        runner(1).restore()


def test_deleted_state_file(tmp_path: Path) -> None:
    storage = FileSystemCheckpointStorage(str(tmp_path))
    expected = _two_checkpoints(storage)
    victim = tmp_path / "job" / "chk-2" / "keyed-process" / "1-0.state"
    victim.unlink()
    with pytest.raises(CheckpointNotFoundError, match=rf"missing file {victim}"):
        _runner(storage).restore(2)
    _assert_restores_checkpoint_1(storage, expected)


def test_missing_metadata_is_ignored(tmp_path: Path) -> None:
    storage = FileSystemCheckpointStorage(str(tmp_path))
    expected = _two_checkpoints(storage)
    (tmp_path / "job" / "chk-2" / "_metadata").unlink()
    _assert_restores_checkpoint_1(storage, expected)


def test_torn_metadata_is_ignored() -> None:
    storage = MemoryCheckpointStorage()
    expected = _two_checkpoints(storage)
    data = storage.read_bytes("chk-2/_metadata")
    with storage.open_write("chk-2/_metadata") as f:
        f.write(data[: len(data) // 2])
    _assert_restores_checkpoint_1(storage, expected)


class ReadOnlyMemoryFileSystem(MemoryFileSystem):
    """fsspec's memory filesystem (same store) refusing every write."""

    protocol = "romemory"

    @classmethod
    def _strip_protocol(cls, path: str) -> str:  # type: ignore[override]
        if path.startswith("romemory://"):
            path = "memory://" + path[len("romemory://") :]
        return MemoryFileSystem._strip_protocol(path)  # type: ignore[no-any-return]

    def _open(self, path: str, mode: str = "rb", **kw: Any) -> Any:
        if "r" not in mode:
            raise PermissionError(f"read-only filesystem: {path}")
        return super()._open(path, mode, **kw)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        raise PermissionError(f"read-only filesystem: {path}")

    def rm(self, *args: Any, **kw: Any) -> None:
        raise PermissionError("read-only filesystem")

    def mv(self, *args: Any, **kw: Any) -> None:
        raise PermissionError("read-only filesystem")


def test_read_only_store_refuses_checkpoints_and_keeps_the_last_one() -> None:
    fsspec.register_implementation("romemory", ReadOnlyMemoryFileSystem, clobber=True)
    name = f"streamstate-ro-{uuid.uuid4().hex}"
    writable = FileSystemCheckpointStorage(f"memory://{name}")
    runner = _runner(writable)
    runner.run(all_kinds_records(30), final_watermark=False)
    expected = runner_content(runner)
    runner.checkpoint()
    read_only = FileSystemCheckpointStorage(f"romemory://{name}")
    runner.run(all_kinds_records(40), final_watermark=False)
    with pytest.raises(
        CheckpointError, match=rf"checkpoint directory .*{name}/job.* is not writable"
    ):
        runner.checkpoint(read_only)
    assert read_only.checkpoint_ids() == [1]
    fresh = _runner(read_only, p=3)
    fresh.restore()
    assert runner_content(fresh) == expected


def test_file_in_place_of_the_checkpoint_directory(tmp_path: Path) -> None:
    (tmp_path / "job").write_text("not a directory")
    runner = _runner(FileSystemCheckpointStorage(str(tmp_path)))
    runner.run(all_kinds_records(5), final_watermark=False)
    with pytest.raises(
        CheckpointError, match=rf"checkpoint directory {tmp_path}/job.* not writable"
    ):
        runner.checkpoint()


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_directory(tmp_path: Path) -> None:
    storage = FileSystemCheckpointStorage(str(tmp_path))
    expected = _two_checkpoints(storage)
    (tmp_path / "job").chmod(0o500)
    try:
        runner = _runner(storage)
        runner.run(all_kinds_records(5), final_watermark=False)
        with pytest.raises(CheckpointError, match="not writable"):
            runner.checkpoint()
    finally:
        (tmp_path / "job").chmod(0o700)
    _assert_restores_checkpoint_1(storage, expected)


def test_failed_write_leaves_no_checkpoint_behind() -> None:
    storage = MemoryCheckpointStorage()
    runner = _runner(storage)
    runner.run(all_kinds_records(30), final_watermark=False)
    expected = runner_content(runner)
    runner.checkpoint()
    backend = runner.subtasks[0].keyed_backend
    key = next(iter(backend.state_table("value")))[0]
    backend.set_current_key(key)
    descriptor = ValueStateDescriptor("value", int)
    # an int beyond 64 bits passes the check at the write (its class is int), not the
    # checkpoint ("not an int" is refused at the write itself)
    backend.get_partitioned_state(VOID_NAMESPACE, None, descriptor).update(2**70)
    with pytest.raises(CheckpointError, match=rf"state 'value' in key group \d+ .*{key!r}"):
        runner.checkpoint()
    assert storage.latest_checkpoint().checkpoint_id == 1
    assert storage.read_metadata("chk-2") is None
    assert list(storage.walk_files("chk-2")) in ([], ["chk-2/keyed-process/1-0.state"])
    _assert_restores_checkpoint_1(storage, expected)
