"""The checkpoint decoders, each as the runtime calls it, with the errors it may raise.

A target decodes one (mutated) input the way a restore, a tool or a state host does, through
the public entry points, and goes on until everything is decoded: a keyed file is restored into
a fresh backend and written out again (what the next checkpoint would do), operator state is
redistributed, a manifest's files are downloaded and opened.

**Which errors may come out** (SPEC §14.5; docs/security.md): from a checkpoint decoder,
:class:`~streamstate.errors.CheckpointError` and its subclasses (``CorruptCheckpointError``
above all, ``MaxParallelismMismatchError``) and
:class:`~streamstate.errors.StateMigrationException` (a serializer the checkpoint describes that
this program cannot read, ``PickleNotAllowedError``); from the host channel,
:class:`~streamstate.spark.wire.protocol.ProtocolError`, ``EOFError`` when the stream ends, and
Arrow's own ``ArrowException`` for a schema or DATA body that is not Arrow IPC (the host fails
that batch with it). Anything else is a finding.
"""

from __future__ import annotations

import io
import os
import posixpath
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import google_crc32c

from streamstate.devtools.fuzzing.channel import (
    ArrowRefused,
    decode_channel,
    join_records,
    split_records,
)
from streamstate.devtools.fuzzing.corpus import MAX_PARALLELISM
from streamstate.devtools.fuzzing.mutations import (
    mutate_bytes,
    mutate_json,
    mutate_msgpack,
    reseal_keyed,
    reseal_manifest,
    reseal_operator,
    restructure_keyed,
    restructure_operator,
)
from streamstate.devtools.fuzzing.seeds import Corpus, Seed
from streamstate.errors import CheckpointError, StateMigrationException, StreamStateError

__all__ = ["CHECKPOINT_ERRORS", "Target", "Unparsed", "targets"]

#: what a checkpoint decoder may raise on any input (the module docstring)
CHECKPOINT_ERRORS: tuple[type[BaseException], ...] = (CheckpointError, StateMigrationException)

Mutator = Callable[[bytes, random.Random, Seed, list[Seed]], bytes]


@dataclass
class Target:
    """One decoder: its seeds, how it decodes, how its inputs are mutated, what it may raise."""

    name: str
    seeds: list[Seed]
    decode: Callable[[bytes, Seed], Any]
    mutators: list[Mutator]
    allowed: tuple[type[BaseException], ...] = CHECKPOINT_ERRORS
    #: how much of a run's inputs go to this target, relative to the others
    weight: float = 1.0
    notes: dict[str, Any] = field(default_factory=dict)


# ---- mutators -----------------------------------------------------------------------------------


def _other(rng: random.Random, seeds: list[Seed]) -> bytes:
    return rng.choice(seeds).data if seeds else b""


def _bytes(data: bytes, rng: random.Random, seed: Seed, seeds: list[Seed]) -> bytes:
    return mutate_bytes(data, rng, _other(rng, seeds))


def _sealed(reseal: Callable[[bytes], bytes]) -> Mutator:
    def mutate(data: bytes, rng: random.Random, seed: Seed, seeds: list[Seed]) -> bytes:
        return reseal(mutate_bytes(data, rng, _other(rng, seeds)))

    return mutate


def _structured(restructure: Callable[[bytes, random.Random], bytes]) -> Mutator:
    def mutate(data: bytes, rng: random.Random, seed: Seed, seeds: list[Seed]) -> bytes:
        return restructure(data, rng)

    return mutate


def _json(data: bytes, rng: random.Random, seed: Seed, seeds: list[Seed]) -> bytes:
    return mutate_json(data, rng)


def _manifest_body(data: bytes, rng: random.Random, seed: Seed, seeds: list[Seed]) -> bytes:
    return reseal_manifest(data[:10] + mutate_msgpack(data[10:], rng))


def _channel_records(data: bytes, rng: random.Random, seed: Seed, seeds: list[Seed]) -> bytes:
    """One record of the stream changed: a head's header values, its body length, or bytes."""
    records = split_records(data)
    if not records:
        return mutate_bytes(data, rng)
    i = rng.randrange(len(records))
    record = records[i]
    pick = rng.random()
    if pick < 0.5 and len(record) > 4:
        records[i] = record[:4] + mutate_msgpack(record[4:], rng)
    elif pick < 0.65 and len(record) >= 4:
        value = rng.choice((0, 1, 2**20, 2**20 + 1, 2**30, 2**32 - 1, len(record)))
        records[i] = value.to_bytes(4, "little") + record[4:]
    elif pick < 0.8:
        del records[i]
    else:
        records[i] = mutate_bytes(record, rng)
    return join_records(records)


# ---- decoders -----------------------------------------------------------------------------------


