"""RocksDB through the checkpoint package's canonical snapshot files (SPEC §6.2, §6.4).

Savepoints written from RocksDB restore into the heap backend and back, at another parallelism,
through ``LocalRunner.savepoint``/``restore``. Skipped until the checkpoint package (format,
coordinator, LocalRunner checkpoints) is merged; it passed against that branch in an overlay.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from streamstate import (
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from streamstate.backends.rocksdb.factory import RocksDBStateBackend

pytest.importorskip("streamstate.checkpoint.coordinator")
pytest.importorskip("streamstate.format.keyed_file")

from streamstate.runtime.local import LocalRunner


@dataclasses.dataclass(frozen=True)
class Reading:
    value: int
    label: str


class Collect(KeyedProcessFunction):
    """Value, list, map and record state plus one event-time timer per element."""

    def open(self, ctx: Any) -> None:
        self.n = ctx.get_state(ValueStateDescriptor("n", int, default=0))
        self.items = ctx.get_list_state(ListStateDescriptor("items", int))
        self.by_mod = ctx.get_map_state(MapStateDescriptor("by_mod", str, int))
        self.last = ctx.get_state(ValueStateDescriptor("last", Reading))  # not built in

    def process_element(self, value: int, ctx: Any) -> Any:
        self.n.update(self.n.value() + 1)
        self.items.add(value)
        self.by_mod.put(str(value % 3), value)
        self.last.update(Reading(value, str(value)))
        ctx.timer_service().register_event_time_timer(1000 + value)
        yield ("element", ctx.get_current_key(), self.n.value(), sorted(self.items.get()))

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        yield (
            "timer",
            ctx.get_current_key(),
            timestamp,
            sorted(self.by_mod.items()),  # map iteration order is unspecified
            self.last.value(),
        )


def _runner(kind: str, parallelism: int, storage: str, tmp_path: Any) -> LocalRunner:
    backend: Any = kind
    if kind == "rocksdb":
        backend = RocksDBStateBackend(working_dir=str(tmp_path / f"work-{parallelism}"))
    return LocalRunner(
        Collect(),
        key_selector=lambda x: x % 17,
        parallelism=parallelism,
        state_backend=backend,
        checkpoint_storage=storage,
        timestamp_assigner=lambda x: x,
        key_type=int,
    )


@pytest.mark.parametrize(
    ("source", "target", "p_source", "p_target"),
    [("rocksdb", "heap", 2, 3), ("heap", "rocksdb", 3, 2), ("rocksdb", "rocksdb", 2, 4)],
)
def test_savepoint_across_backends_and_parallelism(
    tmp_path: Any, source: str, target: str, p_source: int, p_target: int
) -> None:
    storage = str(tmp_path / "checkpoints")
    first = _runner(source, p_source, storage, tmp_path)
    first.run(range(200), final_watermark=False)
    savepoint = first.savepoint()
    expected = first.run(range(200, 300))
    first.close()
    second = _runner(target, p_target, storage, tmp_path)
    second._ensure_started(0)
    second.restore(savepoint)
    got = second.run(range(200, 300))
    second.close()
    assert sorted(map(repr, got)) == sorted(map(repr, expected))
    assert sum(1 for o in got if o[0] == "timer") == 300
