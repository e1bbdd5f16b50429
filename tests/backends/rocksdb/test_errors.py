"""Clear errors of the RocksDB backend (SPEC §12): locked or unwritable directory, disposal."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from streamstate import ValueStateDescriptor
from streamstate.backends.rocksdb.backend import RocksDBKeyedStateBackend
from streamstate.backends.rocksdb.factory import RocksDBStateBackend
from streamstate.backends.rocksdb.instance import RocksDBConfig
from streamstate.errors import InvalidStateNameError, StateAccessError, StateBackendError
from streamstate.keygroups import KeyGroupRange
from streamstate.namespace import VOID_NAMESPACE
from streamstate.serializers import Int64Serializer, VoidNamespaceSerializer

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "..", "src")


def _backend(path: str, **config: Any) -> RocksDBKeyedStateBackend:
    return RocksDBKeyedStateBackend(
        Int64Serializer(), 128, KeyGroupRange(0, 127), options=RocksDBConfig(**config), path=path
    )


def test_second_backend_on_the_same_directory_is_refused(tmp_path: Any) -> None:
    path = str(tmp_path / "op-0")
    first = _backend(path)
    with pytest.raises(StateBackendError, match=rf"{path}.*is locked"):
        _backend(path)
    first.dispose()
    _backend(path).dispose()  # released on dispose


@pytest.mark.subprocess
def test_directory_locked_by_another_process(tmp_path: Any) -> None:
    path = str(tmp_path / "op-0")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, time
                sys.path.insert(0, {SRC!r})
                from streamstate.backends.rocksdb.backend import RocksDBKeyedStateBackend
                from streamstate.keygroups import KeyGroupRange
                from streamstate.serializers import Int64Serializer
                b = RocksDBKeyedStateBackend(Int64Serializer(), 128, KeyGroupRange(0, 127),
                                             path={path!r})
                print("ready", flush=True)
                time.sleep(60)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        with pytest.raises(StateBackendError, match=rf"{path}.*locked.*another"):
            _backend(path)
    finally:
        holder.kill()
        holder.wait()
    _backend(path).dispose()  # the lock died with the process


def test_unwritable_directory(tmp_path: Any) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(StateBackendError, match=r"a-file/op-0.*not writable"):
        _backend(str(blocker / "op-0"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_directory(tmp_path: Any) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(StateBackendError, match="not writable"):
            _backend(str(ro / "op-0"))
    finally:
        ro.chmod(0o700)


def test_state_handles_fail_after_dispose(tmp_path: Any) -> None:
    path = str(tmp_path / "op-0")
    b = _backend(path)
    s = b.get_partitioned_state(VOID_NAMESPACE, None, ValueStateDescriptor("v", int))
    b.set_current_key(1)
    s.update(1)
    b.dispose()
    with pytest.raises(StateBackendError, match="'v'.*disposed"):
        s.value()
    b.set_current_key(1)
    with pytest.raises(StateBackendError, match="disposed"):
        s.update(2)
    with pytest.raises(StateBackendError, match="disposed"):
        b.snapshot(1)
    _backend(path).dispose()  # the handle held by the test does not keep RocksDB open


def test_default_column_family_is_refused(tmp_path: Any) -> None:
    b = _backend(str(tmp_path / "op-0"))
    d = ValueStateDescriptor("x", int)
    d.name = "default"  # descriptors refuse it too; the backend refuses it on its own
    with pytest.raises(InvalidStateNameError, match="default column family"):
        b._create_internal_state(VoidNamespaceSerializer(), d)
    b.dispose()


def test_options_are_validated() -> None:
    with pytest.raises(ValueError, match="unknown RocksDB option 'blok_cache'"):
        RocksDBConfig.from_options(RocksDBStateBackend(extra={"blok_cache": 1}))
    with pytest.raises(ValueError, match="write_buffer_size must be at least"):
        RocksDBConfig.from_options(RocksDBStateBackend(write_buffer_size=10))
    with pytest.raises(ValueError, match="disable_auto_compactions must be True or False"):
        RocksDBConfig.from_options(RocksDBStateBackend(extra={"disable_auto_compactions": "y"}))
    config = RocksDBConfig.from_options(
        RocksDBStateBackend(
            block_cache_size=1 << 20, compression="zstd", extra={"cache_entries": 7}
        )
    )
    assert (config.block_cache_size, config.compression, config.cache_entries) == (
        1 << 20,
        "zstd",
        7,
    )


def test_factory_creates_one_directory_per_subtask(tmp_path: Any) -> None:
    sb = RocksDBStateBackend(working_dir=str(tmp_path), extra={"cache_entries": 10})
    backends = [
        sb.create_keyed_backend(
            Int64Serializer(), 128, KeyGroupRange(0, 63), operator_name="counts", subtask_index=i
        )
        for i in range(2)
    ]
    assert sorted(os.listdir(tmp_path)) == ["counts-0", "counts-1"]
    assert backends[0].config.cache_entries == 10
    for b in backends:
        b.dispose()


def test_namespace_needs_a_namespace_serializer(tmp_path: Any) -> None:
    """The void namespace serializer writes nothing: another namespace would share its entry."""
    b = _backend(str(tmp_path / "op-0"))
    s = b.get_partitioned_state(VOID_NAMESPACE, None, ValueStateDescriptor("v", int))
    b.set_current_key(1)
    with pytest.raises(StateAccessError, match="'v'.*void namespace serializer.*'window-1'"):
        s.set_current_namespace("window-1")
    b.dispose()
