"""A native RocksDB snapshot read outside the RocksDB backend, as a canonical keyed snapshot.

What ``checkpoint/native.py`` needs to let every other reader (the heap backend, ``read_state``,
the CLI) read a native snapshot: load and verify its manifest, download its files, and open them
read-only as a :class:`~streamstate.format.snapshot.KeyedStateSnapshot`.
"""

from __future__ import annotations

import msgspec

from streamstate.backends.rocksdb.incremental import IncrementalManifest
from streamstate.backends.rocksdb.restore import download_snapshot, load_manifest
from streamstate.backends.rocksdb.snapshot import RocksDBKeyedStateSnapshot

__all__ = ["download_snapshot", "load_manifest", "open_native_snapshot"]


def open_native_snapshot(
    manifest: IncrementalManifest, directory: str, only_states: set[str] | None = None
) -> RocksDBKeyedStateSnapshot:
    """The files of ``manifest``, downloaded into ``directory`` (:func:`download_snapshot`),
    opened as a canonical snapshot (``release()`` it when done). ``only_states``: keep only
    these states and no timers (None: everything)."""
    if only_states is not None:
        manifest = msgspec.structs.replace(
            manifest, states=[m for m in manifest.states if m.name in only_states], timers=[]
        )
    return RocksDBKeyedStateSnapshot.of_manifest(manifest, directory)
