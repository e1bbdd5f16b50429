"""The runtimes checkpoint RocksDB natively: new SST files only, plus a manifest (SPEC §10).

Checked through the LocalRunner and real checkpoint storage: what each checkpoint uploads, that
retention keeps exactly the shared files retained checkpoints list, restores on either backend
at any parallelism, the CLI, and faults (a killed upload, a flipped byte, a deleted SST).
"""

from __future__ import annotations

import posixpath
import textwrap
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from streamstate import KeyedProcessFunction, RocksDBStateBackend, ValueStateDescriptor
from streamstate.backends.rocksdb.snapshot_strategy import MANIFEST_KIND, SST_KIND
from streamstate.checkpoint.storage import FileSystemCheckpointStorage
from streamstate.cli import app
from streamstate.errors import CheckpointError, CheckpointNotFoundError, CorruptCheckpointError
from streamstate.runtime.local import LocalRunner
from streamstate.serializers import PickleSerializer
from support.checkpoint import AllKinds, all_kinds_records, runner_content, sigkill_when

SRC = str(Path(__file__).resolve().parents[2] / "src")
TESTS = str(Path(__file__).resolve().parents[1])


class Count(KeyedProcessFunction):
    """One value state: records are ``(key, _)``, the state counts them."""

    def open(self, runtime_context: Any) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("count", int))

    def process_element(self, record: Any, ctx: Any) -> None:
        self.count.update((self.count.value() or 0) + 1)


def _runner(storage: Any, p: int = 2, backend: Any = "rocksdb", fn: Any = None) -> LocalRunner:
    return LocalRunner(
        fn or AllKinds(),
        key_selector=lambda r: r[0],
        parallelism=p,
        max_parallelism=128,
        checkpoint_storage=storage,
        state_backend=backend,
    )


def _keyed(cp: Any) -> list[Any]:
    return [f for s in cp.metadata.operators["keyed-process"].subtasks for f in s.keyed]


def _ssts(cp: Any) -> list[Any]:
    return [f for f in _keyed(cp) if f.kind == SST_KIND]


def test_a_checkpoint_uploads_only_the_sst_files_no_committed_checkpoint_uploaded(
    tmp_path: Path,
) -> None:
    storage = FileSystemCheckpointStorage(str(tmp_path))
    runner = _runner(storage, fn=Count())
    runner.run([(k, 0) for k in range(50_000)], final_watermark=False)
    cp1 = runner.checkpoint()
    kinds = [f.kind for f in _keyed(cp1)]
    assert kinds.count(MANIFEST_KIND) == 2 and kinds.count(SST_KIND) >= 2
    first = {f.path: f for f in _ssts(cp1)}
    assert all(p.startswith("../shared/keyed-process/") for p in first)

    runner.run([(k, 0) for k in range(0, 50_000, 100)], final_watermark=False)  # 1% of keys
    cp2 = runner.checkpoint()
    uploaded = [f for f in _ssts(cp2) if f.checkpoint_id == 2]
    reused = [f for f in _ssts(cp2) if f.checkpoint_id == 1]
    assert uploaded and {f.path for f in reused} == set(first)  # referenced, not re-uploaded
    assert all(first[f.path].checksum == f.checksum for f in reused)
    new_bytes = sum(f.size for f in uploaded)
    assert new_bytes <= 0.05 * sum(f.size for f in first.values())
    on_disk = {str(p.relative_to(tmp_path / "job")) for p in (tmp_path / "job").rglob("*.sst")}
    listed = {posixpath.normpath(posixpath.join("chk-2", f.path)) for f in _ssts(cp2)}
    assert on_disk == listed  # one copy of every file, nothing else
    expected = {k: 2 if k % 100 == 0 else 1 for k in range(50_000)}
    runner.close()

    for backend, p in (("rocksdb", 3), ("heap", 1)):
        fresh = _runner(storage, p=p, backend=backend, fn=Count())
        fresh.restore()
        assert _counts(fresh) == expected
        fresh.close()


