"""Checkpoints on an S3-compatible server (moto on 127.0.0.1, through s3fs): the LocalRunner
checkpoints, restores, rescales and reads state there, heap and RocksDB (incremental SSTs)."""

from __future__ import annotations

from typing import Any

import pytest

from streamstate import KeyedProcessFunction, ValueStateDescriptor
from streamstate.backends.rocksdb.snapshot_strategy import SST_KIND
from streamstate.checkpoint.storage import FileSystemCheckpointStorage
from streamstate.runtime.local import LocalRunner
from support.checkpoint import AllKinds, all_kinds_records, runner_content


class Count(KeyedProcessFunction):
    def open(self, runtime_context: Any) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("count", int))

    def process_element(self, record: Any, ctx: Any) -> None:
        self.count.update((self.count.value() or 0) + 1)


def _runner(storage: Any, backend: str, p: int = 2, fn: Any = None, **kw: Any) -> LocalRunner:
    return LocalRunner(
        fn or AllKinds(),
        key_selector=lambda r: r[0],
        parallelism=p,
        max_parallelism=128,
        checkpoint_storage=storage,
        state_backend=backend,
        **kw,
    )


def _ssts(cp: Any) -> list[Any]:
    return [
        f
        for s in cp.metadata.operators["keyed-process"].subtasks
        for f in s.keyed
        if f.kind == SST_KIND
    ]


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_checkpoint_restore_and_rescale_on_s3(s3_bucket: Any, backend: str) -> None:
    url, options = s3_bucket
    storage = FileSystemCheckpointStorage(f"{url}/ck", "job", storage_options=options)
    storage.retained_checkpoints = 2
    incremental = {"incremental_checkpoints": True} if backend == "heap" else {}
    runner = _runner(storage, backend, **incremental)
    records = all_kinds_records(300, per_key=1)
    for i in range(4):
        runner.run(records[i * 75 : (i + 1) * 75], final_watermark=False)
        runner.checkpoint()
        runner.checkpoint_coordinator.wait_for_retention()
    expected = runner_content(runner)
    runner.close()
    assert storage.url.startswith("s3://")
    assert storage.checkpoint_ids() == [3, 4]  # retention on S3
    latest = storage.latest_checkpoint(deep=True)
    assert latest.checkpoint_id == 4
    # every shared file on S3 is one a retained checkpoint lists (and nothing is missing)
    kept = [storage.load(3), latest]
    listed = {cp.resolve(f.path) for cp in kept for f in cp.metadata.files()}
    listed |= {cp.resolve(p) for cp in kept for p in cp.metadata.pending_files()}
    assert set(storage.walk_files("shared")) <= listed
    for p in (2, 3):
        fresh = _runner(storage, backend, p=p)
        fresh.restore()
        assert runner_content(fresh) == expected
        fresh.close()


def test_rocksdb_checkpoints_on_s3_reference_earlier_ssts_instead_of_uploading(
    s3_bucket: Any,
) -> None:
    url, options = s3_bucket
    storage = FileSystemCheckpointStorage(f"{url}/ck", "job", storage_options=options)
    runner = _runner(storage, "rocksdb", fn=Count())
    runner.run([(k, 0) for k in range(20_000)], final_watermark=False)
    cp1 = runner.checkpoint()
    first = {f.path: f for f in _ssts(cp1)}
    assert first and all(f.checkpoint_id == 1 for f in first.values())
    runner.run([(k, 0) for k in range(0, 20_000, 100)], final_watermark=False)
    cp2 = runner.checkpoint()
    reused = [f for f in _ssts(cp2) if f.checkpoint_id == 1]
    uploaded = [f for f in _ssts(cp2) if f.checkpoint_id == 2]
    assert {f.path for f in reused} == set(first)  # referenced, not uploaded again
    assert uploaded and sum(f.size for f in uploaded) < 0.1 * sum(f.size for f in first.values())
    on_s3 = {p for p in storage.walk_files("shared") if p.endswith(".sst")}
    assert on_s3 == {cp2.resolve(f.path) for f in _ssts(cp2)}  # one copy of each
    runner.close()
    fresh = _runner(storage, "heap", p=3, fn=Count())
    fresh.restore()
    counts = {k: v for (s, k, _), v in runner_content(fresh).items() if s == "count"}
    assert counts == {k: 2 if k % 100 == 0 else 1 for k in range(20_000)}
    fresh.close()


def test_the_cli_verifies_and_rolls_back_a_job_on_s3(
    s3_server: Any, s3_bucket: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from streamstate.cli import app

    url, options = s3_bucket
    storage = FileSystemCheckpointStorage(f"{url}/ck", "job", storage_options=options)
    runner = _runner(storage, "rocksdb")
    records = all_kinds_records(60, per_key=1)
    for i in range(3):
        runner.run(records[i * 20 : (i + 1) * 20], final_watermark=False)
        runner.checkpoint()
    runner.close()
    # the command line reaches S3 through the environment (endpoint and credentials)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    job = f"{url}/ck/job"
    result = CliRunner().invoke(app, ["checkpoints", "verify", job])
    assert result.exit_code == 0 and "every checksum matches" in result.output, result.output
    result = CliRunner().invoke(app, ["checkpoints", "rollback", job, "--to", "1", "--yes"])
    assert result.exit_code == 0, result.output
    assert storage.checkpoint_ids() == [1]
    assert not [p for p in storage.walk_files("shared") if "-2-" in p or "-3-" in p]
    assert storage.problems(storage.load(1), deep=True) == []
