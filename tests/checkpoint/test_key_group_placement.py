"""Key group placement (``streamstate.keygroups.PLACEMENT_VERSION``): every checkpoint records
it; a savepoint rewrite carries an older one unless it re-keys; a restore of a checkpoint of
placement 1 whose int keys a Spark job put in one key group is refused, naming a key and the
remedy, and ``regroup_savepoint`` (``streamstate checkpoints regroup``) moves every key and timer
to the key group the runtime looks in. Spark's placement of INT, SMALLINT and TINYINT columns:
tests/spark/driver/plan/test_spark_key_group_placement.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from typer.testing import CliRunner

from streamstate import KeyedProcessFunction, KeyGroupPlacementError, ValueStateDescriptor
from streamstate.checkpoint.metadata import decode_metadata, encode_metadata
from streamstate.checkpoint.placement import SAMPLE, MisplacedKey, check_placement, misplaced_key
from streamstate.checkpoint.rewrite import regroup_savepoint, rewrite_savepoint
from streamstate.checkpoint.storage import FileSystemCheckpointStorage, open_location
from streamstate.cli import app
from streamstate.keygroups import (
    PLACEMENT_VERSION,
    assign_to_key_group,
    placement_version,
)
from streamstate.runtime.local import LocalRunner
from support.checkpoint import placement_1_savepoint, runner_content, strip_key_group_placement

MAX_P = 128
#: where placement 1 put every key of a 32-bit integer column (its hash was 0)
ONE = assign_to_key_group(0, MAX_P)
KEYS = [0, 1, -1, 5, -5, 123456, -99999, 7, 42, 1000]


class CountWithTimer(KeyedProcessFunction):
    """A count per key and an event-time timer per record that reports the count."""

    def open(self, ctx: Any) -> None:
        self.n = ctx.get_state(ValueStateDescriptor("n", int, default=0))

    def process_element(self, value: Any, ctx: Any) -> Any:
        n = self.n.value() + 1
        self.n.update(n)
        ctx.timer_service().register_event_time_timer(value[1] + 1_000)
        yield ("count", ctx.get_current_key(), n)

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        yield ("timer", ctx.get_current_key(), timestamp, self.n.value())


def _runner(storage: Any = None, parallelism: int = 2) -> LocalRunner:
    return LocalRunner(
        CountWithTimer(),
        key_selector=lambda r: r[0],
        parallelism=parallelism,
        max_parallelism=MAX_P,
        checkpoint_storage=storage,
        timestamp_assigner=lambda r: r[1],
    )


def _records(start: int, rounds: int) -> list[tuple[int, int]]:
    return [(k, start + i) for i in range(rounds) for k in KEYS]


@pytest.fixture
def legacy(tmp_path: Path) -> tuple[Any, Path]:
    """A checkpoint of placement 1 as a Spark job with an INT key column wrote it (every key and
    timer in key group ``ONE``), and the runner's checkpoint it holds the content of."""
    storage = FileSystemCheckpointStorage(str(tmp_path / "job"), durable=False)
    runner = _runner(storage)
    runner.run(_records(0, 3), final_watermark=False)
    checkpoint = runner.checkpoint()
    runner.close()
    assert placement_version(checkpoint.metadata.properties) == PLACEMENT_VERSION
    placement_1_savepoint(checkpoint, tmp_path / "legacy")
    return checkpoint, tmp_path / "legacy"


def _load(directory: Path) -> Any:
    storage, name = open_location(str(directory))
    return storage.load(name)


