"""Real checkpoints to mutate: every file kind a checkpoint holds, written by the runtime.

:func:`build_corpus` runs a keyed function that uses every state kind (value, list, map,
reducing, aggregating; several namespaces; event- and processing-time timers) through the
:class:`~streamstate.runtime.local.LocalRunner` on each backend, and writes:

* heap checkpoints with each block codec (``none``, ``lz4``, ``zstd``): ``_metadata`` and keyed
  snapshot files (``SSKS``, kind ``full``);
* an incremental heap chain: a full file and a delta file (removed entries included);
* a RocksDB checkpoint: manifests (``SSRI``) and the SST files they reference;
* operator-state files (``SSOS``: split-distribute, union and broadcast state);
* the serializer descriptions of the files' headers, and a record's;
* the host channel's messages (HELLO, BEGIN with a real ``JobSpec``, DATA with an Arrow batch,
  END, PING).

Every value has a built-in serializer, so a restore decodes everything at once.
"""

from __future__ import annotations

import io
import os
import posixpath
from typing import Any

import msgspec

from streamstate.api.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from streamstate.api.functions import AggregateFunction, KeyedProcessFunction
from streamstate.backends.operator import (
    BroadcastStateSnapshot,
    ListStateSnapshot,
    OperatorStateMode,
    OperatorStateSnapshot,
)
from streamstate.checkpoint.operator_format import write_operator_state
from streamstate.checkpoint.storage import METADATA_FILE, FileSystemCheckpointStorage
from streamstate.devtools.fuzzing.seeds import Corpus, Seed
from streamstate.runtime.local import LocalRunner
from streamstate.serializers import Int64Serializer, StrSerializer, serializer_for

__all__ = ["MAX_PARALLELISM", "build_corpus"]

MAX_PARALLELISM = 128


