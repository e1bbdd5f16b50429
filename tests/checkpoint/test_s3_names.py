"""A checkpoint on an object store is input too (SPEC §14.5): a name in ``_metadata`` or in a
RocksDB manifest that points outside the job's prefix (another prefix of the bucket, another
bucket) is refused, not read; the storage itself never leaves the prefix. On the S3 test server
(moto, through s3fs); ``test_untrusted_names.py`` is the same on local files."""

from __future__ import annotations

import contextlib
import posixpath
from collections.abc import Iterator
from typing import Any

import pytest

from streamstate.checkpoint.storage import FileSystemCheckpointStorage
from streamstate.errors import CorruptCheckpointError
from streamstate.runtime.local import LocalRunner
from support.checkpoint import AllKinds, all_kinds_records
from support.tampering import edit_manifest, edit_metadata, metadata_doc, replaced, subtask_docs


def _runner(storage: Any, backend: str) -> LocalRunner:
    return LocalRunner(
        AllKinds(),
        key_selector=lambda r: r[0],
        parallelism=2,
        max_parallelism=128,
        checkpoint_storage=storage,
        state_backend=backend,
    )


@pytest.fixture(scope="module")
def jobs(s3_server: Any) -> dict[str, Any]:
    """One checkpoint of each backend in a bucket of their own (written once: each test puts
    back what it changed)."""
    out = {}
    for backend in ("heap", "rocksdb"):
        storage = FileSystemCheckpointStorage(
            f"s3://{s3_server.bucket()}/ck", "job", storage_options=s3_server.storage_options
        )
        runner = _runner(storage, backend)
        runner.run(all_kinds_records(40), final_watermark=False)
        runner.checkpoint()
        runner.close()
        out[backend] = storage
    return out


@contextlib.contextmanager
def _tampered(storage: Any) -> Iterator[None]:
    """Put back chk-1's ``_metadata`` and manifests after the test changed them."""
    saved = {p: storage.read_bytes(p) for p in storage.walk_files("chk-1")}
    try:
        yield
    finally:
        for path, data in saved.items():
            storage.put_atomic(path, data)


def _restore(storage: Any, backend: str) -> None:
    runner = _runner(storage, backend)
    try:
        runner.restore(1)
    finally:
        runner.close()


@pytest.mark.parametrize(("backend", "form"), [("heap", "relative"), ("rocksdb", "absolute")])
def test_a_metadata_path_outside_the_job_prefix_is_refused_not_read(
    s3_server: Any, jobs: dict[str, Any], backend: str, form: str
) -> None:
    """Subtask 0's keyed file is copied outside the job's prefix (``<bucket>/elsewhere/``) or
    into another bucket, and ``_metadata`` names the copy: before, the restore read it."""
    storage = jobs[backend]
    fs = storage.fs
    bucket = storage.url.removeprefix("s3://").split("/")[0]
    handle = subtask_docs(metadata_doc(storage, "chk-1"))[0]["keyed"][0]
    data = storage.read_bytes(posixpath.normpath(f"chk-1/{handle['path']}"))
    if form == "absolute":
        other = s3_server.bucket()
        fs.pipe_file(f"{other}/state", data)
        name = f"/{other}/state"
    else:
        fs.pipe_file(f"{bucket}/elsewhere/state", data)
        name = "../../../elsewhere/state"  # chk-1 -> job -> ck -> bucket

    def point_outside(d: dict[str, Any]) -> None:
        subtask_docs(d)[0]["keyed"][0]["path"] = name

    with _tampered(storage):
        edit_metadata(storage, "chk-1", point_outside)
        with pytest.raises(CorruptCheckpointError, match=r"subtasks\[0\]\.keyed\[0\]\.path") as err:
            _restore(storage, backend)
    assert "s3://" in str(err.value) and "not a plain relative name" in str(err.value)


def test_a_manifest_shared_path_in_another_bucket_is_refused_not_read(
    s3_server: Any, jobs: dict[str, Any]
) -> None:
    storage = jobs["rocksdb"]
    other = s3_server.bucket()

    def elsewhere(m: Any) -> Any:
        first = m.shared[0]
        storage.fs.pipe_file(f"{other}/x.sst", storage.read_bytes(first.path))
        return replaced(m, shared=[replaced(first, path=f"/{other}/x.sst"), *m.shared[1:]])

    with _tampered(storage):
        edit_manifest(storage, "chk-1", elsewhere)
        for backend in ("rocksdb", "heap"):  # natively, and through its canonical view
            with pytest.raises(CorruptCheckpointError, match=r"shared\[0\]\.path in .*not a plain"):
                _restore(storage, backend)


def test_the_storage_never_leaves_the_job_prefix(s3_bucket: Any) -> None:
    url, options = s3_bucket
    storage = FileSystemCheckpointStorage(f"{url}/ck", "job", storage_options=options)
    storage.fs.pipe_file(f"{url.removeprefix('s3://')}/ck/secret", b"x")
    for path in ("../secret", "/" + url.removeprefix("s3://") + "/ck/secret"):
        with pytest.raises(CorruptCheckpointError, match="outside the checkpoint storage"):
            storage.read_bytes(path)
        with pytest.raises(CorruptCheckpointError, match="outside the checkpoint storage"):
            storage.put_atomic(path, b"y")
    assert storage.fs.cat_file(f"{url.removeprefix('s3://')}/ck/secret") == b"x"
