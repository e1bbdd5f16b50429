"""The Spark driver's side of a keyed operator, by the life of a micro-batch.

* the modules here: what every part of the driver (and the offline tools) uses: the session's
  kind (``session``), a classic session's Columns built once per JVM (``jvm_columns``), the
  workers' Python (``environment``), the sinks (``sinks``), the
  interfaces through which a query and its micro-batches learn of each other (``reports``), and
  Spark's own checkpoint: where it is and what its logs say (``spark_checkpoint``);
* ``plan/``: what is planned once, when a job starts;
* ``monitor/``: what is measured, and the figures made of it;
* ``step/``: what runs per micro-batch (plan, tasks, commit, delivery, no-data steps, hosts);
* ``query/``: the public API (``keyed_process``, the streaming query) and its start.

Runs in the process that holds the ``SparkSession`` (the user's program, or the client of a
Spark Connect server; a Connect query's steps run in a Python process of the server). It may
import :mod:`streamstate.spark.task` (the functions it hands to ``mapInArrow``) and the modules
shared by every process; nothing below imports it. The map of ``spark/`` by process is in
``docs/architecture.md``.
"""
