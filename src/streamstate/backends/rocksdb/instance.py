"""One RocksDB instance of one subtask: its directory, lock, options and column families.

Directory layout of an instance (``path`` = ``<working_dir>/<operator>-<subtask>``)::

    streamstate.lock      flock held while the instance is open (refuses a second opener)
    db/                   the RocksDB database (one column family per state)
    checkpoints/chk-<id>  native checkpoints (hard links) waiting for their asynchronous upload
    restore/              files downloaded while restoring

The local directory is never a recovery source: state is restored from checkpoint storage, so
on open everything but the lock is wiped (Flink does the same) and the write-ahead log is off by
default (a checkpoint flushes the memtables first).

rocksdict keeps a database open as long as any column-family handle is referenced, so states
never hold rocksdict objects directly: they hold a :class:`ColumnFamily`, which :meth:`close`
detaches, releasing RocksDB's own lock even if user code still holds state handles.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import os
import shutil
from collections.abc import Iterator
from typing import Any

from rocksdict import (
    AccessType,
    BlockBasedIndexType,
    BlockBasedOptions,
    BottommostLevelCompaction,
    Cache,
    Checkpoint,
    CompactOptions,
    DBCompressionType,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)

from streamstate.backends.rocksdb.keys import prefix_successor
from streamstate.errors import CorruptCheckpointError, InvalidStateNameError, StateBackendError

__all__ = ["ColumnFamily", "RocksDBConfig", "RocksDBInstance", "open_read_only"]

DEFAULT_COLUMN_FAMILY = "default"

_COMPRESSION = {
    "lz4": DBCompressionType.lz4,
    "zstd": DBCompressionType.zstd,
    "snappy": DBCompressionType.snappy,
    "none": DBCompressionType.none,
}


@dataclasses.dataclass
class RocksDBConfig:
    """RocksDB and cache settings of a subtask's instance (defaults suit a laptop)."""

    #: LRU block cache shared by all column families (bytes)
    block_cache_size: int = 64 * 1024 * 1024
    #: RocksDB's row cache (bytes; 0 = off): caches point-lookup results per SST file, so a
    #: warm ``get`` skips the index, filter and data block search. RocksDB refuses range
    #: deletions while it is on, so the backend then deletes key ranges entry by entry
    row_cache_size: int = 0
    #: memtable size per column family (bytes)
    write_buffer_size: int = 32 * 1024 * 1024
    #: upper bound of all memtables of the instance together (bytes; 0 = no bound)
    total_write_buffer_size: int = 128 * 1024 * 1024
    max_write_buffer_number: int = 2
    #: "lz4", "zstd", "snappy" or "none"
    compression: str = "lz4"
    bloom_bits_per_key: int = 10
    max_background_jobs: int = 2
    #: RocksDB's ``disable_auto_compactions``: SST files change only by flushes and the
    #: backend's own full compactions. For bulk loads that compact once at the end, and for
    #: checks that follow which files each checkpoint references
    disable_auto_compactions: bool = False
    #: the write-ahead log is useless when recovery always comes from a checkpoint
    disable_wal: bool = True
    #: entries of the write-back cache in front of RocksDB (0 disables caching)
    cache_entries: int = 100_000
    #: bytes per WriteBatch when copying key groups during a rescaling restore
    restore_batch_bytes: int = 4 * 1024 * 1024
    #: checkpoints in the native incremental format (see ``RocksDBStateBackend.incremental``)
    incremental: bool = True

    @classmethod
    def from_options(cls, options: Any) -> RocksDBConfig:
        """From a :class:`~streamstate.backends.factory.RocksDBStateBackend` (or None)."""
        if options is None:
            return cls()
        if isinstance(options, RocksDBConfig):
            return options
        config = cls()
        for field in (
            "block_cache_size",
            "row_cache_size",
            "write_buffer_size",
            "compression",
            "incremental",
        ):
            if hasattr(options, field):
                setattr(config, field, getattr(options, field))
        names = {f.name for f in dataclasses.fields(cls)}
        for name, value in (getattr(options, "extra", None) or {}).items():
            if name not in names:
                raise ValueError(
                    f"unknown RocksDB option {name!r} in RocksDBStateBackend.extra; known: "
                    f"{sorted(names)}"
                )
            setattr(config, name, value)
        config.validate()
        return config

    def validate(self) -> None:
        if self.compression not in _COMPRESSION:
            raise ValueError(
                f"RocksDB compression must be one of {sorted(_COMPRESSION)}, got "
                f"{self.compression!r}"
            )
        for name in ("block_cache_size", "row_cache_size", "write_buffer_size", "cache_entries"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"RocksDB option {name} must be an integer, got {value!r}")
            if value < 0:
                raise ValueError(f"RocksDB option {name} must be >= 0, got {value}")
        for name in ("disable_auto_compactions", "disable_wal", "incremental"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"RocksDB option {name} must be True or False, got {getattr(self, name)!r}"
                )
        if self.write_buffer_size < 64 * 1024:
            raise ValueError(
                f"RocksDB write_buffer_size must be at least 64 KiB, got {self.write_buffer_size}"
            )

    def db_options(self, cache: Cache | None, row_cache: Cache | None = None) -> Options:
        """Options of the database and of every column family (raw mode)."""
        opts = Options(raw_mode=True)
        if row_cache is not None:
            opts.set_row_cache(row_cache)
        opts.create_if_missing(True)
        opts.create_missing_column_families(True)
        table = BlockBasedOptions()
        if self.bloom_bits_per_key > 0:
            table.set_bloom_filter(self.bloom_bits_per_key, False)
        if cache is not None:
            table.set_block_cache(cache)
            # index and filter blocks live in the block cache: memory stays bounded with the data.
            # They are partitioned (as Flink's bounded-memory setup), so a lookup loads small
            # partitions instead of a file's whole multi-megabyte index and filter.
            table.set_cache_index_and_filter_blocks(True)
            table.set_index_type(BlockBasedIndexType.two_level_index_search())
            table.set_partition_filters(True)
            table.set_metadata_block_size(4096)
            table.set_pin_top_level_index_and_filter(True)
            table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        else:
            table.disable_cache()
        opts.set_block_based_table_factory(table)
        opts.set_compression_type(_COMPRESSION[self.compression]())
        opts.set_write_buffer_size(self.write_buffer_size)
        opts.set_max_write_buffer_number(self.max_write_buffer_number)
        if self.total_write_buffer_size:
            opts.set_db_write_buffer_size(self.total_write_buffer_size)
        opts.set_max_background_jobs(self.max_background_jobs)
        opts.set_disable_auto_compactions(self.disable_auto_compactions)
        opts.set_keep_log_file_num(2)
        return opts


