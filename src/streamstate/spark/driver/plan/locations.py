"""Where Spark keeps a streaming query's own checkpoint (offset and commit logs).

By default ``<checkpoint>/spark``, next to the state checkpoint; ``write_stream(...,
spark_checkpoint=...)`` puts it elsewhere, e.g. a local or HDFS path when the state checkpoint
is on an object store Spark has no Hadoop connector for (``s3a://`` needs ``hadoop-aws``).
"""

from __future__ import annotations

import os
from typing import Any

from streamstate.spark.driver.session import is_connect
from streamstate.spark.driver.sinks import spark_readable

__all__ = ["spark_checkpoint_location"]


def spark_checkpoint_location(
    spark: Any, default: str, given: str | None, state_checkpoint: str
) -> str:
    """The location of Spark's streaming checkpoint as Spark reads it: ``given`` (made
    absolute) or ``default``; a ValueError naming the setting if Hadoop has no filesystem for
    its scheme (``s3a://`` needs the ``hadoop-aws`` jar) or if it is the state checkpoint
    directory itself."""
    if given is not None:
        if not isinstance(given, str) or not given.strip():
            raise ValueError(f"spark_checkpoint must be a path or URL, got {given!r}")
        location = given if "://" in given else os.path.abspath(given)
        if location.rstrip("/") == state_checkpoint.rstrip("/"):
            raise ValueError(
                f"spark_checkpoint={given!r} is the state checkpoint directory itself; give "
                f"Spark its own directory (the default is {default})"
            )
    else:
        location = default
    location = spark_readable(location)
    scheme = location.split("://", 1)[0] if "://" in location else "file"
    if scheme != "file" and not is_connect(spark):  # Connect: no py4j, the server checks
        try:
            jvm = spark.sparkContext._jvm
            conf = spark.sparkContext._jsc.hadoopConfiguration()
            jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass(scheme, conf)
        except Exception as exc:
            what = "spark_checkpoint" if given is not None else "the default spark_checkpoint"
            raise ValueError(
                f"Spark cannot write its streaming checkpoint to {location} ({what}): Hadoop "
                f"has no filesystem for {scheme}:// ({str(exc).splitlines()[0][:200]}). Add the "
                "connector (for s3a:// the hadoop-aws jar matching Spark's Hadoop) or pass "
                "write_stream(..., spark_checkpoint=<a local or HDFS path>)"
            ) from None
    return location
