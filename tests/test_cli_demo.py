"""``streamstate demo`` on the command line (the runs that need no Spark)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from streamstate.cli import app

cli = CliRunner()


def test_demo_with_the_local_runner_prints_hourly_results() -> None:
    result = cli.invoke(
        app, ["demo", "--runner", "local", "--events", "3000"], env={"COLUMNS": "120"}
    )
    assert result.exit_code == 0, result.output
    assert "app-4" in result.output
    assert "hourly results" in result.output


def test_fresh_refuses_to_delete_a_directory_that_is_not_a_demo(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    result = cli.invoke(app, ["demo", "--dir", str(tmp_path), "--fresh"], env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert "does not look like one" in result.output
    assert (tmp_path / "precious.txt").exists()


@pytest.mark.subprocess
def test_demo_is_reachable_as_python_dash_m(tmp_path: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "streamstate", "demo", "--help"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"), "COLUMNS": "120"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "--fresh" in done.stdout


def test_the_results_table_says_how_many_rows_it_leaves_out() -> None:
    import io

    from rich.console import Console

    from streamstate.demo.streaming import DemoRun, print_run

    results = [(f"app-{a}", hour, 10 * hour + a) for hour in range(8) for a in range(3)]
    run = DemoRun(
        directory="/d",
        resumed_from=None,
        resumed_parallelism=None,
        parallelism=2,
        batches=[{"batch": 0, "checkpoint": 0, "rows": 10, "restore": ["empty"]}],
        events=10,
        processed=10,
        seconds=1.0,
        checkpoint_id=0,
        watermark=0,
        results=results,
        new=set(),
    )
    out = io.StringIO()
    print_run(run, Console(file=out, width=200), max_hours=6)
    text = " ".join(out.getvalue().split())
    assert "6 more row(s), of 2 earlier hour(s), in /d/output" in text


def test_help_paragraphs_are_not_broken_where_the_source_breaks_them() -> None:
    result = cli.invoke(app, ["checkpoints", "rollback", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "the restarted query re-runs the Spark micro-batch after chk-N's" in result.output
