"""Savepoint rewrites (SPEC §14.3): states replaced, renamed, dropped, re-keyed; everything
else carried over byte for byte; the new code starting from the rewritten savepoint behaves
as if it had run from the start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from streamstate import ListStateDescriptor
from streamstate.checkpoint.rewrite import Rekey, ReplacedState, rewrite_savepoint
from streamstate.checkpoint.storage import FileSystemCheckpointStorage
from streamstate.errors import CheckpointError, StateMigrationException
from streamstate.format.keyed_file import KeyedSnapshotReader
from streamstate.format.meta import StateMetaInfo
from streamstate.runtime.local import LocalRunner
from streamstate.serializers import Int64Serializer, VoidNamespaceSerializer, serializer_for
from support.checkpoint import runner_content
from support.payments import LastV1, LastV2, Payments, PaymentsV2, payment_records

BACKENDS = ("heap", "rocksdb")


def _runner(function: Any, backend: str, storage: Any, p: int, **kw: Any) -> LocalRunner:
    return LocalRunner(
        function,
        key_selector=lambda r: r[0] if kw.get("key_type") is not int else int(r[0]),
        parallelism=p,
        max_parallelism=32,
        state_backend=backend,
        checkpoint_storage=storage,
        timestamp_assigner=lambda r: r[2],
        watermark_delay=10,
        **kw,
    )


def _last_entries(checkpoint: Any, backend: str, storage: Any) -> list[tuple[Any, Any, Any]]:
    """The ``last`` state of the checkpoint, read with the old code."""
    reader = _runner(Payments(), backend, storage, 1)
    reader.restore(checkpoint)
    found = [(k, ns, v) for (name, k, ns), v in _states(reader).items() if name == "last"]
    reader.close()
    return found


def _states(runner: LocalRunner) -> dict[Any, Any]:
    return {k: v for k, v in runner_content(runner).items() if k[0] != "timer"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_key_type_and_record_type_rewrite_continues_as_a_replay_of_the_new_code(
    backend: str, tmp_path: Path
) -> None:
    before, after = payment_records(7, 6, 0), payment_records(7, 5, 1_000)
    storage = FileSystemCheckpointStorage(str(tmp_path / "old"), durable=False)
    old = _runner(Payments(), backend, storage, 2)
    old.run(before, final_watermark=False)
    checkpoint = old.checkpoint()
    old.close()

    # the new code refuses the checkpoint: the key type and a record type changed
    refused = _runner(PaymentsV2(), backend, storage, 3, key_type=int)
    with pytest.raises(StateMigrationException, match="the key type"):
        refused.restore(checkpoint)
    refused.close()

    last = [
        (int(k), ns, LastV2(v.amount, len(v.note)))
        for k, ns, v in _last_entries(checkpoint, backend, storage)
    ]
    meta = StateMetaInfo("last", "value", VoidNamespaceSerializer(), serializer_for(LastV2))
    savepoint = rewrite_savepoint(
        checkpoint,
        str(tmp_path / "rewritten"),
        replace={"last": ReplacedState(meta, last)},
        rekey=Rekey(Int64Serializer(), int),
    )
    assert savepoint.is_savepoint

    new = _runner(
        PaymentsV2(),
        backend,
        FileSystemCheckpointStorage(str(tmp_path / "new"), durable=False),
        3,
        key_type=int,
    )
    new.restore(savepoint)
    continued = new.run(after)
    restored_state = new
    replay = _runner(
        PaymentsV2(),
        backend,
        FileSystemCheckpointStorage(str(tmp_path / "r"), durable=False),
        1,
        key_type=int,
    )
    replay.run([(int(r[0]), *r[1:]) for r in before], final_watermark=False)
    replayed = replay.run([(int(r[0]), *r[1:]) for r in after])
    # timers the old code registered fire in the new code, under the new keys
    assert {o[0] for o in continued} == {"payment", "timer"} and len(continued) > len(after)
    assert sorted(continued) == sorted(replayed)
    assert _states(restored_state) == _states(replay)
    new.close()
    replay.close()


def _sections(checkpoint: Any) -> dict[tuple[str, int], bytes]:
    """Every state's entries section in every key group of a checkpoint of canonical files."""
    out: dict[tuple[str, int], bytes] = {}
    for op in checkpoint.metadata.operators.values():
        for sub in op.subtasks:
            for handle in sub.keyed:
                with checkpoint.storage.open_read(checkpoint.resolve(handle.path)) as f:
                    reader = KeyedSnapshotReader(f, handle.path)
                    for kg, records in reader.read():
                        for r in records:
                            out[(reader.states[r.state_id].name, kg)] = bytes(r.entries)
    return out


