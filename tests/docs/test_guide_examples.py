"""The Python examples of the documentation's pages that need no Spark run and print what the
pages say (``support.guide``: Sybil, one namespace per page, in a fresh directory)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from support.guide import PAGES, ROOT, SPARK_PAGES, run_page

FAST_PAGES = [page for page in PAGES if page not in SPARK_PAGES]


@pytest.mark.parametrize("page", FAST_PAGES)
def test_the_examples_of(page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    run_page(page)


def test_every_spark_page_exists() -> None:
    assert set(PAGES) >= SPARK_PAGES


#: a streamstate name in a page, between backticks: ``streamstate.spark.read_state``
_NAME = re.compile(r"`(streamstate(?:\.[A-Za-z_]\w*)+)")
#: a file of the repository in a page: ``bench/results/x.json``, ``tools/check_imports.py``
_PATH = re.compile(r"\b((?:bench|src|tests|tools)/[\w./{},*-]*\w)")


#: names of files, not of modules (RocksDB's working directory lock)
_FILE_NAMES = frozenset({"streamstate.lock"})


def _resolves(name: str) -> bool:
    if name in _FILE_NAMES:
        return True
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False


def _expand(path: str) -> list[str]:
    """``a_{x,y}-{1,2}.json`` -> its four names; ``-N.json`` (a placeholder) -> ``-*.json``."""
    match = re.search(r"\{([^{}]*)\}", path)
    if match is None:
        return [re.sub(r"(?<=[-_])N(?=\.)", "*", path)]
    head, tail = path[: match.start()], path[match.end() :]
    return [name for part in match.group(1).split(",") for name in _expand(head + part + tail)]


@pytest.mark.parametrize("page", PAGES)
def test_the_names_and_files_a_page_mentions_exist(page: str) -> None:
    """A module, class or function renamed, or a results file removed, shows up here rather
    than in a reader's ImportError."""
    text = (ROOT / page).read_text()
    missing = [name for name in sorted(set(_NAME.findall(text))) if not _resolves(name)]
    for path in sorted(set(_PATH.findall(text))):
        missing += [name for name in _expand(path.rstrip(".")) if not any(ROOT.glob(name))]
    assert not missing, f"{page} mentions what does not exist: {missing}"