def _counts(runner: LocalRunner) -> dict[Any, int]:
    return {
        key: value
        for (state, key, _ns), value in runner_content(runner).items()
        if state == "count"
    }


def test_incremental_false_checkpoints_canonically(tmp_path: Path) -> None:
    storage = FileSystemCheckpointStorage(str(tmp_path))
    runner = _runner(storage, backend=RocksDBStateBackend(incremental=False))
    runner.run(all_kinds_records(30), final_watermark=False)
    cp = runner.checkpoint()
    assert {f.kind for f in _keyed(cp)} == {"full"}
    runner.close()


def test_retention_keeps_exactly_the_shared_files_retained_checkpoints_list(
    tmp_path: Path,
) -> None:
    storage = FileSystemCheckpointStorage(str(tmp_path))
    storage.retained_checkpoints = 2
    # compactions only where the test says: after the third checkpoint one full compaction
    # replaces the files of checkpoints 1-3 (retention must then delete them once no retained
    # checkpoint lists them), and the compacted files stay listed by checkpoints 5 and 6
    no_background = RocksDBStateBackend(extra={"disable_auto_compactions": True})
    runner = _runner(storage, backend=no_background)
    for round_ in range(6):
        if round_ == 3:
            for op in runner.subtasks:
                op.keyed_backend.instance.compact()
        runner.run(all_kinds_records(200 + 40 * round_, per_key=1), final_watermark=False)
        runner.checkpoint()
        runner.checkpoint_coordinator.wait_for_retention()
    expected = runner_content(runner)
    runner.close()
    assert storage.checkpoint_ids() == [5, 6]
    kept = [storage.load(5), storage.load(6)]
    listed = {cp.resolve(f.path) for cp in kept for f in _ssts(cp)}
    shared = {p for p in storage.walk_files("shared") if p.endswith(".sst")}
    assert shared == listed
    assert any(f.checkpoint_id == 4 for f in _ssts(kept[1]))  # the compacted files, uploaded by 4
    assert not any(f.checkpoint_id < 4 for f in _ssts(kept[1]))  # compacted away, then deleted
    for cp in kept:
        assert storage.problems(cp, deep=True) == []
    fresh = _runner(storage, p=3)
    fresh.restore()
    assert runner_content(fresh) == expected
    fresh.close()


def test_restoring_from_another_storage_uploads_every_file(tmp_path: Path) -> None:
    source = FileSystemCheckpointStorage(str(tmp_path / "a"))
    runner = _runner(source)
    runner.run(all_kinds_records(100), final_watermark=False)
    runner.checkpoint()
    runner.close()
    target = FileSystemCheckpointStorage(str(tmp_path / "b"))
    moved = _runner(target)
    moved.restore(str(tmp_path / "a" / "job" / "chk-1"))
    expected = runner_content(moved)
    cp = moved.checkpoint()
    moved.close()
    assert all(f.checkpoint_id == cp.checkpoint_id for f in _ssts(cp))
    assert target.problems(cp, deep=True) == []
    fresh = _runner(target, p=1)
    fresh.restore()
    assert runner_content(fresh) == expected
    fresh.close()


def test_heap_and_rocksdb_restore_each_others_checkpoints_at_other_parallelisms(
    tmp_path: Path,
) -> None:
    storage = FileSystemCheckpointStorage(str(tmp_path))
    runner = _runner(storage, p=2, backend="rocksdb")
    runner.run(all_kinds_records(120), final_watermark=False)
    runner.checkpoint()
    expected = runner_content(runner)
    runner.close()
    heap = _runner(storage, p=3, backend="heap")
    heap.restore()
    assert runner_content(heap) == expected
    heap.run(all_kinds_records(10, per_key=1), final_watermark=False)
    expected = runner_content(heap)
    heap.checkpoint()  # canonical, written by the heap backend
    heap.close()
    rocks = _runner(storage, p=1, backend="rocksdb")
    rocks.restore()
    assert runner_content(rocks) == expected
    rocks.close()


