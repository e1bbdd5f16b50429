"""RocksDB's row cache (``row_cache_size``): configuration, and no stale read after an update, a
delete, a restore or a rescaling (RocksDB refuses range deletions while it is on)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from streamstate import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from streamstate.backends.rocksdb.factory import RocksDBStateBackend
from streamstate.backends.rocksdb.instance import RocksDBConfig, _range_deletions
from streamstate.keygroups import assign_to_key_group, compute_operator_index_for_key_group
from streamstate.namespace import VOID_NAMESPACE
from support.rocksdb import (  # noqa: F401 - fixtures
    checkpoint,
    make_rocks_fixture,
    raw_content,
    restore_files,
    restore_native,
    snapshot_files,
    store_fixture,
)

V = ValueStateDescriptor("v", int)
L = ListStateDescriptor("l", int)
M = MapStateDescriptor("m", int, str)
MAX_P = 128
ROW_CACHE = {"row_cache_size": 1 << 20, "cache_entries": 0}


def _flush_to_sst(backend: Any) -> None:
    """Write the memtables into SST files (the row cache only caches lookups in SST files)."""
    backend.flush()
    inst = backend.instance
    for name in inst.column_family_names():
        inst.column_family(name).cf.flush()


def _fill(backends: list[Any], keys: range, *, p: int) -> None:
    for k in keys:
        kg = assign_to_key_group(k, MAX_P)
        b = backends[compute_operator_index_for_key_group(MAX_P, p, kg)]
        b.set_current_key(k, kg)
        b.get_partitioned_state(VOID_NAMESPACE, None, V).update(k)
        b.get_partitioned_state(VOID_NAMESPACE, None, L).add_all([k, -k])
        b.get_partitioned_state(VOID_NAMESPACE, None, M).put_all({k % 5: f"x{k}", 9: "nine"})


def _check(backends: list[Any], keys: range) -> None:
    seen = 0
    for b in backends:
        keys_here = sorted(b.get_keys("v", VOID_NAMESPACE))
        for k in keys_here:
            assert b.key_group_range.contains(assign_to_key_group(k, MAX_P))
            b.set_current_key(k)
            for _ in range(2):  # the second read is served by the row cache
                assert b.get_partitioned_state(VOID_NAMESPACE, None, V).value() == k
                assert b.get_partitioned_state(VOID_NAMESPACE, None, L).get() == [k, -k]
                assert dict(b.get_partitioned_state(VOID_NAMESPACE, None, M).items()) == {
                    k % 5: f"x{k}",
                    9: "nine",
                }
        seen += len(keys_here)
    assert seen == len(keys)


# ---- configuration -----------------------------------------------------------------------------


def test_row_cache_size_flows_from_the_state_backend() -> None:
    assert RocksDBConfig().row_cache_size == 0  # off by default, as in Flink
    config = RocksDBConfig.from_options(RocksDBStateBackend(row_cache_size=8 << 20))
    assert config.row_cache_size == 8 << 20
    extra = RocksDBConfig.from_options(RocksDBStateBackend(extra={"row_cache_size": 1 << 20}))
    assert extra.row_cache_size == 1 << 20


@pytest.mark.parametrize("bad", [-1, 1.5, "64MB", True])
def test_bad_row_cache_size_names_the_setting(bad: Any) -> None:
    with pytest.raises(ValueError, match="row_cache_size"):
        RocksDBStateBackend(row_cache_size=bad)
    with pytest.raises(ValueError, match="row_cache_size"):
        RocksDBConfig.from_options(RocksDBStateBackend(extra={"row_cache_size": bad}))


def test_spark_runtime_passes_row_cache_size_to_subtasks(tmp_path: Any) -> None:
    from streamstate.spark.driver.plan.resolve import _backend_name
    from streamstate.spark.subtask import _state_backend

    name, options = _backend_name(RocksDBStateBackend(row_cache_size=4 << 20))
    assert (name, options["row_cache_size"]) == ("rocksdb", 4 << 20)

    @dataclasses.dataclass
    class Job:
        state_backend: str
        state_backend_options: dict[str, Any]

    backend = _state_backend(Job(name, options), 0, str(tmp_path), True)  # type: ignore[arg-type]
    assert backend.row_cache_size == 4 << 20
    assert RocksDBConfig.from_options(backend).row_cache_size == 4 << 20


def test_each_instance_has_its_own_row_cache(make_rocks: Any) -> None:
    a, b = make_rocks(0, 2, **ROW_CACHE), make_rocks(1, 2, **ROW_CACHE)
    assert a.instance.has_row_cache and b.instance.has_row_cache
    assert a.instance._row_cache is not b.instance._row_cache
    assert not make_rocks(0, 1).instance.has_row_cache


# ---- no stale reads ----------------------------------------------------------------------------


def test_update_and_delete_are_never_hidden_by_the_row_cache(make_rocks: Any) -> None:
    b = make_rocks(**ROW_CACHE)
    v = b.get_partitioned_state(VOID_NAMESPACE, None, V)
    m = b.get_partitioned_state(VOID_NAMESPACE, None, M)
    for k in range(50):
        b.set_current_key(k)
        v.update(k)
        m.put_all({1: "a", 2: "b"})
    _flush_to_sst(b)
    for k in range(50):  # warm the row cache with the values in the SST files
        b.set_current_key(k)
        assert v.value() == k and m.get(1) == "a"
    for k in range(50):
        b.set_current_key(k)
        if k % 2:
            v.clear()
            m.clear()
        else:
            v.update(-k)
            m.remove(1)
    for round_ in range(2):  # in the memtable, then in a newer SST file
        for k in range(50):
            b.set_current_key(k)
            assert v.value() == (None if k % 2 else -k), (round_, k)
            assert m.get(1) is None, (round_, k)
            assert m.get(2) == (None if k % 2 else "b"), (round_, k)
        _flush_to_sst(b)


@pytest.mark.parametrize(("p_old", "p_new"), [(1, 2), (2, 1), (1, 3)])
def test_rescaling_restore_with_a_row_cache(
    make_rocks: Any, store: Any, p_old: int, p_new: int
) -> None:
    old = [make_rocks(i, p_old) for i in range(p_old)]
    _fill(old, range(600), p=p_old)
    handles = checkpoint(old, store, 1)
    new = [make_rocks(i, p_new, **ROW_CACHE) for i in range(p_new)]
    for b in new:
        restore_native(b, store, handles)  # RocksDB would refuse a DeleteRange here
        # the foreign key groups of the base are gone, entry by entry
        for content in raw_content(b).values():
            assert all(b.key_group_range.contains(raw_key[0]) for raw_key in content)
    _check(new, range(600))
    # and checkpoint, restore again into row-cached instances
    handles2 = checkpoint(new, store, 2)
    again = [make_rocks(i, p_old, **ROW_CACHE) for i in range(p_old)]
    for b in again:
        restore_native(b, store, handles2)
    _check(again, range(600))


def test_range_tombstones_of_a_restored_base_are_compacted_away(
    make_rocks: Any, store: Any
) -> None:
    # a job without a row cache rescales 1 -> 2: subtask 1's files carry a range tombstone over
    # the key groups of subtask 0, above the older file that still holds their entries
    whole = [make_rocks(0, 1)]
    _fill(whole, range(400), p=1)
    foreign = raw_content(whole[0])["v"]
    half = make_rocks(1, 2)
    restore_native(half, store, checkpoint(whole, store, 1))
    handles = checkpoint([half], store, 2)
    assert _range_deletions(half.instance.column_family("v")) == 1

    # restored with a row cache, no SST file may keep a range tombstone: a row-cache hit on the
    # older file would ignore it and return a deleted entry
    cached = make_rocks(1, 2, **ROW_CACHE)
    restore_native(cached, store, handles)
    cf = cached.instance.column_family("v")
    assert _range_deletions(cf) == 0
    gone = [k for k in foreign if not cached.key_group_range.contains(k[0])]
    assert gone
    for _ in range(2):
        assert [cf.get(k) for k in gone] == [None] * len(gone)
    kept = [k for k in foreign if cached.key_group_range.contains(k[0])]
    assert [cf.get(k) for k in kept] == [foreign[k] for k in kept]
    # the compacted files are new: the next checkpoint uploads them and restores from them
    again = make_rocks(1, 2, **ROW_CACHE)
    restore_native(again, store, checkpoint([cached], store, 3))
    assert raw_content(again) == raw_content(cached)
    assert sorted(again.get_keys("v", VOID_NAMESPACE)) == sorted(
        k for k in range(400) if again.key_group_range.contains(assign_to_key_group(k, MAX_P))
    )


def test_savepoint_restore_with_a_row_cache(make_rocks: Any) -> None:
    # two savepoints of the same key groups: the later one's full blocks replace the earlier
    # ones (a range deletion without a row cache)
    old = [make_rocks(0, 1)]
    _fill(old, range(300), p=1)
    first = snapshot_files([old[0].snapshot(1)])
    b = old[0]
    for k in range(300):
        b.set_current_key(k)
        b.get_partitioned_state(VOID_NAMESPACE, None, V).update(k)
    second = snapshot_files([b.snapshot(2)])
    new = [make_rocks(i, 2, **ROW_CACHE) for i in range(2)]
    for nb in new:
        restore_files(nb, first + second)
    _check(new, range(300))
