"""The state host: the long-lived process per subtask that keeps its keyed state hot between
micro-batches, with its front door (handshakes, refusals).

Imports only the modules shared by every process (:mod:`streamstate.spark.wire` and the
top-level modules of :mod:`streamstate.spark`), never the driver's or a task's. The map of
``spark/`` by process is in ``docs/architecture.md``.
"""
