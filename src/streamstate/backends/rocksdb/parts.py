"""What the RocksDB backend's snapshot and restore modules get from the backend.

``snapshot.py``, ``restore.py`` and ``restore_files.py`` take a :class:`RocksDBParts` (the
``RocksDBKeyedStateBackend`` is one): its database, cache, registered states, restored data
(:class:`~streamstate.backends.rocksdb.restored.RestoredStates`) and upload bookkeeping
(:class:`~streamstate.backends.rocksdb.incremental.UploadTracker`), used through public names
only. None of them imports ``backend.py``, which imports them.
"""

from __future__ import annotations

from typing import Any, Protocol

from streamstate.backends.decorators.ttl_cleanup import TtlCleanupHook
from streamstate.backends.rocksdb.cache import MapCache, ValueCache, WriteBackCache
from streamstate.backends.rocksdb.incremental import UploadTracker
from streamstate.backends.rocksdb.instance import ColumnFamily, RocksDBConfig, RocksDBInstance
from streamstate.backends.rocksdb.keys import KeyLayout
from streamstate.backends.rocksdb.restored import RestoredStates
from streamstate.backends.timer_queues import TimerQueues
from streamstate.format.meta import StateMetaInfo, StateMetaSnapshot
from streamstate.keygroups import KeyGroupRange
from streamstate.serializers.base import TypeSerializer

__all__ = ["RegisteredState", "RocksDBParts"]


class RegisteredState:
    """What the backend knows about one state's column family."""

    __slots__ = ("cache", "cf", "layout", "meta", "ttl_hook")

    def __init__(
        self,
        meta: StateMetaInfo,
        cf: ColumnFamily,
        layout: KeyLayout,
        cache: ValueCache | MapCache,
    ) -> None:
        self.meta = meta
        self.cf = cf
        self.layout = layout
        self.cache = cache
        self.ttl_hook: TtlCleanupHook | None = None


class RocksDBParts(Protocol):
    """The RocksDB backend as its snapshot and restore modules see it."""

    key_serializer: TypeSerializer[Any]
    max_parallelism: int
    key_group_range: KeyGroupRange
    instance: RocksDBInstance
    cache: WriteBackCache
    config: RocksDBConfig
    backend_uid: str
    restored: RestoredStates
    uploads: UploadTracker
    timer_queues: TimerQueues

    @property
    def key_layout(self) -> KeyLayout: ...

    def registered_state_names(self) -> list[str]: ...

    def registered_states(self) -> list[RegisteredState]: ...

    def restored_state_meta(self, name: str) -> StateMetaSnapshot | None: ...

    def add_restored_meta(self, meta: StateMetaSnapshot) -> bool: ...
