"""streamstate on PySpark: keyed functions with Flink's state model, batch and streaming.

Spark moves the data; streamstate keeps the state (SPEC §11, ``docs/spark/index.md``):

.. code-block:: python

    from streamstate.spark import keyed_process

    counts = keyed_process(events, key="user", function=CountPerUser(),
                           output_schema="user string, n long")           # batch: a DataFrame
    query = keyed_process(stream, key="user", function=CountPerUser(),
                          output_schema="user string, n long", checkpoint="/tmp/ck",
                          ).write_stream("parquet", path="/tmp/out")       # streaming

* :func:`keyed_process`: placement by key group, one subtask per Spark partition, outputs
  cast to ``output_schema``; streaming micro-batches are exactly-once through checkpoints that
  the driver commits after every subtask finished, with the state kept hot between batches in
  per-subtask state hosts; a restart with another ``parallelism`` rescales by key group.
* sinks: ``"parquet"`` (exactly-once), ``"memory"``, ``"console"``, ``"foreach_batch"``.
* :func:`read_state`: a checkpoint's or savepoint's state as a DataFrame; :func:`register`
  puts the formats ``"streamstate"`` and ``"streamstate-metadata"`` (``spark.read.format``) in
  a session (``keyed_process`` and ``read_state`` do it themselves).
* :func:`rewrite_savepoint`: a new savepoint with states replaced from DataFrames, renamed,
  dropped or re-keyed, everything else carried over (docs: "Upgrading a job").
* :func:`original_error`: the error a function raised in a task, from the exception Spark
  raised (a batch-mode DataFrame's ``collect()``; streaming queries raise it themselves).

The names load on first use (PEP 562): a state host or a task imports ``streamstate.spark.host``
or ``streamstate.spark.task`` without the driver's modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamstate.errors import OutputSchemaError, StateHostError
from streamstate.lazy_exports import lazy_getattr

if TYPE_CHECKING:
    from streamstate.spark.driver.environment import WorkerPythonError
    from streamstate.spark.driver.query.keyed import keyed_process
    from streamstate.spark.driver.query.streaming import KeyedStream, KeyedStreamingQuery
    from streamstate.spark.driver.sinks import (
        ConsoleSink,
        FileSink,
        ForeachBatchSink,
        MemorySink,
        Sink,
        StagedBatch,
    )
    from streamstate.spark.failures import original_error
    from streamstate.spark.offline.reader import read_state, register
    from streamstate.spark.offline.rewrite import rewrite_savepoint
    from streamstate.spark.records import Row

__all__ = [
    "ConsoleSink",
    "FileSink",
    "ForeachBatchSink",
    "KeyedStream",
    "KeyedStreamingQuery",
    "MemorySink",
    "OutputSchemaError",
    "Row",
    "Sink",
    "StagedBatch",
    "StateHostError",
    "WorkerPythonError",
    "keyed_process",
    "original_error",
    "read_state",
    "register",
    "rewrite_savepoint",
]

#: where each public name lives
_MODULES = {
    "WorkerPythonError": "streamstate.spark.driver.environment",
    "keyed_process": "streamstate.spark.driver.query.keyed",
    "read_state": "streamstate.spark.offline.reader",
    "register": "streamstate.spark.offline.reader",
    "rewrite_savepoint": "streamstate.spark.offline.rewrite",
    "ConsoleSink": "streamstate.spark.driver.sinks",
    "FileSink": "streamstate.spark.driver.sinks",
    "ForeachBatchSink": "streamstate.spark.driver.sinks",
    "MemorySink": "streamstate.spark.driver.sinks",
    "Sink": "streamstate.spark.driver.sinks",
    "StagedBatch": "streamstate.spark.driver.sinks",
    "KeyedStream": "streamstate.spark.driver.query.streaming",
    "KeyedStreamingQuery": "streamstate.spark.driver.query.streaming",
    "original_error": "streamstate.spark.failures",
    "Row": "streamstate.spark.records",
}


__getattr__ = lazy_getattr(__name__, _MODULES, globals())


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
