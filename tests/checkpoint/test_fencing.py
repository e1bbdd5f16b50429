"""Fencing: a committed ``_metadata`` is never replaced, and a run that a newer epoch took over
commits and deletes nothing; on a local directory, in memory and on an S3 server (moto)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from streamstate.checkpoint.coordinator import CheckpointCoordinator
from streamstate.checkpoint.metadata import CheckpointMetadata
from streamstate.checkpoint.storage import (
    EPOCHS_DIR,
    FileSystemCheckpointStorage,
    MemoryCheckpointStorage,
)
from streamstate.errors import CheckpointFencedError
from streamstate.runtime.local import LocalRunner
from support.checkpoint import AllKinds, all_kinds_records


@pytest.fixture(params=["local", "memory", pytest.param("s3", marks=pytest.mark.subprocess)])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "local":
        return FileSystemCheckpointStorage(str(tmp_path / "ck"))
    if request.param == "memory":
        return MemoryCheckpointStorage()
    url, options = request.getfixturevalue("s3_bucket")
    return FileSystemCheckpointStorage(f"{url}/ck", storage_options=options)


def _metadata(cid: int, lineage: str) -> CheckpointMetadata:
    return CheckpointMetadata(
        kind="checkpoint",
        job_id="job",
        checkpoint_id=cid,
        timestamp=1_700_000_000_000,
        operators={},
        properties={"lineage": lineage},
    )


def test_put_if_absent_creates_once_whoever_races(storage: Any) -> None:
    wins: list[bytes] = []
    lock = threading.Lock()

    def put(i: int) -> None:
        data = f"writer {i}".encode()
        if storage.put_if_absent("chk-1/_metadata", data):
            with lock:
                wins.append(data)

    threads = [threading.Thread(target=put, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    assert storage.read_bytes("chk-1/_metadata") == wins[0]
    assert not storage.put_if_absent("chk-1/_metadata", b"late")
    assert storage.read_bytes("chk-1/_metadata") == wins[0]
    assert [n for n, _ in storage.list_dir("chk-1")] == ["_metadata"]  # no temporary left


def test_a_committed_checkpoint_is_never_replaced(storage: Any) -> None:
    storage.write_metadata("chk-4", _metadata(4, "a" * 32))
    with pytest.raises(CheckpointFencedError, match=r"chk-4 is already committed by lineage a+"):
        storage.write_metadata("chk-4", _metadata(4, "b" * 32))
    assert storage.read_metadata("chk-4").properties["lineage"] == "a" * 32
    # the same commit written again (a retried put) is fine
    storage.write_metadata("chk-4", _metadata(4, "a" * 32))


def test_a_newer_epoch_fences_the_older_run(storage: Any) -> None:
    first = storage.acquire_epoch(driver="A")
    storage.check_epoch(first)
    second = storage.acquire_epoch(driver="B")
    assert second.number == first.number + 1
    assert storage.current_epoch().run == second.run
    storage.check_epoch(second)
    with pytest.raises(CheckpointFencedError) as info:
        storage.check_epoch(first)
    message = str(info.value)
    assert f"run {first.run} (epoch {first.number}" in message
    assert f"run {second.run} (epoch {second.number}" in message and "driver=B" in message
    assert sorted(n for n, _ in storage.list_dir(EPOCHS_DIR)) == ["epoch-1", "epoch-2"]


def test_concurrent_takeovers_get_distinct_epochs(storage: Any) -> None:
    got: list[int] = []
    lock = threading.Lock()

    def take() -> None:
        e = storage.acquire_epoch()
        with lock:
            got.append(e.number)

    threads = [threading.Thread(target=take) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(1, 7))


def _runner(storage: Any, backend: str) -> LocalRunner:
    from streamstate.backends.registry import state_backend_from

    return LocalRunner(
        AllKinds(),
        key_selector=lambda r: r[0],
        parallelism=2,
        max_parallelism=128,
        checkpoint_storage=storage,
        state_backend=state_backend_from(backend),
    )


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_a_fenced_coordinator_commits_and_deletes_nothing(storage: Any, backend: str) -> None:
    storage.retained_checkpoints = 1
    runner = _runner(storage, backend)
    old = storage.acquire_epoch(driver="old")
    runner._coordinator = CheckpointCoordinator(storage, epoch=old, background_retention=False)
    records = all_kinds_records(40)
    runner.run(records[:20], final_watermark=False)
    first = runner.checkpoint()
    assert first.metadata.properties["run"] == old.run
    assert first.metadata.properties["epoch"] == old.number
    runner.run(records[20:], final_watermark=False)
    newer = storage.acquire_epoch(driver="new")
    before = sorted(storage.walk_files(""))
    with pytest.raises(CheckpointFencedError, match=f"run {newer.run}"):
        runner.checkpoint()
    assert storage.read_metadata("chk-2") is None  # not committed
    # retention of the fenced run deletes nothing, not even what only it wrote
    with pytest.raises(CheckpointFencedError):
        storage.apply_retention(1, epoch=old)
    runner.checkpoint_coordinator._retain()  # logs, deletes nothing
    after = sorted(storage.walk_files(""))
    assert set(before) <= set(after)
    # the newer run commits on top of the last committed checkpoint
    runner._coordinator = CheckpointCoordinator(storage, epoch=newer, background_retention=False)
    second = runner.checkpoint()
    assert second.checkpoint_id == 3 and second.metadata.properties["run"] == newer.run
    assert storage.problems(storage.load(3), deep=True) == []
    runner.close()
