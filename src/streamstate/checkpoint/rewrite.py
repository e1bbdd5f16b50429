"""Savepoint rewrites: a new savepoint made from a checkpoint or savepoint (SPEC §14.3; Flink's
State Processor API, ``SavepointWriter.fromExistingSavepoint``).

:func:`rewrite_savepoint` writes a self-contained canonical savepoint in which, for one
operator, chosen keyed states are replaced by new entries (:class:`ReplacedState`), renamed or
dropped, and optionally every keyed state and timer is re-keyed by one mapping (:class:`Rekey`,
a key type change). Everything else is carried over: the operator's other keyed states and
timers with their entries byte for byte (keys, namespaces and values are never decoded unless
re-keyed, and then only the keys), every operator's operator state file as it is, the other
operators' keyed state, and the checkpoint's properties (the watermark). The savepoint keeps
the source's subtask layout (key-group ranges); a job restores it at any parallelism, on either
backend.

It is the remedy every refused migration names: read the old state, convert it, and write it
back with the new declaration while everything else stays as it was. No Spark here:
``streamstate.spark.rewrite_savepoint`` turns DataFrames into :class:`ReplacedState` entries.

How it runs (bounded memory): every old subtask's keyed files (a full snapshot and its deltas,
or a native snapshot's canonical view) are merged key group by key group without decoding, and
what each new file needs (a carried section, re-keyed or replaced entries) is spooled to a local
temporary file per new subtask; each new file is then written from its spool. Memory holds one
subtask's state at a time; the local disk holds one copy of the operator's state.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import struct
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import IO, Any

import msgspec

from streamstate.checkpoint.coordinator import CheckpointCoordinator
from streamstate.checkpoint.metadata import OperatorMetadata, StateFileHandle, SubtaskStateHandle
from streamstate.checkpoint.restore import keyed_file_restore, operator_metadata
from streamstate.checkpoint.storage import (
    CompletedCheckpoint,
    FileSystemCheckpointStorage,
    open_location,
)
from streamstate.errors import CheckpointError
from streamstate.format.codec import StateCodec
from streamstate.format.handles import FULL_FILE
from streamstate.format.keyed_file import KeyedSnapshotWriter
from streamstate.format.meta import TIMER_STATE_KIND, StateMetaInfo, StateMetaSnapshot
from streamstate.format.restore import EncodedKeyGroup, RestoredSerializer, expand_namespaces
from streamstate.format.snapshot import EncodedEntries
from streamstate.keygroups import (
    PLACEMENT_PROPERTY,
    PLACEMENT_VERSION,
    KeyGroupRange,
    assign_to_key_group,
    placement_version,
)
from streamstate.serializers import serializer_from_snapshot
from streamstate.serializers.base import TypeSerializer

__all__ = ["Rekey", "ReplacedState", "regroup_savepoint", "rewrite_savepoint"]

_ENCODER = msgspec.msgpack.Encoder()
_RAW_SECTION = msgspec.msgpack.Decoder(
    tuple[list[msgspec.Raw], list[msgspec.Raw], list[msgspec.Raw]]
)
_RECORD = msgspec.msgpack.Decoder(tuple[str, int, int, msgspec.Raw])
_U32 = struct.Struct(">I")
#: replaced entries encoded per chunk (bounds what one encode holds)
_CHUNK = 16_384
#: the checkpoint's properties a rewritten savepoint keeps: where event and processing time
#: stood (a run's own properties, its staged outputs, batch and lineage, are not the new job's)
_CARRIED_PROPERTIES = frozenset(
    {"watermark", "max_timestamp", "processing_time", "event_timer", "processing_timer"}
)


@dataclasses.dataclass(frozen=True)
class ReplacedState:
    """The new content of one keyed state.

    ``meta``: its name (a new name renames it), kind, namespace serializer, the serializer of
    what it stores (with time-to-live, ``(last access ms, value)`` pairs: see
    ``streamstate.backends.decorators.ttl``) and TTL configuration. ``entries``: ``(key,
    namespace, stored value)``, keys of the savepoint's key type (the new one when re-keying).
    """

    meta: StateMetaInfo
    entries: Iterable[tuple[Any, Any, Any]]


@dataclasses.dataclass(frozen=True)
class Rekey:
    """Every keyed state and timer of the operator moves to ``mapping(old key)``, a key of
    ``key_serializer``'s type (the key type the new job declares)."""

    key_serializer: TypeSerializer[Any]
    mapping: Callable[[Any], Any]


