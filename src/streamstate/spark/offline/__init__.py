"""Offline tools on checkpoints, outside any running query: state as a Spark data source,
savepoint rewrites and the rollback of a streaming job.

The formats ``streamstate`` and ``streamstate-metadata`` (``source.py``) read a checkpoint or
savepoint without the program that wrote it, in Spark's Python workers:

* ``options.py``: the formats' options, read once;
* ``catalog.py``: what a checkpoint holds (operators, states), from metadata and file headers;
* ``plan.py``: what one read reads, its partitions, a filter on ``key``, a change feed's steps;
* ``entries.py``: one state's entries key group by key group, decoded without the program;
* ``layout.py``, ``spark_types.py``: entries as columns, values as Spark types;
* ``keyed_rows.py``, ``changes.py``, ``operator_rows.py``, ``metadata.py``: the rows of
  each kind of read.

On the driver: ``reader.py`` (``register`` puts the formats in a session, ``read_state`` is
the shortcut of one read), ``rewrite.py`` (``rewrite_savepoint``: a new savepoint with states
replaced from DataFrames, renamed, dropped or re-keyed) and ``rollback.py`` (``streamstate
checkpoints rollback``). They take of the driver only its base (the session, the workers'
Python, the sinks, Spark's checkpoint); the query API (``keyed_process``) registers the
formats. The map of ``spark/`` is in ``docs/architecture.md``.
"""
