"""The node's run directory (host sockets, locks, logs) is checked before anything is created in
it: a refused one leaves nothing behind."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from streamstate.spark.wire.security import run_dir


def test_a_run_dir_below_an_unsafe_parent_is_refused_before_anything_is_created(
    tmp_path: Path,
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    d = shared / "node" / "run"
    with pytest.raises(PermissionError, match=rf"{shared}, a parent of .* has mode 0777"):
        run_dir(str(d))
    assert list(shared.iterdir()) == []
    os.chmod(shared, 0o755)
    assert run_dir(str(d)) == str(d)
    # every directory it created is private, not only the last
    for created in (shared / "node", d):
        assert stat.S_IMODE(created.stat().st_mode) == 0o700, created
    assert run_dir(str(d)) == str(d)  # an existing one is used as it is