def rewrite_savepoint(
    source: CompletedCheckpoint | str,
    target: str,
    *,
    operator: str = "keyed-process",
    replace: Mapping[str, ReplacedState] | None = None,
    rename: Mapping[str, str] | None = None,
    drop: Iterable[str] = (),
    rekey: Rekey | None = None,
    storage_options: dict[str, Any] | None = None,
    compression: str = "lz4",
) -> CompletedCheckpoint:
    """Write a new savepoint at ``target`` from ``source`` (see the module docstring).

    Parameters:
        source: a completed checkpoint or savepoint, or the path/URL of one (a job's
            checkpoint directory: its latest complete checkpoint).
        target: the new savepoint's directory (must not hold a savepoint yet).
        operator: the operator whose keyed state changes.
        replace: checkpointed state name → its new content (a name the checkpoint does not hold
            adds a state).
        rename: checkpointed state name → new name.
        drop: checkpointed state names to leave out (timer pseudo-states
            ``_timers.<service>.<domain>`` too).
        rekey: map every key of the operator (states and timers) to a key of a new type.
        storage_options: fsspec options of both locations.
        compression: block codec of the new keyed files.

    Returns the new savepoint. Raises :class:`~streamstate.errors.CheckpointError` naming a
    state that is not there, a name used twice, or two keys the mapping sends to one.
    """
    cp = _completed(source, storage_options)
    op = operator_metadata(cp, operator)
    storage, directory = _target(target, storage_options)
    plan = _Plan.of(cp, op, dict(replace or {}), dict(rename or {}), set(drop), rekey)
    operators: dict[str, OperatorMetadata] = {}
    handles: list[SubtaskStateHandle] = []
    for name, meta in cp.metadata.operators.items():
        writer = _OperatorRewrite(
            cp, meta, plan if name == operator else _Plan.carry(cp, meta), storage, directory
        )
        written = writer.run(compression)
        handles.extend(written)
        operators[name] = meta
    coordinator = CheckpointCoordinator(storage)
    try:
        properties = {k: v for k, v in cp.metadata.properties.items() if k in _CARRIED_PROPERTIES}
        properties["rewritten_from"] = cp.url
        # re-keyed entries are placed anew; carried ones keep the source's key groups (another
        # operator's keyed state too)
        others_keyed = any(
            s.keyed for name, m in operators.items() if name != operator for s in m.subtasks
        )
        properties[PLACEMENT_PROPERTY] = (
            PLACEMENT_VERSION
            if rekey is not None and not others_keyed
            else placement_version(cp.metadata.properties)
        )
        properties["created"] = time.time_ns() // 1_000_000
        return coordinator.commit(
            cp.checkpoint_id,
            handles,
            expected={name: meta.parallelism for name, meta in operators.items()},
            properties=properties,
            savepoint_directory=directory,
        )
    finally:
        coordinator.close()


def regroup_savepoint(
    source: CompletedCheckpoint | str,
    target: str,
    *,
    operator: str = "keyed-process",
    storage_options: dict[str, Any] | None = None,
) -> CompletedCheckpoint:
    """Write a savepoint at ``target`` that holds ``source``'s state with every key of
    ``operator`` (its states and timers) in the key group ``assign_to_key_group`` gives it: key
    group placement ``streamstate.keygroups.PLACEMENT_VERSION``.

    The remedy for a checkpoint of placement 1, which a Spark job with a key column of type INT,
    SMALLINT or TINYINT wrote with every key in one key group (a restore of it is refused:
    :class:`~streamstate.errors.KeyGroupPlacementError`). Keys, namespaces and values keep their
    bytes; only the key groups change. Any other checkpoint comes out with the same content.
    """
    cp = _completed(source, storage_options)
    op = operator_metadata(cp, operator)
    # the metadata names the key type; only a checkpoint older than that reads a file's header
    key_snapshot = op.key_serializer or _checkpointed_states(cp, op)[1]
    same_keys = Rekey(serializer_from_snapshot(key_snapshot), lambda key: key)
    return rewrite_savepoint(
        cp, target, operator=operator, rekey=same_keys, storage_options=storage_options
    )


