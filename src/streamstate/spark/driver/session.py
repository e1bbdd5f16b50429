"""What streamstate asks of a SparkSession, for both kinds: classic (py4j, ``sparkContext``) and
Spark Connect (a gRPC client; no ``sparkContext``, no RDDs).

Every driver-side question goes through here, so the rest of the runtime never touches
``sparkContext`` directly:

* :func:`is_connect`: is this a Spark Connect client session?
* :func:`master`: the master URL (Connect: the server's ``spark.master`` conf, or None).
* :func:`default_parallelism`: the ``parallelism`` of a ``keyed_process`` that gives none.
  Classic: ``sparkContext.defaultParallelism``. Connect: ``spark.default.parallelism`` if the
  server sets it, else ``N`` of a ``local[N]``/``local[N,F]`` master, else
  ``spark.sql.shuffle.partitions``.
* :func:`conf`: a Spark conf value, or a default.
* :func:`functions_for`: ``pyspark.sql.functions`` for the session's kind.
* :func:`parse_ddl`: a DDL string as a StructType (Connect: parsed by the server).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = [
    "conf",
    "default_parallelism",
    "functions_for",
    "is_connect",
    "is_local",
    "master",
    "parse_ddl",
]


def is_connect(spark: Any) -> bool:
    """True if ``spark`` is a Spark Connect client session (or a DataFrame of one). Checked by
    module so that a classic-only install never imports the Connect client (grpc)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def conf(spark: Any, name: str, default: str | None = None) -> str | None:
    """The session's value of ``name``, else ``default`` (both session kinds)."""
    try:
        value = spark.conf.get(name, None)
    except Exception:
        # Connect raises for a conf the server does not know and has no default for
        return default
    return default if value is None else str(value)


def master(spark: Any) -> str | None:
    """The master URL: ``sparkContext.master``, or a Connect server's ``spark.master``."""
    if not is_connect(spark):
        return str(spark.sparkContext.master)
    return conf(spark, "spark.master")


def is_local(spark: Any) -> bool:
    """True if the session's master is ``local``/``local[...]`` (its executors are threads of
    the driver's JVM, on this machine for classic, on the Connect server's for Connect)."""
    return (master(spark) or "").startswith("local")


_LOCAL = re.compile(r"local\[(\d+)(?:,\s*\d+)?\]$")


def default_parallelism(spark: Any) -> int:
    """Spark's default parallelism (see the module docstring for Connect)."""
    if not is_connect(spark):
        return int(spark.sparkContext.defaultParallelism)
    configured = conf(spark, "spark.default.parallelism")
    if configured:
        return int(configured)
    url = master(spark) or ""
    if url == "local":
        return 1
    found = _LOCAL.match(url)
    if found:
        return int(found.group(1))
    return int(conf(spark, "spark.sql.shuffle.partitions", "200") or 200)


def parse_ddl(spark: Any, ddl: str) -> Any:
    """``ddl`` (``"a string, n long"``) as a StructType. Classic parses through the JVM of the
    active context; a Connect client has none, so the server parses it."""
    from pyspark.sql.types import StructType

    if not is_connect(spark):
        return StructType.fromDDL(ddl)
    return spark.createDataFrame([], ddl).schema


def functions_for(spark: Any) -> Any:
    """The ``functions`` module that builds Columns for ``spark`` (a session or DataFrame).
    ``pyspark.sql.functions`` picks its kind from the process (``SPARK_CONNECT_MODE_ENABLED``),
    which is wrong for a Connect session in a process that also runs a classic one."""
    if is_connect(spark):
        from pyspark.sql.connect import functions

        return functions
    from pyspark.sql import functions as classic

    return classic
