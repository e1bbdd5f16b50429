"""The Spark driver's side of a keyed operator: query lifecycle, planning, commit, the state
host fleet, Spark Connect support, rollback, progress and no-data scheduling.

Runs in the process that holds the ``SparkSession`` (the user's program, or the client of a
Spark Connect server). It may import :mod:`streamstate.spark.task` (the functions it hands to
``mapInArrow``) and the modules shared by every process; nothing below imports it. The map of
``spark/`` by process is in ``docs/architecture.md``.
"""
