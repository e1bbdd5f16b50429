"""Every ``>>>`` example of docs/state.md runs and prints what the page says."""

from __future__ import annotations

import doctest
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "state.md"


def test_state_md_examples():
    result = doctest.testfile(
        str(DOC),
        module_relative=False,
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
        verbose=False,
    )
    assert result.attempted > 0
    assert result.failed == 0
