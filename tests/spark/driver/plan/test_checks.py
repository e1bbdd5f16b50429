"""Mistakes ``keyed_process`` finds on the driver, before the first Spark job, naming the
state or column; and the state backend that follows the checkpoint.

The checks themselves run without Spark (the options of a job and checkpoints written by the
LocalRunner); one Spark test shows that ``keyed_process`` raises them before any job runs.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from streamstate import (
    KeyedProcessFunction,
    LocalRunner,
    StateMigrationException,
    UnsupportedKeyTypeError,
    UnsupportedStateTypeError,
    ValueStateDescriptor,
)
from streamstate.backends.base import check_key_type
from streamstate.checkpoint.storage import FileSystemCheckpointStorage
from streamstate.errors import OutputSchemaError, UndeclaredStateWarning
from streamstate.serializers import Int64Serializer, StrSerializer
from streamstate.spark.driver.plan.checks import (
    _entries_of,
    _open_function,
    _restored_declarations,
    _state_declarations,
)
from streamstate.spark.driver.plan.options import KeyedOptions
from streamstate.spark.driver.plan.resolve import _follow_backend
from support.spark_data import write_batches


class Plain:
    """Not a type streamstate can serialize."""


class Declares(KeyedProcessFunction):
    """Declares one value state ``name`` of ``type_`` in ``open``."""

    def __init__(self, name: str, type_: Any) -> None:
        self.name = name
        self.type_ = type_

    def open(self, ctx: Any) -> None:
        self.state = ctx.get_state(ValueStateDescriptor(self.name, self.type_))

    def process_element(self, value: Any, ctx: Any) -> Any:
        self.state.update(self.type_(1))
        return None


class NeedsExecutor(KeyedProcessFunction):
    """An ``open`` that only works on an executor."""

    def open(self, ctx: Any) -> None:
        raise ConnectionError("no database from the driver")


def _options(function: Any, **kwargs: Any) -> KeyedOptions:
    values: dict[str, Any] = dict(
        df=None,
        key_columns=["user"],
        function=function,
        output_struct=None,
        parallelism=2,
        max_parallelism=128,
        state_backend="heap",
        state_backend_options={},
        checkpoint=None,
        event_time=None,
        watermark_delay=None,
        operator_name="keyed-process",
        storage_options={},
        initial_state=None,
        max_deltas=16,
        retained_checkpoints=3,
        host_idle_timeout=600.0,
        adaptive=False,
    )
    values.update(kwargs)
    return KeyedOptions(**values)


def _checkpoint(tmp_path: Path, backend: str, function: Any = None) -> Any:
    storage = FileSystemCheckpointStorage(str(tmp_path / backend))
    runner = LocalRunner(
        function or Declares("count", int),
        key_selector=lambda r: r,
        parallelism=2,
        max_parallelism=128,
        state_backend=backend,
        checkpoint_storage=storage,
    )
    runner.run(["ann", "bob", "cy"])
    completed = runner.checkpoint()
    runner.close()
    return completed


def test_a_state_type_without_a_serializer_is_found_on_the_driver_naming_the_state() -> None:
    with pytest.raises(UnsupportedStateTypeError, match=r"state 'visit': the type of its values"):
        _open_function(_options(Declares("visit", Plain)), StrSerializer(), [])


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_a_changed_state_type_is_found_on_the_driver_in_words_with_the_remedy(
    tmp_path: Path, backend: str
) -> None:
    restored = _checkpoint(tmp_path, backend)
    declared = _state_declarations(_options(Declares("count", str)), restored)
    assert [d.name for d in declared] == ["count"]
    with pytest.raises(StateMigrationException) as e:
        _open_function(_options(Declares("count", str)), StrSerializer(), declared)
    message = str(e.value)
    assert "state 'count': its values were checkpointed as int but are now declared as str" in (
        message
    )
    for remedy in ("savepoint", "initial_state=", "a new name", "a new checkpoint directory"):
        assert remedy in message
    # the same declaration passes
    _open_function(_options(Declares("count", int)), StrSerializer(), declared)


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_a_changed_key_type_is_found_on_the_driver_in_words(tmp_path: Path, backend: str) -> None:
    restored = _checkpoint(tmp_path, backend)
    declared, key_snapshot = _restored_declarations(_options(Declares("count", int)), restored)
    assert [d.name for d in declared] == ["count"]
    check_key_type(key_snapshot, StrSerializer(), "key column 'user'")  # unchanged: passes
    with pytest.raises(StateMigrationException) as e:
        check_key_type(key_snapshot, Int64Serializer(), "key column 'user'")
    message = str(e.value)
    assert message.startswith(
        "the key type was checkpointed as str but is now int (key column 'user')"
    )
    assert "rekey=" in message and "Serializer" not in message


class Renamed(KeyedProcessFunction):
    """Declares the value state ``count`` as ``total`` (``previous_name="count"``)."""

    def __init__(self, type_: Any) -> None:
        self.type_ = type_

    def open(self, ctx: Any) -> None:
        ctx.get_state(ValueStateDescriptor("total", self.type_, previous_name="count"))

    def process_element(self, value: Any, ctx: Any) -> Any:
        return None


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_a_renamed_state_is_checked_under_its_previous_name_on_the_driver(
    tmp_path: Path, backend: str
) -> None:
    restored = _checkpoint(tmp_path, backend)
    declared = _state_declarations(_options(Renamed(int)), restored)
    assert _open_function(_options(Renamed(float)), StrSerializer(), declared) == []
    with pytest.raises(StateMigrationException, match=r"state 'total' \(checkpointed as 'count'\)"):
        _open_function(_options(Renamed(str)), StrSerializer(), declared)


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_undeclared_states_are_found_on_the_driver_with_their_entries(
    tmp_path: Path, backend: str
) -> None:
    restored = _checkpoint(tmp_path, backend)
    options = _options(Declares("other", int))
    declared = _state_declarations(options, restored)
    undeclared = _open_function(options, StrSerializer(), declared)
    assert undeclared == ["count"]
    assert _entries_of(restored, "keyed-process", undeclared) == {"count": 3}


def test_an_open_that_fails_on_the_driver_for_its_own_reasons_is_left_to_the_executors(
    caplog: Any,
) -> None:
    with caplog.at_level(logging.INFO, logger="streamstate.spark.driver.plan.checks"):
        _open_function(_options(NeedsExecutor()), StrSerializer(), [])
    assert "no database from the driver" in caplog.text


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_the_backend_follows_the_checkpoint_unless_given(
    tmp_path: Path, backend: str, caplog: Any
) -> None:
    restored = _checkpoint(tmp_path, backend)
    with caplog.at_level(logging.WARNING, logger="streamstate.spark.driver.plan.resolve"):
        assert _follow_backend(None, restored, "keyed-process") == backend
        assert _follow_backend(None, None, "keyed-process") == "heap"
        assert _follow_backend(backend, restored, "keyed-process") == backend
    assert caplog.text == ""
    other = "heap" if backend == "rocksdb" else "rocksdb"
    with caplog.at_level(logging.WARNING, logger="streamstate.spark.driver.plan.resolve"):
        assert _follow_backend(other, restored, "keyed-process") == other
    lines = caplog.text.strip().splitlines()
    assert len(lines) == 1
    assert f"checkpointed by the {backend} backend" in lines[0]
    assert f"restored into the {other} backend" in lines[0]


def test_keyed_process_raises_before_any_job(spark: Any, tmp_path: Path) -> None:
    from streamstate.spark import keyed_process

    events = spark.createDataFrame([("ann", 1)], "user string, v long").selectExpr(
        "user", "v", "timestamp_millis(v) AS ts"
    )
    jobs = spark.sparkContext.statusTracker().getJobIdsForGroup()
    with pytest.raises(UnsupportedKeyTypeError, match=r"key column 'ts' has type timestamp"):
        keyed_process(events, key="ts", function=Declares("n", int), output_schema="n long")
    with pytest.raises(OutputSchemaError, match=r"output column 'm' has type interval year"):
        keyed_process(
            events,
            key="user",
            function=Declares("n", int),
            output_schema="user string, d interval day to second, m interval year to month",
        )
    with pytest.raises(UnsupportedStateTypeError, match=r"state 'visit'"):
        keyed_process(events, key="user", function=Declares("visit", Plain), output_schema="n long")
    assert spark.sparkContext.statusTracker().getJobIdsForGroup() == jobs
    batch = keyed_process(events, key="user", function=Declares("n", int), output_schema="n long")
    with pytest.raises(TypeError, match=r"ran in batch mode .* spark\.readStream"):
        batch.write_stream("memory")

    # a streaming job on a RocksDB checkpoint continues on RocksDB when not told otherwise
    restored = _checkpoint(tmp_path, "rocksdb")
    write_batches(str(tmp_path / "in"), [[("ann", 1)]])
    stream = spark.readStream.schema("user string, v long").parquet(str(tmp_path / "in"))
    keyed = keyed_process(
        stream,
        key="user",
        function=Declares("count", int),
        output_schema="user string",
        checkpoint=str(tmp_path / "rocksdb" / "job"),
    )
    assert keyed.options.state_backend == "rocksdb"
    assert restored.metadata.operators["keyed-process"].parallelism == keyed.options.parallelism

    # the key column's type changed: refused before the query starts, input waiting or not
    jobs = spark.sparkContext.statusTracker().getJobIdsForGroup()
    (tmp_path / "empty").mkdir()
    for source in ("in", "empty"):
        retyped = spark.readStream.schema("user long, v long").parquet(str(tmp_path / source))
        with pytest.raises(StateMigrationException) as e:
            keyed_process(
                retyped,
                key="user",
                function=Declares("count", int),
                output_schema="user long",
                checkpoint=str(tmp_path / "rocksdb" / "job"),
            )
        assert str(e.value).startswith("the key type was checkpointed as str but is now int")
    # a state the function no longer declares: one warning with its entries, at the call
    with pytest.warns(UndeclaredStateWarning, match=r"'count' \(3 entries\)"):
        keyed_process(
            stream,
            key="user",
            function=Declares("other", int),
            output_schema="user string",
            checkpoint=str(tmp_path / "rocksdb" / "job"),
        )
    assert spark.sparkContext.statusTracker().getJobIdsForGroup() == jobs
