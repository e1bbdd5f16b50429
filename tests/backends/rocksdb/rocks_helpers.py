"""Helpers of the RocksDB backend tests (imported by the test modules)."""

from __future__ import annotations

from typing import Any

from streamstate.backends.rocksdb.backend import RocksDBKeyedStateBackend
from streamstate.backends.rocksdb.incremental import IncrementalStateHandle, SharedStateRegistry
from streamstate.backends.rocksdb.storage import FsspecFileStore


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