class _Mean(AggregateFunction):  # type: ignore[type-arg]
    def create_accumulator(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, value: int, acc: tuple[int, int]) -> tuple[int, int]:
        return (acc[0] + value, acc[1] + 1)

    def get_result(self, acc: tuple[int, int]) -> float:
        return acc[0] / max(acc[1], 1)

    def merge(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        return (a[0] + b[0], a[1] + b[1])


def _add(a: int, b: int) -> int:
    return a + b


class EveryStateKind(KeyedProcessFunction):  # type: ignore[type-arg]
    """Records ``(key, i)``: every keyed state kind, namespaces, and timers of both domains;
    every tenth record removes what its key holds (delta files then carry removals)."""

    def open(self, runtime_context: Any) -> None:
        ctx = runtime_context
        self.value = ctx.get_state(ValueStateDescriptor("value", int))
        self.list = ctx.get_list_state(ListStateDescriptor("list", str))
        self.map = ctx.get_map_state(MapStateDescriptor("map", str, list[int]))
        self.reducing = ctx.get_reducing_state(ReducingStateDescriptor("reducing", _add, int))
        self.mean = ctx.get_aggregating_state(
            AggregatingStateDescriptor("mean", _Mean(), tuple[int, int])
        )

    def process_element(self, record: tuple[str, int], ctx: Any) -> None:
        _, i = record
        if i % 10 == 9:
            self.value.clear()
            self.map.clear()
            return
        self.value.update(i)
        self.list.add(f"e{i}")
        self.map.put(f"m{i % 4}", [i, -i])
        self.reducing.add(i)
        self.mean.add(i)
        ctx.timer_service().register_event_time_timer(1_000_000 + i)
        ctx.timer_service().register_processing_time_timer(2_000_000 + i % 7)


def _records(n_keys: int, start: int) -> list[tuple[str, int]]:
    return [(f"key-{k}", start + k) for k in range(n_keys)]


def _run(directory: str, backend: Any, *, compression: str, incremental: bool) -> str:
    """Checkpoints of :class:`EveryStateKind` (two with ``incremental``: a full file and a
    delta); returns the job directory."""
    storage = FileSystemCheckpointStorage(directory, "job", durable=False)
    runner = LocalRunner(
        EveryStateKind(),
        key_selector=lambda r: r[0],
        parallelism=2,
        max_parallelism=MAX_PARALLELISM,
        key_type=str,
        checkpoint_storage=storage,
        state_backend=backend,
        incremental_checkpoints=incremental,
        checkpoint_compression=compression,
    )
    try:
        for start in (0, 1000) if incremental else (0,):
            runner.run(_records(30, start), final_watermark=False)
            runner.checkpoint()
        runner.checkpoint_coordinator.wait_for_retention()
    finally:
        runner.close()
    return os.path.join(directory, "job")


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _checkpoint_seeds(corpus: Corpus, job: str, label: str) -> None:
    """The ``_metadata`` and every file it lists, of the latest checkpoint under ``job``."""
    import json

    latest = max(
        (n for n in os.listdir(job) if n.startswith("chk-")), key=lambda n: int(n.split("-")[1])
    )
    directory = os.path.join(job, latest)
    meta_path = os.path.join(directory, METADATA_FILE)
    meta = _read(meta_path)
    doc = json.loads(meta)
    # the properties a Spark step commits with (commit.py): its staged outputs
    staged = {"path": "outputs/batch-1/part-00000-0-abc123.parquet", "size": 10, "rows": 2}
    doc["properties"].update(outputs=[staged], side_outputs={"late": [staged]}, lineage="l")
    meta = json.dumps(doc, indent=1).encode()
    rel = os.path.relpath(meta_path, corpus.directory)
    corpus.seeds.setdefault("metadata", []).append(Seed(meta, rel, {"label": label}))
    for op in doc["operators"].values():
        for sub in op["subtasks"]:
            chain: list[bytes] = []
            for h in sub["keyed"]:
                path = posixpath.normpath(posixpath.join(directory, h["path"]))
                data = _read(path)
                rel = os.path.relpath(path, corpus.directory)
                context = {
                    "label": label,
                    "range": tuple(sub["key_group_range"]),
                    "kind": h["kind"],
                }
                if h["kind"] == "full":
                    corpus.seeds.setdefault("keyed", []).append(Seed(data, rel, context))
                    chain = [data]
                elif h["kind"] == "delta":
                    context["before"] = list(chain)
                    corpus.seeds.setdefault("keyed", []).append(Seed(data, rel, context))
                    chain.append(data)
                elif h["kind"] == "rocksdb-manifest":
                    context["job"] = job
                    corpus.seeds.setdefault("manifest", []).append(Seed(data, rel, context))


def _operator_state_seeds(corpus: Corpus) -> None:
    lists = {
        "offsets": ListStateSnapshot(
            "offsets", OperatorStateMode.SPLIT_DISTRIBUTE, Int64Serializer(), list(range(20))
        ),
        "union": ListStateSnapshot(
            "union", OperatorStateMode.UNION, StrSerializer(), [f"u{i}" for i in range(6)]
        ),
        "nested": ListStateSnapshot(
            "nested",
            OperatorStateMode.SPLIT_DISTRIBUTE,
            serializer_for(tuple[str, list[int]]),
            [(f"t{i}", [i, i * 2]) for i in range(5)],
        ),
    }
    broadcast = {
        "rules": BroadcastStateSnapshot(
            "rules", StrSerializer(), Int64Serializer(), {f"r{i}": i for i in range(8)}
        )
    }
    out = io.BytesIO()
    write_operator_state(OperatorStateSnapshot(lists, broadcast), out, path="opstate")
    corpus.seeds.setdefault("operator_state", []).append(Seed(out.getvalue(), "opstate"))
    out = io.BytesIO()
    write_operator_state(OperatorStateSnapshot({"offsets": lists["offsets"]}, {}), out, path="o")
    corpus.seeds["operator_state"].append(Seed(out.getvalue(), "opstate-small"))


class _Visit(msgspec.Struct):
    page: str
    clicks: int = 0
    tags: list[str] | None = None


def _serializer_snapshot_seeds(corpus: Corpus) -> None:
    """Every serializer description the keyed files' headers hold, and a record's (whose
    field types are text: ``serializers/schema_text.py`` reads it), as JSON."""
    import json

    from streamstate.format.keyed_file import KeyedSnapshotReader
    from streamstate.serializers.schema import schema_of_type

    found: dict[str, Any] = {}
    for seed in corpus.seeds["keyed"]:
        reader = KeyedSnapshotReader(io.BytesIO(seed.data), seed.origin)
        found[json.dumps(reader.key_serializer, sort_keys=True)] = reader.key_serializer
        for meta in reader.states:
            for snap in (meta.namespace_serializer, meta.state_serializer):
                found[json.dumps(snap, sort_keys=True)] = snap
    record = serializer_for(_Visit).snapshot()
    with_schema = {**record, "schema": msgspec.to_builtins(schema_of_type(_Visit))}
    for snap in (*found.values(), record, with_schema):
        corpus.seeds.setdefault("serializer_snapshot", []).append(
            Seed(json.dumps(snap).encode(), f"snapshot {snap.get('type')}")
        )


def build_corpus(directory: str) -> Corpus:
    """Write the real checkpoints into ``directory`` and collect every seed (see the module
    docstring)."""
    from streamstate.backends.heap.factory import HeapStateBackend
    from streamstate.backends.rocksdb.factory import RocksDBStateBackend
    from streamstate.devtools.fuzzing.channel import channel_seeds

    corpus = Corpus(directory)
    for compression in ("none", "lz4", "zstd"):
        where = os.path.join(directory, f"heap-{compression}")
        job = _run(where, HeapStateBackend(), compression=compression, incremental=False)
        _checkpoint_seeds(corpus, job, f"heap-{compression}")
    job = _run(
        os.path.join(directory, "heap-incremental"),
        HeapStateBackend(),
        compression="lz4",
        incremental=True,
    )
    _checkpoint_seeds(corpus, job, "heap-incremental")
    job = _run(
        os.path.join(directory, "rocksdb"),
        RocksDBStateBackend(working_dir=os.path.join(directory, "rocksdb-work")),
        compression="lz4",
        incremental=False,
    )
    _checkpoint_seeds(corpus, job, "rocksdb")
    _operator_state_seeds(corpus)
    _serializer_snapshot_seeds(corpus)
    corpus.seeds["channel"] = channel_seeds()
    return corpus
