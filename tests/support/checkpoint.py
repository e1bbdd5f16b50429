"""Shared pieces of the checkpoint tests: a function using every state kind, content dumps."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from streamstate import (
    AggregateFunction,
    AggregatingStateDescriptor,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from streamstate.format.meta import StateMetaInfo
from streamstate.format.snapshot import SnapshotSource
from streamstate.keygroups import KeyGroupRange, assign_to_key_group
from streamstate.namespace import VOID_NAMESPACE
from streamstate.runtime.local import LocalRunner
from streamstate.serializers import Int64Serializer, StrSerializer


class Average(AggregateFunction):
    def create_accumulator(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, value: int, acc: tuple[int, int]) -> tuple[int, int]:
        return (acc[0] + value, acc[1] + 1)

    def get_result(self, acc: tuple[int, int]) -> float:
        return acc[0] / acc[1]

    def merge(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        return (a[0] + b[0], a[1] + b[1])


class AllKinds(KeyedProcessFunction):
    """Writes all five keyed state kinds under several namespaces, and registers timers.

    Records are ``(key, i)``.
    """

    def open(self, runtime_context: Any) -> None:
        self.backend = runtime_context._backend
        self.value = ValueStateDescriptor("value", int)
        self.list = ListStateDescriptor("list", str)
        self.map = MapStateDescriptor("map", str, int)
        self.reducing = ReducingStateDescriptor("reducing", lambda a, b: a + b, int)
        self.agg = AggregatingStateDescriptor("agg", Average(), tuple[int, int])

    def process_element(self, record: tuple[Any, int], ctx: Any) -> None:
        _, i = record
        b = self.backend
        b.get_partitioned_state(VOID_NAMESPACE, None, self.value).update(i)
        b.get_partitioned_state(i % 3, Int64Serializer(), self.list).add(f"e{i}")
        b.get_partitioned_state(f"ns{i % 2}", StrSerializer(), self.map).put(f"m{i % 4}", i)
        b.get_partitioned_state(i % 5, Int64Serializer(), self.reducing).add(i)
        b.get_partitioned_state(VOID_NAMESPACE, None, self.agg).add(i)
        ctx.timer_service().register_event_time_timer(1_000_000 + i)
        ctx.timer_service().register_processing_time_timer(2_000_000 + i % 7)


def all_kinds_records(n_keys: int, per_key: int = 3, int_keys: bool = False) -> list[Any]:
    out = []
    for r in range(per_key):
        for k in range(n_keys):
            key: Any = k * 7919 - 5000 if int_keys else f"key-{k}"
            out.append((key, k * per_key + r))
    return out


def runner_content(runner: LocalRunner) -> dict[tuple[Any, ...], Any]:
    """Every state entry and timer of every subtask, checking that each key lives in the subtask
    owning its key group and appears once."""
    out: dict[tuple[Any, ...], Any] = {}
    max_p = runner.max_parallelism
    for op in runner.subtasks:
        rng = op.key_group_range
        # read through a snapshot: the same on every backend
        snap = op.keyed_backend.snapshot(0)
        try:
            names = [m.name for m in snap.states]
            for kg_of_entries in snap.key_group_range:
                for idx, entries in snap.key_group_entries(kg_of_entries):
                    if names[idx].startswith("_timers."):
                        continue  # read from the timer queues below
                    for key, ns, state in entries:
                        kg = assign_to_key_group(key, max_p)
                        assert kg == kg_of_entries
                        assert rng.contains(kg), (
                            f"{key!r} (kg {kg}) is in subtask {op.subtask_index}"
                        )
                        ident = (names[idx], key, ns)
                        assert ident not in out, f"{ident} appears twice"
                        out[ident] = copy.deepcopy(state)  # live lists/dicts change later
                snap.release_key_group(kg_of_entries)
        finally:
            snap.release()
        for domain, queue in (
            ("event", op.timer_service.event_time_timers),
            ("processing", op.timer_service.processing_time_timers),
        ):
            for ts, key, ns, kgi in queue:
                assert kgi + rng.start == assign_to_key_group(key, max_p)
                ident = ("timer", domain, key, ns, ts)
                assert ident not in out
                out[ident] = True
    return out


class ListSource(SnapshotSource):
    """A snapshot source over per-key-group lists (tests build snapshots by hand)."""

    def __init__(self, meta: StateMetaInfo, per_kg: list[Any]) -> None:
        self.meta = meta
        self.per_kg = per_kg
        self.released: set[int] = set()

    def entries(self, key_group_index: int) -> Any:
        return self.per_kg[key_group_index]

    def release_key_group(self, key_group_index: int) -> None:
        self.released.add(key_group_index)


def group_by_key_group(
    entries: Iterable[tuple[Any, Any, Any]], max_p: int, rng: KeyGroupRange
) -> list[list[tuple[Any, Any, Any]] | None]:
    per_kg: list[list[tuple[Any, Any, Any]] | None] = [None] * len(rng)
    for key, ns, state in entries:
        i = assign_to_key_group(key, max_p) - rng.start
        if per_kg[i] is None:
            per_kg[i] = []
        per_kg[i].append((key, ns, state))  # type: ignore[union-attr]
    return per_kg


def sigkill_when(script: Path, args: list[str], marker: Path, what: str) -> None:
    """Run ``script`` with ``args`` and SIGKILL it as soon as it creates ``marker`` (it must do
    so within two minutes; ``what`` names the awaited moment in failures)."""
    proc = subprocess.Popen([sys.executable, str(script), *args])
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, f"the child died before {what}"
            assert time.monotonic() < deadline, f"the child never reached {what}"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def strip_key_group_placement(path: str | Path) -> None:
    """Remove the key group placement a checkpoint records, as a writer before placement 2 left
    it. ``path``: a checkpoint or savepoint directory, or a job directory (its latest)."""
    from streamstate.checkpoint.metadata import decode_metadata, encode_metadata
    from streamstate.checkpoint.storage import FileSystemCheckpointStorage
    from streamstate.keygroups import PLACEMENT_PROPERTY

    metadata = Path(path) / "_metadata"
    if not metadata.exists():
        latest = FileSystemCheckpointStorage(str(path), "").load()
        metadata = Path(path) / latest.directory / "_metadata"
    meta = decode_metadata(metadata.read_bytes(), str(metadata))
    meta.properties.pop(PLACEMENT_PROPERTY)
    metadata.write_bytes(encode_metadata(meta))


def placement_1_savepoint(
    checkpoint: Any, target: str | Path, misplaced: Any = lambda key: True
) -> None:
    """A savepoint of ``checkpoint`` (int keys) as a Spark job of key group placement 1 with an
    INT key column wrote it: the keys for which ``misplaced`` holds (every one by default) in
    key group ``assign_to_key_group(0, max_parallelism)``, the others in their own, and no
    placement recorded."""
    from unittest import mock

    from streamstate.checkpoint import rewrite
    from streamstate.checkpoint.rewrite import Rekey, rewrite_savepoint

    def placed(key: Any, max_parallelism: int) -> int:
        return assign_to_key_group(0 if misplaced(key) else key, max_parallelism)

    with mock.patch.object(rewrite, "assign_to_key_group", placed):
        rewrite_savepoint(checkpoint, str(target), rekey=Rekey(Int64Serializer(), int))
    strip_key_group_placement(target)
