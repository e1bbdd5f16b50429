"""Runs the Python examples of the documentation's pages (``docs/**/*.md`` and the README) with
Sybil: every ```` ```python ```` block, a doctest when it starts with ``>>>`` (its output must
match) and plain code otherwise, and every hidden setup block (a MyST comment ``%
invisible-code-block: python``, or ``<!-- invisible-code-block: python ... -->`` in the README,
which GitHub shows too), in the page's order and one namespace per page, in a fresh working
directory. Blocks in other languages (``bash``, ``text``) are shown, not run: write a command's
output as ``text``.

Nothing is skipped: Sybil's ``skip`` comments are not parsed (and refused), and every Python
block of a page must have been run. A page that needs a SparkSession uses the name ``spark``
and is listed in :data:`SPARK_PAGES`: the Spark tier runs it with the tests' shared session
(``tests/spark/test_guide_on_spark.py``), the fast tier every other page
(``tests/docs/test_guide_examples.py``)."""

from __future__ import annotations

import doctest
import re
from pathlib import Path
from typing import Any

from sybil import Document
from sybil.parsers.markdown import PythonCodeBlockParser as MarkdownCodeBlockParser
from sybil.parsers.myst import PythonCodeBlockParser as MystCodeBlockParser

__all__ = ["DOCS", "PAGES", "README", "ROOT", "SPARK_PAGES", "run_page"]

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"

#: pages whose examples use ``spark`` (relative to the repository's root)
SPARK_PAGES = frozenset(
    {
        "README.md",
        "docs/getting-started.md",
        "docs/spark/index.md",
        "docs/spark/batch.md",
        "docs/spark/streaming.md",
        "docs/spark/window-aggregates.md",
        "docs/spark/monitoring.md",
        "docs/checkpoints/reading-state.md",
        "docs/checkpoints/state-source.md",
        "docs/checkpoints/upgrading.md",
    }
)

#: every page with Python in it, relative to the repository's root
PAGES = sorted(
    [str(p.relative_to(ROOT)) for p in DOCS.rglob("*.md")] + [str(README.relative_to(ROOT))]
)

OPTIONFLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
_PYTHON_FENCE = re.compile(r"^(`{3,})python[ \t]*\n.*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
_SKIP = re.compile(r"^\s*(%|<!--)\s*skip\s*:", re.MULTILINE)


class _NoSpark:
    """The ``spark`` of a page run in the fast tier: using it says what to do."""

    def __init__(self, page: str) -> None:
        self._page = page

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(
            f"{self._page} uses spark: list it in SPARK_PAGES (tests/support/guide.py) so that "
            "the Spark tier runs it"
        )


def run_page(page: str, spark: Any = None) -> int:
    """Runs every Python example of ``page`` (a path relative to the repository's root) in
    the current directory; returns how many ran. Raises Sybil's failure (the page's line, what
    was expected and what came) at the first example that fails."""
    path = ROOT / page
    parser = (
        MarkdownCodeBlockParser(doctest_optionflags=OPTIONFLAGS)
        if path == README
        else MystCodeBlockParser(doctest_optionflags=OPTIONFLAGS)
    )
    text = path.read_text()
    assert not _SKIP.search(text), f"{page}: examples are not skipped; give them their setup"
    document = Document.parse(str(path), parser)
    document.namespace["spark"] = spark if spark is not None else _NoSpark(page)
    examples = list(document)
    run = 0
    try:
        for example in examples:
            example.evaluate()
            run += 1
    finally:
        if spark is not None:
            _stop_queries(document.namespace)
    for fence in _PYTHON_FENCE.finditer(text):
        assert any(fence.start() <= e.region.start < fence.end() for e in examples), (
            f"{page}, line {text.count(chr(10), 0, fence.start()) + 1}: a Python block that "
            "no example was parsed from"
        )
    return run


def _stop_queries(namespace: dict[str, Any]) -> None:
    """Stops the streaming queries a page left running (and their state hosts)."""
    from streamstate.spark import KeyedStreamingQuery

    for value in list(namespace.values()):
        if isinstance(value, KeyedStreamingQuery):
            value.stop()
