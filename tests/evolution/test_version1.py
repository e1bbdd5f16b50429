"""Checkpoints whose record snapshots are of version 1 (each field's type as the text of its
msgspec repr, written before record snapshots stored their schema) restore: as they are, and
into a record that evolved, on both backends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from streamstate.checkpoint.restore import keyed_file_restore
from streamstate.checkpoint.storage import FileSystemCheckpointStorage
from streamstate.errors import StateMigrationException
from streamstate.keygroups import KeyGroupRange
from streamstate.runtime.local import LocalRunner
from streamstate.serializers import StructSerializer
from support.evolution_job import Job, Spec
from support.evolution_types import Acc, AccRenamed, AccTagInt, AccWider


def _records(n: int) -> list[Any]:
    return [
        (
            f"k{i}",
            "write",
            {"value": Acc(i, f"t{i}"), "list": [Acc(i, "x")], "map": {"a": Acc(i, "y")}},
        )
        for i in range(n)
    ]


def _specs(cls: Any) -> list[Spec]:
    return [Spec("value", "value", cls), Spec("list", "list", cls), Spec("map", "map", cls)]


def _runner(cls: Any, backend: str, path: Path, p: int) -> LocalRunner:
    return LocalRunner(
        Job(_specs(cls)),
        key_selector=lambda r: r[0],
        parallelism=p,
        max_parallelism=16,
        state_backend=backend,
        checkpoint_storage=FileSystemCheckpointStorage(str(path), durable=False),
    )


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_version_1_checkpoints_restore_as_they_are_and_evolved(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as patch:  # record serializers write what version 1 wrote
        patch.setattr(StructSerializer, "version", 1)
        patch.setattr(StructSerializer, "params", StructSerializer.v1_params)
        writer = _runner(Acc, backend, tmp_path, 2)
        writer.run(_records(8), final_watermark=False)
        checkpoint = writer.checkpoint()
        writer.close()
    snapshots = [
        meta.state_serializer
        for sub in checkpoint.metadata.operators["keyed-process"].subtasks
        for f in keyed_file_restore(
            checkpoint, list(sub.keyed), KeyGroupRange(*sub.key_group_range)
        )
        for meta in f.states
        if meta.name == "value"
    ]
    assert snapshots and all(s["version"] == 1 and "fields" in s for s in snapshots)

    for cls, convert in (
        (Acc, lambda v: v),
        (AccRenamed, lambda v: AccRenamed(v.n, v.tag)),
        (AccWider, lambda v: AccWider(float(v.n), v.tag)),
    ):
        reader = _runner(cls, backend, tmp_path, 3)
        reader.restore(checkpoint)
        read = dict(reader.run([(f"k{i}", "read", None) for i in range(8)], final_watermark=False))
        reader.close()
        for i in range(8):
            assert read[f"k{i}"]["value"] == convert(Acc(i, f"t{i}"))
            assert type(read[f"k{i}"]["value"]) is cls
            assert read[f"k{i}"]["list"] == [convert(Acc(i, "x"))]
            assert read[f"k{i}"]["map"] == {"a": convert(Acc(i, "y"))}

    refused = _runner(AccTagInt, backend, tmp_path, 1)
    with pytest.raises(StateMigrationException, match=r"AccTagInt\.tag: str → int"):
        refused.restore(checkpoint)
    refused.close()
