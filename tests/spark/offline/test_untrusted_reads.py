"""A checkpoint is input (SPEC §14.5), for the state formats too: every name a read takes from
the checkpoint (the file paths of ``_metadata``, a heap chain's delta files, a RocksDB
manifest's shared paths and file names) passes ``streamstate.format.names``, and a refused
name fails the read with a :class:`CorruptCheckpointError` naming the checkpoint, the file and
the field, before anything outside the checkpoint is read or written. The reads run the
reader Spark runs, without Spark (``offline_reads``); checkpoints are edited as their
storage's writer would (``support/tampering.py``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import google_crc32c
import pytest
from offline_reads import metadata_rows, read_rows

from streamstate.backends.rocksdb.incremental import PrivateFile
from streamstate.checkpoint.storage import FileSystemCheckpointStorage
from streamstate.errors import CorruptCheckpointError
from streamstate.runtime.local import LocalRunner
from support.checkpoint import AllKinds, all_kinds_records
from support.tampering import edit_manifest, edit_metadata, metadata_doc, replaced, subtask_docs

_PRISTINE: dict[str, Path] = {}


def _write_job(directory: Path, backend: str) -> None:
    """Two checkpoints; the heap's second is a delta on the first's full file."""
    runner = LocalRunner(
        AllKinds(),
        key_selector=lambda r: r[0],
        parallelism=2,
        max_parallelism=128,
        checkpoint_storage=FileSystemCheckpointStorage(str(directory), "job"),
        state_backend=backend,
        incremental_checkpoints=True,
    )
    records = all_kinds_records(40, per_key=2)
    runner.run(records[:60], final_watermark=False)
    runner.checkpoint()
    runner.run(records[60:], final_watermark=False)
    runner.checkpoint()
    runner.checkpoint_coordinator.wait_for_retention()
    runner.close()


@pytest.fixture(scope="module", autouse=True)
def _pristine(tmp_path_factory: pytest.TempPathFactory) -> None:
    for backend in ("heap", "rocksdb"):
        directory = tmp_path_factory.mktemp(backend)
        _write_job(directory, backend)
        _PRISTINE[backend] = directory


def _copy(tmp_path: Path, backend: str) -> tuple[FileSystemCheckpointStorage, str]:
    shutil.copytree(_PRISTINE[backend], tmp_path / "ck", symlinks=True)
    job = tmp_path / "ck" / "job"
    return FileSystemCheckpointStorage(str(tmp_path / "ck"), "job"), str(job)


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_a_metadata_path_outside_the_checkpoint_fails_every_read(
    tmp_path: Path, backend: str
) -> None:
    storage, job = _copy(tmp_path, backend)
    outside = tmp_path / "elsewhere.state"
    handle = subtask_docs(metadata_doc(storage, "chk-2"))[0]["keyed"][0]
    shutil.copyfile(os.path.normpath(os.path.join(job, "chk-2", handle["path"])), outside)
    name = os.path.relpath(outside, os.path.join(job, "chk-2"))

    def point_outside(doc: dict[str, Any]) -> None:
        subtask_docs(doc)[0]["keyed"][0]["path"] = name

    edit_metadata(storage, "chk-2", point_outside)
    chk2 = os.path.join(job, "chk-2")
    reads = [
        lambda: read_rows(chk2, state="value"),
        lambda: read_rows(job, state="value", checkpointId=2),
        lambda: metadata_rows(chk2),
        lambda: read_rows(job, state="value", readChangeFeed="true", changeStartCheckpointId=2),
    ]
    for read in reads:
        with pytest.raises(CorruptCheckpointError) as err:
            read()
        message = str(err.value)
        assert "subtasks[0].keyed[0].path in _metadata" in message
        assert "chk-2" in message and "not a plain relative name" in message
    # the job's latest complete checkpoint is the one before (as a restore takes it)
    assert read_rows(job, state="value") == read_rows(job, state="value", checkpointId=1)


def test_a_delta_file_of_a_heap_chain_named_outside_the_checkpoint_is_refused(
    tmp_path: Path,
) -> None:
    storage, job = _copy(tmp_path, "heap")
    keyed = subtask_docs(metadata_doc(storage, "chk-2"))[1]["keyed"]
    assert [h["kind"] for h in keyed] == ["full", "delta"]

    def point_outside(doc: dict[str, Any]) -> None:
        subtask_docs(doc)[1]["keyed"][1]["path"] = "../../../" + keyed[1]["path"].lstrip("./")

    edit_metadata(storage, "chk-2", point_outside)
    with pytest.raises(
        CorruptCheckpointError, match=r"subtasks\[1\]\.keyed\[1\]\.path in _metadata"
    ):
        read_rows(job, state="list", checkpointId=2)


def test_a_rocksdb_manifest_s_shared_path_outside_shared_is_refused(tmp_path: Path) -> None:
    storage, job = _copy(tmp_path, "rocksdb")
    outside = tmp_path / "outside.sst"

    def move_out(m: Any) -> Any:
        shutil.copyfile(os.path.join(job, m.shared[0].path), outside)
        return replaced(m, shared=[replaced(m.shared[0], path="../../outside.sst"), *m.shared[1:]])

    edit_manifest(storage, "chk-2", move_out)
    with pytest.raises(CorruptCheckpointError, match=r"shared\[0\]\.path in .*chk-2/") as err:
        read_rows(job, state="value")
    assert "not a plain relative name" in str(err.value)


def test_a_rocksdb_manifest_s_file_name_cannot_make_a_read_write_outside(tmp_path: Path) -> None:
    storage, job = _copy(tmp_path, "rocksdb")
    target = tmp_path / "planted" / "site.pth"
    target.parent.mkdir()
    data = b"import os  # code a checkpoint writer wants run\n"
    planted = PrivateFile(str(target), len(data), google_crc32c.value(data), data)
    for i in range(2):
        edit_manifest(storage, "chk-2", lambda m: replaced(m, private=[*m.private, planted]), i)
    with pytest.raises(CorruptCheckpointError, match=r"private\[\d+\]\.name in .*chk-2/"):
        read_rows(job, state="map")
    assert list(target.parent.iterdir()) == []
