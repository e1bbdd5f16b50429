"""The RocksDB keyed state backend: state larger than memory (SPEC §10).

One RocksDB instance per subtask (rocksdict, raw mode), one column family per state, composite
keys ``[key group][key][namespace][user key]``, a write-back cache flushed in atomic
WriteBatches, incremental checkpoints of native RocksDB checkpoints, restore and rescaling by
key-group ranges. See ``docs/architecture.md`` ("RocksDB backend").
"""

from streamstate.backends.rocksdb.backend import RocksDBKeyedStateBackend
from streamstate.backends.rocksdb.incremental import IncrementalStateHandle, SharedStateRegistry
from streamstate.backends.rocksdb.instance import RocksDBConfig
from streamstate.backends.rocksdb.snapshot import RocksDBKeyedStateSnapshot
from streamstate.backends.rocksdb.storage import (
    CheckpointStorageFileStore,
    FsspecFileStore,
    SnapshotFileStore,
)

__all__ = [
    "CheckpointStorageFileStore",
    "FsspecFileStore",
    "IncrementalStateHandle",
    "RocksDBConfig",
    "RocksDBKeyedStateBackend",
    "RocksDBKeyedStateSnapshot",
    "SharedStateRegistry",
    "SnapshotFileStore",
]
