"""Helpers and fixtures of the RocksDB backend tests.

Test modules import the fixtures (``make_rocks``, ``store``) from here: a second ``conftest.py``
would clash with ``tests/conftest.py`` under ``--doctest-modules``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest

from streamstate.backends.base import RestoreInput, RestoreMode
from streamstate.backends.rocksdb.backend import RocksDBKeyedStateBackend
from streamstate.backends.rocksdb.incremental import (  # noqa: F401 - SharedFile: doctest
    IncrementalStateHandle,
    SharedFile,
)
from streamstate.backends.rocksdb.instance import RocksDBConfig
from streamstate.backends.rocksdb.restore import NativeRestoreFile
from streamstate.backends.rocksdb.storage import CheckpointStorageFileStore, SnapshotFileStore
from streamstate.checkpoint.storage import FileSystemCheckpointStorage
from streamstate.keygroups import KeyGroupRange, compute_key_group_range_for_operator_index
from streamstate.serializers import serializer_for
from support.memory_restore import MemoryRestore

RocksFactory = Callable[..., RocksDBKeyedStateBackend]


class SharedStateRegistry:
    """(Test scaffolding: the runtimes rely on the checkpoint storage's retention instead.)

    Reference counts of shared files over the retained checkpoints of a job.

    The checkpoint coordinator registers each completed checkpoint's handles and releases a
    checkpoint when retention drops it; a shared file is deleted when the last retained
    checkpoint referencing it is released.

    >>> class NoStore:
    ...     def delete(self, path): print("delete", path)
    >>> h = lambda cid, paths: IncrementalStateHandle(path=f"chk-{cid}", size=0, crc32c=0,
    ...     checkpoint_id=cid, key_group_range=(0, 1), uploaded_bytes=0, reused_bytes=0,
    ...     shared=[SharedFile(p.rsplit("/", 1)[-1], p, 1, 0) for p in paths])
    >>> r = SharedStateRegistry(NoStore())
    >>> r.register(1, [h(1, ["shared/a", "shared/b"])]); r.register(2, [h(2, ["shared/b"])])
    >>> r.release(1)
    delete shared/a
    ['shared/a']
    """

    def __init__(self, store: SnapshotFileStore) -> None:
        self.store = store
        self._by_checkpoint: dict[int, set[str]] = {}
        self._refs: dict[str, int] = {}

    def register(self, checkpoint_id: int, handles: Iterable[IncrementalStateHandle]) -> None:
        if checkpoint_id in self._by_checkpoint:
            raise ValueError(f"checkpoint {checkpoint_id} is already registered")
        paths = {p for h in handles for p in h.shared_paths}
        self._by_checkpoint[checkpoint_id] = paths
        for p in paths:
            self._refs[p] = self._refs.get(p, 0) + 1

    def release(self, checkpoint_id: int) -> list[str]:
        """Drop a checkpoint; delete and return the shared files nothing references any more."""
        paths = self._by_checkpoint.pop(checkpoint_id, set())
        deleted = []
        for p in sorted(paths):
            n = self._refs[p] - 1
            if n:
                self._refs[p] = n
            else:
                del self._refs[p]
                self.store.delete(p)
                deleted.append(p)
        return deleted

    def referenced(self) -> set[str]:
        return set(self._refs)

    def retained_checkpoints(self) -> list[int]:
        return sorted(self._by_checkpoint)


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


def file_store(directory: str) -> CheckpointStorageFileStore:
    """The file store of the checkpoint storage at ``directory`` (what the runtimes use)."""
    return CheckpointStorageFileStore(FileSystemCheckpointStorage(directory, job_id=""))


def stored_files(store: CheckpointStorageFileStore, prefix: str) -> list[str]:
    """Relative paths of the files under ``prefix``."""
    return sorted(store.storage.walk_files(prefix))


def restore_native(
    backend: RocksDBKeyedStateBackend,
    store: SnapshotFileStore,
    handles: Iterable[IncrementalStateHandle | str],
) -> dict[str, int]:
    """Restore ``backend`` through its one entry point from native snapshots of ``store``
    (reusing their files, as a restore from the checkpoint storage it writes to); returns the
    restore's statistics."""
    files = tuple(NativeRestoreFile(store, h) for h in handles)
    backend.restore(RestoreInput(files, RestoreMode.CLAIM))
    return backend.restore_statistics


def snapshot_files(snapshots: Iterable[Any]) -> list[bytes]:
    """The snapshot file of each keyed snapshot (savepoints; the snapshots are released)."""
    return [MemoryRestore.write(snapshot) for snapshot in snapshots]


def restore_files(backend: Any, files: Iterable[bytes]) -> None:
    """Restore ``backend`` through its one entry point from snapshot files (its key groups)."""
    backend.restore([MemoryRestore(data, backend.key_group_range) for data in files])


@pytest.fixture(name="store")
def store_fixture(tmp_path: Any) -> CheckpointStorageFileStore:
    return file_store(str(tmp_path / "checkpoints" / "job"))


def checkpoint(
    backends: list[RocksDBKeyedStateBackend],
    store: SnapshotFileStore,
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
