"""Incremental checkpoints, restore and rescaling of the RocksDB backend (SPEC §6.3, §7, §10)."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from typing import Any

import pytest

from streamstate import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from streamstate.backends.rocksdb.incremental import IncrementalManifest
from streamstate.backends.rocksdb.restore import load_manifest
from streamstate.backends.rocksdb.storage import CheckpointStorageFileStore
from streamstate.errors import (
    CheckpointError,
    CorruptCheckpointError,
    MaxParallelismMismatchError,
    StateBackendError,
    StateMigrationException,
)
from streamstate.keygroups import assign_to_key_group, compute_operator_index_for_key_group
from streamstate.namespace import VOID_NAMESPACE
from streamstate.serializers import StrSerializer
from support.rocksdb import (  # noqa: F401 - fixtures
    SharedStateRegistry,
    checkpoint,
    make_rocks_fixture,
    raw_content,
    restore_native,
    store_fixture,
    stored_files,
)

V = ValueStateDescriptor("v", int)
L = ListStateDescriptor("l", int)
M = MapStateDescriptor("m", int, str)
W = ValueStateDescriptor("w", str)  # used in window namespaces
NS = StrSerializer()
MAX_P = 128


def _fill(backends: list[Any], keys: range, *, p: int) -> None:
    for k in keys:
        kg = assign_to_key_group(k, MAX_P)
        b = backends[compute_operator_index_for_key_group(MAX_P, p, kg)]
        b.set_current_key(k, kg)
        b.get_partitioned_state(VOID_NAMESPACE, None, V).update(k)
        b.get_partitioned_state(VOID_NAMESPACE, None, L).add_all([k, -k])
        b.get_partitioned_state(VOID_NAMESPACE, None, M).put_all({k % 5: f"x{k}", 9: "nine"})
        b.get_partitioned_state(f"win-{k % 3}", NS, W).update(str(k))


def _expect(k: int) -> tuple[int, list[int], dict[int, str], str]:
    return k, [k, -k], {k % 5: f"x{k}", 9: "nine"}, str(k)


def _check(backends: list[Any], keys: range) -> None:
    seen = 0
    for b in backends:
        v = b.get_partitioned_state(VOID_NAMESPACE, None, V)
        keys_here = sorted(b.get_keys("v", VOID_NAMESPACE))
        for k in keys_here:
            b.set_current_key(k)
            got = (
                v.value(),
                b.get_partitioned_state(VOID_NAMESPACE, None, L).get(),
                dict(b.get_partitioned_state(VOID_NAMESPACE, None, M).items()),
                b.get_partitioned_state(f"win-{k % 3}", NS, W).value(),
            )
            assert got == _expect(k)
            assert b.key_group_range.contains(assign_to_key_group(k, MAX_P))
        seen += len(keys_here)
        # one entry per mapping (streamstate.format.entries): two mappings per key
        assert b.num_entries("m") == 2 * len(keys_here)
        assert b.num_entries("l") == 2 * len(keys_here)  # and per list element
    assert seen == len(keys)


def test_restore_same_parallelism_is_byte_identical(make_rocks: Any, store: Any) -> None:
    old = [make_rocks(i, 2) for i in range(2)]
    _fill(old, range(3000), p=2)
    before = [raw_content(b) for b in old]
    handles = checkpoint(old, store, 1)
    # work after the checkpoint is not part of it
    _fill(old, range(3000, 3100), p=2)
    new = [make_rocks(i, 2) for i in range(2)]
    for b, h in zip(new, handles, strict=True):
        stats = restore_native(b, store, [h])
        assert stats["copied_entries"] == 0 and stats["deleted_ranges"] == 0
    assert [raw_content(b) for b in new] == before
    _check(new, range(3000))


@pytest.mark.parametrize(("p_old", "p_new"), [(4, 2), (2, 4), (1, 3), (3, 1), (2, 2)])
def test_rescale(make_rocks: Any, store: Any, p_old: int, p_new: int) -> None:
    old = [make_rocks(i, p_old) for i in range(p_old)]
    _fill(old, range(2000), p=p_old)
    handles = checkpoint(old, store, 7)
    new = [make_rocks(i, p_new) for i in range(p_new)]
    for b in new:
        restore_native(b, store, handles)
    _check(new, range(2000))
    # and the rescaled backends checkpoint and restore again
    handles2 = checkpoint(new, store, 8)
    again = [make_rocks(i, p_old) for i in range(p_old)]
    for b in again:
        restore_native(b, store, handles2)
    _check(again, range(2000))


def test_rescale_deletes_foreign_key_groups_with_delete_range(make_rocks: Any, store: Any) -> None:
    old = [make_rocks(0, 1)]
    _fill(old, range(500), p=1)
    handles = checkpoint(old, store, 1)
    half = make_rocks(1, 2)
    stats = restore_native(half, store, handles)
    assert stats == {
        "base_files": len(load_manifest(store, handles[0]).shared),
        "copied_entries": 0,
        "deleted_ranges": 1,
    }
    for content in raw_content(half).values():
        for raw_key in content:
            assert half.key_group_range.contains(raw_key[0])


def test_incremental_checkpoint_uploads_only_new_files(make_rocks: Any, store: Any) -> None:
    b = make_rocks(write_buffer_size=256 * 1024)
    _fill([b], range(20000), p=1)
    (h1,) = checkpoint([b], store, 1)
    assert h1.reused_bytes == 0
    b.set_current_key(7)
    b.get_partitioned_state(VOID_NAMESPACE, None, V).update(-7)
    (h2,) = checkpoint([b], store, 2)
    assert h2.reused_bytes > 0
    assert h2.uploaded_bytes < h1.uploaded_bytes * 0.2
    m1, m2 = load_manifest(store, h1), load_manifest(store, h2)
    reused = {f.path for f in m1.shared} & {f.path for f in m2.shared}
    assert reused and sum(f.size for f in m2.shared if f.path in reused) == h2.reused_bytes


def test_unconfirmed_checkpoints_are_not_reused(make_rocks: Any, store: Any) -> None:
    """Files of a checkpoint that never completed may be deleted as orphans: never reuse them."""
    b = make_rocks()
    _fill([b], range(1000), p=1)
    h1 = b.snapshot(1).write_incremental(store, "chk-1/op/0-0.state")  # never confirmed
    h2 = b.snapshot(2).write_incremental(store, "chk-2/op/0-0.state")
    assert h2.reused_bytes == 0 and not set(h1.shared_paths) & set(h2.shared_paths)
    b.notify_checkpoint_complete(2)
    h3 = b.snapshot(3).write_incremental(store, "chk-3/op/0-0.state")
    assert set(h3.shared_paths) <= set(h2.shared_paths) and h3.reused_bytes > 0


def test_shared_files_deleted_only_when_unreferenced(make_rocks: Any, store: Any) -> None:
    b = make_rocks(write_buffer_size=128 * 1024)
    registry = SharedStateRegistry(store)
    retained: list[int] = []
    for cid in range(1, 8):
        _fill([b], range(cid * 300, cid * 300 + 300), p=1)
        checkpoint([b], store, cid, registry)
        retained.append(cid)
        while len(retained) > 3:  # keep the last 3 checkpoints
            registry.release(retained.pop(0))
        on_storage = set(stored_files(store, "shared"))
        assert on_storage == registry.referenced()
    # every retained checkpoint restores
    for cid in retained:
        r = make_rocks(name=f"restore-{cid}")
        restore_native(r, store, [f"chk-{cid}/op/0-0.state"])
        assert r.num_entries("v") == cid * 300


def test_restore_after_rescale_reuses_base_files(make_rocks: Any, store: Any) -> None:
    old = [make_rocks(i, 2) for i in range(2)]
    _fill(old, range(2000), p=2)
    handles = checkpoint(old, store, 1)
    b = make_rocks(0, 1)
    restore_native(b, store, handles)
    (h,) = checkpoint([b], store, 2)
    assert h.reused_bytes > 0


def test_timers_follow_their_key_groups(make_rocks: Any, store: Any) -> None:
    from streamstate.timers import InternalTimerService

    class Sink:
        def __init__(self) -> None:
            self.fired: list[tuple[int, Any]] = []

        def on_event_time(self, ts: int, key: Any, ns: Any) -> None:
            self.fired.append((ts, key))

        def on_processing_time(self, ts: int, key: Any, ns: Any) -> None:
            pass

    old = [make_rocks(i, 2) for i in range(2)]
    services = [InternalTimerService("user", b, Sink()) for b in old]
    for k in range(100):
        kg = assign_to_key_group(k, MAX_P)
        i = compute_operator_index_for_key_group(MAX_P, 2, kg)
        old[i].set_current_key(k, kg)
        services[i].register_event_time_timer(VOID_NAMESPACE, 1000 + k)
    handles = checkpoint(old, store, 1)
    fired: list[tuple[int, Any]] = []
    for i in range(3):
        b = make_rocks(i, 3)
        restore_native(b, store, handles)
        sink = Sink()
        service = InternalTimerService("user", b, sink)  # finds the restored timers
        assert service.num_event_time_timers() > 0
        service.advance_watermark(10_000)
        assert all(b.key_group_range.contains(assign_to_key_group(k, MAX_P)) for _, k in sink.fired)
        fired.extend(sink.fired)
    assert sorted(fired) == [(1000 + k, k) for k in range(100)]


# ---- errors ---------------------------------------------------------------------------------


def test_corrupt_shared_file_is_detected(make_rocks: Any, store: Any) -> None:
    b = make_rocks()
    _fill([b], range(200), p=1)
    (h,) = checkpoint([b], store, 1)
    victim = h.shared_paths[0]
    data = bytearray(store.get_bytes(victim))
    data[len(data) // 2] ^= 0xFF
    store.put_bytes(bytes(data), victim)
    r = make_rocks(name="restore")
    with pytest.raises(CorruptCheckpointError, match=victim):
        restore_native(r, store, [h])


def test_corrupt_or_foreign_manifest_is_detected(make_rocks: Any, store: Any) -> None:
    b = make_rocks()
    _fill([b], range(10), p=1)
    (h,) = checkpoint([b], store, 1)
    data = bytearray(store.get_bytes(h.path))
    data[-3] ^= 1
    with pytest.raises(CorruptCheckpointError, match="checksum"):
        IncrementalManifest.decode(bytes(data), h.path)
    store.put_bytes(bytes(data), h.path)
    with pytest.raises(CorruptCheckpointError, match="does not match its checkpoint metadata"):
        restore_native(make_rocks(name="r"), store, [h])
    with pytest.raises(CorruptCheckpointError, match="not a RocksDB incremental manifest"):
        IncrementalManifest.decode(b"SSKS\x00\x01" + b"\x00" * 20, "x.state")


def test_missing_shared_file_is_reported(make_rocks: Any, store: Any) -> None:
    b = make_rocks()
    _fill([b], range(10), p=1)
    (h,) = checkpoint([b], store, 1)
    store.delete(h.shared_paths[0])
    with pytest.raises(Exception, match="missing"):
        restore_native(make_rocks(name="r"), store, [h])


def test_max_parallelism_cannot_change(make_rocks: Any, store: Any) -> None:
    b = make_rocks()
    _fill([b], range(10), p=1)
    handles = checkpoint([b], store, 1)
    with pytest.raises(MaxParallelismMismatchError, match="max_parallelism=128.*256"):
        restore_native(make_rocks(max_parallelism=256, name="r"), store, handles)


def test_key_serializer_must_stay_compatible(make_rocks: Any, store: Any) -> None:
    b = make_rocks()
    _fill([b], range(10), p=1)
    handles = checkpoint([b], store, 1)
    with pytest.raises(StateMigrationException, match="the key type was checkpointed as"):
        restore_native(make_rocks(key_type=str, name="r"), store, handles)


def test_restore_needs_a_fresh_backend(make_rocks: Any, store: Any) -> None:
    b = make_rocks()
    _fill([b], range(10), p=1)
    handles = checkpoint([b], store, 1)
    with pytest.raises(StateBackendError, match="before any state is registered"):
        restore_native(b, store, handles)


def test_restored_state_kind_and_serializer_are_checked(make_rocks: Any, store: Any) -> None:
    b = make_rocks()
    _fill([b], range(10), p=1)
    handles = checkpoint([b], store, 1)
    r = make_rocks(name="r")
    restore_native(r, store, handles)
    with pytest.raises(StateMigrationException, match="'v'.*value.*list"):
        r.get_partitioned_state(VOID_NAMESPACE, None, ListStateDescriptor("v", int))
    with pytest.raises(StateMigrationException, match="'l'"):
        r.get_partitioned_state(VOID_NAMESPACE, None, ListStateDescriptor("l", str))


def test_compatible_serializer_change_migrates(make_rocks: Any, store: Any) -> None:
    b = make_rocks()
    s = b.get_partitioned_state(VOID_NAMESPACE, None, ValueStateDescriptor("o", int))
    for k in range(20):
        b.set_current_key(k)
        s.update(k)
    handles = checkpoint([b], store, 1)
    r = make_rocks(name="r")
    restore_native(r, store, handles)
    # int -> int | None: compatible after migration (OptionalSerializer reads plain ints)
    s2 = r.get_partitioned_state(VOID_NAMESPACE, None, ValueStateDescriptor("o", int | None))
    for k in range(20):
        r.set_current_key(k)
        assert s2.value() == k


class DictCheckpointStorage:
    """The file operations of ``streamstate.checkpoint.storage.CheckpointStorage`` over a dict."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}

    @contextlib.contextmanager
    def open_write(self, path: str) -> Iterator[io.BytesIO]:
        buf = io.BytesIO()
        yield buf
        self.files[path] = buf.getvalue()

    def open_read(self, path: str) -> io.BytesIO:
        if path not in self.files:
            raise CheckpointError(f"checkpoint file {path} is missing")
        return io.BytesIO(self.files[path])

    def put_atomic(self, path: str, data: bytes) -> None:
        self.files[path] = bytes(data)

    def size(self, path: str) -> int | None:
        data = self.files.get(path)
        return None if data is None else len(data)

    def delete(self, path: str) -> None:
        self.files.pop(path, None)

    def url_of(self, path: str) -> str:
        return f"dict://{id(self)}/{path}"


def test_checkpoint_storage_adapter(make_rocks: Any) -> None:
    storage = DictCheckpointStorage()
    store = CheckpointStorageFileStore(storage)
    old = [make_rocks(i, 2) for i in range(2)]
    _fill(old, range(500), p=2)
    handles = checkpoint(old, store, 3)
    assert {p for h in handles for p, *_ in h.files()} == set(storage.files)
    assert all(p.startswith("shared/op/") for h in handles for p in h.shared_paths)
    new = [make_rocks(i, 3) for i in range(3)]
    for b in new:
        restore_native(b, store, handles)
    _check(new, range(500))


def test_an_aborted_checkpoint_drops_its_pending_uploads(make_rocks: Any, store: Any) -> None:
    """Once checkpoint 1 is aborted, its files are never referenced, even if a (stale)
    completion notice for it arrives later."""
    b = make_rocks()
    _fill([b], range(1000), p=1)
    b.snapshot(1).write_incremental(store, "chk-1/op/0-0.state")
    b.notify_checkpoint_aborted(1)
    b.notify_checkpoint_complete(1)
    h2 = b.snapshot(2).write_incremental(store, "chk-2/op/0-0.state")
    assert h2.reused_bytes == 0