def test_a_regrouped_savepoint_continues_as_the_job_would_have(
    legacy: tuple[Any, Path], tmp_path: Path
) -> None:
    checkpoint, old = legacy
    cp = _load(old)
    assert placement_version(cp.metadata.properties) == 1
    groups = {tuple(s.key_group_range) for s in cp.metadata.operators["keyed-process"].subtasks}
    assert len(groups) == 2  # the source's layout: two subtasks, one of them holds every key
    # a rewrite that does not re-key keeps the older placement: the key groups are carried
    carried = rewrite_savepoint(cp, str(tmp_path / "carried"))
    assert placement_version(carried.metadata.properties) == 1
    new = regroup_savepoint(str(old), str(tmp_path / "new"))
    assert placement_version(new.metadata.properties) == PLACEMENT_VERSION
    # every key and timer where the runtime looks (runner_content checks each key's group),
    # the same content as the job's own checkpoint, at another parallelism too
    reference = _runner()
    reference.restore(checkpoint)
    for parallelism in (1, 3):
        restored = _runner(parallelism=parallelism)
        restored.restore(new)
        assert runner_content(restored) == runner_content(reference)
        restored.close()
    # and the job continues: counts and timers as a run of every record from the start
    later = _records(10, 2)
    continued = _runner(parallelism=3)
    continued.restore(new)
    got = continued.run(later)
    continued.close()
    whole = _runner()
    expected = whole.run(_records(0, 3) + later)
    whole.close()
    reference.close()
    assert sorted(got) == sorted(expected[len(KEYS) * 3 :])
    assert any(row[0] == "timer" for row in got)


def test_the_cli_regroups_and_names_a_missing_operator(
    legacy: tuple[Any, Path], tmp_path: Path
) -> None:
    _, old = legacy
    cli = CliRunner(env={"COLUMNS": "400"})
    done = cli.invoke(app, ["checkpoints", "regroup", str(old), str(tmp_path / "sp")])
    assert done.exit_code == 0, done.output
    assert placement_version(_load(tmp_path / "sp").metadata.properties) == PLACEMENT_VERSION
    again = cli.invoke(app, ["checkpoints", "regroup", str(old), str(tmp_path / "sp")])
    assert again.exit_code == 1 and "already holds a savepoint" in again.output
    other = cli.invoke(
        app, ["checkpoints", "regroup", str(old), str(tmp_path / "sp2"), "--operator", "nope"]
    )
    assert other.exit_code == 1 and "no state of operator 'nope'" in other.output


def test_a_restore_of_misplaced_keys_is_refused_naming_a_key_and_the_remedy(
    legacy: tuple[Any, Path], tmp_path: Path
) -> None:
    checkpoint, old = legacy
    cp = _load(old)
    found = misplaced_key(cp, "keyed-process")
    assert found is not None and found.stored == ONE
    assert found.expected == assign_to_key_group(found.key, MAX_P) != ONE
    runner = _runner()
    with pytest.raises(KeyGroupPlacementError) as raised:
        runner.restore(cp)
    runner.close()
    message = str(raised.value)
    assert f"key group {ONE} (key {found.key} among them)" in message
    assert f"key {found.key}: key group {found.expected}" in message
    assert f"streamstate checkpoints regroup {cp.url}" in message
    # the same check on Spark, before the query starts, names the key columns
    with pytest.raises(KeyGroupPlacementError, match=r"where this job \(key 'user_id'\) looks"):
        check_placement(cp, "keyed-process", "this job (key 'user_id')")
    # nothing to refuse: the regrouped savepoint, the job's own checkpoint (placement 2), and
    # the same checkpoint of placement 1, whose keys are where they belong (a LocalRunner's,
    # a Spark job's with a BIGINT key): the one key group holds only its own keys
    new = regroup_savepoint(cp, str(tmp_path / "new"))
    assert misplaced_key(new, "keyed-process") is None
    assert misplaced_key(checkpoint, "keyed-process") is None
    rewrite_savepoint(checkpoint, str(tmp_path / "placed"))
    strip_key_group_placement(tmp_path / "placed")
    placed = _load(tmp_path / "placed")
    assert placement_version(placed.metadata.properties) == 1
    assert misplaced_key(placed, "keyed-process") is None
    runner = _runner()
    runner.restore(placed)
    runner.close()
    # another operator, or keys that are not ints: nothing to read
    assert misplaced_key(cp, "another") is None