def _compact_fully(cf: ColumnFamily) -> None:
    options = CompactOptions()
    options.set_bottommost_level_compaction(BottommostLevelCompaction.force())
    cf._db().compact_range(None, None, options)


class ColumnFamily:
    """The column family of one state; detached (``cf is None``) once the instance closes."""

    __slots__ = ("cf", "handle", "name")

    def __init__(self, name: str, cf: Rdict, handle: Any) -> None:
        self.name = name
        self.cf: Rdict | None = cf
        self.handle = handle

    def _db(self) -> Rdict:
        cf = self.cf
        if cf is None:
            raise StateBackendError(
                f"state {self.name!r}: its RocksDB instance was closed (the backend was disposed)"
            )
        return cf

    def get(self, key: bytes) -> bytes | None:
        return self._db().get(key)  # type: ignore[no-any-return]

    def get_function(self) -> Any:
        """The column family's bound point read (for hot paths; drop it when detached)."""
        return self._db().get

    def multi_get(self, keys: list[bytes]) -> list[bytes | None]:
        """The values of ``keys`` (None where absent), read in one call."""
        if not keys:
            return []
        found: Any = self._db().get(list[Any](keys))
        return list(found)

    def _iterator(self, start: bytes, end: bytes | None) -> Any:
        ro = ReadOptions()
        if end is not None:
            ro.set_iterate_upper_bound(end)
        it = self._db().iter(ro)
        # iterate_lower_bound is ignored by rocksdict when iterating from the start: seek instead
        it.seek(start)
        return it

    def scan(self, start: bytes, end: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` pairs with ``start <= key < end`` in key order (a consistent view:
        a RocksDB iterator pins the data it iterates)."""
        it = self._iterator(start, end)
        try:
            while it.valid():
                yield it.key(), it.value()
                it.next()
        finally:
            del it

    def scan_columns(self, start: bytes, end: bytes) -> tuple[list[bytes], list[bytes]]:
        """The keys and the values of :meth:`scan`, as two lists made by rocksdict itself: no
        Python frame and no tuple per entry (a read-only snapshot's key group read whole; the
        two passes see the same entries only where nothing writes meanwhile)."""
        bound = ReadOptions()
        bound.set_iterate_upper_bound(end)
        # made while ``bound`` lives: the iterators read their upper bound from it
        db: Any = self._db()  # raw mode: keys and values are bytes
        keys: list[bytes] = list(db.keys(from_key=start, read_opt=bound))
        values: list[bytes] = list(db.values(from_key=start, read_opt=bound))
        return keys, values

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every ``(key, value)`` in key order, iterated by rocksdict itself (no Python frame
        per entry: a whole column family's rewrite)."""
        items: Any = self._db().items()  # raw mode: keys and values are bytes
        return items  # type: ignore[no-any-return]

    def scan_keys(self, start: bytes, end: bytes | None = None) -> Iterator[bytes]:
        """The keys of :meth:`scan` (values are not copied to Python)."""
        it = self._iterator(start, end)
        try:
            while it.valid():
                yield it.key()
                it.next()
        finally:
            del it

    def scan_prefix(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Entries whose key starts with ``prefix``."""
        return self.scan(prefix, prefix_successor(prefix))

    def scan_prefix_keys(self, prefix: bytes) -> Iterator[bytes]:
        """Keys that start with ``prefix``."""
        return self.scan_keys(prefix, prefix_successor(prefix))

    def detach(self) -> None:
        self.cf = None
        self.handle = None


class RocksDBInstance:
    """The RocksDB database of one subtask (see the module docstring)."""

    def __init__(self, path: str, config: RocksDBConfig) -> None:
        self.path = os.path.abspath(path)
        self.config = config
        self.db_path = os.path.join(self.path, "db")
        self.checkpoints_path = os.path.join(self.path, "checkpoints")
        self.restore_path = os.path.join(self.path, "restore")
        self._lock_fd: int | None = None
        self._db: Rdict | None = None
        self._column_families: dict[str, ColumnFamily] = {}
        self._cache = Cache(config.block_cache_size) if config.block_cache_size > 0 else None
        # one row cache per instance, like the block cache: a subtask's memory stays its own
        # (RocksDB would also tell instances sharing one apart: its keys carry a per-open id)
        self._row_cache = Cache(config.row_cache_size) if config.row_cache_size > 0 else None
        self._options = config.db_options(self._cache, self._row_cache)
        self._write_options = WriteOptions()
        # a property at runtime; rocksdict's type stub declares it as a method
        self._write_options.disable_wal = config.disable_wal  # type: ignore[method-assign,assignment]
        self._lock_and_wipe()

    # ---- directory ---------------------------------------------------------------------------

    def _lock_and_wipe(self) -> None:
        try:
            os.makedirs(self.path, exist_ok=True)
            fd = os.open(os.path.join(self.path, "streamstate.lock"), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StateBackendError(
                f"RocksDB working directory {self.path!r} is not writable: {exc.strerror or exc}"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StateBackendError(
                    f"RocksDB working directory {self.path!r} is locked: another backend "
                    "instance or process is using it (two subtasks must not share a working "
                    "directory)"
                ) from exc
            raise StateBackendError(
                f"cannot lock RocksDB working directory {self.path!r}: {exc}"
            ) from exc
        self._lock_fd = fd
        for sub in (self.db_path, self.checkpoints_path, self.restore_path):
            shutil.rmtree(sub, ignore_errors=True)
        try:
            os.makedirs(self.checkpoints_path)
            probe = os.path.join(self.path, ".write-probe")
            with open(probe, "wb") as f:
                f.write(b"x")
            os.remove(probe)
        except OSError as exc:
            self._unlock()
            raise StateBackendError(
                f"RocksDB working directory {self.path!r} is not writable: {exc.strerror or exc}"
            ) from exc

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    # ---- database ----------------------------------------------------------------------------

    def open(self) -> None:
        """Open (or create) the database in ``db/`` with every column family it already has."""
        if self._db is not None:
            return
        names: list[str] = []
        try:
            if os.path.exists(os.path.join(self.db_path, "CURRENT")):
                names = [n for n in Rdict.list_cf(self.db_path) if n != DEFAULT_COLUMN_FAMILY]
            self._db = Rdict(
                self.db_path,
                self._options,
                column_families={n: self._options for n in names},
            )
        except Exception as exc:
            raise StateBackendError(f"cannot open RocksDB at {self.db_path!r}: {exc}") from exc
        self._db.set_write_options(self._write_options)
        for name in names:
            self._attach(name)

    @property
    def db(self) -> Rdict:
        if self._db is None:
            raise StateBackendError(f"the RocksDB instance at {self.path!r} is closed")
        return self._db

    def _attach(self, name: str) -> ColumnFamily:
        db = self.db
        cf = ColumnFamily(name, db.get_column_family(name), db.get_column_family_handle(name))
        self._column_families[name] = cf
        return cf

    def column_family(self, name: str) -> ColumnFamily:
        """The column family of state ``name``, created if missing."""
        cf = self._column_families.get(name)
        if cf is not None:
            return cf
        if name == DEFAULT_COLUMN_FAMILY:
            raise InvalidStateNameError(
                f"state name {name!r} collides with RocksDB's default column family"
            )
        self.db.create_column_family(name, self._options)
        return self._attach(name)

    def column_family_names(self) -> list[str]:
        return list(self._column_families)

    def drop_column_family(self, name: str) -> None:
        """Drop the column family of state ``name`` with its data (a renamed state's old one,
        once copied); nothing if there is none."""
        cf = self._column_families.pop(name, None)
        if cf is None:
            return
        cf.detach()
        self.db.drop_column_family(name)

    def new_batch(self) -> WriteBatch:
        return WriteBatch(raw_mode=True)

    def write(self, batch: WriteBatch) -> None:
        """Apply ``batch`` atomically (all its column families or none)."""
        if len(batch):
            self.db.write(batch)

    @property
    def has_row_cache(self) -> bool:
        """True when RocksDB's row cache is on (range deletions are then refused)."""
        return self._row_cache is not None

    def estimates(self) -> tuple[int, int, int]:
        """RocksDB's own totals over every column family: estimated keys, estimated live data
        bytes (on disk) and memtable bytes; each a property read (no scan)."""
        keys = live = memtables = 0
        for cf in self._column_families.values():
            db = cf.cf
            if db is None:
                continue
            keys += db.property_int_value("rocksdb.estimate-num-keys") or 0
            live += db.property_int_value("rocksdb.estimate-live-data-size") or 0
            memtables += db.property_int_value("rocksdb.size-all-mem-tables") or 0
        return keys, live, memtables

    def cache_usage(self) -> int:
        """Bytes held by the block and row caches."""
        block = int(self._cache.get_usage()) if self._cache is not None else 0
        return block + self.row_cache_usage()

    def row_cache_usage(self) -> int:
        """Bytes held by the row cache (0 without one)."""
        return int(self._row_cache.get_usage()) if self._row_cache is not None else 0

    def delete_range(self, begin: bytes, end: bytes) -> None:
        """Delete ``[begin, end)`` in every column family (one atomic batch, or with a row
        cache, batches of point deletions: only used while restoring a fresh instance)."""
        batch = self.new_batch()
        for cf in self._column_families.values():
            batch = self.delete_range_into(batch, cf, begin, end)
        self.write(batch)

    def delete_range_into(
        self, batch: WriteBatch, cf: ColumnFamily, begin: bytes, end: bytes
    ) -> WriteBatch:
        """Add the deletion of ``[begin, end)`` of ``cf`` to ``batch``; returns the batch to
        go on with (write it when done).

        With a row cache RocksDB refuses range tombstones ("DeleteRange is not compatible with
        row cache": a cached lookup would ignore a newer tombstone covering it), so the
        entries are deleted one by one: ``batch`` is written first (its puts must be visible
        to the scan), then new batches of point deletions follow, written whenever they reach
        ``restore_batch_bytes``."""
        if self._row_cache is None:
            batch.delete_range(begin, end, cf.handle)
            return batch
        self.write(batch)  # rocksdict consumes a written batch: go on with a new one
        batch = self.new_batch()
        handle, limit, size = cf.handle, self.config.restore_batch_bytes, 0
        for key in cf.scan_keys(begin, end):
            batch.delete(key, handle)
            size += len(key)
            if size >= limit:
                self.write(batch)
                batch = self.new_batch()
                size = 0
        return batch

    def drop_range_tombstones(self) -> None:
        """With a row cache, compact away the range tombstones of restored SST files (a base
        snapshot written without a row cache may hold some); refuses to go on if any stay."""
        if self._row_cache is None:
            return
        for cf in self._column_families.values():
            if _range_deletions(cf) == 0:
                continue
            _compact_fully(cf)
            left = _range_deletions(cf)
            if left:
                raise StateBackendError(
                    f"state {cf.name!r}: the restored RocksDB files keep {left} range "
                    "deletion(s) after a full compaction, which RocksDB's row cache cannot "
                    "honour; restore with row_cache_size=0"
                )

    def compact(self) -> None:
        """A full manual compaction of every column family: each one's files rewritten into
        its bottom level (what RocksDB's background compactions do gradually)."""
        for cf in self._column_families.values():
            _compact_fully(cf)

    def create_checkpoint(self, target: str) -> None:
        """A native RocksDB checkpoint in ``target`` (memtables flushed, SST files hard-linked)."""
        Checkpoint(self.db).create_checkpoint(target)

    def flush(self) -> None:
        self.db.flush()

    def close_db(self) -> None:
        """Close and delete the database but keep the directory locked (restore replaces
        ``db/``)."""
        self.close_db_keep_files()
        shutil.rmtree(self.db_path, ignore_errors=True)

    def close(self) -> None:
        """Close the database and release the directory lock. Idempotent."""
        try:
            self.close_db_keep_files()
        finally:
            self._unlock()

    def close_db_keep_files(self) -> None:
        for cf in self._column_families.values():
            cf.detach()
        self._column_families.clear()
        if self._db is not None:
            db, self._db = self._db, None
            try:
                db.close()
            finally:
                del db


def _range_deletions(cf: ColumnFamily) -> int:
    """Range tombstones in the SST files of ``cf`` (from RocksDB's aggregated properties)."""
    text = cf._db().property_value("rocksdb.aggregated-table-properties") or ""
    for part in text.split(";"):
        name, _, value = part.partition("=")
        if name.strip() == "# range deletions":
            return int(value)
    return 0


def open_read_only(
    path: str, config: RocksDBConfig | None = None
) -> tuple[Rdict, dict[str, Rdict]]:
    """Open the database (or native checkpoint) at ``path`` read-only, with its column families.

    Returns the database and ``name -> column family``; close the database when done (and drop
    the column families: rocksdict keeps the database open while they are referenced).
    """
    opts = (config or RocksDBConfig()).db_options(None)
    try:
        names = [n for n in Rdict.list_cf(path) if n != DEFAULT_COLUMN_FAMILY]
        db = Rdict(
            path,
            opts,
            column_families={n: opts for n in names},
            access_type=AccessType.read_only(False),
        )
    except Exception as exc:  # rocksdict raises Exception with RocksDB's status
        raise CorruptCheckpointError(
            f"the RocksDB snapshot at {path!r} does not open: {exc}"
        ) from None
    try:
        return db, {n: db.get_column_family(n) for n in names}
    except BaseException:
        db.close()
        raise
