"""Reading checkpoints offline: state as a Spark data source.

The formats ``streamstate`` and ``streamstate-metadata`` (:mod:`.source`) read a checkpoint or
savepoint without the program that wrote it, in Spark's Python workers:

* :mod:`.options`: the formats' options, read once;
* :mod:`.catalog`: what a checkpoint holds (operators, states), from metadata and file headers;
* :mod:`.plan`: what one read reads, its partitions, a filter on ``key``, a change feed's steps;
* :mod:`.entries`: one state's entries key group by key group, decoded without the program;
* :mod:`.layout`, :mod:`.spark_types`: entries as columns, values as Spark types;
* :mod:`.keyed_rows`, :mod:`.changes`, :mod:`.operator_rows`, :mod:`.metadata`: the rows of
  each kind of read.
"""
