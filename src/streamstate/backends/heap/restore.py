"""Restore of the heap backend from snapshot files (SPEC §7).

:class:`HeapRestoreOperation` applies the files handed over by checkpoint restore, in order (for
each old subtask: its full snapshot, then its deltas), to a fresh heap backend:

* states whose serializers are built-in (:func:`~streamstate.format.restore.is_builtin_snapshot`)
  are decoded at once into state tables, with serializers rebuilt from the checkpoint;
* timers go into the backend's timer queues (``backends/timer_queues.py``);
* every other state (records, TTL-wrapped values, pickle) stays encoded in
  :class:`RestoredRawStates` until the program registers it: it is then decoded with the
  program's serializers (after the compatibility check of
  :meth:`~streamstate.backends.base.KeyedStateBackend._check_restored`, which is where pickle
  is refused unless declared). Until then it is written into every checkpoint unchanged.

Nothing is installed unless every block of every file was read and verified: on any error the
backend is left as it was before the restore.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from streamstate.backends.base import check_key_type
from streamstate.backends.timer_queues import TimerQueues, TimerRestore
from streamstate.errors import (
    CorruptCheckpointError,
    MaxParallelismMismatchError,
    StateAccessError,
    StateMigrationException,
)
from streamstate.format.codec import StateCodec
from streamstate.format.entries import COUNTED_BY_ELEMENT, count_entries
from streamstate.format.meta import StateMetaInfo, StateMetaSnapshot
from streamstate.format.restore import (
    EncodedKeyGroup,
    KeyedStateRestore,
    RestoredSerializer,
    expand_namespaces,
    is_builtin_snapshot,
)
from streamstate.format.snapshot import EncodedEntries, SnapshotSource
from streamstate.keygroups import KeyGroupRange
from streamstate.serializers import serializer_from_snapshot
from streamstate.serializers.base import TypeSerializer

if TYPE_CHECKING:
    from streamstate.backends.heap.state_table import StateTable

__all__ = ["HeapRestoreOperation", "HeapRestoreTarget", "RestoredRawStates"]


class HeapRestoreTarget(Protocol):
    """What :class:`HeapRestoreOperation` needs of the backend it restores
    (``HeapKeyedStateBackend``): given to its constructor, no private field is written."""

    key_serializer: TypeSerializer[Any]
    max_parallelism: int
    key_group_range: KeyGroupRange

    def registered_state_names(self) -> list[str]: ...

    def has_state_table(self, name: str) -> bool: ...

    def register_state_table(
        self,
        name: str,
        kind: str,
        namespace_serializer: TypeSerializer[Any],
        state_serializer: TypeSerializer[Any],
        ttl: dict[str, Any] | None = None,
    ) -> StateTable: ...

    def drop_state_table(self, name: str) -> None: ...

    def add_restored_meta(self, meta: StateMetaSnapshot) -> bool: ...

    def discard_restored_meta(self, name: str) -> None: ...

    def install_pending_restore(self, pending: RestoredRawStates) -> None: ...

    def reset_change_tracking(self) -> None: ...


class _PendingState:
    """One restored state kept encoded until it is registered."""

    __slots__ = ("_entries", "blocks", "meta")

    def __init__(self, meta: StateMetaSnapshot, num_key_groups: int) -> None:
        self.meta = meta
        self.blocks: list[EncodedEntries | None] = [None] * num_key_groups
        self._entries: int | None = None

    def entry_count(self) -> int:
        """The state's entries (``streamstate.format.entries``): a list's elements and a map's
        mappings are counted in the stored collections, read once (encoded state never
        changes); other kinds count their (key, namespace) entries."""
        if self._entries is None:
            blocks = [b for b in self.blocks if b is not None]
            if self.meta.kind in COUNTED_BY_ELEMENT:
                self._entries = sum(
                    count_entries(self.meta.kind, msgspec.msgpack.decode(b.data)[2]) for b in blocks
                )
            else:
                self._entries = sum(b.count for b in blocks)
        return self._entries

    def snapshot_meta(self) -> StateMetaInfo:
        """The live form, with serializers that write the encoded entries as they are."""
        m = self.meta
        return StateMetaInfo(
            m.name,
            m.kind,
            RestoredSerializer(m.namespace_serializer),
            RestoredSerializer(m.state_serializer),
            m.ttl,
        )


class _PendingSource(SnapshotSource):
    __slots__ = ("_blocks", "meta")

    def __init__(self, meta: StateMetaInfo, blocks: list[EncodedEntries | None]) -> None:
        self.meta = meta
        self._blocks = blocks

    def entries(self, key_group_index: int) -> EncodedEntries | None:
        return self._blocks[key_group_index]


class RestoredRawStates:
    """Restored states not decoded yet; written into every snapshot of the backend, so that
    they reach every later checkpoint unchanged until the program registers them."""

    def __init__(self, key_group_start: int, num_key_groups: int) -> None:
        self._start = key_group_start
        self._n = num_key_groups
        self.states: dict[str, _PendingState] = {}

    def __len__(self) -> int:
        return len(self.states)

    def snapshot_sources(self) -> list[SnapshotSource]:
        return [_PendingSource(p.snapshot_meta(), list(p.blocks)) for p in self.states.values()]

    def delta_snapshot_sources(self) -> list[SnapshotSource]:
        return []  # encoded state never changes

    def reset_changes(self) -> None:
        return None  # encoded state never changes

    def num_entries(self, name: str | None = None) -> int:
        """Entries of one pending state, or of all of them, counted as
        ``streamstate.format.entries`` counts them."""
        states = self.states.values() if name is None else [self.states.get(name)]
        return sum(p.entry_count() for p in states if p is not None)

    def rename(self, old: str, new: str) -> None:
        """Pending state ``old`` is state ``new`` from now on."""
        pending = self.states.pop(old, None)
        if pending is not None:
            pending.meta = msgspec.structs.replace(pending.meta, name=new)
            self.states[new] = pending

    def fill(
        self,
        table: StateTable,
        key_serializer: TypeSerializer[Any],
        reader: TypeSerializer[Any] | None = None,
    ) -> bool:
        """Decode the pending entries of ``table``'s state into it; False if there are none.
        ``reader`` reads the stored values (a migrating serializer), by default the table's."""
        pending = self.states.pop(table.meta.name, None)
        if pending is None:
            return False
        codec = StateCodec(
            key_serializer, table.meta.namespace_serializer, reader or table.meta.state_serializer
        )
        maps = table.key_group_maps()
        for index, block in enumerate(pending.blocks):
            if block is not None:
                kg = self._start + index
                _put_section(maps[index], codec, block.data, None, table.meta.name, kg)
        table.recount()  # the entries went into the maps directly
        return True


