"""The error a failed micro-batch raised, as the user should first see it.

A streaming query fails inside ``foreachBatch``; Spark wraps what went wrong in a
``StreamingQueryException`` (``FOREACH_BATCH_USER_FUNCTION_ERROR``), and an error raised on an
executor reaches the driver only as text, inside a ``PythonException`` with Java stack traces.
:func:`original_error` turns that back into the error that was raised: the same exception
object when the driver raised it (a commit, the sink), or an exception of the same class with
the same message and notes when a task or a state host raised it (a streamstate error, a
built-in one such as the ``TypeError`` of a user's function), with the remote traceback in a
note. :class:`~streamstate.spark.streaming.KeyedStreamingQuery` re-raises it from
``await_termination()`` and ``process_all_available()``, with Spark's exception chained.
"""

from __future__ import annotations

import builtins
import importlib
import re
import sys
from typing import Any

from streamstate.errors import StateHostError

__all__ = ["original_error", "parse_remote_error"]

#: the last line of a Python traceback: ``module.Class: message`` or ``Class: message``
_EXCEPTION_LINE = re.compile(r"^(?P<cls>[A-Za-z_][\w.]*)(?::\s?(?P<message>.*))?$")
_HOST_FAILED = re.compile(r"the state host of (?P<op>'[^']*') subtask (?P<subtask>\d+) failed: ")
_SQLSTATE = re.compile(r"\s*SQLSTATE: \w+.*$", re.DOTALL)


def original_error(exc: BaseException) -> BaseException:
    """The error to show for ``exc``, raised by a micro-batch on the driver: ``exc`` itself
    unless it is Spark's report of an error raised by a task, which is rebuilt (falling back to
    ``exc`` when the text cannot be read)."""
    if type(exc).__name__ != "PythonException" or not type(exc).__module__.startswith("pyspark"):
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
