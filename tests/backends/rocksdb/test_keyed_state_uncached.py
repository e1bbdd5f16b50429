"""The keyed-state behaviour suite again, on RocksDB with a zero-entry write-back cache.

With ``cache_entries=0`` every record boundary flushes and evicts everything, so each test runs
through the cache's miss, reload and flush paths instead of its hits.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
from collections.abc import Iterator
from typing import Any

import pytest

from streamstate.backends.base import KeyedStateBackend
from streamstate.backends.rocksdb.factory import RocksDBStateBackend
from streamstate.keygroups import KeyGroupRange
from streamstate.serializers import serializer_for

_SUITE = os.path.join(os.path.dirname(__file__), "..", "test_keyed_state.py")
_spec = importlib.util.spec_from_file_location("keyed_state_suite", _SUITE)
assert _spec is not None and _spec.loader is not None
_suite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_suite)
globals().update(
    {
        name: fn
        for name, fn in vars(_suite).items()
        if name.startswith("test_") and "make_backend" in inspect.signature(fn).parameters
    }
)


@pytest.fixture
def make_backend(tmp_path: Any) -> Iterator[Any]:
    created: list[KeyedStateBackend] = []

    def factory(
        key_type: Any = str,
        max_parallelism: int = 128,
        key_group_range: KeyGroupRange | None = None,
        clock: Any = None,
        **options: Any,
    ) -> KeyedStateBackend:
        sb = RocksDBStateBackend(
            working_dir=str(tmp_path / f"rocksdb-{len(created)}"),
            block_cache_size=1 << 20,
            extra={"cache_entries": 0},
        )
        backend = sb.create_keyed_backend(
            serializer_for(key_type),
            max_parallelism,
            key_group_range or KeyGroupRange(0, max_parallelism - 1),
            clock=clock,
            subtask_index=len(created),
        )
        created.append(backend)
        return backend

    yield factory
    for b in created:
        b.dispose()
