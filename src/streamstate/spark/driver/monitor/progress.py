"""A streaming query's state figures in Spark's own monitoring (SPEC §13.5), on the driver.

Spark fills a micro-batch's ``StreamingQueryProgress.observedMetrics`` from the
``CollectMetricsExec`` nodes of the query's own plan: what ``Dataset.observe`` puts there. The
keyed job of a micro-batch runs inside ``foreachBatch``, outside that plan, so the figures take
this way instead:

1. :func:`observe_state` adds ``observe("streamstate", max(null) per figure)`` to the streaming
   DataFrame: aggregates over a typed null literal, which read no input column (a task that
   ran the ``CollectMetricsExec`` node would update one buffer slot per figure and row: step 3
   spares them).
2. After the micro-batch's steps committed (still inside the ``foreachBatch`` call, which a
   classic session runs on the driver), :class:`ProgressPublisher` finds that node in the
   query's current execution, resets its accumulator and merges one aggregation buffer of
   figures into it (``mergeBuffer``: an interpreted projection; ``add`` would generate and
   compile the accumulator's update code anew for every micro-batch's accumulator).
   Spark then reports them as ``observedMetrics["streamstate"]`` in the micro-batch's progress:
   ``query.last_progress``, ``recent_progress``, every ``StreamingQueryListener`` and the UI.
3. The micro-batch's own jobs read its input past that node
   (:meth:`ProgressPublisher.unobserved`): Spark hands ``foreachBatch`` the micro-batch's
   executed plan as an RDD (a ``LogicalRDD`` over ``SQLExecutionRDD``), whose top is the node's
   ``mapPartitions``; its parent RDD is the same scan without the node. The node's buffer is
   set in step 2 anyway, so no task needs to update it, and each task that did paid a fixed
   15-30 ms (its accumulator, the update code for every figure) besides the per-row updates:
   10-20% of a pre-aggregated window query's events/s (bench/spark_windows.py). Spark's own
   figures are unchanged: the scan below is the micro-batch's own, whose metrics give
   ``numInputRows``.

Spark Connect runs ``foreachBatch`` in a Python process of the server that has no handle on the
JVM: the client's
:attr:`~streamstate.spark.driver.query.streaming.KeyedStreamingQuery.last_progress` and
``recent_progress`` add the figures the server reported (:func:`with_state_figures`); Spark's
own progress events (listeners, the UI) carry none there.

The figures themselves (their names, and how a micro-batch's are made from its steps') are in
:mod:`streamstate.spark.driver.monitor.figures`; docs/spark/monitoring.md lists them all.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from streamstate.spark.driver.monitor.figures import FIGURES, micro_batch_figures

__all__ = [
    "OBSERVATION",
    "ProgressPublisher",
    "observe_state",
    "unsafe_row_bytes",
    "with_state_figures",
]

log = logging.getLogger(__name__)

#: the name of the observation in ``observedMetrics``
OBSERVATION = "streamstate"


def observe_state(df: Any) -> Any:
    """``df`` with the ``streamstate`` observation (see the module docstring); the same
    columns."""
    from pyspark.sql import functions

    from streamstate.spark.driver.session import is_connect

    exprs = [f"max(CAST(NULL AS BIGINT)) AS `{name}`" for name in FIGURES]
    if is_connect(df):  # Columns are built in the client
        return df.observe(OBSERVATION, *[functions.expr(e) for e in exprs])
    # a classic session builds each Column in the JVM: one round trip per figure through the
    # functions object looked up once, where PySpark's Column API makes four (0.1-0.3 s of a
    # query's start)
    from pyspark.sql.classic.column import Column

    jfunctions = getattr(df.sparkSession._jvm, "org.apache.spark.sql.functions")
    return df.observe(OBSERVATION, *[Column(jfunctions.expr(e)) for e in exprs])


class ProgressPublisher:
    """Sets the ``streamstate`` observation of a classic session's running query to a micro-batch's
    figures (see the module docstring). Publishing never fails a micro-batch: a failure (a Spark
    version whose internals differ) is logged once as a warning, and the figures stay in
    ``query.batches``."""

    def __init__(self) -> None:
        #: the query's ``StreamExecution`` (JVM), found once
        self._execution: tuple[str, Any] | None = None
        #: the JVM classes used at every micro-batch (each lookup is a round trip)
        self._classes: tuple[Any, Any] | None = None
        #: the observation's pre-order number in the last plan (the same in every micro-batch
        #: of a query)
        self._number: int | None = None
        #: an UnsafeRow of the observation's aggregation buffer (one ``long`` per figure)
        self._row: Any = None
        #: the micro-batch's plan was not as :meth:`unobserved` expects (Spark's structure does
        #: not change within a query run): its jobs read through the node from then on
        self._read_through = False
        self._warned = False

    def publish(self, spark: Any, query_id: str, figures: dict[str, int | None]) -> bool:
        """Returns whether Spark's progress of the running micro-batch will carry ``figures``.
        Ten py4j calls (0.1-2 ms each, by the driver's load), a few more at a query's first
        micro-batch."""
        try:
            self._publish(spark, query_id, figures)
            return True
        except Exception as exc:
            if not self._warned:
                self._warned = True
                log.warning(
                    "cannot put the state figures into Spark's progress of query %s (they stay "
                    "in query.batches): %s",
                    query_id,
                    _reason(exc),
                )
            return False

    def unobserved(self, df: Any) -> Any:
        """The ``foreachBatch`` DataFrame ``df`` of a classic session read past the observation
        (the module docstring, step 3): the same rows from the same scan. ``df`` itself where
        its plan is not as expected (logged, and not looked at again: the jobs then update the
        observation too). About eight py4j calls."""
        if self._read_through:
            return df
        try:
            node = df._jdf.logicalPlan()
            if node.getClass().getSimpleName() != "LogicalRDD":
                raise LookupError(f"the micro-batch's input is a {node.nodeName()}")
            rdd = node.rdd()
            if rdd.getClass().getSimpleName() == "SQLExecutionRDD":
                rdd = rdd.sqlRDD()
            scope = rdd.scope()
            # the RDDs a plan node makes carry its name as their scope
            if scope.isEmpty() or scope.get().name() != "CollectMetrics":
                raise LookupError("the micro-batch's plan does not end with the observation")
            dependencies = rdd.dependencies()
            if dependencies.size() != 1:
                raise LookupError("the observation's RDD has more than one parent")
            session = df.sparkSession
            scan = session._jsparkSession.internalCreateDataFrame(
                dependencies.head().rdd(), df._jdf.schema(), False
            )
        except Exception as exc:
            self._read_through = True
            log.warning(
                "the micro-batch's jobs read their input through the state figures' "
                "observation (it costs each task a little): %s",
                _reason(exc),
            )
            return df
        from pyspark.sql.classic.dataframe import DataFrame

        return DataFrame(scan, session)

    def _publish(self, spark: Any, query_id: str, figures: dict[str, int | None]) -> None:
        if self._execution is None or self._execution[0] != query_id:
            query = spark._jsparkSession.streams().get(query_id)
            if query is None:
                raise LookupError(f"no active query {query_id}")
            self._execution = (query_id, query.streamingQuery())
            self._number = None
        if self._classes is None:
            from py4j.java_gateway import JavaClass

            # by name, without a round trip per package (``jvm.org.apache...`` asks the JVM
            # at every dot)
            client = spark._jvm._gateway_client
            self._classes = (
                JavaClass("org.apache.spark.util.AccumulatorContext", client),
                JavaClass("org.apache.spark.sql.catalyst.expressions.UnsafeRow", client),
            )
        accumulators, unsafe_row = self._classes
        execution = self._execution[1].lastExecution()
        if execution is None:
            raise LookupError("the query has no current execution")
        node = self._find(execution.executedPlan())
        accumulator = accumulators.get(node.accumulatorId()).get()
        data = unsafe_row_bytes([figures.get(name) for name in FIGURES])
        if self._row is None:
            self._row = unsafe_row(len(FIGURES))
        self._row.pointTo(bytearray(data), len(data))
        # the reset clears what the tasks' attempts merged. Not the node's resetMetrics(): it
        # also resets every node below it, and Spark's numInputRows (read from the scan's
        # metrics) would become 0. Each max(null)'s buffer is one long, so the row of figures
        # is the whole buffer, and a max merged into an empty buffer is the value merged
        # (mergeBuffer: protected in Scala, public in the class file). Then what add() does on
        # the driver: Spark reports a value the driver set over what the tasks' last attempts
        # gave (LastAttemptAggregatingAccumulator)
        accumulator.reset()
        accumulator.mergeBuffer(self._row)
        accumulator.setValueIfOnDriverSide(accumulator.value().copy())

    def _find(self, plan: Any) -> Any:
        """The ``CollectMetricsExec`` named ``streamstate``: at the last plan's number if it is
        there (a query plans the same tree at every micro-batch), else by a walk of the plan's
        nodes in pre-order (``TreeNode.p(n)``)."""
        if self._number is not None:
            node = plan.p(self._number)
            if _is_observation(node):
                return node
        number = 0
        while True:
            node = plan.p(number)
            if node is None:
                raise LookupError(
                    f"the query's plan has no observation named {OBSERVATION!r} "
                    "(CollectMetricsExec)"
                )
            if _is_observation(node):
                self._number = number
                return node
            number += 1


def unsafe_row_bytes(values: Sequence[int | None]) -> bytes:
    """Spark's ``UnsafeRow`` of ``long`` fields (None: null): a null bit set of 64-bit words,
    then one 8-byte slot per field. One byte array crosses to the JVM instead of a call per
    field.

    >>> unsafe_row_bytes([None, 5]).hex()
    '010000000000000000000000000000000500000000000000'
    """
    import struct

    words = [0] * ((len(values) + 63) // 64)
    slots = []
    for i, v in enumerate(values):
        if v is None:
            words[i // 64] |= 1 << (i % 64)
            slots.append(0)
        else:
            slots.append(int(v))
    # Spark's Platform writes in the machine's order (little-endian on every platform it runs)
    return struct.pack(f"<{len(words)}Q{len(slots)}q", *words, *slots)


def _reason(exc: BaseException) -> str:
    """The first line of what ``exc`` says (a py4j error carries a Java trace after it)."""
    text = str(exc)
    return text.splitlines()[0][:500] if text else repr(exc)


def _is_observation(node: Any) -> bool:
    return node is not None and node.nodeName() == "CollectMetrics" and node.name() == OBSERVATION


def with_state_figures(progress: Any, batches: Sequence[dict[str, Any]]) -> Any:
    """Spark Connect client: ``progress`` (a ``StreamingQueryProgress``, a dict) with
    ``observedMetrics["streamstate"]`` from the steps the server reported for its micro-batch
    (``batches``: ``query.batches``); unchanged if it has them already or none ran."""
    if progress is None:
        return None
    observed = progress.get("observedMetrics")
    if observed is None:
        observed = progress["observedMetrics"] = {}
    if OBSERVATION in observed:
        return progress
    batch_id = progress.get("batchId")
    steps = [
        b["state"]
        for b in batches
        if b.get("batch") == batch_id and not b.get("idle") and b.get("state") is not None
    ]
    figures = micro_batch_figures(steps)
    if figures is not None:
        from pyspark.sql import Row

        observed[OBSERVATION] = Row(**{name: figures.get(name) for name in FIGURES})
    return progress