def _completed(source: CompletedCheckpoint | str, options: dict[str, Any] | None) -> Any:
    if isinstance(source, CompletedCheckpoint):
        return source
    path = source if "://" in source else os.path.abspath(source)
    storage, directory = open_location(path, options)
    return storage.load(directory)


def _target(target: str, options: dict[str, Any] | None) -> tuple[Any, str]:
    path = target if "://" in target else os.path.abspath(target)
    parent, name = posixpath.split(path.rstrip("/"))
    if not name:
        raise ValueError(f"target must name a directory, got {target!r}")
    storage = FileSystemCheckpointStorage(parent, "", storage_options=options)
    if storage.size(f"{name}/_metadata") is not None:
        raise CheckpointError(f"{target} already holds a savepoint; choose a new directory")
    storage.delete(name)  # leftovers of a failed attempt
    return storage, name


# ---- what becomes of each state ---------------------------------------------------------------


@dataclasses.dataclass
class _Plan:
    """The states of the new files of one operator, and where each comes from."""

    key_snapshot: dict[str, Any]
    #: the key serializer of the new files (its snapshot goes into their headers)
    key_serializer: TypeSerializer[Any]
    #: checkpointed name -> new name (carried states; dropped and replaced ones are absent)
    carried: dict[str, str]
    #: new name -> meta of the new files' header
    metas: dict[str, StateMetaInfo]
    replaced: dict[str, ReplacedState]
    rekey: Rekey | None

    @classmethod
    def carry(cls, cp: CompletedCheckpoint, op: OperatorMetadata) -> _Plan:
        return cls.of(cp, op, {}, {}, set(), None)

    @classmethod
    def of(
        cls,
        cp: CompletedCheckpoint,
        op: OperatorMetadata,
        replace: dict[str, ReplacedState],
        rename: dict[str, str],
        drop: set[str],
        rekey: Rekey | None,
    ) -> _Plan:
        states, key_snapshot = _checkpointed_states(cp, op)
        unknown = sorted((set(rename) | drop) - set(states))
        if unknown:
            raise CheckpointError(
                f"{cp.url}, operator {op.name!r}: no state {unknown[0]!r} to rename or drop "
                f"(the checkpoint holds {sorted(states)})"
            )
        both = sorted((set(rename) | drop) & set(replace)) or sorted(set(rename) & drop)
        if both:
            raise CheckpointError(f"state {both[0]!r} is named twice (replace, rename, drop)")
        carried: dict[str, str] = {}
        metas: dict[str, StateMetaInfo] = {}
        for name, meta in states.items():
            if name in drop or name in replace:
                continue
            new = rename.get(name, name)
            if new in metas:
                raise CheckpointError(
                    f"the new savepoint would hold two states named {new!r} (rename {name!r} "
                    "to a name no state keeps)"
                )
            carried[name] = new
            metas[new] = StateMetaInfo(
                new,
                meta.kind,
                RestoredSerializer(meta.namespace_serializer),
                RestoredSerializer(meta.state_serializer),
                meta.ttl,
            )
        replaced: dict[str, ReplacedState] = {}
        for state in replace.values():
            if state.meta.name in metas:
                raise CheckpointError(
                    f"the new savepoint would hold two states named {state.meta.name!r}"
                )
            metas[state.meta.name] = state.meta
            replaced[state.meta.name] = state
        key_serializer: TypeSerializer[Any] = RestoredSerializer(key_snapshot)
        if rekey is not None or replaced:
            key_serializer = (
                rekey.key_serializer if rekey else serializer_from_snapshot(key_snapshot)
            )
        return cls(key_snapshot, key_serializer, carried, metas, replaced, rekey)


