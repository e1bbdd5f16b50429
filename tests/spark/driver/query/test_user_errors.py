"""A failed micro-batch surfaces as the error that was raised, not as Spark's wrapper."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from streamstate.errors import OutputSchemaError, RemoteError, StateHostError
from streamstate.spark import keyed_process, original_error
from streamstate.spark.failures import error_from_report, failure_report, parse_remote_error
from support.spark_data import write_batches
from support.spark_functions import Boom, FailOnKey, HalfCount

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


def test_a_failure_report_brings_back_the_class_message_and_notes():
    """What a Spark Connect server's micro-batch reports, as its client rebuilds it."""
    error = ValueError("bad value 7")
    error.add_note("streamstate: raised in process_element of key 'bob', record Row(v=7)")
    back = error_from_report(failure_report(error, 3, "counts"))
    assert type(back) is ValueError and str(back) == "bad value 7"
    assert back.__notes__[0].endswith("of key 'bob', record Row(v=7)")
    assert "raised on the Spark Connect server in micro-batch 3 of 'counts'" in back.__notes__[-1]
    # a state host's error the server could not rebuild (a module it never imported) stands in
    # as a StateHostError; a client that imported the module gets the class back
    with pytest.MonkeyPatch.context() as mp:
        mp.delitem(sys.modules, "support.spark_functions")  # as on a server that never imported it
        boom = "\nsupport.spark_functions.Boom: can"
        standin = parse_remote_error(REMOTE.replace("\nTypeError: can", boom))
    assert type(standin) is StateHostError
    back = error_from_report(failure_report(standin, 0, "counts"))
    assert type(back) is Boom and str(back).startswith("can only concatenate")
    assert any("key 'c'" in n for n in back.__notes__)
    # a class the client cannot build either: the StateHostError naming it, as classic
    unknown = parse_remote_error(REMOTE.replace("\nTypeError: can", "\nnotimported.Oops: can"))
    back = error_from_report(failure_report(unknown, 0, "counts"))
    assert type(back) is StateHostError
    assert str(back).startswith("notimported.Oops: can only concatenate")
    assert any("key 'c'" in n for n in back.__notes__)
    # an error raised in the server's process (a callback) that does not load here
    report = json.loads(failure_report(ValueError("x"), 2, "counts"))
    report.update(type="notimported.Oops", message="boom", pickle=None, notes=["a note"])
    back = error_from_report(json.dumps(report).encode())
    assert type(back) is RemoteError and back.remote_type == "notimported.Oops"
    assert str(back) == "notimported.Oops: boom" and back.__notes__[0] == "a note"


def test_a_failure_report_is_read_as_data_never_unpickled(tmp_path: Any) -> None:
    """Whoever can write the checkpoint can write ``failure.json``: a pickled payload in it
    (earlier versions wrote the exception pickled) must not run on the client."""
    import base64

    import cloudpickle

    marker = tmp_path / "ran"

    class Trap:
        def __reduce__(self) -> Any:
            return (marker.write_text, ("the checkpoint's code ran",))

    report = json.loads(failure_report(KeyError("k"), 1, "counts"))
    assert "pickle" not in report
    report["pickle"] = base64.b64encode(cloudpickle.dumps(Trap())).decode()
    back = error_from_report(json.dumps(report).encode())
    assert type(back) is KeyError and not marker.exists()


def test_a_failed_micro_batch_raises_the_original_error(any_spark: Any, tmp_path: Any) -> None:
    spark = any_spark
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
        # the function's error, once: Spark's exception is not chained (query.exception())
        assert e.value.__cause__ is None
        assert type(query.exception()).__name__ == "StreamingQueryException"
        assert any("in the state host of 'keyed-process' subtask 0" in n for n in e.value.__notes__)
        with pytest.raises(OutputSchemaError, match=r"output column 'n'"):
            query.await_termination()
    finally:
        query.stop()


def test_a_function_error_names_the_key_from_both_session_kinds(
    any_spark: Any, tmp_path: Any
) -> None:
    """A user's own exception class, raised for one key: a streaming query raises it from
    ``await_termination()`` (through Spark Connect too, where the micro-batch ran on the
    server) without Spark's exception chained, a savepoint batch job raises it, and
    ``original_error`` rebuilds it from a batch DataFrame's ``collect()``."""
    spark = any_spark
    write_batches(str(tmp_path / "in"), [[("ann", 1), ("bob", 2), ("ann", 3)]])
    stream = spark.readStream.schema("user string, v long").parquet(str(tmp_path / "in"))
    query = keyed_process(
        stream,
        key="user",
        function=FailOnKey("bob"),
        output_schema="user string, n long",
        checkpoint=str(tmp_path / "ck"),
        parallelism=2,
    ).write_stream("memory", trigger={"availableNow": True})
    for _ in range(2):  # and again: the same error
        with pytest.raises(Boom) as e:
            query.await_termination()
        assert str(e.value) == "cannot count 2"
        assert e.value.__cause__ is None
        notes = "\n".join(e.value.__notes__)
        assert "raised in process_element of key 'bob', record" in notes
        assert "in the state host of 'keyed-process' subtask" in notes
    query.stop()

    df = spark.read.schema("user string, v long").parquet(str(tmp_path / "in"))
    with pytest.raises(Boom) as e:
        keyed_process(
            df,
            key="user",
            function=FailOnKey("bob"),
            output_schema="user string, n long",
            parallelism=2,
            savepoint=str(tmp_path / "sp"),
        )
    assert str(e.value) == "cannot count 2"
    assert any("key 'bob'" in n for n in e.value.__notes__)
    lazy = keyed_process(
        df, key="user", function=FailOnKey("bob"), output_schema="user string, n long"
    )
    with pytest.raises(Exception, match="cannot count 2") as spark_error:
        lazy.collect()
    error = original_error(spark_error.value)
    assert type(error) is Boom and str(error) == "cannot count 2"
    assert any("key 'bob'" in n for n in error.__notes__)
