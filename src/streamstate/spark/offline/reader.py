"""Reading state out of a checkpoint or savepoint as a Spark DataFrame, on the driver.

The state formats themselves (``streamstate``, ``streamstate-metadata``) are in
:mod:`streamstate.spark.offline`; here is what a driver calls: :func:`register` puts them in a
session, and :func:`read_state` is the shortcut of one ``spark.read.format("streamstate")``.
Like Flink's State Processor API and Spark's ``statestore`` data source.
"""

from __future__ import annotations

import weakref
from typing import Any

__all__ = ["FILTER_PUSHDOWN_CONF", "read_state", "register"]

FILTER_PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
"""Spark's switch for Python data sources that take filters; :func:`register` turns it on
unless the session set it."""

#: the sessions the formats were registered in (classic and Spark Connect sessions alike: a
#: Connect session's registration lives in its session on the server)
_REGISTERED: weakref.WeakSet[Any] = weakref.WeakSet()


def register(spark: Any) -> None:
    """Register the formats ``"streamstate"`` and ``"streamstate-metadata"`` in the session
    ``spark`` (classic or Spark Connect). Calling it again does nothing.

    A filter on ``key`` narrows a read to the key groups that can hold the keys; Spark hands a
    Python data source its filters only with ``spark.sql.python.filterPushdown.enabled``, which
    this turns on unless the session set it (set to ``false``, reads are the same, unnarrowed).
    """
    from streamstate.spark.driver.environment import ensure_worker_path
    from streamstate.spark.offline.source import (
        StateDataSource,
        StateMetadataDataSource,
        UnfilteredStateDataSource,
    )

    if spark in _REGISTERED:
        return
    # the formats' Python workers import streamstate (a source checkout is not installed)
    ensure_worker_path(spark)
    setting = spark.conf.get(FILTER_PUSHDOWN_CONF, None)
    if setting is None:
        spark.conf.set(FILTER_PUSHDOWN_CONF, "true")
    filtered = setting is None or str(setting).lower() == "true"
    spark.dataSource.register(StateDataSource if filtered else UnfilteredStateDataSource)
    spark.dataSource.register(StateMetadataDataSource)
    _REGISTERED.add(spark)


def read_state(
    spark: Any,
    path: str,
    *,
    state: str,
    operator: str = "keyed-process",
    storage_options: dict[str, Any] | None = None,
    include_expired: bool = False,
    now: int | None = None,
) -> Any:
    """The entries of keyed state ``state`` of ``operator`` as a DataFrame ``(key, namespace,
    value)``, or the timers of a timer pseudo-state as ``(key, namespace, timestamp,
    time_domain)``: ``spark.read.format("streamstate")`` with these options
    (docs/checkpoints/state-source.md).

    Parameters:
        path: a job's checkpoint directory (its latest complete checkpoint is read), a
            ``chk-<id>`` directory, or a savepoint directory.
        state: a state name, or a timer pseudo-state ``_timers.<service>.<event|processing>``
            (a function's own timers are ``_timers.user.event`` and
            ``_timers.user.processing``; ``streamstate checkpoints inspect`` lists them).
        operator: the operator's name (``keyed_process(operator_name=...)``).
        storage_options: fsspec options of the checkpoint storage.
        include_expired: a state with time-to-live: keep the entries expired at ``now`` and add
            a ``last_access`` column (ms; per element for a list, per mapping for a map).
            Without it expired entries are left out, as the function would not read them.
        now: the processing time (ms) against which TTL expiry is judged (default: this
            driver's clock when ``read_state`` is called).

    Records are structs (no class of the job is needed: they are read from the checkpoint's
    own description of them). The checkpoint and the state are looked up here, on the driver:
    an unknown ``state`` raises :class:`~streamstate.errors.CheckpointError` listing every
    readable name.
    """
    import json
    import os

    from streamstate.spark.offline.options import read_options
    from streamstate.spark.offline.plan import plan_read
    from streamstate.spark.offline.source import STATE_FORMAT, output_struct

    if "://" not in path:
        path = os.path.abspath(path)  # the read is planned again in other processes
    options = {"path": path, "state": state, "operator": operator}
    if storage_options:
        options["storageOptions"] = json.dumps(storage_options)
    if include_expired:
        options["includeExpired"] = "true"
    plan = plan_read(read_options(options))
    # one `now` for the plan here and the tasks, so the columns and the rows agree
    options["now"] = str(plan.now)
    register(spark)
    reader = spark.read.format(STATE_FORMAT).schema(output_struct(plan))
    path_option = options.pop("path")
    return reader.options(**options).load(path_option)
