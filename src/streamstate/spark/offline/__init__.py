"""Offline tools on checkpoints, outside any running query: the state of a checkpoint or
savepoint as a DataFrame (``read_state``), a savepoint rewritten with states replaced from
DataFrames (``rewrite_savepoint``), and the rollback of a streaming job to an earlier checkpoint
(``streamstate checkpoints rollback``). They take of the driver only its base (the session, the
workers' Python, the sinks, Spark's checkpoint); the map of ``spark/`` is in
``docs/architecture.md``.
"""
