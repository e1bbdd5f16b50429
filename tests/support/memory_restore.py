"""A keyed snapshot file held in memory, as a restoring backend reads it (shared by the tests
of both backends' restores and of the timer queues; ``tests/`` is on the path as for
``s3_server``)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

from streamstate.format.keyed_file import KeyedSnapshotReader, write_keyed_snapshot
from streamstate.format.restore import KeyedStateRestore, RestoredBlock
from streamstate.keygroups import KeyGroupRange


class MemoryRestore(KeyedStateRestore):
    """A keyed snapshot file held in memory, as a restoring backend of ``key_groups`` reads it."""

    def __init__(self, data: bytes, key_groups: KeyGroupRange) -> None:
        self._data = data
        self._key_groups = key_groups
        self.path = "memory"
        reader = self._reader()
        self.kind = reader.kind
        self.key_serializer = reader.key_serializer
        self.max_parallelism = reader.max_parallelism
        self.states = reader.states

    def _reader(self) -> KeyedSnapshotReader:
        return KeyedSnapshotReader(
            io.BytesIO(self._data), "memory", len(self._data), self._key_groups
        )

    @staticmethod
    def write(snapshot: Any) -> bytes:
        """The snapshot file of ``snapshot`` (which is released)."""
        out = io.BytesIO()
        write_keyed_snapshot(snapshot, out, path="memory")
        return out.getvalue()

    def blocks(self) -> Iterator[RestoredBlock]:
        reader = self._reader()
        for kg, records in reader.read(self._key_groups):
            for r in records:
                yield RestoredBlock(kg, reader.states[r.state_id], r.count, r.entries, r.removed)
