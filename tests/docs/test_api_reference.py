"""The API reference (``make docs``, docs/api) builds from the docstrings without a warning: a
reference to a streamstate name that does not resolve, a malformed docstring table or a
missing page fails here, so the reference cannot rot."""

from __future__ import annotations

from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs" / "api"


# a whole Sphinx build (~10 s of CPU, autodoc imports every documented module, pyspark
# included): make test and CI run it, make check not
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")  # Sphinx's own deprecation warnings
def test_the_api_reference_builds_without_warnings(tmp_path: Path) -> None:
    sphinx_build = pytest.importorskip("sphinx.cmd.build")
    warnings = tmp_path / "warnings.txt"
    status = sphinx_build.build_main(
        [
            "-E",
            "-n",
            "-q",
            "--keep-going",
            "-b",
            "html",
            "-w",
            str(warnings),
            str(DOCS),
            str(tmp_path / "html"),
        ]
    )
    assert status == 0
    assert warnings.read_text() == ""
    pages = {p.name for p in (tmp_path / "html").glob("*.html")}
    assert {"functions.html", "state.html", "windows.html", "spark.html"} <= pages
    spark = (tmp_path / "html" / "spark.html").read_text()
    for name in (
        "driver.query.keyed.keyed_process",
        "offline.reader.read_state",
        "driver.query.streaming.KeyedStreamingQuery",
        "driver.reports.QueryReports",
        "failures.original_error",
        "records.Row",
    ):
        assert f'id="streamstate.spark.{name}"' in spark
    functions = (tmp_path / "html" / "functions.html").read_text()
    for name in (
        "TimerService.current_watermark",
        "TimerService.delete_event_time_timer",
        "KeyedProcessFunction.OnTimerContext.time_domain",
        "KeyedProcessFunction.Context.output",
    ):
        assert f'id="streamstate.api.functions.{name}"' in functions
