"""The error a failed micro-batch raised, as the user should first see it.

A *function error* (:func:`is_function_error`: raised by the user's function, or one of
streamstate's errors about what the job declares) is deterministic, so it is not a task
failure: the state host reports it as plain data (:func:`task_error_report`), the task returns
it in its acknowledgement, and the driver raises it once (:func:`raise_function_error`),
before anything is committed, with Spark's query-failure log silenced while the query stops
(:func:`quiet_query_failure_log`). Errors of the infrastructure fail their task as before, and
Spark retries it.

A streaming query fails inside ``foreachBatch``; Spark wraps what went wrong in a
``StreamingQueryException`` (``FOREACH_BATCH_USER_FUNCTION_ERROR``), and an error raised on an
executor reaches the driver only as text, inside a ``PythonException`` with Java stack traces.
:func:`original_error` turns that back into the error that was raised: the same exception
object when the driver raised it (a commit, the sink), or an exception of the same class with
the same message and notes when a task or a state host raised it (a streamstate error, a
built-in one such as the ``TypeError`` of a user's function), with the remote traceback in a
note. :class:`~streamstate.spark.driver.query.streaming.KeyedStreamingQuery` re-raises it from
``await_termination()`` and ``process_all_available()``, with Spark's exception chained.

Through Spark Connect the micro-batches run in a Python process on the server, so the client
never holds that error: the server writes it as a report (:func:`failure_report`: class,
message, notes, traceback; plain JSON) into the query run's report directory, and the client
rebuilds it (:func:`error_from_report`): the same class and message where the client can build
it, else a :class:`~streamstate.errors.RemoteError` naming the class. The notes name the key
and record (or timer) the function was processing, and the state host's subtask.

The report lives in the checkpoint, which the client trusts less than its own process: it is
read as data only. Nothing in it is unpickled, and a class is looked up only among the built-in
exceptions, streamstate's and the modules the client already imported (an exception class whose
constructor takes the message).
"""

from __future__ import annotations

import builtins
import importlib
import json
import re
import sys
import traceback
from collections.abc import Iterable
from typing import Any

from streamstate.errors import (
    CheckpointError,
    InvalidStateNameError,
    KeyGroupOutOfRangeError,
    NoCurrentKeyError,
    OutputSchemaError,
    RemoteError,
    StateAccessError,
    StateBackendError,
    StateHostError,
    StateMigrationException,
    UnsupportedKeyTypeError,
    UnsupportedStateTypeError,
)
from streamstate.spark.wire.acks import TaskAck
from streamstate.spark.wire.messages import ErrorReport

__all__ = [
    "error_from_report",
    "error_from_task_report",
    "failure_report",
    "is_function_error",
    "original_error",
    "parse_remote_error",
    "quiet_query_failure_log",
    "raise_function_error",
    "task_error_report",
]

#: the loggers through which Spark's stream execution thread logs a query that ends with an
#: error (``Query ... terminated with error`` and the Java stack trace)
QUERY_FAILURE_LOGGERS = (
    "org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution",
    "org.apache.spark.sql.execution.streaming.runtime.StreamExecution",
)

#: streamstate's errors about what the job itself declares or does: a retry raises them again
_JOB_ERRORS = (
    OutputSchemaError,
    StateAccessError,
    StateMigrationException,
    UnsupportedStateTypeError,
    InvalidStateNameError,
    UnsupportedKeyTypeError,
    KeyGroupOutOfRangeError,
    NoCurrentKeyError,
)
#: what the infrastructure raises (storage, the state host, the backend's files, the OS): Spark
#: retries the task, even when the user's function was on the stack
_INFRASTRUCTURE_ERRORS = (CheckpointError, StateBackendError, StateHostError, OSError, MemoryError)