def _operator_files(checkpoint: Any) -> list[bytes]:
    return [
        checkpoint.storage.read_bytes(checkpoint.resolve(sub.operator_state.path))
        for op in checkpoint.metadata.operators.values()
        for sub in op.subtasks
        if sub.operator_state is not None
    ]


@pytest.mark.parametrize("backend", BACKENDS)
def test_what_a_rewrite_does_not_touch_is_carried_byte_for_byte(
    backend: str, tmp_path: Path
) -> None:
    storage = FileSystemCheckpointStorage(str(tmp_path / "old"), durable=False)
    old = _runner(Payments(), backend, storage, 2)
    old.run(payment_records(9, 4, 0), final_watermark=False)
    source = old.savepoint()
    expected = _states(old)
    old.close()

    seen_by = {(k, ns): v for k, ns, v in _last_entries(source, backend, storage)}
    bumped = [(k, ns, LastV1(v.amount + 1, v.note)) for (k, ns), v in seen_by.items()]
    meta = StateMetaInfo("last", "value", VoidNamespaceSerializer(), serializer_for(LastV1))
    rewritten = rewrite_savepoint(
        source,
        str(tmp_path / "rewritten"),
        replace={"last": ReplacedState(meta, bumped)},
        rename={"recent": "recent-amounts"},
        drop=["by-note"],
    )
    before, after = _sections(source), _sections(rewritten)
    for (name, kg), data in before.items():
        if name == "total" or name.startswith("_timers."):
            assert after[(name, kg)] == data  # carried byte for byte
        elif name == "recent":
            assert after[("recent-amounts", kg)] == data  # renamed: the same bytes
    assert not any(name == "by-note" for name, _ in after)
    assert _operator_files(rewritten) == _operator_files(source)
    assert rewritten.metadata.properties["watermark"] == source.metadata.properties["watermark"]

    class Renamed(Payments):
        def open(self, ctx: Any) -> None:
            super().open(ctx)
            self.recent = ctx.get_list_state(ListStateDescriptor("recent-amounts", int))

    reader = _runner(
        Renamed(), backend, FileSystemCheckpointStorage(str(tmp_path / "n"), durable=False), 3
    )
    reader.restore(rewritten)
    got = _states(reader)
    reader.close()
    want = {
        (("recent-amounts" if k[0] == "recent" else k[0]), *k[1:]): (
            LastV1(v.amount + 1, v.note) if k[0] == "last" else v
        )
        for k, v in expected.items()
        if k[0] != "by-note"
    }
    assert got == want


def test_a_rewrite_names_what_it_cannot_do(tmp_path: Path) -> None:
    storage = FileSystemCheckpointStorage(str(tmp_path / "old"), durable=False)
    old = _runner(Payments(), "heap", storage, 2)
    old.run(payment_records(5, 2, 0), final_watermark=False)
    source = old.checkpoint()
    old.close()
    with pytest.raises(CheckpointError, match=r"no state 'nope' to rename or drop.*'total'"):
        rewrite_savepoint(source, str(tmp_path / "a"), drop=["nope"])
    with pytest.raises(CheckpointError, match=r"two states named 'total'"):
        rewrite_savepoint(source, str(tmp_path / "b"), rename={"recent": "total"})
    with pytest.raises(CheckpointError, match=r"state 'total'.*two entries of key 0"):
        rewrite_savepoint(source, str(tmp_path / "c"), rekey=Rekey(Int64Serializer(), lambda k: 0))
    with pytest.raises(CheckpointError, match=r"maps to 'x'"):
        rewrite_savepoint(
            source, str(tmp_path / "d"), rekey=Rekey(Int64Serializer(), lambda k: "x")
        )
    done = rewrite_savepoint(source, str(tmp_path / "e"))
    with pytest.raises(CheckpointError, match="already holds a savepoint"):
        rewrite_savepoint(source, str(tmp_path / "e"))
    # nothing changed: every section as it was
    assert _sections(done) == _sections(source)
