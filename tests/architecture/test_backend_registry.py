"""Backends are found by name (``state_backend=``) and by the kinds of their own snapshot files,
through ``streamstate.backends.registry``: nothing above the backends names one."""

from __future__ import annotations

from typing import Any

import pytest

from streamstate.backends.heap.factory import HeapStateBackend
from streamstate.backends.registry import (
    backend_format_restore,
    backend_package,
    state_backend_from,
)
from streamstate.backends.rocksdb.factory import RocksDBStateBackend
from streamstate.checkpoint.storage import MemoryCheckpointStorage
from streamstate.errors import CheckpointError
from streamstate.format.handles import StateFileHandle
from streamstate.keygroups import KeyGroupRange


def test_names_give_configured_backends() -> None:
    assert isinstance(state_backend_from(None), HeapStateBackend)
    assert state_backend_from("heap-nested").table_kind == "nested_maps"  # type: ignore[attr-defined]
    assert isinstance(state_backend_from("rocksdb"), RocksDBStateBackend)
    configured = RocksDBStateBackend(incremental=False)
    assert state_backend_from(configured) is configured


@pytest.mark.parametrize("name", ["ramdisk", "decorators", "heap-sideways", "../heap"])
def test_an_unknown_name_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match=f"unknown state backend {name!r}"):
        state_backend_from(name)


def test_packages_are_found_from_the_first_part_of_a_kind() -> None:
    package = backend_package("rocksdb-manifest")
    assert package is not None and "rocksdb-manifest" in package.SNAPSHOT_KINDS
    assert backend_package("heap").SNAPSHOT_KINDS == {}  # type: ignore[union-attr]
    assert backend_package("nothing-here") is None


class _Location:
    def __init__(self) -> None:
        self.storage = MemoryCheckpointStorage()
        self.directory = "chk-1"

    def resolve(self, path: str) -> str:
        return f"{self.directory}/{path}"


def test_a_file_kind_no_backend_reads_names_the_file() -> None:
    handle = StateFileHandle(
        path="op/0-0.state", size=1, checksum=0, kind="ramdisk-image", checkpoint_id=1
    )
    location: Any = _Location()
    with pytest.raises(CheckpointError, match=r"chk-1/op/0-0\.state.*'ramdisk-image'"):
        backend_format_restore(location, [handle], KeyGroupRange(0, 127))
