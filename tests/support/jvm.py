"""JVM options of the Spark processes the tests start (the local session, the Spark Connect
server, child drivers, the standalone clusters' daemons and executors).

The tests' JVMs live for seconds to minutes and run small batches: C2's compilations (and G1's
parallel threads) cost them more CPU than they save. With the client compiler only and the
serial collector a local session's start took about half the CPU (11 s instead of 23 s) and
its first small queries too (9 s instead of 19 s), on a machine whose two cores the two pytest
workers share. Behaviour is the same; only the JIT and the collector differ."""

from __future__ import annotations

__all__ = ["JAVA_OPTIONS", "spark_java_conf"]

#: C1 only (no C2 compile threads), the serial collector
JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def spark_java_conf() -> dict[str, str]:
    """Spark settings that start a driver (and a cluster's executors) with :data:`JAVA_OPTIONS`
    (set before the driver's JVM starts: a builder's config, ``--conf`` of spark-submit)."""
    return {
        "spark.driver.extraJavaOptions": JAVA_OPTIONS,
        "spark.executor.extraJavaOptions": JAVA_OPTIONS,
    }
