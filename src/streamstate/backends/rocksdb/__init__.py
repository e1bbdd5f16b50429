"""The RocksDB keyed state backend: state larger than memory (SPEC §10).

One RocksDB instance per subtask (rocksdict, raw mode), one column family per state, composite
keys ``[key group][key][namespace][user key]``, a write-back cache flushed in atomic
WriteBatches, incremental checkpoints of native RocksDB checkpoints, restore and rescaling by
key-group ranges. See ``docs/architecture.md`` ("RocksDB backend").
"""

from typing import Any

from streamstate.backends.rocksdb.factory import RocksDBStateBackend
from streamstate.backends.rocksdb.incremental import MANIFEST_KIND

__all__ = ["SNAPSHOT_KINDS", "STATE_BACKENDS", "RocksDBStateBackend"]


def _manifest_restore(location: Any, files: list[Any], key_groups: Any) -> Any:
    """A checkpoint's manifest (then its SST files) as a restore file."""
    # imported when a checkpoint holds one: importing the package stays free of rocksdict
    from streamstate.backends.rocksdb.native_restore import NativeKeyedStateRestore

    return NativeKeyedStateRestore(location, files[0], key_groups)


#: the names this backend answers to (``streamstate.backends.registry``)
STATE_BACKENDS = {"rocksdb": RocksDBStateBackend}
#: its native snapshots in checkpoints: the manifest, then the SST files it references
SNAPSHOT_KINDS = {MANIFEST_KIND: _manifest_restore}