class _BytesStorage:
    """A checkpoint storage holding one file (what ``FileKeyedStateRestore`` reads)."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files

    def open_read(self, path: str) -> io.BytesIO:
        return io.BytesIO(self.files[path])

    def url_of(self, path: str) -> str:
        return f"fuzz://{path}"


class _BytesLocation:
    def __init__(self, files: dict[str, bytes]) -> None:
        self.storage = _BytesStorage(files)
        self.directory = "chk-1"

    def resolve(self, path: str) -> str:
        return path


def _keyed_restore(backend_factory: Callable[[Any], Any]) -> Callable[[bytes, Seed], Any]:
    """Restore a keyed file (after the real files of its chain) into a fresh backend, then
    write the backend's snapshot out as the next checkpoint would."""
    from streamstate.backends.base import RestoreInput
    from streamstate.format.handles import StateFileHandle
    from streamstate.format.keyed_file import write_keyed_snapshot
    from streamstate.format.restore import FileKeyedStateRestore
    from streamstate.keygroups import KeyGroupRange
    from streamstate.serializers import StrSerializer

    def decode(data: bytes, seed: Seed) -> Any:
        rng = KeyGroupRange(*seed.context["range"])
        chain = [*seed.context.get("before", []), data]
        files = {f"f{i}": d for i, d in enumerate(chain)}
        location = _BytesLocation(files)
        restores = [
            FileKeyedStateRestore(
                location,
                StateFileHandle(
                    path=f"f{i}",
                    size=len(d),
                    checksum=google_crc32c.value(d),
                    kind="full" if i == 0 else "delta",
                    checkpoint_id=1,
                ),
                rng,
            )
            for i, d in enumerate(chain)
        ]
        backend = backend_factory(None).create_keyed_backend(StrSerializer(), MAX_PARALLELISM, rng)
        try:
            backend.restore(RestoreInput(restores))
            snapshot = backend.snapshot(2)
            write_keyed_snapshot(snapshot, io.BytesIO(), path="fuzz://next", compression="none")
        finally:
            for r in restores:
                r.close()
            backend.dispose()

    return decode


def _metadata(corpus: Corpus) -> Callable[[bytes, Seed], Any]:
    from streamstate.checkpoint.metadata import decode_metadata
    from streamstate.checkpoint.storage import CompletedCheckpoint, FileSystemCheckpointStorage
    from streamstate.spark.driver.step.staged import staged_outputs, staged_side_outputs

    storages: dict[str, Any] = {}

    def decode(data: bytes, seed: Seed) -> Any:
        path = os.path.join(corpus.directory, seed.origin)
        chk = os.path.dirname(path)
        job = os.path.dirname(chk)
        storage = storages.get(job)
        if storage is None:
            storage = storages[job] = FileSystemCheckpointStorage(job, "", durable=False)
        metadata = decode_metadata(data, storage.url_of(f"{os.path.basename(chk)}/_metadata"))
        checkpoint = CompletedCheckpoint(storage, os.path.basename(chk), metadata)
        for f in metadata.files():
            checkpoint.resolve(f.path)
        # what the Spark driver reads of a committed checkpoint's properties
        staged_outputs(checkpoint)
        staged_side_outputs(checkpoint)
        return storage.problems(checkpoint)

    return decode


def _operator_state(data: bytes, seed: Seed) -> Any:
    from streamstate.checkpoint.operator_format import read_operator_state
    from streamstate.checkpoint.rescale import repartition_operator_state

    snapshot = read_operator_state(data, "fuzz://opstate")
    return repartition_operator_state([snapshot, snapshot], 3)


def _manifest(corpus: Corpus, native: bool) -> Callable[[bytes, Seed], Any]:
    """A manifest as a RocksDB backend restores it (``native``: its files downloaded into the
    database directory and opened) or as the heap backend reads its canonical view; both start
    with the manifest's decoding and name checks."""
    from streamstate.backends.base import RestoreInput, RestoreMode
    from streamstate.backends.heap.factory import HeapStateBackend
    from streamstate.backends.rocksdb.factory import RocksDBStateBackend
    from streamstate.backends.rocksdb.native_restore import NativeKeyedStateRestore
    from streamstate.checkpoint.metadata import CheckpointMetadata
    from streamstate.checkpoint.storage import CompletedCheckpoint, FileSystemCheckpointStorage
    from streamstate.format.handles import StateFileHandle
    from streamstate.keygroups import KeyGroupRange
    from streamstate.serializers import StrSerializer

    def decode(data: bytes, seed: Seed) -> Any:
        job = seed.context["job"]
        # the mutated manifest replaces the real one in a copy of the job's checkpoints
        scratch = corpus.scratch(job)
        rel = os.path.relpath(os.path.join(corpus.directory, seed.origin), job)
        with open(os.path.join(scratch, rel), "wb") as f:
            f.write(data)
        storage = FileSystemCheckpointStorage(scratch, "", durable=False)
        directory = rel.split("/", 1)[0]
        checkpoint = CompletedCheckpoint(
            storage, directory, CheckpointMetadata(checkpoint_id=2, timestamp=0)
        )
        rng = KeyGroupRange(*seed.context["range"])
        handle = StateFileHandle(
            path=posixpath.relpath(rel, directory),
            size=len(data),
            checksum=google_crc32c.value(data),
            kind="rocksdb-manifest",
            checkpoint_id=2,
            key_group_range=tuple(seed.context["range"]),
        )
        restore = NativeKeyedStateRestore(checkpoint, handle, rng)
        factory = (
            RocksDBStateBackend(working_dir=corpus.fresh_work_directory())
            if native
            else HeapStateBackend()
        )
        backend = factory.create_keyed_backend(StrSerializer(), MAX_PARALLELISM, rng)
        try:
            backend.restore(RestoreInput([restore], RestoreMode.NO_CLAIM))
            snapshot = backend.snapshot(3)
            from streamstate.format.keyed_file import write_keyed_snapshot

            write_keyed_snapshot(snapshot, io.BytesIO(), path="fuzz://next", compression="none")
        finally:
            restore.close()
            backend.dispose()

    return decode