#: what decoding (and migrating) entries that do not fit the declared types raises
_UNREADABLE = (
    msgspec.ValidationError,
    msgspec.DecodeError,
    ValueError,
    TypeError,
    KeyError,
    IndexError,
)


def _put_section(
    m: Any,
    codec: StateCodec,
    entries: bytes,
    removed: bytes | None,
    state_name: str,
    key_group: int,
    count: int | None = None,
) -> None:
    try:
        keys, nss, states = codec.decode(entries)
        if count is not None and count != len(keys):
            raise ValueError(f"the block says {count} entries but holds {len(keys)}")
        if len(nss) != len(keys) and len(nss) != 1:
            raise ValueError(f"namespace column has {len(nss)} values for {len(keys)} keys")
        gone: tuple[list[Any], list[Any]] | None = None
        if removed is not None:
            gone_keys, gone_nss = codec.decode_removed(removed)
            gone = (gone_keys, expand_namespaces(gone_nss, len(gone_keys)))
    except _UNREADABLE as exc:
        raise StateMigrationException(
            f"state {state_name!r}, key group {key_group}: the checkpointed entries cannot be "
            f"read with the declared serializers ({exc})"
        ) from None
    if removed is None and len(m):
        drop = getattr(m, "untracked_remove", m.remove)
        for k, ns, _ in list(m):
            drop(k, ns)
    if keys:
        m.put_all(keys, nss, states)  # change tracking is reset once the restore is done
    if gone is not None:
        remove = getattr(m, "untracked_remove", m.remove)
        for k, ns in zip(*gone, strict=True):
            remove(k, ns)


