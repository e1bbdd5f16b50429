"""JVM options of the Spark processes the tests start (the local session, the Spark Connect
server, child drivers, the standalone clusters' daemons and executors).

The tests' JVMs live for seconds to minutes and run small batches: C2's compilations (and G1's
parallel threads) cost them more CPU than they save. With the client compiler only and the
serial collector a local session's start took about half the CPU (11 s instead of 23 s) and
its first small queries too (9 s instead of 19 s), on a machine whose two cores the two pytest
workers share. Behaviour is the same; only the JIT and the collector differ.

Class-data sharing: every one of these JVMs loads and verifies the same ~15k classes of Spark's
jars. ``python tests/support/jvm.py`` (``make test`` runs it before the Spark tests) runs a small
Spark job once with ``-XX:ArchiveClassesAtExit`` and keeps the archive in the virtualenv, keyed
by the JDK, the jars and :data:`BASE_OPTIONS`; while it exists, :data:`JAVA_OPTIONS` maps it
(``-XX:SharedArchiveFile``): a local session's start and first query took 10 s of CPU instead
of 19 s. A JVM whose class path or JDK does not match the archive runs without it (the JVM's
warning is silenced); nothing else differs. ``STREAMSTATE_TEST_CDS=0`` runs them without it
(to compare)."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time

__all__ = ["BASE_OPTIONS", "CDS_ARCHIVE", "JAVA_OPTIONS", "create_cds_archive", "spark_java_conf"]

#: C1 only (no C2 compile threads), the serial collector
BASE_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def _archive_path() -> str:
    """Where the class-data archive of this virtualenv's Spark and this JDK lives: its name
    changes with the jars (names, sizes, times), the ``java`` on PATH and the options."""
    key = hashlib.sha256(BASE_OPTIONS.encode())
    java = (
        shutil.which("java", path=os.path.join(os.environ["JAVA_HOME"], "bin"))
        if (os.environ.get("JAVA_HOME"))
        else shutil.which("java")
    )
    key.update(os.path.realpath(java or "").encode())
    spec = importlib.util.find_spec("pyspark")  # found, not imported (the fast tier's import)
    try:
        jars = os.path.join(os.path.dirname(spec.origin or "") if spec else "", "jars")
        for name in sorted(os.listdir(jars)):
            st = os.stat(os.path.join(jars, name))
            key.update(f"{name} {st.st_size} {st.st_mtime_ns}\n".encode())
    except OSError:
        key.update(b"no pyspark")
    return os.path.join(sys.prefix, "jvm-cds", f"spark-{key.hexdigest()[:16]}.jsa")


#: the class-data archive :func:`create_cds_archive` writes (used while it exists)
CDS_ARCHIVE = _archive_path()

#: :data:`BASE_OPTIONS`, and the class-data archive where there is one
JAVA_OPTIONS = BASE_OPTIONS + (
    f" -XX:SharedArchiveFile={CDS_ARCHIVE} -Xlog:cds=off,cds+dynamic=off"
    if os.path.exists(CDS_ARCHIVE) and os.environ.get("STREAMSTATE_TEST_CDS") != "0"
    else ""
)


def spark_java_conf() -> dict[str, str]:
    """Spark settings that start a driver (and a cluster's executors) with :data:`JAVA_OPTIONS`
    (set before the driver's JVM starts: a builder's config, ``--conf`` of spark-submit)."""
    return {
        "spark.driver.extraJavaOptions": JAVA_OPTIONS,
        "spark.executor.extraJavaOptions": JAVA_OPTIONS,
    }


#: what the archiving JVM runs: a local session, Parquet files written and read, a shuffle, Arrow
#: batches to a Python worker and back, a streaming query with foreachBatch (the classes the
#: tests' JVMs load first; without the streaming query and the Python worker the archive cost
#: 74 s of CPU to write instead of 87 s, but held fewer of the classes every test loads)
_WORKLOAD = """
import sys, tempfile
from pyspark.sql import SparkSession
d = tempfile.mkdtemp()
s = (SparkSession.builder.master("local[2]").appName("cds")
     .config("spark.driver.extraJavaOptions", sys.argv[1])
     .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
     .config("spark.sql.shuffle.partitions", "2").getOrCreate())
s.range(2000).selectExpr("cast(id % 50 as string) as user", "id as v").write.parquet(d + "/in")
df = s.readStream.schema("user string, v long").option("maxFilesPerTrigger", 1).parquet(d + "/in")
df = df.groupBy("user").count().mapInArrow(lambda it: it, "user string, count long")
q = (df.writeStream.outputMode("complete").option("checkpointLocation", d + "/ck")
     .foreachBatch(lambda b, i: b.write.mode("append").parquet(d + "/out"))
     .trigger(availableNow=True).start())
q.awaitTermination()
s.read.parquet(d + "/out").groupBy("user").count().collect()
jvm = s.sparkContext._gateway.proc  # spark-submit execs the JVM: this is its process
s.stop()
jvm.stdin.close()  # the JVM exits at the end of its input, writing the archive
jvm.wait(timeout=300)
"""


def create_cds_archive(timeout: float = 600) -> bool:
    """Write :data:`CDS_ARCHIVE` unless it exists (one JVM running a small Spark job and
    archiving the classes it loaded at its exit). True when the archive exists after it."""
    if os.path.exists(CDS_ARCHIVE):
        return True
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return False
    os.makedirs(os.path.dirname(CDS_ARCHIVE), exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".jsa", dir=os.path.dirname(CDS_ARCHIVE))
    os.close(fd)
    os.unlink(tmp)  # the JVM writes it at its exit
    options = f"{BASE_OPTIONS} -XX:ArchiveClassesAtExit={tmp} -Xlog:cds=off,cds+dynamic=off"
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    try:
        subprocess.run(
            [sys.executable, "-c", _WORKLOAD, options],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
            check=True,
        )
        if not os.path.exists(tmp):
            return False
        os.replace(tmp, CDS_ARCHIVE)
        for name in os.listdir(os.path.dirname(CDS_ARCHIVE)):  # those of earlier jars or JDKs
            if name.startswith("spark-") and name != os.path.basename(CDS_ARCHIVE):
                os.unlink(os.path.join(os.path.dirname(CDS_ARCHIVE), name))
        return True
    except (subprocess.SubprocessError, OSError):
        return False
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


if __name__ == "__main__":
    t0 = time.monotonic()
    made = create_cds_archive()
    print(
        f"JVM class-data archive: {CDS_ARCHIVE if made else 'not created'}"
        f" ({time.monotonic() - t0:.0f} s)"
    )