def _checkpointed_states(
    cp: CompletedCheckpoint, op: OperatorMetadata
) -> tuple[dict[str, StateMetaSnapshot], dict[str, Any]]:
    """Every keyed state (timers included) of the operator's files, and the key serializer's
    snapshot."""
    states: dict[str, StateMetaSnapshot] = {}
    key_snapshot = op.key_serializer
    for sub in op.subtasks:
        if not sub.keyed:
            continue
        files = keyed_file_restore(cp, list(sub.keyed), KeyGroupRange(*sub.key_group_range))
        for f in files:
            try:
                key_snapshot = key_snapshot or f.key_serializer
                for meta in f.states:
                    states.setdefault(meta.name, meta)
            finally:
                f.close()
    if key_snapshot is None:
        key_snapshot = {"type": "str", "version": 1}  # an operator that never held keyed state
    return states, key_snapshot


# ---- one operator -----------------------------------------------------------------------------


class _OperatorRewrite:
    """Writes the new files of one operator: spool, then one keyed file per subtask."""

    def __init__(
        self,
        cp: CompletedCheckpoint,
        op: OperatorMetadata,
        plan: _Plan,
        storage: Any,
        directory: str,
    ) -> None:
        self.cp = cp
        self.op = op
        self.plan = plan
        self.storage = storage
        self.directory = directory
        self.ranges = [KeyGroupRange(*s.key_group_range) for s in op.subtasks]
        self._old_keys: TypeSerializer[Any] | None = None

    def run(self, compression: str) -> list[SubtaskStateHandle]:
        with tempfile.TemporaryDirectory(prefix="streamstate-rewrite-") as spool_dir:
            spools = [_Spool(os.path.join(spool_dir, str(i))) for i in range(len(self.ranges))]
            try:
                for index, sub in enumerate(self.op.subtasks):
                    self._spool_subtask(index, sub, spools)
                for name, state in self.plan.replaced.items():
                    self._spool_replaced(name, state, spools)
            finally:
                for spool in spools:
                    spool.close()
            return [
                self._write_subtask(index, sub, spools[index], compression)
                for index, sub in enumerate(self.op.subtasks)
            ]

    # ---- reading the old files ----------------------------------------------------------------

    def _spool_subtask(self, index: int, sub: SubtaskStateHandle, spools: list[_Spool]) -> None:
        if not sub.keyed:
            return
        merged: dict[tuple[str, int], EncodedKeyGroup] = {}
        files = keyed_file_restore(self.cp, list(sub.keyed), self.ranges[index])
        try:
            for f in files:
                for block in f.blocks():
                    name = block.state.name
                    if name not in self.plan.carried:
                        continue
                    group = merged.get((name, block.key_group))
                    if group is None:
                        group = merged[(name, block.key_group)] = EncodedKeyGroup()
                    group.apply(block.count, block.entries, block.removed)
        finally:
            for f in files:
                f.close()
        for (name, kg), group in sorted(merged.items(), key=lambda item: item[0][1]):
            entries = group.result()
            if entries is None:
                continue
            new_name = self.plan.carried[name]
            if self.plan.rekey is None:
                spools[index].add(new_name, kg, entries.count, entries.data)
            else:
                self._spool_rekeyed(new_name, entries, spools)

    def _old_key_serializer(self) -> TypeSerializer[Any]:
        if self._old_keys is None:
            self._old_keys = serializer_from_snapshot(self.plan.key_snapshot)
        return self._old_keys

    def _spool_rekeyed(self, name: str, entries: EncodedEntries, spools: list[_Spool]) -> None:
        """Map the keys of one merged section; namespaces and values stay their bytes."""
        rekey = self.plan.rekey
        assert rekey is not None
        old = self._old_key_serializer()
        old_keys = msgspec.msgpack.Decoder(old.wire_type)
        new = rekey.key_serializer
        max_p = self.op.max_parallelism
        keys, namespaces, states = _RAW_SECTION.decode(entries.data)
        by_group: dict[int, tuple[list[Any], list[Any], list[Any]]] = {}
        for k, ns, s in zip(keys, expand_namespaces(namespaces, len(keys)), states, strict=True):
            old_key = old.from_wire(old_keys.decode(k))
            new_key = rekey.mapping(old_key)
            try:
                new.check(new_key)
            except TypeError as exc:
                raise CheckpointError(
                    f"rekey: state {name!r}: key {old_key!r} maps to {new_key!r}, which the new "
                    f"key type cannot hold ({exc})"
                ) from None
            kg = assign_to_key_group(new_key, max_p)
            group = by_group.setdefault(kg, ([], [], []))
            group[0].append(msgspec.Raw(_ENCODER.encode(new.to_wire(new_key))))
            group[1].append(ns)
            group[2].append(s)
        for kg, (ks, nss, ss) in by_group.items():
            section = _ENCODER.encode((ks, nss, ss))
            spools[self._subtask_of(kg)].add(name, kg, len(ks), section)

    def _spool_replaced(self, name: str, state: ReplacedState, spools: list[_Spool]) -> None:
        codec = StateCodec(
            self.plan.key_serializer, state.meta.namespace_serializer, state.meta.state_serializer
        )
        max_p = self.op.max_parallelism
        chunk: dict[int, list[tuple[Any, Any, Any]]] = {}
        pending = 0
        for entry in state.entries:
            kg = assign_to_key_group(entry[0], max_p)
            chunk.setdefault(kg, []).append(entry)
            pending += 1
            if pending >= _CHUNK:
                self._spool_chunk(name, codec, chunk, spools)
                chunk, pending = {}, 0
        self._spool_chunk(name, codec, chunk, spools)

    def _spool_chunk(
        self,
        name: str,
        codec: StateCodec,
        chunk: dict[int, list[tuple[Any, Any, Any]]],
        spools: list[_Spool],
    ) -> None:
        for kg, entries in chunk.items():
            try:
                section = codec.encode(entries)
            except ValueError as exc:
                raise CheckpointError(f"state {name!r}, key group {kg}: {exc}") from None
            spools[self._subtask_of(kg)].add(name, kg, len(entries), section)

    def _subtask_of(self, key_group: int) -> int:
        for i, r in enumerate(self.ranges):
            if r.contains(key_group):
                return i
        raise CheckpointError(f"key group {key_group} is in no subtask of {self.op.name!r}")

    # ---- writing the new files ----------------------------------------------------------------

    def _write_subtask(
        self, index: int, sub: SubtaskStateHandle, spool: _Spool, compression: str
    ) -> SubtaskStateHandle:
        plan = self.plan
        names = list(plan.metas)
        position = {name: i for i, name in enumerate(names)}
        kg_range = self.ranges[index]
        sections: dict[int, dict[str, list[tuple[int, bytes]]]] = {}
        for name, kg, count, data in spool.records():
            sections.setdefault(kg, {}).setdefault(name, []).append((count, data))
        keyed: list[StateFileHandle] = []
        if sections or sub.keyed:
            path = self.storage.subtask_file(self.op.name, sub.subtask_index, 0)
            full = f"{self.directory}/{path}"
            with self.storage.open_write(full) as out:
                writer = KeyedSnapshotWriter(
                    out,
                    path=self.storage.url_of(full),
                    key_serializer=plan.key_serializer,
                    max_parallelism=self.op.max_parallelism,
                    key_group_range=kg_range,
                    states=[plan.metas[n] for n in names],
                    kind=FULL_FILE,
                    checkpoint_id=self.cp.checkpoint_id,
                    compression=compression,
                )
                for kg in sorted(sections):
                    items = [
                        (position[name], _joined(name, kg, parts, plan.metas[name]))
                        for name, parts in sections[kg].items()
                    ]
                    writer.write_key_group(kg, sorted(items, key=lambda item: item[0]))
                summary = writer.finish()
            keyed.append(
                StateFileHandle(
                    path=path,
                    size=summary.size,
                    checksum=summary.checksum,
                    kind=summary.kind,
                    checkpoint_id=self.cp.checkpoint_id,
                    key_group_range=(kg_range.start, kg_range.end),
                    entries=sorted(summary.entries.items()),
                    states=summary.state_names,
                )
            )
        return SubtaskStateHandle(
            operator=self.op.name,
            subtask_index=sub.subtask_index,
            parallelism=self.op.parallelism,
            max_parallelism=self.op.max_parallelism,
            key_group_range=sub.key_group_range,
            checkpoint_id=self.cp.checkpoint_id,
            key_serializer=plan.key_serializer.snapshot(),
            keyed=keyed,
            operator_state=self._copy_operator_state(sub),
        )

    def _copy_operator_state(self, sub: SubtaskStateHandle) -> StateFileHandle | None:
        """The subtask's operator state file, copied byte for byte."""
        handle = sub.operator_state
        if handle is None:
            return None
        data = self.cp.storage.read_bytes(self.cp.resolve(handle.path))
        if len(data) != handle.size:
            raise CheckpointError(
                f"corrupt checkpoint file {self.cp.storage.url_of(self.cp.resolve(handle.path))}:"
                f" it has {len(data)} bytes but the checkpoint metadata says {handle.size}"
            )
        path = self.storage.subtask_file(self.op.name, sub.subtask_index, 0, "opstate")
        with self.storage.open_write(f"{self.directory}/{path}") as out:
            out.write(data)
        return StateFileHandle(
            path=path,
            size=handle.size,
            checksum=handle.checksum,
            kind=handle.kind,
            checkpoint_id=self.cp.checkpoint_id,
            entries=list(handle.entries),
            states=list(handle.states),
        )


