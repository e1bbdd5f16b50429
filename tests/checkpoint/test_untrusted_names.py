"""A checkpoint is input (SPEC §14.5): whoever can write its storage must not make a restore, a
tool or a commit read or write outside the checkpoint.

Each test edits a real checkpoint as such a writer would (``support/tampering.py``: manifests
sealed again, sizes and checksums in ``_metadata`` updated, so that only the name can be
refused) and checks that the name is refused with a :class:`CorruptCheckpointError` naming the
checkpoint, the file and the field, and that nothing outside was read or written. Both backends,
on local files; ``test_s3_names.py`` does the same on the S3 test server.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from streamstate.backends.rocksdb.incremental import PrivateFile
from streamstate.checkpoint.storage import FileSystemCheckpointStorage
from streamstate.cli import app
from streamstate.errors import CheckpointError, CorruptCheckpointError
from streamstate.format.names import (
    MAX_NAME_BYTES,
    create_restored_file,
    file_name,
    handle_path,
    name_below,
    plain_name,
)
from streamstate.runtime.local import LocalRunner
from support.checkpoint import AllKinds, all_kinds_records, runner_content
from support.tampering import (
    edit_manifest,
    edit_metadata,
    metadata_doc,
    replaced,
    subtask_docs,
)

BACKENDS = ["heap", "rocksdb"]
WHERE = {"checkpoint": "ck/chk-3", "file": "_metadata", "field": "keyed[0].path"}


# ---- the one function ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("../../etc/passwd", "'..' part"),
        ("op/../../x", "'..' part"),
        ("..", "'..' part"),
        ("/etc/passwd", "absolute"),
        ("op//x", "empty or '.' part"),
        ("./op/x", "empty or '.' part"),
        ("op/x\x00.state", "NUL"),
        ("op/x\n.state", "control character"),
        ("op\\..\\x", "backslash"),
        ("", "empty"),
        ("a/" * 600, "over the limit"),
        ("x" * 300, "over 255 bytes"),
        (b"op/x", "not a string"),
        (None, "not a string"),
    ],
)
def test_a_name_that_is_not_plain_is_refused_naming_checkpoint_file_and_field(
    name: Any, reason: str
) -> None:
    with pytest.raises(CorruptCheckpointError, match=reason) as err:
        plain_name(name, **WHERE)
    assert "ck/chk-3" in str(err.value) and "keyed[0].path in _metadata" in str(err.value)


def test_plain_names_pass_and_shared_paths_only_from_a_checkpoint() -> None:
    assert plain_name("op/0-0-ab12.state", **WHERE) == "op/0-0-ab12.state"
    assert plain_name("é/" + "x" * 250, **WHERE)
    shared = "../shared/op/0-0-3-ab12.full.state"
    assert handle_path(shared, shared=True, **WHERE) == shared
    with pytest.raises(CorruptCheckpointError, match="'..' part"):
        handle_path(shared, shared=False, **WHERE)  # a savepoint is self-contained
    for bad in ("../shared/../x", "../shared//x", "../sharedx/y", "../../shared/x"):
        with pytest.raises(CorruptCheckpointError):
            handle_path(bad, shared=True, **WHERE)
    with pytest.raises(CorruptCheckpointError, match="over"):
        handle_path("../shared/" + "a/" * (MAX_NAME_BYTES // 2 - 4) + "x", shared=True, **WHERE)
    assert file_name("000042.sst", **WHERE) == "000042.sst"
    with pytest.raises(CorruptCheckpointError, match="no '/'"):
        file_name("db/000042.sst", **WHERE)
    assert name_below("shared/op/x.sst", "shared", **WHERE)
    with pytest.raises(CorruptCheckpointError, match="not below shared/"):
        name_below("chk-1/op/x.sst", "shared", **WHERE)


def test_a_restored_file_is_created_exclusively_and_never_through_a_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"theirs")
    db = tmp_path / "db"
    db.mkdir()
    os.symlink(outside, db / "CURRENT")
    with pytest.raises(CorruptCheckpointError, match="exists already"):
        create_restored_file(str(db), "CURRENT", **WHERE)
    assert outside.read_bytes() == b"theirs"
    with create_restored_file(str(db), "OPTIONS-7", **WHERE) as f:
        f.write(b"ok")
    with pytest.raises(CorruptCheckpointError, match="exists already"):
        create_restored_file(str(db), "OPTIONS-7", **WHERE)
    assert (db / "OPTIONS-7").stat().st_mode & 0o777 == 0o600


# ---- checkpoints with names that leave them --------------------------------------------------


def _runner(storage: Any, backend: str, p: int = 2) -> LocalRunner:
    return LocalRunner(
        AllKinds(),
        key_selector=lambda r: r[0],
        parallelism=p,
        max_parallelism=128,
        checkpoint_storage=storage,
        state_backend=backend,
    )


def _write_job(directory: Path, backend: str, n: int) -> None:
    storage = FileSystemCheckpointStorage(str(directory), "job")
    runner = _runner(storage, backend)
    records = all_kinds_records(60, per_key=2)
    for i in range(n):
        runner.run(records[i * 20 : (i + 1) * 20 + 60], final_watermark=False)
        runner.checkpoint()
    runner.checkpoint_coordinator.wait_for_retention()
    runner.close()


_PRISTINE: dict[tuple[str, int], Path] = {}


@pytest.fixture(scope="module", autouse=True)
def _pristine(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The module's checkpoints, written once: each test tampers with a copy."""
    for backend, n in (("heap", 1), ("rocksdb", 1), ("heap", 2)):
        directory = tmp_path_factory.mktemp(f"{backend}-{n}")
        _write_job(directory, backend, n)
        _PRISTINE[backend, n] = directory