class HeapRestoreOperation:
    """Applies snapshot files to a fresh :class:`HeapKeyedStateBackend`, all or nothing."""

    def __init__(self, backend: HeapRestoreTarget, timer_queues: TimerQueues) -> None:
        self.backend = backend
        self.timer_queues = timer_queues

    def run(self, files: Iterable[KeyedStateRestore]) -> None:
        backend = self.backend
        if backend.registered_state_names():
            raise StateAccessError(
                "keyed state must be restored before any state is registered; registered: "
                f"{backend.registered_state_names()}"
            )
        created_tables: list[str] = []
        added_meta: list[str] = []
        kg_start = backend.key_group_range.start
        n = len(backend.key_group_range)
        pending = RestoredRawStates(kg_start, n)
        raw: dict[str, list[EncodedKeyGroup | None]] = {}
        timers = TimerRestore(self.timer_queues, backend.key_serializer)
        plans: dict[str, tuple[str, Any]] = {}
        gc_was_enabled = gc.isenabled()
        gc.disable()  # millions of new objects: generation scans would dominate
        try:
            for f in files:
                self._check_file(f)
                for block in f.blocks():
                    name = block.state.name
                    plan = plans.get(name)
                    if plan is None:
                        plan = plans[name] = self._plan(
                            block.state, created_tables, added_meta, pending
                        )
                    how, target = plan
                    index = block.key_group - kg_start
                    if how == "eager":
                        table, codec = target
                        m = table.key_group_maps()[index]
                        try:
                            _put_section(
                                m,
                                codec,
                                block.entries,
                                block.removed,
                                name,
                                block.key_group,
                                block.count,
                            )
                        except StateMigrationException as exc:
                            raise CorruptCheckpointError(
                                f"{f.path}: state {name!r}, key group {block.key_group}: {exc}"
                            ) from None
                    elif how == "timer":
                        timers.add_block(block, str(f.path))
                    else:
                        slots = raw.setdefault(name, [None] * n)
                        slot = slots[index]
                        if slot is None:
                            slot = slots[index] = EncodedKeyGroup()
                        try:
                            slot.apply(block.count, block.entries, block.removed)
                        except (msgspec.DecodeError, ValueError) as exc:
                            raise CorruptCheckpointError(
                                f"{f.path}: state {name!r}, key group {block.key_group}: {exc}"
                            ) from None
        except BaseException:
            timers.abort()
            for name in created_tables:
                backend.drop_state_table(name)
            for name in added_meta:
                backend.discard_restored_meta(name)
            raise
        finally:
            if gc_was_enabled:
                gc.enable()
        # everything was read: install
        for how, target in plans.values():
            if how == "eager":
                target[0].recount()  # the entries went into the maps directly
        for name, slots in raw.items():
            state = pending.states[name]
            for i, slot in enumerate(slots):
                if slot is not None:
                    state.blocks[i] = slot.result()
        timers.install()
        if len(pending):
            backend.install_pending_restore(pending)
        backend.reset_change_tracking()

    # ---- helpers -------------------------------------------------------------------------------

    def _check_file(self, f: KeyedStateRestore) -> None:
        backend = self.backend
        if f.max_parallelism != backend.max_parallelism:
            raise MaxParallelismMismatchError(
                f"{f.path} was written with max_parallelism={f.max_parallelism} but this backend "
                f"has max_parallelism={backend.max_parallelism}; the number of key groups is "
                "fixed for the life of a job"
            )
        check_key_type(f.key_serializer, backend.key_serializer, str(f.path))

    def _plan(
        self,
        meta: StateMetaSnapshot,
        created_tables: list[str],
        added_meta: list[str],
        pending: RestoredRawStates,
    ) -> tuple[str, Any]:
        backend = self.backend
        if meta.is_timer:
            return "timer", None
        name = meta.name
        if backend.add_restored_meta(meta):
            added_meta.append(name)
        ns_snap, state_snap = meta.namespace_serializer, meta.state_serializer
        if is_builtin_snapshot(ns_snap) and is_builtin_snapshot(state_snap):
            ns_ser = serializer_from_snapshot(ns_snap)
            state_ser = serializer_from_snapshot(state_snap)
            if not backend.has_state_table(name):
                created_tables.append(name)
            table = backend.register_state_table(name, meta.kind, ns_ser, state_ser, meta.ttl)
            return "eager", (table, StateCodec(backend.key_serializer, ns_ser, state_ser))
        pending.states[name] = _PendingState(meta, len(backend.key_group_range))
        return "raw", None
