"""Restoring the RocksDB backend from the checkpoint storage's keyed snapshot files (SPEC §6.2).

A restore hands every backend the same thing: one
``streamstate.format.restore.KeyedStateRestore`` per file, in the order to apply them (for each
old subtask: its full snapshot, then its deltas), each yielding verified, still-encoded blocks of
the backend's key groups. This module turns those blocks into RocksDB entries:

* states whose serializers are built-in are decoded at once and written in WriteBatches (a
  full block replaces the key group of its state, a delta block upserts and removes entries; an
  upserted map replaces every mapping of its ``(key, namespace)``);
* states with other serializers (records, TTL-wrapped values, pickle) are decoded when the
  program registers them, with the program's serializers (migrated if its declaration changed),
  by reading their blocks again from the files (the files stay in checkpoint storage: nothing
  is held in memory). A state still unregistered when the backend is snapshotted (or scanned)
  is written first as the checkpoint stored it, from the files' bytes (``stored_form.py``), so
  that it reaches every later checkpoint;
* timers go into the backend's timer queues (``backends/timer_queues.py``).

The entries are decoded with the canonical format's codec (``streamstate.format``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from streamstate.backends.rocksdb.keys import KeyLayout, key_group_bound, prefix_successor
from streamstate.backends.rocksdb.parts import RocksDBParts
from streamstate.backends.rocksdb.restore import (
    check_compatible,
    check_fresh,
    remember_states,
)
from streamstate.backends.rocksdb.stored_form import StoredForm
from streamstate.backends.timer_queues import TimerRestore
from streamstate.errors import CheckpointError, CorruptCheckpointError, StateMigrationException
from streamstate.format.codec import StateCodec
from streamstate.format.meta import StateMetaSnapshot
from streamstate.format.restore import KeyedStateRestore, expand_namespaces, is_builtin_snapshot
from streamstate.serializers import serializer_from_snapshot
from streamstate.serializers.base import TypeSerializer

__all__ = ["BlockWriter", "materialize_deferred_state", "restore_deferred_state", "restore_files"]


class BlockWriter:
    """Writes decoded blocks of one state into its column family."""

    def __init__(
        self,
        backend: RocksDBParts,
        name: str,
        kind: str,
        namespace_serializer: TypeSerializer[Any],
        state_serializer: TypeSerializer[Any],
        *,
        reader: TypeSerializer[Any] | None = None,
    ) -> None:
        self.name = name
        self.instance = backend.instance
        self.cf = backend.instance.column_family(name)
        self.handle = self.cf.handle
        self.is_map = kind == "map"
        self.layout = KeyLayout(
            backend.max_parallelism,
            backend.key_serializer,
            namespace_serializer,
            has_user_key=self.is_map,
        )
        self.serializer = state_serializer
        self.codec = StateCodec(
            backend.key_serializer, namespace_serializer, reader or state_serializer
        )
        self.kg_bytes = self.layout.kg_bytes
        #: key groups already written (a later full block of one replaces it)
        self.written: set[int] = set()

    def apply(self, batch: Any, block: Any, where: str) -> tuple[int, Any]:
        """Write one block into ``batch``; returns its entries and the batch to go on with
        (with a row cache, deleting a key range writes ``batch`` and starts a new one)."""
        kg = block.key_group
        try:
            keys, nss, states = self.codec.decode(block.entries)
            namespaces = expand_namespaces(nss, len(keys))
            gone: list[tuple[Any, Any]] = []
            if block.removed is not None:
                gone_keys, gone_nss = self.codec.decode_removed(block.removed)
                gone = list(
                    zip(gone_keys, expand_namespaces(gone_nss, len(gone_keys)), strict=True)
                )
        except (msgspec.ValidationError, msgspec.DecodeError, ValueError, TypeError) as exc:
            raise CorruptCheckpointError(
                f"{where}: state {self.name!r}, key group {kg}: the entries cannot be read with "
                f"the declared serializers ({exc})"
            ) from None
        handle = self.handle
        if block.removed is None and kg in self.written:  # a full block replaces the group
            batch = self.instance.delete_range_into(
                batch,
                self.cf,
                key_group_bound(kg, self.kg_bytes),
                key_group_bound(kg + 1, self.kg_bytes),
            )
        self.written.add(kg)
        composite = self.layout.composite
        for key, ns in gone:
            batch = self._delete_entry(batch, composite(kg, key, ns))
        if not self.is_map:
            serialize = self.serializer.serialize
            for key, ns, state in zip(keys, namespaces, states, strict=True):
                batch.put(composite(kg, key, ns), serialize(state), handle)
            return len(keys), batch
        sk = self.serializer.key.serialize  # type: ignore[attr-defined]
        sv = self.serializer.value.serialize  # type: ignore[attr-defined]
        for key, ns, mapping in zip(keys, namespaces, states, strict=True):
            prefix = composite(kg, key, ns)
            if block.removed is not None:
                batch = self._delete_entry(batch, prefix)  # an upserted map replaces the old one
            for uk, v in mapping.items():
                batch.put(prefix + sk(uk), sv(v), handle)
        return len(keys), batch

    def _delete_entry(self, batch: Any, ck: bytes) -> Any:
        if self.is_map:
            end = prefix_successor(ck)
            if end is not None:
                batch = self.instance.delete_range_into(batch, self.cf, ck, end)
        else:
            batch.delete(ck, self.handle)
        return batch


def _builtin(meta: StateMetaSnapshot) -> bool:
    return is_builtin_snapshot(meta.namespace_serializer) and is_builtin_snapshot(
        meta.state_serializer
    )


def restore_files(backend: RocksDBParts, files: Sequence[KeyedStateRestore]) -> int:
    """Restore a fresh ``backend`` from ``KeyedStateRestore`` files; returns entries written."""
    check_fresh(backend)
    instance = backend.instance
    writers: dict[str, BlockWriter | None] = {}
    timers = TimerRestore(backend.timer_queues, backend.key_serializer)
    written = 0
    batch = instance.new_batch()
    for f in files:
        check_compatible(backend, f.max_parallelism, f.key_serializer, str(f.path))
        for block in f.blocks():
            meta = block.state
            name = meta.name
            if meta.is_timer:
                timers.add_block(block, str(f.path))
                continue
            if name not in writers:
                writers[name] = None
                if _builtin(meta):
                    writers[name] = BlockWriter(
                        backend,
                        name,
                        meta.kind,
                        serializer_from_snapshot(meta.namespace_serializer),
                        serializer_from_snapshot(meta.state_serializer),
                    )
            writer = writers[name]
            if writer is None:
                backend.restored.defer(name, f)
                continue
            count, batch = writer.apply(batch, block, str(f.path))
            written += count
            if batch.size_in_bytes() >= instance.config.restore_batch_bytes:
                instance.write(batch)
                batch = instance.new_batch()
    instance.write(batch)
    states: dict[str, StateMetaSnapshot] = {}
    for f in files:
        for meta in f.states:
            if not meta.is_timer:
                states.setdefault(meta.name, meta)
    remember_states(backend, states.values())
    timers.install()
    return written


def restore_deferred_state(
    backend: RocksDBParts,
    name: str,
    kind: str,
    namespace_serializer: TypeSerializer[Any],
    state_serializer: TypeSerializer[Any],
    reader: TypeSerializer[Any] | None = None,
) -> int:
    """Decode a deferred state's blocks with the program's serializers (on registration);
    ``reader`` reads the stored values (a migrating serializer), by default
    ``state_serializer``."""
    files, source = backend.restored.take_deferred(name)
    writer = BlockWriter(backend, name, kind, namespace_serializer, state_serializer, reader=reader)
    instance = backend.instance
    batch = instance.new_batch()
    written = 0
    try:
        for f in files:
            for block in f.blocks():
                if block.state.name == source:
                    count, batch = writer.apply(batch, block, str(f.path))
                    written += count
    except CorruptCheckpointError as exc:
        raise StateMigrationException(str(exc)) from None
    instance.write(batch)
    return written


def materialize_deferred_state(backend: RocksDBParts, name: str) -> int:
    """Write a deferred state that the program has not registered into its column family as
    the checkpoint's serializers stored it (``stored_form.py``: no value is decoded, no class
    imported); returns the entries written. It is then a restored state like one restored
    natively: registered later, it is checked and migrated from its column family."""
    meta = backend.restored_state_meta(name)
    assert meta is not None, name
    where = f"state {name!r}, restored from snapshot files and not registered"
    try:
        namespace_serializer = serializer_from_snapshot(meta.namespace_serializer)
    except Exception as exc:
        raise CheckpointError(
            f"{where}: its namespaces cannot be written without the program's serializer "
            f"({exc}); register the state before the next checkpoint"
        ) from exc
    form = StoredForm(meta.state_serializer, meta.kind, where)
    return restore_deferred_state(backend, name, meta.kind, namespace_serializer, form, reader=form)