def _checkpointed(tmp_path: Path, backend: str, n: int = 1) -> tuple[Any, None]:
    shutil.copytree(_PRISTINE[backend, n], tmp_path / "ck", symlinks=True)
    return FileSystemCheckpointStorage(str(tmp_path / "ck"), "job"), None


def _restore(storage: Any, backend: str, checkpoint: Any = None) -> dict[Any, Any]:
    runner = _runner(storage, backend)
    try:
        runner.restore(checkpoint)
        return runner_content(runner)
    finally:
        runner.close()


def _job(tmp_path: Path) -> Path:
    return tmp_path / "ck" / "job"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("form", ["relative", "absolute"])
def test_a_metadata_path_outside_the_checkpoint_is_refused_not_read(
    tmp_path: Path, backend: str, form: str
) -> None:
    """The keyed file of subtask 0 is moved outside the job directory and ``_metadata`` names it
    there (size and checksum unchanged): before, a restore read it and succeeded."""
    storage, _ = _checkpointed(tmp_path, backend)
    job = _job(tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    doc = metadata_doc(storage, "chk-1")
    handle = subtask_docs(doc)[0]["keyed"][0]
    moved = outside / "state"
    shutil.move(os.path.normpath(job / "chk-1" / handle["path"]), moved)
    name = str(moved) if form == "absolute" else os.path.relpath(moved, job / "chk-1")

    def point_outside(d: dict[str, Any]) -> None:
        subtask_docs(d)[0]["keyed"][0]["path"] = name

    edit_metadata(storage, "chk-1", point_outside)
    reads = []
    real_open = os.open

    def watching(path: Any, *args: Any, **kw: Any) -> int:
        if str(path) == str(moved) or str(path).endswith("elsewhere/state"):
            reads.append(path)
        return real_open(path, *args, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "open", watching)
        with pytest.raises(CorruptCheckpointError) as err:
            _restore(storage, backend, 1)
    message = str(err.value)
    assert "subtasks[0].keyed[0].path in _metadata" in message
    assert str(job / "chk-1") in message and name in message
    assert reads == []
    # the tools refuse it the same way
    result = CliRunner().invoke(
        app, ["checkpoints", "verify", str(job / "chk-1")], env={"COLUMNS": "2000"}
    )
    assert result.exit_code != 0
    assert "not a plain relative name" in result.output


@pytest.mark.parametrize("form", ["relative", "absolute"])
def test_a_savepoint_names_no_file_outside_its_directory(tmp_path: Path, form: str) -> None:
    storage = FileSystemCheckpointStorage(str(tmp_path / "ck"), "job")
    runner = _runner(storage, "heap")
    runner.run(all_kinds_records(30), final_watermark=False)
    sp = runner.savepoint()
    runner.close()
    target = "../shared/x.state" if form == "relative" else "/etc/hostname"

    def point_outside(d: dict[str, Any]) -> None:
        subtask_docs(d)[1]["operator_state"] = {**subtask_docs(d)[0]["keyed"][0], "path": target}

    edit_metadata(storage, sp.directory, point_outside)
    with pytest.raises(CorruptCheckpointError, match=r"subtasks\[1\]\.operator_state\.path"):
        storage.load(sp.directory)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("form", ["relative", "absolute"])
def test_a_rocksdb_manifest_cannot_make_a_restore_write_outside_its_database(
    tmp_path: Path, backend: str, form: str
) -> None:
    """The high finding: a private file of the manifest named ``../../..`` (or absolute) with a
    matching size and CRC was written outside the database directory, and the restore went
    on. Refused now on both backends (the heap backend reads the manifest's canonical view)."""
    storage, _ = _checkpointed(tmp_path, "rocksdb")
    target = tmp_path / "planted" / "site.pth"
    target.parent.mkdir()
    data = b"import os  # code a checkpoint writer wants run\n"
    import google_crc32c

    planted = PrivateFile(
        str(target) if form == "absolute" else "../" * 12 + str(target).lstrip("/"),
        len(data),
        google_crc32c.value(data),
        data,
    )

    def plant(m: Any) -> Any:
        return replaced(m, private=[*m.private, planted])

    for i in range(2):
        edit_manifest(storage, "chk-1", plant, index=i)
    with pytest.raises(CorruptCheckpointError, match=r"private\[\d+\]\.name in .*chk-1/") as err:
        _restore(storage, backend, 1)
    assert "not a plain relative name" in str(err.value)
    assert not target.exists()
    assert list(target.parent.iterdir()) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_shared_file_named_with_an_absolute_path_is_not_written_there(
    tmp_path: Path, backend: str
) -> None:
    storage, _ = _checkpointed(tmp_path, "rocksdb")
    target = tmp_path / "planted" / "000042.sst"
    target.parent.mkdir()

    def rename(m: Any) -> Any:
        return replaced(m, shared=[replaced(m.shared[0], name=str(target)), *m.shared[1:]])

    edit_manifest(storage, "chk-1", rename)
    with pytest.raises(CorruptCheckpointError, match=r"shared\[0\]\.name"):
        _restore(storage, backend, 1)
    assert not target.exists()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_shared_path_outside_the_shared_directory_is_not_read(
    tmp_path: Path, backend: str
) -> None:
    storage, _ = _checkpointed(tmp_path, "rocksdb")
    job = _job(tmp_path)
    outside = tmp_path / "outside.sst"

    def move_out(m: Any) -> Any:
        shutil.copyfile(job / m.shared[0].path, outside)
        return replaced(m, shared=[replaced(m.shared[0], path="../../outside.sst"), *m.shared[1:]])

    edit_manifest(storage, "chk-1", move_out)
    with pytest.raises(CorruptCheckpointError, match=r"shared\[0\]\.path in .*not a plain"):
        _restore(storage, backend, 1)


# ---- links in a checkpoint -------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_symlinked_state_file_is_refused_not_followed(tmp_path: Path, backend: str) -> None:
    storage, _ = _checkpointed(tmp_path, backend)
    job = _job(tmp_path)
    handle = subtask_docs(metadata_doc(storage, "chk-1"))[0]["keyed"][0]
    inside = Path(os.path.normpath(job / "chk-1" / handle["path"]))
    outside = tmp_path / "outside.state"
    shutil.move(inside, outside)
    os.symlink(outside, inside)
    with pytest.raises(CheckpointError, match="is a symbolic link"):
        _restore(storage, backend, 1)
    with pytest.raises(CheckpointError, match="is a symbolic link"):
        storage.open_read(os.path.relpath(inside, job))
    result = CliRunner().invoke(
        app, ["checkpoints", "verify", str(job / "chk-1")], env={"COLUMNS": "2000"}
    )
    assert result.exit_code == 1 and "is a symbolic link" in result.output, result.output
    # a directory on the way counts too
    op_dir = job / "chk-1" / "keyed-process"
    if op_dir.is_dir():
        shutil.move(op_dir, tmp_path / "op-dir")
        os.symlink(tmp_path / "op-dir", op_dir)
        with pytest.raises(CheckpointError, match="is a symbolic link"):
            storage.load(1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_commit_does_not_write_through_a_planted_checkpoint_directory(
    tmp_path: Path, backend: str
) -> None:
    storage = FileSystemCheckpointStorage(str(tmp_path / "ck"), "job")
    runner = _runner(storage, backend)
    records = all_kinds_records(40)
    runner.run(records[:40], final_watermark=False)
    runner.checkpoint()
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, _job(tmp_path) / "chk-2")
    runner.run(records[40:], final_watermark=False)
    try:
        with pytest.raises(CheckpointError, match="symbolic link"):
            runner.checkpoint(storage)
    finally:
        runner.close()
    assert list(outside.iterdir()) == []
    assert storage.latest_checkpoint().checkpoint_id == 1


def test_retention_deletes_a_planted_link_not_what_it_points_to(tmp_path: Path) -> None:
    storage, _ = _checkpointed(tmp_path, "heap", n=2)
    job = _job(tmp_path)
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "keep.txt").write_text("mine")
    os.symlink(precious, job / "chk-2" / "planted-dir")  # unlisted in a kept checkpoint
    (job / "shared").mkdir(exist_ok=True)
    os.symlink(precious / "keep.txt", job / "shared" / "0-0-1-abcdef12.full.state")
    os.symlink(precious, job / "chk-0")  # not a checkpoint directory: retention skips it
    deleted = storage.apply_retention(1)
    assert (precious / "keep.txt").read_text() == "mine"
    assert "chk-2/planted-dir" in deleted
    assert not os.path.lexists(job / "chk-2" / "planted-dir")
    assert not os.path.lexists(job / "shared" / "0-0-1-abcdef12.full.state")
    assert [p for p in job.rglob("*") if p.is_symlink()] == [job / "chk-0"]
    assert storage.latest_checkpoint().checkpoint_id == 2


def test_storage_paths_never_leave_the_job_directory(tmp_path: Path) -> None:
    storage = FileSystemCheckpointStorage(str(tmp_path / "ck"), "job")
    (tmp_path / "ck" / "secret").parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "ck" / "secret").write_text("x")
    for path in ("../secret", "/etc/hostname", "chk-1/../../secret"):
        with pytest.raises(CorruptCheckpointError, match="outside the checkpoint storage"):
            storage.open_read(path)
        with pytest.raises(CorruptCheckpointError, match="outside the checkpoint storage"):
            storage.size(path)
    with pytest.raises(CorruptCheckpointError, match="not a plain relative name"):
        storage.load("../job2/chk-1")
