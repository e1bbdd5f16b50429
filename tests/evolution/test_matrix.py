"""Schema evolution, every change x state kind x backend (SPEC §14.1).

For each change a job writes every keyed state kind (value, list, map, reducing, aggregating)
with the old declaration and checkpoints; the new code restores the checkpoint and reads every
state. A compatible change gives the old values in the new types (compared with every part's type,
so that ``1`` and ``1.0`` differ), and the checkpoint the new code takes next is written in the
new schema (its file headers hold the new serializers; a heap chain starts over with a full
snapshot) and restores again, at another parallelism. A refused change raises
``StateMigrationException`` at the restore naming the state, both types in the user's words and
the remedy; the old code then still restores the checkpoint, values intact.

Backends: heap with full checkpoints, heap with incremental checkpoints, RocksDB from its native
incremental checkpoints, and RocksDB from a savepoint (the usual upgrade: canonical files).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from streamstate import ValueStateDescriptor
from streamstate.backends.base import Clock
from streamstate.backends.heap.factory import HeapStateBackend
from streamstate.checkpoint.restore import keyed_file_restore
from streamstate.checkpoint.storage import FileSystemCheckpointStorage
from streamstate.errors import StateMigrationException, UndeclaredStateWarning
from streamstate.format.entries import entries_of
from streamstate.keygroups import KeyGroupRange
from streamstate.runtime.local import LocalRunner
from streamstate.serializers.evolution import resolve_schema_change
from support import evolution_moved_types as moved
from support.evolution_job import TTL_MS, Job, Spec
from support.evolution_types import (
    Acc,
    AccAdded,
    AccOptional,
    AccRemoved,
    AccRenamed,
    AccReordered,
    AccRequired,
    AccTagInt,
    AccWider,
    Color,
    ColorV2,
    Inner,
    InnerV2,
    Outer,
    OuterV2,
    Pair,
    PairV2,
    Point,
    PointV2,
)

KINDS = ("value", "list", "map", "reducing", "aggregating")
#: heap with full checkpoints, heap with incremental ones, RocksDB from its native checkpoint,
#: RocksDB from a savepoint (canonical files: states wait in them until registered)
BACKENDS = ("heap", "heap-incremental", "rocksdb", "rocksdb-savepoint")
KEYS = [f"k{i}" for i in range(6)]
WRITTEN_AT = 0  # the old job's processing time
RESTORED_AT = 10_000  # the new job's, at the restore: later than WRITTEN_AT + TTL_MS


class ManualClock(Clock):
    """Processing time moved by hand."""

    def __init__(self, time: int) -> None:
        self.time = time

    def now(self) -> int:
        return self.time


def _runner(
    specs: list[Spec],
    backend: str,
    storage: Any,
    *,
    parallelism: int = 1,
    clock: ManualClock | None = None,
    key_type: Any = None,
) -> LocalRunner:
    state_backend: Any = "rocksdb" if backend.startswith("rocksdb") else HeapStateBackend()
    return LocalRunner(
        Job(specs),
        key_selector=lambda r: r[0],
        parallelism=parallelism,
        max_parallelism=16,
        state_backend=state_backend,
        checkpoint_storage=storage,
        incremental_checkpoints=backend == "heap-incremental",
        clock=clock or ManualClock(WRITTEN_AT),
        key_type=key_type,
    )


def _written(change: Change, old: list[Spec], backend: str, storage: Any) -> Any:
    """The old job's checkpoint (a heap chain: a full snapshot, then a delta), or savepoint,
    of every key's values."""
    names = {spec.kind: spec.name for spec in old}
    writer = _runner(old, backend, storage)
    writer.run(_writes(change, names), final_watermark=False)
    if backend == "heap-incremental":
        writer.checkpoint()
        writer.run(_writes(change, names)[:2], final_watermark=False)
    taken = writer.savepoint() if backend.endswith("savepoint") else writer.checkpoint()
    writer.close()
    return taken


def _read(runner: LocalRunner, keys: list[Any]) -> dict[Any, dict[str, Any]]:
    return dict(runner.run([(k, "read", None) for k in keys], final_watermark=False))


