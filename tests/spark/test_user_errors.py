"""A failed micro-batch surfaces as the error that was raised, not as Spark's wrapper."""

from __future__ import annotations

from typing import Any

import pytest
from data import write_batches
from functions import HalfCount

from streamstate.errors import OutputSchemaError, StateHostError
from streamstate.spark import keyed_process
from streamstate.spark.failures import parse_remote_error

# str() of the PythonException a driver gets when a function raised in a state host
# (captured from a real run; paths shortened)
REMOTE = """An exception was thrown from the Python worker:
Traceback (most recent call last):
  File "/src/streamstate/spark/tasks.py", line 88, in task
    result, timings = run_batch(spec, begin, batches, pythonpath=host.get("pythonpath"))
                      ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/src/streamstate/spark/host_client.py", line 172, in _raise_remote
    raise StateHostError(
streamstate.errors.StateHostError: the state host of 'keyed-process' subtask 0 failed: \
TypeError: can only concatenate str (not "NoneType") to str
Traceback (most recent call last):
  File "/src/streamstate/spark/state_host.py", line 353, in _handle
    host.run_batch(conn, msg)
  File "/src/streamstate/runtime/operator.py", line 242, in _collect
    out.extend(outputs)
  File "/home/ann/job.py", line 20, in process_element
    yield value.user + None
          ~~~~~~~~~~~^~~~~~
TypeError: can only concatenate str (not "NoneType") to str
streamstate: raised in process_element of key 'c', record Row(user='c', v=3)
"""


def test_an_error_raised_in_a_state_host_is_rebuilt_with_its_class_message_and_notes():
    error = parse_remote_error(REMOTE)
    assert type(error) is TypeError
    assert str(error) == 'can only concatenate str (not "NoneType") to str'
    notes = error.__notes__
    assert (
        notes[0] == "streamstate: raised in process_element of key 'c', record Row(user='c', v=3)"
    )
    assert "in the state host of 'keyed-process' subtask 0" in notes[1]
    assert 'File "/home/ann/job.py", line 20, in process_element' in notes[1]


def test_streamstate_errors_and_unknown_classes_are_rebuilt():
    text = REMOTE.replace(
        'TypeError: can only concatenate str (not "NoneType") to str\nstreamstate:',
        "streamstate.errors.OutputSchemaError: output column 'n' is declared int64\nstreamstate:",
    )
    error = parse_remote_error(text)
    assert type(error) is OutputSchemaError and str(error).startswith("output column 'n'")
    unknown = parse_remote_error(REMOTE.replace("\nTypeError: can", "\nnotimported.Oops: can"))
    assert type(unknown) is StateHostError and str(unknown).startswith("notimported.Oops: can")
    assert parse_remote_error("no traceback here") is None


@pytest.mark.spark
def test_a_failed_micro_batch_raises_the_original_error(spark: Any, tmp_path: Any) -> None:
    write_batches(str(tmp_path / "in"), [[("ann", 2), ("bob", 3)]])
    stream = spark.readStream.schema("user string, v long").parquet(str(tmp_path / "in"))
    query = keyed_process(
        stream,
        key="user",
        function=HalfCount(),
        output_schema="user string, n long",
        checkpoint=str(tmp_path / "ck"),
        parallelism=1,
    ).write_stream("memory")
    try:
        with pytest.raises(OutputSchemaError, match=r"output column 'n' .* 1\.5 \(float\)") as e:
            query.process_all_available()
        assert type(e.value.__cause__).__name__ == "StreamingQueryException"
        assert any("in the state host of 'keyed-process' subtask 0" in n for n in e.value.__notes__)
        with pytest.raises(OutputSchemaError, match=r"output column 'n'"):
            query.await_termination()
    finally:
        query.stop()
