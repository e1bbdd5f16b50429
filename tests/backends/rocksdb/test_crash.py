"""Crashes: a subtask process killed with SIGKILL while processing, while uploading a checkpoint,
and while flushing WriteBatches. Restore must give the last complete checkpoint, byte for byte."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

import msgspec
import pytest
from rocksdict import Options, Rdict

from streamstate.backends.rocksdb.backend import RocksDBKeyedStateBackend
from streamstate.backends.rocksdb.incremental import IncrementalStateHandle
from streamstate.backends.rocksdb.restore import load_manifest
from streamstate.backends.rocksdb.storage import CheckpointStorageFileStore
from streamstate.keygroups import KeyGroupRange
from streamstate.serializers import Int64Serializer
from support.rocksdb import file_store, restore_native, stored_files

pytestmark = pytest.mark.subprocess

CHILD = os.path.join(os.path.dirname(__file__), "crash_child.py")


def _run_until(mode: str, workdir: str, checkpoints: str, line: str) -> list[str]:
    """Start the child, read its output until ``line``, then SIGKILL it."""
    child = subprocess.Popen(
        [sys.executable, CHILD, mode, workdir, checkpoints],
        stdout=subprocess.PIPE,
        text=True,
    )
    seen: list[str] = []
    try:
        assert child.stdout is not None
        for out in child.stdout:
            seen.append(out.strip())
            if out.strip() == line:
                break
        else:
            pytest.fail(f"child exited ({child.wait()}) before printing {line!r}: {seen}")
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL
    return seen


def _latest_complete(
    store: CheckpointStorageFileStore,
) -> tuple[int, list[IncrementalStateHandle]]:
    done = sorted(
        int(p.split("/")[0][4:]) for p in stored_files(store, "") if p.endswith("/_metadata")
    )
    assert done, "no complete checkpoint"
    meta = json.loads(store.get_bytes(f"chk-{done[-1]}/_metadata"))
    handles = [msgspec.convert(h, IncrementalStateHandle) for h in meta["handles"]]
    return done[-1], handles


def _restore(
    workdir: str, store: CheckpointStorageFileStore, handles: list[Any]
) -> dict[str, list[Any]]:
    b = RocksDBKeyedStateBackend(Int64Serializer(), 128, KeyGroupRange(0, 127), path=workdir)
    try:
        restore_native(b, store, handles)
        inst = b.instance
        return {
            name: [list(kv) for kv in inst.column_family(name).scan(b"", None)]
            for name in inst.column_family_names()
        }
    finally:
        b.dispose()


def _expected(store: CheckpointStorageFileStore, cid: int) -> dict[str, list[Any]]:
    content = msgspec.msgpack.decode(store.get_bytes(f"chk-{cid}/expected.msgpack"))
    return {name: [list(kv) for kv in entries] for name, entries in content.items()}


def test_kill_during_processing_restores_last_checkpoint(tmp_path: Any) -> None:
    workdir, checkpoints = str(tmp_path / "work" / "op-0"), str(tmp_path / "checkpoints")
    seen = _run_until("process", workdir, checkpoints, "processed 4")
    assert "complete 2" in seen
    store = file_store(checkpoints)
    cid, handles = _latest_complete(store)
    assert cid == 2
    # the same working directory is reused: the dead process's lock is gone, stale files wiped
    restored = _restore(workdir, store, handles)
    assert restored == _expected(store, 2)
    assert sum(len(v) for v in restored.values()) > 0


def test_kill_during_upload_restores_previous_checkpoint(tmp_path: Any) -> None:
    workdir, checkpoints = str(tmp_path / "work" / "op-0"), str(tmp_path / "checkpoints")
    seen = _run_until("upload", workdir, checkpoints, "uploading")
    assert seen[0] == "complete 1"
    store = file_store(checkpoints)
    cid, handles = _latest_complete(store)
    assert cid == 1  # checkpoint 2 has no manifest and no metadata
    assert not store.exists("chk-2/op/0-0.state")
    # shared: checkpoint 1's files and the one file of checkpoint 2 uploaded before the stall,
    # nothing of the upload that was killed
    shared = stored_files(store, "shared")
    assert len(shared) == len(load_manifest(store, handles[0]).shared) + 1, shared
    restored = _restore(workdir, store, handles)
    assert restored == _expected(store, 1)


def test_kill_during_write_batches_never_tears_a_batch(tmp_path: Any) -> None:
    """With the write-ahead log on, each flush of the cache is all-or-nothing after a crash."""
    workdir, checkpoints = str(tmp_path / "work" / "op-0"), str(tmp_path / "checkpoints")
    _run_until("batches", workdir, checkpoints, "batches 100000")
    opts = Options(raw_mode=True)
    db = Rdict(os.path.join(workdir, "db"), opts, column_families={"a": opts, "b": opts})
    try:
        a = dict(db.get_column_family("a").items())
        b = dict(db.get_column_family("b").items())
    finally:
        db.close()
    assert a and a == b  # every record wrote the same value to both states in one batch
