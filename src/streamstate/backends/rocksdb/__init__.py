"""The RocksDB keyed state backend: state larger than memory (SPEC §10).

One RocksDB instance per subtask (rocksdict, raw mode), one column family per state, composite
keys ``[key group][key][namespace][user key]``, a write-back cache flushed in atomic
WriteBatches, incremental checkpoints of native RocksDB checkpoints, restore and rescaling by
key-group ranges. See ``docs/architecture.md`` ("RocksDB backend").
"""

from streamstate.backends.rocksdb.backend import RocksDBKeyedStateBackend
from streamstate.backends.rocksdb.incremental import (
    IncrementalManifest,
    IncrementalStateHandle,
)
from streamstate.backends.rocksdb.instance import RocksDBConfig
from streamstate.backends.rocksdb.native_view import (
    download_snapshot,
    load_manifest,
    open_native_snapshot,
)
from streamstate.backends.rocksdb.snapshot import RocksDBKeyedStateSnapshot
from streamstate.backends.rocksdb.storage import (
    CheckpointStorageFileStore,
    SnapshotFileStore,
)

__all__ = [
    "CheckpointStorageFileStore",
    "IncrementalManifest",
    "IncrementalStateHandle",
    "RocksDBConfig",
    "RocksDBKeyedStateBackend",
    "RocksDBKeyedStateSnapshot",
    "SnapshotFileStore",
    "download_snapshot",
    "load_manifest",
    "open_native_snapshot",
]
