"""TTL through checkpoint files: expired entries are not written, the TTL config is.

Needs the checkpoint file format (``streamstate.format.keyed_file``, ``LocalRunner.checkpoint``);
skipped where it is not there yet.
"""

from __future__ import annotations

import glob
import os

import pytest

from streamstate import (
    KeyedProcessFunction,
    ListStateDescriptor,
    LocalRunner,
    MapStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)
from streamstate.serializers import serializer_from_snapshot

fmt = pytest.importorskip("streamstate.format.keyed_file")
codec_mod = pytest.importorskip("streamstate.format.codec")
if not hasattr(LocalRunner, "checkpoint"):  # pragma: no cover - depends on the branch
    pytest.skip("LocalRunner has no checkpoints here", allow_module_level=True)

CFG = StateTtlConfig(ttl=100, cleanup_size=0, cleanup_full_snapshot=True)


class Writes(KeyedProcessFunction):
    def open(self, ctx):
        self.v = ctx.get_state(ValueStateDescriptor("v", int).enable_time_to_live(CFG))
        self.l = ctx.get_list_state(ListStateDescriptor("l", int).enable_time_to_live(CFG))
        self.m = ctx.get_map_state(MapStateDescriptor("m", str, int).enable_time_to_live(CFG))

    def process_element(self, value, ctx):
        _, x = value
        self.v.update(x)
        self.l.add(x)
        self.m.put(str(x), x)
        yield (ctx.get_current_key(), self.v.value(), list(self.l.get()), dict(self.m.items()))


def read_files(directory):
    found: dict[str, dict] = {}
    ttl: dict[str, object] = {}
    for path in glob.glob(os.path.join(directory, "**", "*.state"), recursive=True):
        with open(path, "rb") as f:
            reader = fmt.KeyedSnapshotReader(f, path)
            for meta in reader.states:
                ttl[meta.name] = meta.ttl
            for _, blocks in reader.read():
                for block in blocks:
                    meta = reader.states[block.state_id]
                    codec = codec_mod.StateCodec(
                        serializer_from_snapshot(reader.key_serializer),
                        serializer_from_snapshot(meta.namespace_serializer),
                        serializer_from_snapshot(meta.state_serializer),
                    )
                    keys, _, values = codec.decode(block.entries)
                    for k, v in zip(keys, values, strict=True):
                        found.setdefault(meta.name, {})[k] = v
    return found, ttl


def test_expired_entries_are_not_in_the_checkpoint_file(clock, tmp_path):
    runner = LocalRunner(Writes(), key_selector=lambda r: r[0], clock=clock, parallelism=2)
    runner.run([("old", 1), ("both", 1)])
    clock.time = 1060
    runner.run([("young", 2), ("both", 2)])
    clock.time = 1100  # everything written at 1000 has expired
    cp = runner.checkpoint(str(tmp_path))
    found, ttl = read_files(str(tmp_path))
    assert ttl["v"] == ttl["l"] == ttl["m"] == CFG.to_dict()
    assert found["v"] == {"both": (1060, 2), "young": (1060, 2)}
    assert found["l"] == {"both": [(1060, 2)], "young": [(1060, 2)]}
    assert found["m"] == {"both": {"2": (1060, 2)}, "young": {"2": (1060, 2)}}

    restored = LocalRunner(Writes(), key_selector=lambda r: r[0], clock=clock, parallelism=3)
    restored.restore(cp)
    clock.time = 1150
    assert restored.run([("both", 3), ("old", 4)]) == [
        ("both", 3, [2, 3], {"2": 2, "3": 3}),
        ("old", 4, [4], {"4": 4}),
    ]