class PickledSet(KeyedProcessFunction):
    """Keeps a set per key in a value state with PickleSerializer (no built-in serializer)."""

    def open(self, runtime_context: Any) -> None:
        descriptor = ValueStateDescriptor("seen", PickleSerializer())
        self.seen = runtime_context.get_state(descriptor)

    def process_element(self, record: Any, ctx: Any) -> None:
        self.seen.update((self.seen.value() or set()) | {record[1]})


def test_a_native_snapshot_the_heap_cannot_convert_names_file_and_remedy(tmp_path: Path) -> None:
    storage = FileSystemCheckpointStorage(str(tmp_path))
    runner = _runner(storage, p=1, fn=PickledSet())
    runner.run([("a", 1), ("b", 2)], final_watermark=False)
    runner.checkpoint()
    runner.close()
    heap = _runner(storage, p=1, backend="heap", fn=PickledSet())
    with pytest.raises(
        CheckpointError,
        match=r"0-0\.state is a native RocksDB snapshot.*'seen'.*PickleSerializer.*"
        r"state_backend='rocksdb'",
    ):
        heap.restore()
    heap.close()
    rocks = _runner(storage, p=2, fn=PickledSet())
    rocks.restore()  # RocksDB restores natively: the bytes are decoded by the program's serializer
    assert {k: v for (_, k, _), v in runner_content(rocks).items()} == {"a": {1}, "b": {2}}
    rocks.close()


class PickledSetAndCount(PickledSet):
    """PickledSet plus a count in a built-in value state."""

    def open(self, runtime_context: Any) -> None:
        super().open(runtime_context)
        self.count = runtime_context.get_state(ValueStateDescriptor("count", int))

    def process_element(self, record: Any, ctx: Any) -> None:
        super().process_element(record, ctx)
        self.count.update((self.count.value() or 0) + 1)


def test_reading_one_state_converts_only_that_state(tmp_path: Path) -> None:
    """The state formats read a native snapshot through its canonical view, built for the one
    state read with serializers from the checkpoint alone: a pickled state beside it does not
    matter, and read itself it gives its pickle streams, unpickled by nobody."""
    import pickle

    from streamstate.spark.offline.options import read_options
    from streamstate.spark.offline.plan import plan_read
    from streamstate.spark.offline.source import StateReader, output_struct

    storage = FileSystemCheckpointStorage(str(tmp_path))
    runner = _runner(storage, p=1, fn=PickledSetAndCount())
    runner.run([("a", 1), ("b", 2), ("a", 3)], final_watermark=False)
    runner.checkpoint()
    runner.close()

    def rows(state: str) -> dict[str, Any]:
        options = read_options({"path": str(tmp_path / "job" / "chk-1"), "state": state})
        reader = StateReader(output_struct(plan_read(options)), options)
        batches = [b for p in reader.partitions() for b in reader.read(p)]
        return {r["key"]: r["value"] for b in batches for r in b.to_pylist()}

    assert rows("count") == {"a": 2, "b": 1}
    seen = rows("seen")
    assert all(isinstance(v, bytes) for v in seen.values())
    assert {k: pickle.loads(v) for k, v in seen.items()} == {"a": {1, 3}, "b": {2}}


def test_checkpoints_to_a_new_storage_upload_every_file_again(tmp_path: Path) -> None:
    runner = _runner(FileSystemCheckpointStorage(str(tmp_path / "a")))
    runner.run(all_kinds_records(100), final_watermark=False)
    runner.checkpoint()
    runner.checkpoint()  # chk-2 in a/ references chk-1's files
    runner.savepoint(str(tmp_path / "b"))  # from now on the runner checkpoints to b/
    runner.run(all_kinds_records(10, per_key=1), final_watermark=False)
    first_in_b = runner.checkpoint()
    runner.run(all_kinds_records(5, per_key=1), final_watermark=False)
    second_in_b = runner.checkpoint()
    expected = runner_content(runner)
    runner.close()
    b = FileSystemCheckpointStorage(str(tmp_path / "b"))
    assert first_in_b.checkpoint_id == 1 and second_in_b.checkpoint_id == 2
    assert all(f.checkpoint_id == 1 for f in _ssts(b.load(1)))  # nothing from a/
    assert any(f.checkpoint_id == 1 for f in _ssts(b.load(2)))  # b's own files are reused
    for cid in (1, 2):
        assert b.problems(b.load(cid), deep=True) == []
    fresh = _runner(b, p=3)
    fresh.restore()
    assert runner_content(fresh) == expected
    fresh.close()


