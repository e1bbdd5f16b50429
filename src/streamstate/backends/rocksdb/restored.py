"""What a RocksDB backend restored but cannot use yet (SPEC §7, §10).

A restore writes every state whose serializers are built in straight into RocksDB; what waits is
kept here, owned by the backend and handed to the restore modules (``restore.py``,
``restore_files.py``) and the snapshot (``snapshot.py``) through its public methods:

* the meta data of restored states not registered yet (their data is in RocksDB already);
* states restored from snapshot files whose serializers are not built in: their files, decoded
  with the program's serializers when it registers the state.

Timers are not kept here: a restore puts them into the backend's timer queues at once
(``backends/timer_queues.py``).
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from streamstate.errors import CorruptCheckpointError
from streamstate.format.meta import StateMetaSnapshot
from streamstate.format.restore import KeyedStateRestore

__all__ = ["RestoredStates"]


class RestoredStates:
    """Restored data of one RocksDB backend waiting for its state."""

    __slots__ = ("_deferred_files", "_sources", "_states")

    def __init__(self) -> None:
        self._states: dict[str, StateMetaSnapshot] = {}
        self._deferred_files: dict[str, list[KeyedStateRestore]] = {}
        #: a renamed state's name in the files it is deferred to
        self._sources: dict[str, str] = {}

    # ---- states ------------------------------------------------------------------------------

    def remember(self, states: Iterable[StateMetaSnapshot]) -> None:
        """The state meta data of a restore; the first of a name wins, a name seen with two
        kinds is corrupt."""
        for meta in states:
            name = meta.name
            known = self._states.get(name)
            if known is not None and known.kind != meta.kind:
                raise CorruptCheckpointError(
                    f"state {name!r} appears as {known.kind} and {meta.kind} state in the "
                    "snapshots being restored"
                )
            self._states.setdefault(name, meta)

    def state(self, name: str) -> StateMetaSnapshot | None:
        return self._states.get(name)

    def take_state(self, name: str) -> StateMetaSnapshot | None:
        """The description of restored state ``name``, which is being registered now."""
        return self._states.pop(name, None)

    def state_names(self) -> list[str]:
        return list(self._states)

    def state_metas(self) -> list[StateMetaSnapshot]:
        return list(self._states.values())

    def rename(self, old: str, new: str) -> None:
        """Restored state ``old`` is state ``new`` from now on (its files still name it
        ``old``)."""
        meta = self._states.pop(old, None)
        if meta is not None:
            self._states[new] = msgspec.structs.replace(meta, name=new)
        files = self._deferred_files.pop(old, None)
        if files is not None:
            self._deferred_files[new] = files
            self._sources[new] = self._sources.pop(old, old)

    # ---- deferred states ---------------------------------------------------------------------

    def defer(self, name: str, f: KeyedStateRestore) -> None:
        """Decode state ``name`` of file ``f`` when the program registers it."""
        deferred = self._deferred_files.setdefault(name, [])
        if f not in deferred:
            deferred.append(f)

    def is_deferred(self, name: str) -> bool:
        return name in self._deferred_files

    def take_deferred(self, name: str) -> tuple[list[KeyedStateRestore], str]:
        """The files state ``name`` is deferred to, and its name in them."""
        return self._deferred_files.pop(name, []), self._sources.pop(name, name)

    def deferred_names(self) -> list[str]:
        return sorted(self._deferred_files)
