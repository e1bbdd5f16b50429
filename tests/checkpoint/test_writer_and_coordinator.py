"""The asynchronous writer (processing goes on, the GIL is shared) and the driver-side commit."""

from __future__ import annotations

import pickle
import time
from typing import Any

import msgspec
import pytest

from streamstate.checkpoint.coordinator import CheckpointCoordinator
from streamstate.checkpoint.metadata import SubtaskStateHandle
from streamstate.checkpoint.storage import MemoryCheckpointStorage
from streamstate.checkpoint.writer import SubtaskCheckpointer
from streamstate.errors import CheckpointError
from streamstate.runtime.local import LocalRunner
from support.checkpoint import AllKinds, all_kinds_records, runner_content


def _runner(storage: Any, p: int = 2) -> LocalRunner:
    return LocalRunner(
        AllKinds(),
        key_selector=lambda r: r[0],
        parallelism=p,
        max_parallelism=128,
        checkpoint_storage=storage,
    )


def test_processing_continues_while_the_snapshot_is_written() -> None:
    storage = MemoryCheckpointStorage()
    runner = _runner(storage, p=1)
    runner.run(all_kinds_records(20_000, per_key=1), final_watermark=False)
    expected = runner_content(runner)
    (checkpointer,) = runner._subtask_checkpointers()
    future = checkpointer.checkpoint(1)  # synchronous phase only
    processed, gaps = 0, []
    last = time.perf_counter()
    while not future.done():
        runner.process((f"key-{processed % 100}", 10**7 + processed))
        processed += 1
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    handle = future.result()
    assert processed > 100, "the processing thread made no progress during the write"
    gaps.sort()
    assert gaps[int(len(gaps) * 0.99)] < 0.05, "the writer starved the processing thread"
    # the checkpoint holds the state as of the synchronous phase, not the later records
    cp = CheckpointCoordinator(storage).commit(1, [handle])
    fresh = _runner(storage, p=2)
    fresh.restore(cp)
    assert runner_content(fresh) == expected


def _handles(storage: Any, p: int = 3) -> list[SubtaskStateHandle]:
    runner = _runner(storage, p=p)
    runner.run(all_kinds_records(20), final_watermark=False)
    cps = [SubtaskCheckpointer(storage, op) for op in runner.subtasks]
    return [f.result() for f in [c.checkpoint(1) for c in cps]]


def test_handles_are_plain_data() -> None:
    storage = MemoryCheckpointStorage()
    handles = _handles(storage)
    for h in handles:
        assert pickle.loads(pickle.dumps(h)) == h
        assert msgspec.msgpack.decode(msgspec.msgpack.encode(h), type=SubtaskStateHandle) == h
        assert msgspec.json.decode(msgspec.json.encode(h), type=SubtaskStateHandle) == h
    cp = CheckpointCoordinator(storage).commit(
        1, [pickle.loads(pickle.dumps(h)) for h in handles], expected={"keyed-process": 3}
    )
    assert storage.latest_checkpoint().metadata == cp.metadata


def test_commit_refuses_incomplete_checkpoints() -> None:
    storage = MemoryCheckpointStorage()
    handles = _handles(storage)
    coordinator = CheckpointCoordinator(storage)
    with pytest.raises(
        CheckpointError, match=r"operator 'keyed-process' is missing subtasks \[1\]"
    ):
        coordinator.commit(1, [handles[0], handles[2]])
    with pytest.raises(CheckpointError, match="operator 'other' acknowledged no subtask"):
        coordinator.commit(1, handles, expected={"keyed-process": 3, "other": 2})
    with pytest.raises(CheckpointError, match="parallelism 3, expected 4"):
        coordinator.commit(1, handles, expected={"keyed-process": 4})
    bad = msgspec.structs.replace(handles[1], key_group_range=(43, 90))
    with pytest.raises(CheckpointError, match=r"subtask 1 covers key groups \(43, 90\)"):
        coordinator.commit(1, [handles[0], bad, handles[2]])
    storage.delete(f"chk-1/{handles[2].keyed[0].path}")
    with pytest.raises(CheckpointError, match="is not committed: missing file"):
        coordinator.commit(1, handles)
    assert storage.read_metadata("chk-1") is None


def test_acknowledge_decline_and_latest_attempt() -> None:
    storage = MemoryCheckpointStorage()
    handles = _handles(storage, p=2)
    coordinator = CheckpointCoordinator(storage)
    coordinator.acknowledge(1, handles[0])
    coordinator.decline(1, "subtask 1 failed: executor lost")
    with pytest.raises(CheckpointError, match="declined.*executor lost"):
        coordinator.complete(1)
    assert storage.read_metadata("chk-1") is None
    retry = msgspec.structs.replace(handles[1], attempt=1)
    stale = msgspec.structs.replace(handles[1], attempt=0, keyed=[])
    for h in (handles[0], retry, stale):
        coordinator.acknowledge(1, h)
    cp = coordinator.complete(1, expected={"keyed-process": 2})
    assert cp.metadata.operators["keyed-process"].subtasks[1].attempt == 1


def test_retention_runs_off_the_commit_path() -> None:
    storage = MemoryCheckpointStorage(retained_checkpoints=1)
    coordinator = CheckpointCoordinator(storage)
    runner = _runner(storage, p=1)
    runner.run(all_kinds_records(10), final_watermark=False)
    cps = [SubtaskCheckpointer(storage, op) for op in runner.subtasks]
    for cid in (1, 2, 3):
        coordinator.commit(cid, [c.checkpoint(cid).result() for c in cps])
    coordinator.close()
    assert storage.checkpoint_ids() == [3]
    sync = CheckpointCoordinator(storage, background_retention=False)
    sync.commit(4, [c.checkpoint(4).result() for c in cps])
    assert storage.checkpoint_ids() == [4]
