"""``streamstate checkpoints inspect|verify``."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from streamstate.cli import app
from streamstate.format.keyed_file import KeyedSnapshotReader
from streamstate.runtime.local import LocalRunner
from support.checkpoint import AllKinds, all_kinds_records

cli = CliRunner()


def _job(tmp_path: Path) -> Path:
    runner = LocalRunner(
        AllKinds(),
        key_selector=lambda r: r[0],
        parallelism=2,
        max_parallelism=128,
        checkpoint_storage=str(tmp_path),
        incremental_checkpoints=True,
    )
    runner.run(all_kinds_records(40), final_watermark=False)
    runner.checkpoint()
    runner.run(all_kinds_records(5), final_watermark=False)
    runner.checkpoint()
    runner.savepoint()
    runner.close()
    return tmp_path / "job"


def test_inspect_lists_checkpoints_operators_states_and_ranges(tmp_path: Path) -> None:
    job = _job(tmp_path)
    result = cli.invoke(app, ["checkpoints", "inspect", str(job)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    out = result.output
    for text in ("chk-1", "chk-2", "savepoints/sp-1", "complete", "keyed-process (p=2)", "0-63"):
        assert text in out
    for text in ("64-127", "full + 1 delta", "list[str]", "dict[str, int64]", "aggregating"):
        assert text in out
    one = cli.invoke(app, ["checkpoints", "inspect", str(job / "chk-1")], env={"COLUMNS": "200"})
    assert one.exit_code == 0 and "chk-2" not in one.output


def test_verify_passes_then_names_file_and_key_group(tmp_path: Path) -> None:
    job = _job(tmp_path)
    ok = cli.invoke(app, ["checkpoints", "verify", str(job)], env={"COLUMNS": "300"})
    assert ok.exit_code == 0, ok.output
    assert "every checksum matches" in ok.output
    victim = job / "savepoints" / "sp-1" / "keyed-process" / "1-0.state"
    with victim.open("rb") as f:
        reader = KeyedSnapshotReader(f, str(victim))
        kg = reader.key_groups()[2]
        offset = reader._offsets[kg - reader.key_group_range.start]
    data = bytearray(victim.read_bytes())
    data[offset + 16] ^= 0x01
    victim.write_bytes(bytes(data))
    bad = cli.invoke(app, ["checkpoints", "verify", str(job)], env={"COLUMNS": "400"})
    assert bad.exit_code == 1
    flat = " ".join(bad.output.split())
    assert f"(key group {kg})" in flat and "1-0.state" in flat
    assert "1 corrupt or missing file(s)" in bad.output


def test_missing_directory(tmp_path: Path) -> None:
    result = cli.invoke(app, ["checkpoints", "inspect", str(tmp_path / "nothing")])
    assert result.exit_code == 1 and "no checkpoints" in result.output


def test_inspect_piped_is_not_cut_and_json_describes_the_same(tmp_path: Path) -> None:
    import json

    job = _job(tmp_path)
    # not a terminal, and no COLUMNS (whatever the environment running the tests sets)
    piped = cli.invoke(app, ["checkpoints", "inspect", str(job)], env={"COLUMNS": None})
    assert piped.exit_code == 0, piped.output
    assert "…" not in piped.output and "attempt" not in piped.output
    assert str(job) in piped.output and "dict[str, int64]" in piped.output
    result = cli.invoke(app, ["checkpoints", "inspect", "--json", str(job)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert [c["directory"] for c in doc["checkpoints"]] == ["chk-1", "chk-2", "savepoints/sp-1"]
    chk2 = doc["checkpoints"][1]
    assert chk2["status"] == "complete" and chk2["id"] == 2
    op = chk2["operators"]["keyed-process"]
    assert op["parallelism"] == 2 and op["max_parallelism"] == 128
    assert [s["key_groups"] for s in op["subtasks"]] == [[0, 63], [64, 127]]
    kinds = {s["name"]: s["kind"] for s in op["states"]}
    assert kinds["agg"] == "aggregating" and kinds["_timers.user.event"] == "timer"


def test_inspect_counts_entries_as_the_backends_do(tmp_path: Path) -> None:
    """The entries ``inspect`` shows are the subtasks' own counts at the snapshot, by the one
    definition (streamstate.format.entries): the state read back from the checkpoint, counted
    that way, gives the same number on both backends; timers apart. A checkpoint written before
    the counts were recorded shows n/a."""
    import json

    from streamstate.checkpoint.metadata import decode_metadata, encode_metadata
    from streamstate.format.entries import count_entries

    for backend in ("heap", "rocksdb"):
        runner = LocalRunner(
            AllKinds(),
            key_selector=lambda r: r[0],
            parallelism=2,
            max_parallelism=128,
            checkpoint_storage=str(tmp_path / backend),
            state_backend=backend,
            incremental_checkpoints=True,
        )
        runner.run(all_kinds_records(40), final_watermark=False)
        runner.checkpoint()
        runner.run(all_kinds_records(9, per_key=5), final_watermark=False)
        runner.checkpoint()
        live = sum(op.keyed_backend.state_figures().rows for op in runner.subtasks)
        timers = sum(op.num_timers() for op in runner.subtasks)
        counted = 0
        for op in runner.subtasks:  # the state as a snapshot reads it, counted by definition
            snap = op.keyed_backend.snapshot(99)
            for kg in snap.key_group_range:
                for index, entries in snap.key_group_entries(kg):
                    kind = snap.states[index].kind
                    if kind != "timer":
                        counted += count_entries(kind, (e[2] for e in entries))
            snap.release()
        runner.close()
        job = tmp_path / backend / "job"
        result = cli.invoke(app, ["checkpoints", "inspect", "--json", str(job / "chk-2")])
        assert result.exit_code == 0, result.output
        (doc,) = json.loads(result.output)["checkpoints"]
        op = doc["operators"]["keyed-process"]
        assert op["entries"] == live == counted, backend
        assert sum(s["timers"] for s in op["subtasks"]) == timers
        assert set(op["subtasks"][0]["state_entries"]) == {
            "value",
            "list",
            "map",
            "reducing",
            "agg",
        }

    # a checkpoint of an older streamstate: no counts recorded
    path = job / "chk-2" / "_metadata"
    metadata = decode_metadata(path.read_bytes(), str(path))
    for op_meta in metadata.operators.values():
        for sub in op_meta.subtasks:
            sub.entries = sub.timers = None
    path.write_bytes(encode_metadata(metadata))
    table = cli.invoke(app, ["checkpoints", "inspect", str(job / "chk-2")], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "n/a" in table.output