def _joined(
    name: str, kg: int, parts: list[tuple[int, bytes]], meta: StateMetaInfo
) -> EncodedEntries:
    """One entries section of the parts spooled for one state and key group: a single part as
    it is; several (re-keyed entries from several old key groups, chunks of a replacement)
    concatenated, a ``(key, namespace)`` found twice refused (a timer found twice is kept
    once)."""
    if len(parts) == 1:
        return EncodedEntries(parts[0][1], parts[0][0])
    timers = meta.kind == TIMER_STATE_KIND
    seen: set[tuple[bytes, ...]] = set()
    keys: list[msgspec.Raw] = []
    namespaces: list[msgspec.Raw] = []
    states: list[msgspec.Raw] = []
    for _, data in parts:
        ks, nss, ss = _RAW_SECTION.decode(data)
        for k, ns, s in zip(ks, expand_namespaces(nss, len(ks)), ss, strict=True):
            entry = (bytes(k), bytes(ns), bytes(s)) if timers else (bytes(k), bytes(ns))
            if entry in seen:
                if timers:
                    continue
                key = msgspec.msgpack.decode(entry[0])
                raise CheckpointError(
                    f"state {name!r}, key group {kg}: two entries of key {key!r} in one "
                    "namespace (rekey maps two keys to one, or the new entries repeat a key)"
                )
            seen.add(entry)
            keys.append(k)
            namespaces.append(ns)
            states.append(s)
    return EncodedEntries(_ENCODER.encode((keys, namespaces, states)), len(keys))


class _Spool:
    """Records ``(state, key group, count, entries section)`` of one new subtask, in a local
    file (length-prefixed msgpack)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._out: IO[bytes] | None = open(path, "wb")  # noqa: SIM115 - closed by close()

    def add(self, name: str, key_group: int, count: int, section: bytes) -> None:
        assert self._out is not None
        record = _ENCODER.encode((name, key_group, count, msgspec.Raw(section)))
        self._out.write(_U32.pack(len(record)))
        self._out.write(record)

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None

    def records(self) -> Iterator[tuple[str, int, int, bytes]]:
        with open(self.path, "rb") as f:
            while True:
                head = f.read(_U32.size)
                if not head:
                    return
                (n,) = _U32.unpack(head)
                name, kg, count, section = _RECORD.decode(f.read(n))
                yield name, kg, count, bytes(section)
