"""Helpers and fixtures of the RocksDB backend tests.

Test modules import the fixtures (``make_rocks``, ``store``) from here: a second ``conftest.py``
would clash with ``tests/conftest.py`` under ``--doctest-modules``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from streamstate.backends.rocksdb.backend import RocksDBKeyedStateBackend
from streamstate.backends.rocksdb.incremental import IncrementalStateHandle, SharedStateRegistry
from streamstate.backends.rocksdb.instance import RocksDBConfig
from streamstate.backends.rocksdb.storage import FsspecFileStore
from streamstate.keygroups import KeyGroupRange, compute_key_group_range_for_operator_index
from streamstate.serializers import serializer_for

RocksFactory = Callable[..., RocksDBKeyedStateBackend]


@pytest.fixture(name="make_rocks")
def make_rocks_fixture(tmp_path: Any) -> Iterator[RocksFactory]:
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


@pytest.fixture(name="store")
def store_fixture(tmp_path: Any) -> FsspecFileStore:
    return FsspecFileStore(str(tmp_path / "checkpoints" / "job"))


def checkpoint(
    backends: list[RocksDBKeyedStateBackend],
    store: FsspecFileStore,
    checkpoint_id: int,
    registry: SharedStateRegistry | None = None,
    operator: str = "op",
) -> list[IncrementalStateHandle]:
    """Snapshot every backend, upload incrementally, register and confirm the checkpoint."""
    handles = [
        b.snapshot(checkpoint_id).write_incremental(
            store, f"chk-{checkpoint_id}/{operator}/{i}-0.state"
        )
        for i, b in enumerate(backends)
    ]
    if registry is not None:
        registry.register(checkpoint_id, handles)
    for b in backends:
        b.notify_checkpoint_complete(checkpoint_id)
    return handles


def raw_content(backend: RocksDBKeyedStateBackend) -> dict[str, dict[bytes, bytes]]:
    """Every RocksDB entry of every column family (after flushing the cache)."""
    backend.flush()
    inst = backend.instance
    return {
        name: dict(inst.column_family(name).scan(b"", None))  # type: ignore[arg-type]
        for name in inst.column_family_names()
    }


def canonical_content(snapshot: Any) -> dict[tuple[str, Any, Any], Any]:
    """``(state name, key, namespace) -> state`` of a canonical keyed snapshot."""
    out: dict[tuple[str, Any, Any], Any] = {}
    names = [m.name for m in snapshot.states]
    for kg in snapshot.key_group_range:
        for index, entries in snapshot.key_group_entries(kg):
            for key, ns, value in entries:
                out[(names[index], key, ns)] = value
        snapshot.release_key_group(kg)
    return out