def _typed(value: Any) -> Any:
    """``value`` with the type of every part kept (so that ``1`` and ``1.0`` differ)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = [(f.name, _typed(getattr(value, f.name))) for f in dataclasses.fields(value)]
        return (type(value), fields)
    if isinstance(value, msgspec.Struct):
        return (type(value), [(k, _typed(v)) for k, v in msgspec.structs.asdict(value).items()])
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return (type(value), [(k, _typed(getattr(value, k))) for k in value._fields])
    if isinstance(value, list | tuple):
        return (type(value), [_typed(v) for v in value])
    if isinstance(value, dict):
        return (dict, sorted((k, _typed(v)) for k, v in value.items()))
    return (type(value), value)


# ---- the changes ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Change:
    """One change of a state's declaration between two deploys."""

    id: str
    old: Any
    new: Any
    #: the i-th old value (of a value state; lists and maps hold two of them)
    sample: Callable[[int], Any]
    #: what an old value becomes (compatible changes)
    convert: Callable[[Any], Any] = lambda v: v
    old_ttl: bool = False
    new_ttl: bool = False
    #: the new job's processing time at the restore
    restored_at: int = RESTORED_AT
    #: the same schema (the values are read as they are: a heap chain goes on)
    as_is: bool = False
    #: refused: what the error says besides the state's name
    error: tuple[str, ...] = ()


def _acc(i: int) -> Acc:
    return Acc(i, f"t{i}")


COMPATIBLE = [
    Change("int->float", int, float, lambda i: i, float),
    Change("int->int|None", int, int | None, lambda i: i),
    Change("str->bytes", str, bytes, lambda i: f"s{i}", lambda v: v.encode()),
    Change(
        "list[int]->list[float]",
        list[int],
        list[float],
        lambda i: [i, i + 1],
        lambda v: [float(x) for x in v],
    ),
    Change("record field added", Acc, AccAdded, _acc, lambda v: AccAdded(v.n, v.tag)),
    Change("record field removed", Acc, AccRemoved, _acc, lambda v: AccRemoved(v.n)),
    Change(
        "record fields reordered",
        Acc,
        AccReordered,
        _acc,
        lambda v: AccReordered(v.tag, v.n),
        as_is=True,
    ),
    Change("record field int->float", Acc, AccWider, _acc, lambda v: AccWider(float(v.n), v.tag)),
    Change("record field T->T|None", Acc, AccOptional, _acc, lambda v: AccOptional(v.n, v.tag)),
    Change("record renamed", Acc, AccRenamed, _acc, lambda v: AccRenamed(v.n, v.tag), as_is=True),
    Change("record moved", Acc, moved.Acc, _acc, lambda v: moved.Acc(v.n, v.tag), as_is=True),
    Change(
        "nested record and list[int]->list[float]",
        Outer,
        OuterV2,
        lambda i: Outer(Inner(i), [i, -i]),
        lambda v: OuterV2(InnerV2(float(v.inner.x)), [float(s) for s in v.scores]),
    ),
    Change(
        "msgspec.Struct field added and widened",
        Point,
        PointV2,
        lambda i: Point(i, -i),
        lambda v: PointV2(float(v.x), v.y),
    ),
    Change(
        "NamedTuple field appended",
        Pair,
        PairV2,
        lambda i: Pair(i, f"b{i}"),
        lambda v: PairV2(float(v.a), v.b),
    ),
    Change(
        "enum gains a member",
        Color,
        ColorV2,
        lambda i: [Color.RED, Color.GREEN][i % 2],
        lambda v: ColorV2(v.value),
    ),
    Change(
        "record with TTL turned on",
        Acc,
        AccWider,
        _acc,
        lambda v: AccWider(float(v.n), v.tag),
        new_ttl=True,
    ),
    Change("TTL turned off", int, int, lambda i: i, old_ttl=True),
    Change(
        "TTL kept, int->float",
        int,
        float,
        lambda i: i,
        float,
        old_ttl=True,
        new_ttl=True,
        restored_at=WRITTEN_AT + TTL_MS - 1,
    ),
]

REFUSED = [
    Change("float->int", float, int, lambda i: i + 0.5, error=("float", "int")),
    Change("str->int", str, int, lambda i: f"s{i}", error=("str → int",)),
    Change(
        "int|None->int",
        int | None,
        int,
        lambda i: i,
        error=("int | None → int", "None is no longer allowed"),
    ),
    Change("record field str->int", Acc, AccTagInt, _acc, error=("AccTagInt.tag: str → int",)),
    Change(
        "record field added without a default",
        Acc,
        AccRequired,
        _acc,
        error=("AccRequired.extra: added without a default",),
    ),
]


def _old_value(change: Change, kind: str, i: int) -> Any:
    if kind == "list":
        return [change.sample(i), change.sample(i + 1)]
    if kind == "map":
        return {"a": change.sample(i), "b": change.sample(i + 1)}
    return change.sample(i)