def test_the_one_key_group_is_read_until_a_key_belongs_elsewhere(tmp_path: Path) -> None:
    """A placement-1 checkpoint whose one key group holds many keys that belong there (more
    than ``SAMPLE``) is accepted; a few of them and a key that belongs elsewhere are refused."""
    mine = [k for k in range(20_000) if assign_to_key_group(k, MAX_P) == ONE][: SAMPLE + 5]
    assert len(mine) == SAMPLE + 5
    stray = next(k for k in range(20_000) if assign_to_key_group(k, MAX_P) != ONE)

    def placement_1(keys: list[int], name: str) -> Any:
        storage = FileSystemCheckpointStorage(str(tmp_path / name), durable=False)
        runner = _runner(storage, parallelism=1)
        runner.run([(k, 0) for k in keys], final_watermark=False)
        checkpoint = runner.checkpoint()
        runner.close()
        # the stray key joins the one key group, as placement 1 put every INT key there
        placement_1_savepoint(checkpoint, tmp_path / f"{name}-sp", lambda key: key == stray)
        return _load(tmp_path / f"{name}-sp")

    assert misplaced_key(placement_1(mine, "own"), "keyed-process") is None
    found = misplaced_key(placement_1([*mine[:3], stray], "stray"), "keyed-process")
    assert found == MisplacedKey(stray, ONE, assign_to_key_group(stray, MAX_P))


def test_a_native_rocksdb_checkpoint_of_placement_1_is_read_and_accepted(tmp_path: Path) -> None:
    """A RocksDB checkpoint (native snapshot files) of placement 1 whose keys are where they
    belong: its key group is read through the snapshot's canonical view, and a runner restores
    it."""
    mine = [k for k in range(20_000) if assign_to_key_group(k, MAX_P) == ONE][:5]
    storage = FileSystemCheckpointStorage(str(tmp_path / "job"), durable=False)
    runner = LocalRunner(
        CountWithTimer(),
        key_selector=lambda r: r[0],
        parallelism=2,
        max_parallelism=MAX_P,
        state_backend="rocksdb",
        checkpoint_storage=storage,
        timestamp_assigner=lambda r: r[1],
    )
    runner.run([(k, 0) for k in [*mine, *KEYS]], final_watermark=False)
    checkpoint = runner.checkpoint()
    runner.close()
    kinds = {
        f.kind for s in checkpoint.metadata.operators["keyed-process"].subtasks for f in s.keyed
    }
    assert not kinds & {"full", "delta"}  # native files, no canonical ones
    strip_key_group_placement(tmp_path / "job" / "job")  # the job directory: its latest
    legacy = storage.load(checkpoint.checkpoint_id)
    assert placement_version(legacy.metadata.properties) == 1
    assert misplaced_key(legacy, "keyed-process") is None
    restored = _runner()
    restored.restore(legacy)
    assert len(restored.run([(mine[0], 5)], final_watermark=False)) == 1
    restored.close()


def test_a_rewrite_keeps_the_older_placement_of_another_operators_keys(
    legacy: tuple[Any, Path], tmp_path: Path
) -> None:
    """Re-keying one operator places its keys anew; another operator's keyed state is carried
    with its key groups, so the savepoint keeps the source's placement."""
    _, old = legacy
    path = old / "_metadata"
    meta = decode_metadata(path.read_bytes(), str(path))
    op = meta.operators["keyed-process"]
    meta.operators["other"] = msgspec.structs.replace(
        op,
        name="other",
        subtasks=[msgspec.structs.replace(s, operator="other") for s in op.subtasks],
    )
    path.write_bytes(encode_metadata(meta))
    new = regroup_savepoint(str(old), str(tmp_path / "new"))
    assert placement_version(new.metadata.properties) == 1
    assert misplaced_key(new, "keyed-process") is None
    found = misplaced_key(new, "other")
    assert found is not None and found.stored == ONE