def _two_checkpoints(storage: Any) -> dict[Any, Any]:
    runner = _runner(storage)
    runner.run(all_kinds_records(60), final_watermark=False)
    content = runner_content(runner)
    runner.checkpoint()
    runner.run(all_kinds_records(80, per_key=2), final_watermark=False)
    runner.checkpoint()
    runner.close()
    return content


def _restores_checkpoint_1(storage: Any, expected: dict[Any, Any]) -> None:
    assert storage.latest_checkpoint().checkpoint_id == 1
    fresh = _runner(storage, p=3)
    fresh.restore()
    assert runner_content(fresh) == expected
    assert storage.problems(storage.load(1), deep=True) == []
    fresh.close()


def test_a_flipped_byte_in_an_sst_file_is_named(tmp_path: Path) -> None:
    storage = FileSystemCheckpointStorage(str(tmp_path))
    expected = _two_checkpoints(storage)
    cp2 = storage.load(2)
    victim = next(f for f in _ssts(cp2) if f.checkpoint_id == 2)
    path = tmp_path / "job" / cp2.resolve(victim.path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x04
    path.write_bytes(bytes(data))
    assert storage.problems(cp2) == []  # same size: only a deep check sees it
    assert f"checksum mismatch in {path}" in storage.problems(cp2, deep=True)
    name = posixpath.basename(victim.path)
    with pytest.raises(CorruptCheckpointError, match=rf"shared file .*{name}.* is corrupt"):
        _runner(storage).restore(2)
    _restores_checkpoint_1_after_dropping(storage, 2, expected)


def _restores_checkpoint_1_after_dropping(storage: Any, cid: int, expected: Any) -> None:
    storage.delete(storage.checkpoint_directory(cid))
    _restores_checkpoint_1(storage, expected)


def test_a_deleted_sst_file_makes_the_checkpoint_incomplete(tmp_path: Path) -> None:
    storage = FileSystemCheckpointStorage(str(tmp_path))
    expected = _two_checkpoints(storage)
    cp2 = storage.load(2)
    victim = next(f for f in _ssts(cp2) if f.checkpoint_id == 2)
    path = tmp_path / "job" / cp2.resolve(victim.path)
    path.unlink()
    with pytest.raises(CheckpointNotFoundError, match=rf"missing file {path}"):
        _runner(storage).restore(2)
    _restores_checkpoint_1(storage, expected)


def test_the_cli_inspects_and_verifies_native_checkpoints(tmp_path: Path) -> None:
    storage = FileSystemCheckpointStorage(str(tmp_path))
    _two_checkpoints(storage)
    cli = CliRunner()
    job = str(tmp_path / "job")
    out = cli.invoke(app, ["checkpoints", "inspect", job], env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    assert "rocksdb:" in out.output and "SST" in out.output and "aggregating" in out.output
    ok = cli.invoke(app, ["checkpoints", "verify", job], env={"COLUMNS": "300"})
    assert ok.exit_code == 0, ok.output
    cp2 = storage.load(2)
    manifest = next(f for f in _keyed(cp2) if f.kind == MANIFEST_KIND)
    path = tmp_path / "job" / cp2.resolve(manifest.path)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.write_bytes(bytes(data))
    bad = cli.invoke(app, ["checkpoints", "verify", job], env={"COLUMNS": "400"})
    assert bad.exit_code == 1
    assert "fails its checksum" in " ".join(bad.output.split())


CHILD = textwrap.dedent(
    """
    import sys, time
    sys.path[:0] = [{src!r}, {tests!r}]
    from support.checkpoint import AllKinds, all_kinds_records
    from streamstate.backends.rocksdb.storage import CheckpointStorageFileStore
    from streamstate.checkpoint.storage import FileSystemCheckpointStorage
    from streamstate.runtime.local import LocalRunner

    root, marker = sys.argv[1], sys.argv[2]
    runner = LocalRunner(AllKinds(), key_selector=lambda r: r[0], parallelism=2,
                         max_parallelism=128, state_backend="rocksdb",
                         checkpoint_storage=FileSystemCheckpointStorage(root))
    runner.run(all_kinds_records(300), final_watermark=False)
    runner.checkpoint()
    runner.run(all_kinds_records(3000, per_key=1), final_watermark=False)
    put_file = CheckpointStorageFileStore.put_file

    def stalling_put_file(self, local, path):
        put_file(self, local, path)  # one SST of checkpoint 2 is uploaded...
        open(marker, "w").close()
        time.sleep(3600)  # ...and the process is killed before the next one

    CheckpointStorageFileStore.put_file = stalling_put_file
    futures = [c.checkpoint(2) for c in runner._subtask_checkpointers()]
    i = 0
    while True:  # processing goes on while the background thread uploads checkpoint 2
        runner.process((f"key-{{i % 50}}", 10**6 + i))
        i += 1
    """
)


@pytest.mark.subprocess
def test_sigkill_during_an_upload_keeps_the_last_checkpoint(tmp_path: Path) -> None:
    marker = tmp_path / "uploading"
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(src=SRC, tests=TESTS))
    sigkill_when(script, [str(tmp_path / "ck"), str(marker)], marker, "uploading checkpoint 2")
    storage = FileSystemCheckpointStorage(str(tmp_path / "ck"))
    orphans = [p for p in storage.walk_files("shared") if "-2-" in posixpath.basename(p)]
    assert orphans and storage.read_metadata("chk-2") is None
    reference = _runner(FileSystemCheckpointStorage(str(tmp_path / "ref")))
    reference.run(all_kinds_records(300), final_watermark=False)
    expected = runner_content(reference)
    reference.close()
    _restores_checkpoint_1(storage, expected)
    # the next commit removes the failed attempt and its uploads
    runner = _runner(storage)
    runner.restore()
    runner.checkpoint()
    runner.checkpoint_coordinator.wait_for_retention()
    runner.close()
    # nothing was written under chk-2 (its manifest goes last), so the id is used again
    assert storage.checkpoint_ids() == [1, 2]
    assert storage.problems(storage.load(2), deep=True) == []
    assert not any(storage.size(p) is not None for p in orphans)


def test_a_failed_checkpoint_is_aborted_on_every_subtask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint that fails to commit is aborted: every subtask's backend drops what it
    uploaded for it, and the next checkpoint references none of those files."""
    storage = FileSystemCheckpointStorage(str(tmp_path))
    runner = _runner(storage, fn=Count())
    runner.run([(k, 0) for k in range(5000)], final_watermark=False)
    aborted: list[int] = []
    for op in runner.subtasks:
        real = op.keyed_backend.notify_checkpoint_aborted

        def spy(cid: int, real: Any = real) -> None:
            aborted.append(cid)
            real(cid)

        monkeypatch.setattr(op.keyed_backend, "notify_checkpoint_aborted", spy)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise CheckpointError("commit refused (test)")

    monkeypatch.setattr(runner.checkpoint_coordinator, "commit", refuse)
    with pytest.raises(CheckpointError, match="commit refused"):
        runner.checkpoint()
    assert len(aborted) == 2 and len(set(aborted)) == 1
    monkeypatch.undo()
    cp = runner.checkpoint()
    assert all(f.checkpoint_id == cp.checkpoint_id for f in _ssts(cp))
    runner.close()