def is_function_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the job's own, deterministic error: raised by the user's function
    (the operator named its key and record in a note) or one of streamstate's errors about
    what the job declares (an output schema, a state's type). Such an error is reported as
    data to the driver, which raises it once; a retry would only raise it again. Errors of
    the infrastructure (storage, a lost host, the OS) are not: Spark retries their task."""
    if isinstance(exc, _INFRASTRUCTURE_ERRORS):
        return False
    if isinstance(exc, _JOB_ERRORS):
        return True
    return any(str(n).startswith("streamstate: raised in ") for n in getattr(exc, "__notes__", ()))


def task_error_report(error: BaseException, where: str) -> ErrorReport:
    """A function error as plain data (it travels in a task's acknowledgement): the class's
    qualified name, message, notes, traceback, and where it was raised."""
    return ErrorReport(
        type=_qualified_name(type(error)),
        message=str(error),
        notes=[str(n) for n in getattr(error, "__notes__", ())],
        # the frames only: the error's own line and notes are above them when it is raised
        traceback="".join(traceback.format_tb(error.__traceback__)),
        where=where,
    )


def error_from_task_report(report: ErrorReport) -> BaseException:
    """The error a :func:`task_error_report` describes, rebuilt on the driver: its class
    (built-in, streamstate's, or of a module the driver imported) with its message and notes,
    else a :class:`~streamstate.errors.StateHostError` naming it; a last note says where it
    was raised and carries the traceback."""
    name, message = report.type, report.message
    error = _instantiate(name, message)
    if error is None:
        error = StateHostError(f"{name}: {message}")
        error.remote_type, error.remote_message = name, message  # type: ignore[attr-defined]
    for note in report.notes:
        error.add_note(note)
    error.add_note(
        f"streamstate: raised {report.where or 'on a Spark executor'}, at:\n"
        + report.traceback.rstrip()
    )
    return error


#: the last line of a Python traceback: ``module.Class: message`` or ``Class: message``
_EXCEPTION_LINE = re.compile(r"^(?P<cls>[A-Za-z_][\w.]*)(?::\s?(?P<message>.*))?$")
_HOST_FAILED = re.compile(r"the state host of (?P<op>'[^']*') subtask (?P<subtask>\d+) failed: ")
_SQLSTATE = re.compile(r"\s*SQLSTATE: \w+.*$", re.DOTALL)


#: the error class of Spark's report of an error a Python data source raised while Spark
#: planned a read (an ``AnalysisException``)
_DATA_SOURCE_ERROR = "[PYTHON_DATA_SOURCE_ERROR]"


def original_error(exc: BaseException) -> BaseException:
    """The error to show for ``exc``, raised by a micro-batch (or a read) on the driver: ``exc``
    itself unless it is Spark's report of an error raised by a task, or by a Python data source
    while Spark planned a read (the state formats), which is rebuilt (falling back to ``exc``
    when the text cannot be read)."""
    if not type(exc).__module__.startswith("pyspark"):
        return exc
    name = type(exc).__name__
    planning = name == "AnalysisException" and _DATA_SOURCE_ERROR in str(exc)
    if name != "PythonException" and not planning:
        return exc
    rebuilt = parse_remote_error(str(exc))
    return exc if rebuilt is None else rebuilt


def parse_remote_error(text: str) -> BaseException | None:
    """Rebuild the innermost error of a Python traceback printed into ``text`` (a Spark
    ``PythonException`` message), or None if there is none.

    The class is looked up among the built-in exceptions and the modules already imported
    (``streamstate.errors``, the user's modules); the first line after the class is the
    message, the lines after it are notes. An unknown class becomes a
    :class:`~streamstate.errors.StateHostError` naming it. The traceback goes into a note.
    """
    text = _SQLSTATE.sub("", text.replace("\r\n", "\n"))
    start = text.rfind("Traceback (most recent call last):")
    if start < 0:
        return None
    lines = text[start:].split("\n")[1:]
    i = 0
    while i < len(lines) and (lines[i].startswith(" ") or not lines[i].strip()):
        i += 1  # frames: indented lines
    if i == len(lines):
        return None
    frames = lines[:i]
    match = _EXCEPTION_LINE.match(lines[i])
    if match is None:
        return None
    name, message = match["cls"], match["message"] or ""
    notes = [line for line in lines[i + 1 :] if line.strip()]
    where = ""
    host = _HOST_FAILED.search(text[:start])
    if host is not None:
        where = f" in the state host of {host['op']} subtask {host['subtask']}"
    error = _instantiate(name, message)
    if error is None:
        error = StateHostError(f"{name}: {message}")
        # what it stands for, for a process that can build the class (a Connect client)
        error.remote_type, error.remote_message = name, message  # type: ignore[attr-defined]
    for note in notes:
        error.add_note(note)
    frames_text = "\n".join(f for f in frames if f.strip())
    error.add_note(
        f"streamstate: raised on a Spark executor{where} (Spark's exception is chained); "
        f"its traceback:\n{frames_text}"
    )
    return error


def _instantiate(name: str, message: str) -> BaseException | None:
    module, _, cls_name = name.rpartition(".")
    if not module:
        cls: Any = getattr(builtins, cls_name, None)
    elif module in sys.modules or module.startswith("streamstate."):
        try:
            cls = getattr(importlib.import_module(module), cls_name, None)
        except ImportError:
            return None
    else:
        return None  # a module this driver never imported: not worth importing to report
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        return None
    try:
        error: BaseException = cls(message)
    except Exception:  # an exception class whose constructor wants other arguments
        return None
    return error


def _qualified_name(cls: type) -> str:
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


def failure_report(error: BaseException, batch: int | None, operator: str) -> bytes:
    """What a Spark Connect server's micro-batch reports to its client about ``error`` (the
    :func:`original_error` of what it raised), as JSON: the class's qualified name, message,
    notes and traceback (plain data: the client never unpickles what a checkpoint holds)."""
    # an error this process could not rebuild (a StateHostError standing for a class of a
    # module it never imported) is reported as what it stands for: the client may know it
    remote_type = getattr(error, "remote_type", None)
    report = {
        "type": remote_type or _qualified_name(type(error)),
        "message": getattr(error, "remote_message", None) if remote_type else str(error),
        "stand_in": remote_type is not None,
        "notes": [str(n) for n in getattr(error, "__notes__", ())],
        "traceback": "".join(traceback.format_exception(error)),
        "batch": batch,
        "operator": operator,
    }
    return json.dumps(report).encode()


def error_from_report(data: bytes) -> BaseException:
    """The error a :func:`failure_report` describes: one of the same class built from the
    message (with the notes) if this process has that class (:func:`_instantiate`), else a
    :class:`~streamstate.errors.RemoteError` naming the class and message. A last note says
    which micro-batch failed on the server and carries the server's traceback. The report is
    read as data: a ``pickle`` field (written by earlier versions) is ignored."""
    report = json.loads(data)
    name, message = str(report.get("type", "Exception")), str(report.get("message", ""))
    error = _instantiate(name, message)
    if error is None and report.get("stand_in"):
        # a state host's error neither side can build: what a classic session raises for it
        error = StateHostError(f"{name}: {message}")
        error.remote_type, error.remote_message = name, message  # type: ignore[attr-defined]
    if error is None:
        error = RemoteError(f"{name}: {message}", remote_type=name)
    for note in report.get("notes", []):
        error.add_note(str(note))
    error.add_note(
        f"streamstate: raised on the Spark Connect server in micro-batch {report.get('batch')} "
        f"of {report.get('operator')!r} ({name}); the server's traceback:\n"
        + str(report.get("traceback", "")).rstrip()
    )
    return error


def raise_function_error(acks: Iterable[TaskAck]) -> None:
    """Raise the function error the first failing subtask's acknowledgement carries, if any:
    once, on the driver, before anything is committed."""
    failed = sorted((a for a in acks if a.error is not None), key=lambda a: a.subtask)
    if failed and failed[0].error is not None:
        raise error_from_task_report(failed[0].error)


def quiet_query_failure_log(spark: Any) -> Any:
    """Silence the stream execution's ``terminated with error`` log (and its Java frames)
    while a query stops on a function error that the driver raises itself; returns the
    function that restores the loggers' levels (None where there is no JVM to ask: Spark
    Connect, whose server logs to its own log).

    Only these loggers are touched, and only until the query has stopped: errors of the
    infrastructure (a failed commit, a lost executor) still reach Spark's log."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        return None
    try:
        log_manager = jvm.org.apache.logging.log4j.LogManager
        configurator = jvm.org.apache.logging.log4j.core.config.Configurator
        level = jvm.org.apache.logging.log4j.Level
        saved = {name: log_manager.getLogger(name).getLevel() for name in QUERY_FAILURE_LOGGERS}
        for name in QUERY_FAILURE_LOGGERS:
            configurator.setLevel(name, level.OFF)
    except Exception:  # a JVM without log4j 2: Spark logs as it would
        return None

    def restore() -> None:
        for name, old in saved.items():
            configurator.setLevel(name, old)

    return restore
