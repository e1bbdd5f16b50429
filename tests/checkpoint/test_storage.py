"""Checkpoint storage: layout, atomic metadata, completeness, retention, locations."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from streamstate.checkpoint.metadata import METADATA_VERSION
from streamstate.checkpoint.storage import (
    FileSystemCheckpointStorage,
    MemoryCheckpointStorage,
    open_location,
    resolve_checkpoint,
)
from streamstate.errors import CheckpointNotFoundError, CorruptCheckpointError
from streamstate.runtime.local import LocalRunner
from support.checkpoint import AllKinds, all_kinds_records, runner_content


def _runner(storage: Any, p: int = 2, **kw: Any) -> LocalRunner:
    return LocalRunner(
        AllKinds(),
        key_selector=lambda r: r[0],
        parallelism=p,
        max_parallelism=128,
        checkpoint_storage=storage,
        **kw,
    )


def test_layout_and_metadata_on_a_local_directory(tmp_path: Path) -> None:
    runner = _runner(str(tmp_path), operator_name="counter")
    runner.run(all_kinds_records(30), final_watermark=False)
    cp = runner.checkpoint()
    job = tmp_path / "job"
    files = sorted(str(p.relative_to(job)) for p in job.rglob("*") if p.is_file())
    assert files == [
        "chk-1/_metadata",
        "chk-1/counter/0-0.state",
        "chk-1/counter/1-0.state",
    ]
    doc = json.loads((job / "chk-1" / "_metadata").read_text())
    assert doc["format"] == "streamstate-checkpoint-metadata"
    assert doc["version"] == METADATA_VERSION and doc["kind"] == "checkpoint"
    op = doc["operators"]["counter"]
    assert op["parallelism"] == 2 and op["max_parallelism"] == 128
    sub0, sub1 = op["subtasks"]
    assert sub0["key_group_range"] == [0, 63] and sub1["key_group_range"] == [64, 127]
    handle = sub0["keyed"][0]
    assert handle["path"] == "counter/0-0.state"
    assert handle["size"] == (job / "chk-1" / "counter" / "0-0.state").stat().st_size
    assert handle["kind"] == "full" and isinstance(handle["checksum"], int)
    assert sum(n for _, n in handle["entries"]) + sum(
        n for _, n in sub1["keyed"][0]["entries"]
    ) == len(runner_content(runner))
    assert "_timers.user.event" in handle["states"]
    assert cp.checkpoint_id == 1 and cp.storage.problems(cp, deep=True) == []
    runner.close()


def test_version_1_metadata_still_restores_and_newer_versions_are_refused(tmp_path: Path) -> None:
    storage = FileSystemCheckpointStorage(str(tmp_path))
    runner = _runner(storage)
    runner.run(all_kinds_records(20), final_watermark=False)
    expected = runner_content(runner)
    runner.checkpoint()
    runner.close()
    path = tmp_path / "job" / "chk-1" / "_metadata"
    doc = json.loads(path.read_text())
    assert METADATA_VERSION == 2
    doc["version"] = 1  # written by the release before native RocksDB snapshots
    path.write_text(json.dumps(doc))
    old = _runner(storage, p=3)
    old.restore(1)
    assert runner_content(old) == expected
    old.close()
    doc["version"] = 3
    path.write_text(json.dumps(doc))
    with pytest.raises(CorruptCheckpointError, match="metadata version 3; .*reads versions 1, 2"):
        storage.read_metadata("chk-1")


@pytest.mark.parametrize("form", ["path", "file_url", "memory_url"])
def test_url_forms(tmp_path: Path, form: str) -> None:
    url = {
        "path": str(tmp_path),
        "file_url": f"file://{tmp_path}",
        "memory_url": f"memory://streamstate-test-{os.getpid()}-{form}",
    }[form]
    storage = FileSystemCheckpointStorage(url, "job-a")
    runner = _runner(storage)
    runner.run(all_kinds_records(10), final_watermark=False)
    expected = runner_content(runner)
    runner.checkpoint()
    fresh = _runner(FileSystemCheckpointStorage(url, "job-a"), p=3)
    fresh.restore()
    assert runner_content(fresh) == expected
    storage.delete("")


def test_metadata_is_written_last_and_atomically(tmp_path: Path) -> None:
    storage = FileSystemCheckpointStorage(str(tmp_path))
    order: list[str] = []
    real_open_write, real_put = storage.open_write, storage.put_atomic
    real_create = storage.put_if_absent

    def open_write(path: str) -> Any:
        order.append(path)
        return real_open_write(path)

    def put_atomic(path: str, data: bytes) -> None:
        order.append(path)
        real_put(path, data)

    def put_if_absent(path: str, data: bytes) -> bool:
        order.append(path)
        return real_create(path, data)

    storage.open_write = open_write  # type: ignore[method-assign]
    storage.put_atomic = put_atomic  # type: ignore[method-assign]
    storage.put_if_absent = put_if_absent  # type: ignore[method-assign]
    runner = _runner(storage)
    runner.run(all_kinds_records(5), final_watermark=False)
    runner.checkpoint()
    assert order[-1] == "chk-1/_metadata"
    assert not [p for p in (tmp_path / "job").rglob("*") if ".tmp-" in p.name]


def test_retention_keeps_the_last_n_and_removes_orphans() -> None:
    storage = MemoryCheckpointStorage(retained_checkpoints=3)
    runner = _runner(storage)
    for i in range(5):
        runner.run(all_kinds_records(5 + i), final_watermark=False)
        runner.checkpoint()
    runner.checkpoint_coordinator.wait_for_retention()  # retention runs in the background
    assert storage.checkpoint_ids() == [3, 4, 5]
    # failed attempts: a stray file in a kept checkpoint, directories without _metadata
    with storage.open_write("chk-4/keyed-process/0-1.state") as f:
        f.write(b"stray")
    with storage.open_write("chk-2/keyed-process/0-0.state") as f:
        f.write(b"partial")
    with storage.open_write("chk-9/keyed-process/0-0.state") as f:
        f.write(b"partial")
    runner.checkpoint()  # 10: retention runs after the commit
    runner.checkpoint_coordinator.wait_for_retention()
    assert storage.checkpoint_ids() == [4, 5, 10]
    assert storage.size("chk-4/keyed-process/0-1.state") is None
    # a checkpoint still being written (newer than the latest complete one) is left alone
    with storage.open_write("chk-11/keyed-process/0-0.state") as f:
        f.write(b"in progress")
    storage.apply_retention()
    assert storage.checkpoint_ids() == [4, 5, 10, 11]
    assert [c.checkpoint_id for c in storage.complete_checkpoints()] == [4, 5, 10]


def test_complete_means_metadata_and_every_listed_file_with_size_and_checksum() -> None:
    storage = MemoryCheckpointStorage()
    runner = _runner(storage)
    runner.run(all_kinds_records(20), final_watermark=False)
    runner.checkpoint()
    runner.run(all_kinds_records(21), final_watermark=False)
    cp2 = runner.checkpoint()
    path = cp2.resolve(cp2.metadata.operators["keyed-process"].subtasks[1].keyed[0].path)
    data = bytearray(storage.read_bytes(path))
    data[len(data) // 2] ^= 1
    with storage.open_write(path) as f:
        f.write(bytes(data))
    assert storage.latest_checkpoint().checkpoint_id == 2  # same size: only a deep check sees it
    assert storage.latest_checkpoint(deep=True).checkpoint_id == 1
    assert "checksum mismatch" in storage.problems(cp2, deep=True)[0]
    with storage.open_write(path) as f:
        f.write(bytes(data[:-10]))
    assert storage.latest_checkpoint().checkpoint_id == 1
    with pytest.raises(CheckpointNotFoundError, match=r"chk-2 is incomplete: file .* has"):
        storage.load(2)


def test_nothing_to_restore_names_the_directory() -> None:
    storage = MemoryCheckpointStorage()
    with pytest.raises(CheckpointNotFoundError, match=r"nothing to restore: .*streamstate-"):
        storage.latest_checkpoint()
    with pytest.raises(CheckpointNotFoundError, match=r"chk-4 has no _metadata"):
        storage.load(4)


def test_checkpoint_references(tmp_path: Path) -> None:
    storage = FileSystemCheckpointStorage(str(tmp_path))
    runner = _runner(storage)
    runner.run(all_kinds_records(5), final_watermark=False)
    runner.checkpoint()
    sp = runner.savepoint()
    runner.checkpoint()
    assert resolve_checkpoint(None, storage).checkpoint_id == 2
    assert resolve_checkpoint(1, storage).checkpoint_id == 1
    assert resolve_checkpoint("chk-1", storage).checkpoint_id == 1
    assert resolve_checkpoint("savepoints/sp-1", storage).is_savepoint
    # absolute locations, as a user types them
    job = tmp_path / "job"
    assert resolve_checkpoint(str(job / "chk-1"), storage).checkpoint_id == 1
    by_path = resolve_checkpoint(str(job / "savepoints" / "sp-1"), storage)
    assert by_path.is_savepoint and by_path.metadata == sp.metadata
    assert resolve_checkpoint(str(job), storage).checkpoint_id == 2
    other, directory = open_location(str(job))
    assert directory is None and other.checkpoint_ids() == [1, 2]
    # fsspec options reach the storage that reads the location (credentials, endpoints)
    with_options, directory = open_location(str(job / "chk-1"), {"auto_mkdir": True})
    assert directory == "chk-1"
    assert with_options.storage_options == {"auto_mkdir": True}  # type: ignore[attr-defined]
    assert with_options._fs.storage_options == {"auto_mkdir": True}  # type: ignore[attr-defined]


def test_storage_pickles_for_executors(tmp_path: Path) -> None:
    import pickle

    storage = FileSystemCheckpointStorage(str(tmp_path), "job-x", retained_checkpoints=5)
    copy = pickle.loads(pickle.dumps(storage))
    assert copy.url == storage.url and copy.retained_checkpoints == 5
    copy.ensure_writable()


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o027])
def test_a_local_checkpoint_is_private_to_its_owner(tmp_path: Path, umask: int) -> None:
    """State and pickled functions are in the checkpoint: directories it creates are 0700 and
    files 0600 (or stricter, as the umask asks), whatever the umask lets others have."""
    old = os.umask(umask)
    try:
        runner = _runner(str(tmp_path / "ck"), operator_name="counter")
        runner.run(all_kinds_records(30), final_watermark=False)
        runner.checkpoint()
        FileSystemCheckpointStorage(str(tmp_path / "ck"), "job").put_if_absent("a/b/c", b"x")
    finally:
        os.umask(old)
    made = [tmp_path / "ck", *(tmp_path / "ck").rglob("*")]
    assert len(made) > 5
    for p in made:
        mode = os.stat(p).st_mode & 0o777
        want = (0o700 if p.is_dir() else 0o600) & ~umask
        assert mode == want, (str(p), oct(mode), oct(want))


def test_readers_of_one_memory_file_do_not_share_a_position() -> None:
    """fsspec's memory filesystem gives every reader of a file the same object: a retention
    thread reading ``_metadata`` beside a restore cut the restore's read short."""
    storage = MemoryCheckpointStorage()
    storage.put_atomic("chk-1/_metadata", b"0123456789")
    first, second = storage.open_read("chk-1/_metadata"), storage.open_read("chk-1/_metadata")
    assert first.read(4) == b"0123"
    assert second.read() == b"0123456789"
    assert first.read() == b"456789"
