"""What a keyed state backend holds and what changed in it: the figures a subtask reports with
each checkpoint (Spark's ``StateOperatorProgress`` counterpart: ``numRowsTotal``,
``numRowsUpdated``, ``numRowsRemoved``, ``memoryUsedBytes``).

Taking them must cost nothing per record: a backend counts what it already walks at checkpoint
time (the heap backend's captured changes, the RocksDB write-back cache's flushes) and reads
totals it keeps anyway (table sizes, RocksDB's own estimates).
"""

from __future__ import annotations

import msgspec

__all__ = ["StateFigures"]


class StateFigures(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One backend's state at a checkpoint.

    Attributes:
        rows: the entries of every state, as :mod:`streamstate.format.entries` counts them
            (a value per key and namespace, a list's elements, a map's mappings; timers apart).
        rows_estimated: ``rows`` is an estimate, not an exact count (no backend estimates it
            now; kept for the acknowledgements of older hosts).
        rows_updated: entries written since the previous figures (None: not tracked).
        rows_removed: entries removed since the previous figures (None: not tracked).
        state_bytes: bytes of state the backend holds (RocksDB: live data on disk plus its
            memtables; None for the heap backend, whose objects have no cheap size).
        memory_bytes: memory the backend itself holds outside Python objects (RocksDB:
            memtables, block and row caches); None when all of it is Python heap.
    """

    rows: int
    rows_estimated: bool = False
    rows_updated: int | None = None
    rows_removed: int | None = None
    state_bytes: int | None = None
    memory_bytes: int | None = None