def _new_value(change: Change, kind: str, i: int) -> Any:
    old = _old_value(change, kind, i)
    if kind == "list":
        return [change.convert(v) for v in old]
    if kind == "map":
        return {k: change.convert(v) for k, v in old.items()}
    return change.convert(old)


def _empty(kind: str) -> Any:
    return [] if kind == "list" else {} if kind == "map" else None


def _writes(change: Change, names: dict[str, str]) -> list[Any]:
    return [
        (key, "write", {names[kind]: _old_value(change, kind, i) for kind in names})
        for i, key in enumerate(KEYS)
    ]


def _mismatches(
    read: dict[Any, dict[str, Any]], expected: Callable[[str, int], Any], names: dict[str, str]
) -> list[str]:
    wrong = []
    for i, key in enumerate(KEYS):
        for kind, name in names.items():
            got, want = read[key][name], expected(kind, i)
            if _typed(got) != _typed(want):
                wrong.append(f"{kind} state of {key}: {got!r}, expected {want!r}")
    return wrong


def _headers(checkpoint: Any) -> tuple[dict[str, Any], list[int]]:
    """The state serializer snapshots the checkpoint's keyed files hold (by state name), and
    each subtask's number of keyed files."""
    snaps: dict[str, Any] = {}
    chains = []
    for op in checkpoint.metadata.operators.values():
        for sub in op.subtasks:
            chains.append(len([f for f in sub.keyed if f.kind in ("full", "delta")]))
            if not sub.keyed:
                continue
            files = keyed_file_restore(
                checkpoint, list(sub.keyed), KeyGroupRange(*sub.key_group_range)
            )
            for f in files:
                for meta in f.states:
                    if not meta.is_timer:
                        snaps.setdefault(meta.name, meta.state_serializer)
                f.close()
    return snaps, chains


def _stored_snapshot(spec: Spec) -> Any:
    from streamstate.backends.base import stored_serializer

    return stored_serializer(spec.descriptor()).snapshot()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("change", COMPATIBLE, ids=lambda c: c.id)
def test_a_compatible_change_restores_every_state_kind_migrated(
    change: Change, backend: str, tmp_path: Path
) -> None:
    names = {kind: kind for kind in KINDS}
    storage = FileSystemCheckpointStorage(str(tmp_path), durable=False)
    old = [Spec(kind, kind, change.old, change.old_ttl) for kind in KINDS]
    new = [Spec(kind, kind, change.new, change.new_ttl) for kind in KINDS]
    first = _written(change, old, backend, storage)

    clock = ManualClock(change.restored_at)
    reader = _runner(new, backend, storage, clock=clock)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UndeclaredStateWarning)
        reader.restore(first)
    assert not _mismatches(_read(reader, KEYS), lambda k, i: _new_value(change, k, i), names)

    # the next checkpoint is written in the new schema (a heap chain starts a full snapshot)
    second = reader.checkpoint()
    snaps, chains = _headers(second)
    for spec in new:  # a chain's base may name a class renamed as-is by its old name
        found = resolve_schema_change(snaps[spec.name], _stored_snapshot(spec))
        assert found.compatibility.is_compatible_as_is, (spec.name, found)
    if backend == "heap-incremental":
        assert chains == ([3] if change.as_is else [1])
    if change.new_ttl and not change.old_ttl:  # the entries count as accessed at the restore
        clock.time = RESTORED_AT + TTL_MS - 1
        assert not _mismatches(_read(reader, KEYS), lambda k, i: _new_value(change, k, i), names)
        clock.time = RESTORED_AT + TTL_MS
        assert not _mismatches(_read(reader, KEYS), lambda k, i: _empty(k), names)
    reader.close()

    again = _runner(new, backend, storage, parallelism=2, clock=ManualClock(change.restored_at))
    again.restore(second)
    assert not _mismatches(_read(again, KEYS), lambda k, i: _new_value(change, k, i), names)
    again.close()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("change", REFUSED, ids=lambda c: c.id)
