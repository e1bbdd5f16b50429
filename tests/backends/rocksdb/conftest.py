"""Fixtures of the RocksDB backend tests: backends in tmp dirs, a checkpoint store, helpers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from streamstate.backends.rocksdb.backend import RocksDBKeyedStateBackend
from streamstate.backends.rocksdb.instance import RocksDBConfig
from streamstate.backends.rocksdb.storage import FsspecFileStore
from streamstate.keygroups import KeyGroupRange, compute_key_group_range_for_operator_index
from streamstate.serializers import serializer_for

RocksFactory = Callable[..., RocksDBKeyedStateBackend]


@pytest.fixture
def make_rocks(tmp_path: Any) -> Iterator[RocksFactory]:
    """``make_rocks(subtask=0, parallelism=1, key_type=int, max_parallelism=128, **config)``."""
    created: list[RocksDBKeyedStateBackend] = []

    def factory(
        subtask: int = 0,
        parallelism: int = 1,
        key_type: Any = int,
        max_parallelism: int = 128,
        key_group_range: KeyGroupRange | None = None,
        clock: Any = None,
        name: str | None = None,
        **config: Any,
    ) -> RocksDBKeyedStateBackend:
        kgr = key_group_range or compute_key_group_range_for_operator_index(
            max_parallelism, parallelism, subtask
        )
        path = tmp_path / "work" / (name or f"op-{parallelism}-{subtask}-{len(created)}")
        backend = RocksDBKeyedStateBackend(
            serializer_for(key_type),
            max_parallelism,
            kgr,
            options=RocksDBConfig(**config),
            path=str(path),
            clock=clock,
        )
        created.append(backend)
        return backend

    yield factory
    for b in created:
        b.dispose()


@pytest.fixture
def store(tmp_path: Any) -> FsspecFileStore:
    return FsspecFileStore(str(tmp_path / "checkpoints" / "job"))
