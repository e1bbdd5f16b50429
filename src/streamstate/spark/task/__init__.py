"""What runs inside a Spark task (an executor's Python worker): the ``mapInArrow`` functions,
batch execution's in-task subtask, and the client that streams a micro-batch to its state host.

Imports only the modules shared by every process (:mod:`streamstate.spark.wire` and the
top-level modules of :mod:`streamstate.spark`), never the driver's or the host's. The map of
``spark/`` by process is in ``docs/architecture.md``.
"""