def test_a_refused_change_names_the_state_and_types_and_leaves_the_checkpoint(
    change: Change, backend: str, tmp_path: Path
) -> None:
    names = {kind: kind for kind in KINDS}
    storage = FileSystemCheckpointStorage(str(tmp_path), durable=False)
    old = [Spec(kind, kind, change.old) for kind in KINDS]
    first = _written(change, old, backend, storage)

    for kind in KINDS:
        runner = _runner([Spec(kind, kind, change.new)], backend, storage)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UndeclaredStateWarning)
            with pytest.raises(StateMigrationException) as e:
                runner.restore(first)
        runner.close()
        message = str(e.value)
        assert message.startswith(f"state {kind!r}"), message
        for words in change.error:
            assert words in message, (kind, message)
        assert "rewrite_savepoint" in message and "previous code still restores" in message
        assert "Serializer(" not in message  # the user's words, not a serializer's repr

    # the old code restores the checkpoint the refused restores left as it was
    back = _runner(old, backend, storage)
    back.restore(first)
    assert not _mismatches(_read(back, KEYS), lambda k, i: _old_value(change, k, i), names)
    back.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_changed_key_type_is_refused_at_the_restore(backend: str, tmp_path: Path) -> None:
    change = COMPATIBLE[0]
    names = {kind: kind for kind in KINDS}
    storage = FileSystemCheckpointStorage(str(tmp_path), durable=False)
    old = [Spec(kind, kind, int) for kind in KINDS]
    first = _written(change, old, backend, storage)
    runner = _runner(old, backend, storage, key_type=int)
    with pytest.raises(StateMigrationException) as e:
        runner.restore(first)
    runner.close()
    message = str(e.value)
    assert message.startswith("the key type was checkpointed as str but is now int"), message
    assert "rekey=" in message and "Serializer(" not in message
    back = _runner(old, backend, storage)
    back.restore(first)
    assert not _mismatches(_read(back, KEYS), lambda k, i: _old_value(change, k, i), names)
    back.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_state_renamed_with_its_previous_name_keeps_its_entries(
    backend: str, tmp_path: Path
) -> None:
    change = COMPATIBLE[4]  # and a record field added on the way
    new_names = {kind: f"{kind}-v2" for kind in KINDS}
    storage = FileSystemCheckpointStorage(str(tmp_path), durable=False)
    old = [Spec(kind, kind, change.old) for kind in KINDS]
    new = [Spec(f"{kind}-v2", kind, change.new, previous_name=kind) for kind in KINDS]
    first = _written(change, old, backend, storage)
    reader = _runner(new, backend, storage)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UndeclaredStateWarning)
        reader.restore(first)
    assert not _mismatches(_read(reader, KEYS), lambda k, i: _new_value(change, k, i), new_names)
    second = reader.checkpoint()
    reader.close()
    snaps, _ = _headers(second)
    assert sorted(snaps) == sorted(new_names.values())  # the old names are gone
    again = _runner(new, backend, storage, parallelism=2)
    again.restore(second)
    assert not _mismatches(_read(again, KEYS), lambda k, i: _new_value(change, k, i), new_names)
    again.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_states_no_longer_declared_are_kept_and_reported_once(backend: str, tmp_path: Path) -> None:
    change = COMPATIBLE[4]
    names = {kind: kind for kind in KINDS}
    storage = FileSystemCheckpointStorage(str(tmp_path), durable=False)
    old = [Spec(kind, kind, change.old) for kind in KINDS]
    first = _written(change, old, backend, storage)
    # the new code declares only the value state, under a new name without previous_name
    renamed = [Spec("value-v2", "value", change.old)]
    reader = _runner(renamed, backend, storage, parallelism=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reader.restore(first)
    found = [w for w in caught if issubclass(w.category, UndeclaredStateWarning)]
    assert len(found) == 1
    text = str(found[0].message)
    for kind in KINDS:
        # one count (streamstate.format.entries): a list's elements, a map's mappings
        entries = sum(entries_of(kind, _old_value(change, kind, i)) for i in range(len(KEYS)))
        assert f"{kind!r} ({entries} entries)" in text, text
    assert "previous_name" in text
    second = reader.checkpoint()
    reader.close()
    # carried into the next checkpoint: the old code finds every state there
    back = _runner(old, backend, storage)
    back.restore(second)
    assert not _mismatches(_read(back, KEYS), lambda k, i: _old_value(change, k, i), names)
    back.close()


def test_a_previous_name_must_differ_from_the_name() -> None:
    from streamstate.errors import InvalidStateNameError

    with pytest.raises(InvalidStateNameError, match="previous_name must differ"):
        ValueStateDescriptor("a", int, previous_name="a")
    with pytest.raises(InvalidStateNameError, match="previous state name"):
        ValueStateDescriptor("a", int, previous_name="x/y")
