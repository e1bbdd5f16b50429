"""The documentation site (``make docs``: docs/, the guide in MyST Markdown and the API reference
from the docstrings) builds without a warning: a link to a page or heading that does not exist,
a reference to a streamstate name that does not resolve, a malformed docstring table or a code
block that does not lex fails here, so the site cannot rot."""

from __future__ import annotations

from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"


# a whole Sphinx build (~10 s of CPU, autodoc imports every documented module, pyspark
# included): make test and CI run it, make check not
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")  # Sphinx's own deprecation warnings
def test_the_site_builds_without_warnings(tmp_path: Path) -> None:
    sphinx_build = pytest.importorskip("sphinx.cmd.build")
    warnings = tmp_path / "warnings.txt"
    html = tmp_path / "html"
    status = sphinx_build.build_main(
        ["-E", "-n", "-q", "--keep-going", "-b", "html", "-w", str(warnings), str(DOCS), str(html)]
    )
    assert status == 0
    assert warnings.read_text() == ""
    # every Markdown page is in the site, reachable from its table of contents
    pages = {p.relative_to(DOCS).with_suffix(".html") for p in DOCS.rglob("*.md")}
    assert pages <= {p.relative_to(html) for p in html.rglob("*.html")}
    index = (html / "index.html").read_text()
    for page in ("getting-started", "concepts/index", "spark/index", "api/index", "benchmarks"):
        assert f'href="{page}.html"' in index
    # the API reference: autodoc found the documented names
    spark = (html / "api" / "spark.html").read_text()
    for name in (
        "driver.query.keyed.keyed_process",
        "offline.reader.read_state",
        "driver.query.streaming.KeyedStreamingQuery",
        "driver.reports.QueryReports",
        "failures.original_error",
        "records.Row",
    ):
        assert f'id="streamstate.spark.{name}"' in spark
    functions = (html / "api" / "functions.html").read_text()
    for name in (
        "TimerService.current_watermark",
        "TimerService.delete_event_time_timer",
        "KeyedProcessFunction.OnTimerContext.time_domain",
        "KeyedProcessFunction.Context.output",
    ):
        assert f'id="streamstate.api.functions.{name}"' in functions
