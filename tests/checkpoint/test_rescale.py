"""Rescale matrix: keyed state and timers move by key group (SPEC §7)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from streamstate.backends.registry import state_backend_from
from streamstate.checkpoint.storage import MemoryCheckpointStorage
from streamstate.errors import MaxParallelismMismatchError
from streamstate.runtime.local import LocalRunner
from support.checkpoint import AllKinds, all_kinds_records, runner_content

OLD = [1, 2, 3, 4, 7]
NEW = [1, 2, 3, 5, 8]


def _runner(p: int, max_p: int, storage: MemoryCheckpointStorage, **kw: object) -> LocalRunner:
    return LocalRunner(
        AllKinds(),
        key_selector=lambda r: r[0],
        parallelism=p,
        max_parallelism=max_p,
        checkpoint_storage=storage,
        **kw,  # type: ignore[arg-type]
    )


def _backend_options(backend_kind: str, tmp_path: Any) -> dict[str, Any]:
    backend = state_backend_from(backend_kind)
    if hasattr(backend, "working_dir"):
        backend = dataclasses.replace(backend, working_dir=str(tmp_path))
    return {"state_backend": backend}


@pytest.mark.parametrize("max_p", [128, 1000])
@pytest.mark.parametrize("old_p", OLD)
def test_rescale_matrix(old_p: int, max_p: int, backend_kind: str, tmp_path: Any) -> None:
    storage = MemoryCheckpointStorage()
    before = _runner(old_p, max_p, storage, **_backend_options(backend_kind, tmp_path / "before"))
    before.run(all_kinds_records(40, int_keys=old_p % 2 == 0), final_watermark=False)
    expected = runner_content(before)
    kinds = {ident[0] for ident in expected}
    assert kinds == {"value", "list", "map", "reducing", "agg", "timer"}
    cp = before.checkpoint()
    for new_p in NEW:
        after = _runner(
            new_p, max_p, storage, **_backend_options(backend_kind, tmp_path / f"after-{new_p}")
        )
        after.restore(cp)
        assert len(after.subtasks) == new_p
        assert runner_content(after) == expected, f"{old_p} -> {new_p} @ {max_p}"
        after.close()
    before.close()


def test_processing_after_rescale_equals_processing_without_it() -> None:
    records = all_kinds_records(30)
    more = [(f"key-{k}", 10_000 + k) for k in range(0, 30, 3)]
    reference = _runner(3, 128, MemoryCheckpointStorage(), timestamp_assigner=lambda r: r[1])
    reference.run(records + more, final_watermark=False)
    rescaled = _runner(3, 128, MemoryCheckpointStorage(), timestamp_assigner=lambda r: r[1])
    rescaled.run(records, final_watermark=False)
    for p in (5, 2, 8):
        rescaled.rescale(p)
    rescaled.run(more, final_watermark=False)
    assert runner_content(rescaled) == runner_content(reference)
    # timers restored after the rescales fire with their keys and leave nothing behind
    rescaled.advance_watermark(10**9)
    assert not any(k[:2] == ("timer", "event") for k in runner_content(rescaled))
    rescaled.close()
    reference.close()


def test_max_parallelism_cannot_change() -> None:
    storage = MemoryCheckpointStorage()
    runner = _runner(2, 128, storage)
    runner.run(all_kinds_records(5), final_watermark=False)
    cp = runner.checkpoint()
    other = _runner(2, 256, storage)
    with pytest.raises(MaxParallelismMismatchError, match="max_parallelism=128"):
        other.restore(cp)
