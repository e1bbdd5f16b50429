"""Sphinx configuration of the documentation site (``make docs``; built in the tests by
tests/docs/test_site.py): the user guide in MyST Markdown and the API reference, generated from
the docstrings by autodoc (``api/*.rst``: autodoc's directives take reStructuredText). Every
cross-reference must resolve (nitpicky, and ``make docs`` turns warnings into errors): links
between pages and to their headings (MyST anchors, GitHub's slugs), and references to
streamstate's names; references to other libraries' types are left as text (no network: no
intersphinx)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "src")))

project = "streamstate"
author = "streamstate"
extensions = ["myst_parser", "sphinx.ext.autodoc"]
root_doc = "index"
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]
html_theme = "furo"
html_title = "streamstate"
html_show_copyright = False
html_static_path: list[str] = []

#: ``[text](page.md#a-heading)`` links resolve to headings of levels 1 to 4, by GitHub's slugs
#: (the same links work on the repository's pages)
myst_heading_anchors = 4

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"show-inheritance": True}
autodoc_inherit_docstrings = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False

nitpicky = True
#: names outside streamstate (the standard library, typing, Arrow, Spark, msgspec) and type
#: variables: left as text
nitpick_ignore_regex = [
    # type variables, private base classes, and internal types that public signatures name
    (r"py:.*", r"streamstate\..*\.(T|K|V|IN|OUT|ACC|W|NS|_\w+)"),
    (r"py:.*", r"streamstate\.spark\.driver\.plan\.options\.KeyedOptions"),
    (r"py:.*", r"streamstate\.spark\.driver\.step\.micro_batches\.RunParts"),
    (r"py:.*", r"streamstate\.windows\.contents\..*"),
    (r"py:.*", r"streamstate\.runtime\.stream_task\..*"),
    (r"py:.*", r"streamstate\.runtime\.operator\.KeyedProcessOperator"),
    (r"py:.*", r"streamstate\.checkpoint\.storage\.CompletedCheckpoint"),
    (r"py:.*", r"streamstate\.format\.meta\.StateMetaInfo"),
    (r"py:.*", r"(dict|list|tuple|set|type)\[.*|Table|RecordBatch|Schema|DataFrame"),
    (r"py:.*", r"(typing|collections|abc|enum|datetime|pyarrow|pa|pyspark|msgspec|rich)\..*"),
    (r"py:.*", r"(Any|T|K|V|IN|OUT|ACC|W|NS|Iterable|Iterator|Callable|Sequence|Mapping)"),
    (r"py:.*", r"(None|int|str|bytes|float|bool|dict|list|tuple|set|object|type|Exception)"),
    (r"py:.*", r"(ValueError|TypeError|RuntimeError|KeyError|BaseException)"),
]


def setup(app: object) -> None:
    """Napoleon reads the ``Parameters:`` sections of functions and classes; an attribute's
    ``#:`` comment stays prose (napoleon would take the text before its first colon for a
    type)."""
    from sphinx.ext import napoleon

    app.setup_extension("sphinx.ext.napoleon")  # type: ignore[attr-defined]
    app.disconnect(  # type: ignore[attr-defined]
        next(
            listener.id
            for listener in app.events.listeners["autodoc-process-docstring"]  # type: ignore[attr-defined]
            if listener.handler is napoleon._process_docstring
        )
    )

    def process(app: object, what: str, name: str, obj: object, options: object, lines: list[str]) -> None:
        if what not in ("attribute", "data", "property"):
            napoleon._process_docstring(app, what, name, obj, options, lines)  # type: ignore[arg-type]

    app.connect("autodoc-process-docstring", process)  # type: ignore[attr-defined]