def _manifest_decode(data: bytes, seed: Seed) -> Any:
    """Only the manifest's own decoding and name checks (cheap: many inputs)."""
    from streamstate.backends.rocksdb.incremental import IncrementalManifest

    return IncrementalManifest.decode(data, seed.origin)


class Unparsed(Exception):
    """A mutated serializer description that is not JSON (no decoder sees it)."""


def _serializer_snapshot(data: bytes, seed: Seed) -> Any:
    """A serializer description as a restore rebuilds it (:func:`serializer_from_snapshot`) and
    as a reader describes its values without the program's classes (its schema, and the type
    that decodes them); the latter never raise."""
    import json

    from streamstate.serializers import serializer_from_snapshot
    from streamstate.serializers.snapshot_schema import decoder_type, schema_of_snapshot

    try:
        snap = json.loads(data)
    except ValueError as exc:
        raise Unparsed(str(exc)) from None
    schema = schema_of_snapshot(snap)
    if schema is not None:
        decoder_type(schema)
    return serializer_from_snapshot(snap)


def _text_in_json(data: bytes, rng: random.Random, seed: Seed, seeds: list[Seed]) -> bytes:
    """One string inside a JSON document (a record field's type text) changed byte-wise."""
    import json

    try:
        doc = json.loads(data)
    except ValueError:
        return mutate_bytes(data, rng)
    strings: list[tuple[Any, Any]] = []

    def walk(node: Any) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            if isinstance(value, str):
                strings.append((node, key))
            elif isinstance(value, dict | list):
                walk(value)

    if isinstance(doc, dict | list):
        walk(doc)
    if not strings:
        return mutate_bytes(data, rng)
    node, key = rng.choice(strings)
    node[key] = mutate_bytes(node[key].encode(), rng).decode("utf-8", "replace")
    return json.dumps(doc).encode()


def _channel(data: bytes, seed: Seed) -> Any:
    return decode_channel(data, seed.context["job"])


def targets(corpus: Corpus) -> list[Target]:
    """Every decoder over the seeds of ``corpus``."""
    from streamstate.backends.heap.factory import HeapStateBackend
    from streamstate.backends.rocksdb.factory import RocksDBStateBackend
    from streamstate.spark.wire.protocol import ProtocolError

    keyed = corpus.seeds["keyed"]
    manifests = corpus.seeds["manifest"]
    return [
        Target("metadata", corpus.seeds["metadata"], _metadata(corpus), [_bytes, _json, _json]),
        Target(
            "keyed",
            keyed,
            _keyed_restore(lambda _: HeapStateBackend()),
            [_bytes, _sealed(reseal_keyed), _structured(restructure_keyed)],
            weight=3.0,
        ),
        Target(
            "keyed-rocksdb",
            keyed,
            _keyed_restore(
                lambda _: RocksDBStateBackend(working_dir=corpus.fresh_work_directory())
            ),
            [_sealed(reseal_keyed), _structured(restructure_keyed)],
            weight=0.3,
        ),
        Target(
            "operator-state",
            corpus.seeds["operator_state"],
            _operator_state,
            [_bytes, _sealed(reseal_operator), _structured(restructure_operator)],
            weight=2.0,
        ),
        Target(
            "manifest",
            manifests,
            _manifest_decode,
            [_bytes, _manifest_body, _manifest_body],
            weight=1.0,
        ),
        Target(
            "manifest-restore",
            manifests,
            _manifest(corpus, native=False),
            [_manifest_body],
            weight=0.15,
        ),
        Target(
            "manifest-native",
            manifests,
            _manifest(corpus, native=True),
            [_manifest_body],
            weight=0.15,
        ),
        Target(
            "serializer-snapshot",
            corpus.seeds["serializer_snapshot"],
            _serializer_snapshot,
            [_json, _json, _text_in_json],
            allowed=(*CHECKPOINT_ERRORS, Unparsed),
            weight=1.0,
        ),
        Target(
            "channel",
            corpus.seeds["channel"],
            _channel,
            [_channel_records],
            allowed=(ProtocolError, EOFError, ArrowRefused, StreamStateError),
            weight=1.5,
        ),
    ]
