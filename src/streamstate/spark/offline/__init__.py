"""Checkpoints outside a running query: state as a Spark data source, and savepoint rewrites.

The formats ``streamstate`` and ``streamstate-metadata`` (``source.py``) read a checkpoint or
savepoint without the program that wrote it, in Spark's Python workers:

* ``options.py``: the formats' options, read once;
* ``catalog.py``: what a checkpoint holds (operators, states), from metadata and file headers;
* ``plan.py``: what one read reads, its partitions, a filter on ``key``, a change feed's steps;
* ``entries.py``: one state's entries key group by key group, decoded without the program;
* ``layout.py``, ``spark_types.py``: entries as columns, values as Spark types;
* ``keyed_rows.py``, ``changes.py``, ``operator_rows.py``, ``metadata.py``: the rows of
  each kind of read.

On the driver, ``rewrite.py`` (``rewrite_savepoint``) writes a new savepoint with states
replaced from DataFrames, renamed, dropped or re-keyed.
"""
