"""Which Python Spark's workers run, and whether it can run streamstate.

PySpark starts its Python workers with ``PYSPARK_PYTHON`` (read when the ``SparkContext``
starts; ``spark.pyspark.python`` for ``spark-submit``), and without it with ``python3`` from
``PATH`` — not the interpreter of the driver. A driver started as ``.venv/bin/python job.py``
without activating the virtualenv therefore gets workers without ``pyarrow`` and fails deep
inside a worker, behind some 200 lines of Java and Python traces. :func:`check_worker_python`
finds this before the first job: on a local master (where the workers run on this machine) it
asks the worker interpreter, once per driver process, to import what streamstate needs, and
raises :class:`WorkerPythonError` naming the interpreter, what it lacks and ``PYSPARK_PYTHON``.
On a cluster the executors' Python cannot be checked from here (docs/spark/clusters.md, "Executors
need the Python side").

Through Spark Connect the workers (and a streaming query's ``foreachBatch`` process) run the
*server's* Python: a server started with ``sbin/start-connect-server.sh`` and no
``PYSPARK_PYTHON`` runs ``python3`` from its ``PATH``. :func:`check_connect_server_python` asks
it, once per client session, with one small Python UDF job that imports what streamstate needs
and reports the interpreter, and raises the same :class:`WorkerPythonError`.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import weakref
from typing import Any

from streamstate.errors import StreamStateError
from streamstate.spark.driver.session import is_connect
from streamstate.spark.job import src_path

__all__ = [
    "WORKER_MODULES",
    "WorkerPythonError",
    "check_connect_server_python",
    "check_worker_python",
    "ensure_worker_path",
]

#: what a worker (and the state hosts it starts) imports
WORKER_MODULES = (
    "pyarrow",
    "msgspec",
    "cloudpickle",
    "numpy",
    "fsspec",
    "lz4",
    "zstandard",
    "google_crc32c",
    "streamstate",
)


class WorkerPythonError(StreamStateError, RuntimeError):
    """Spark's Python workers run an interpreter that cannot run streamstate."""


def check_worker_python(spark: Any, pythonpath: str = "") -> None:
    """Raise :class:`WorkerPythonError` if the Python that Spark's workers run on this machine
    cannot import what streamstate needs (local masters only; cached per interpreter)."""
    if is_connect(spark):
        check_connect_server_python(spark)  # the workers run on the server, with its Python
        return
    sc = spark.sparkContext
    if not str(sc.master).startswith("local"):
        return
    configured = _configured_python(sc)
    python = configured or sc.pythonExec
    problem = _problem(python, pythonpath)
    if problem is None:
        return
    if configured:
        source = "spark.pyspark.python"
    elif os.environ.get("PYSPARK_PYTHON"):
        source = "PYSPARK_PYTHON"
    else:
        source = "PYSPARK_PYTHON is not set, so Spark runs python3 from PATH"
    raise WorkerPythonError(
        f"Spark's Python workers run {python!r} ({source}), which {problem}; this driver runs "
        f"{sys.executable}. Set PYSPARK_PYTHON={sys.executable} (and PYSPARK_DRIVER_PYTHON) "
        "before the SparkSession starts, or activate the virtualenv that has streamstate"
    )


#: SparkContext -> its ``spark.pyspark.python`` (None: not set)
_CONFIGURED_PYTHON: weakref.WeakKeyDictionary[Any, str | None] = weakref.WeakKeyDictionary()


def _configured_python(sc: Any) -> str | None:
    """``spark.pyspark.python`` of the running context ``sc``, asked once per context (a
    context's settings are fixed when it starts: setting it later changes no worker). One key
    through the context's own conf: getConf() copies every entry through py4j, a round trip
    each."""
    try:
        return _CONFIGURED_PYTHON[sc]
    except KeyError:
        configured: str | None = sc._conf.get("spark.pyspark.python", None)
        _CONFIGURED_PYTHON[sc] = configured
        return configured


@functools.lru_cache(maxsize=8)
def _problem(python: str, pythonpath: str) -> str | None:
    """What is wrong with ``python`` as a worker interpreter, or None."""
    path = shutil.which(python)
    if path is None:
        return "cannot be found"
    if os.path.abspath(path) == os.path.abspath(sys.executable):
        return None  # the driver's own interpreter (not resolving symlinks: a venv's python
        # is a link to a system interpreter that lacks the venv's packages)
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH")) if p)
    code = "import " + ", ".join(WORKER_MODULES)
    try:
        done = subprocess.run(
            [path, "-c", code], env=env, capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot be started ({exc})"
    if done.returncode == 0:
        return None
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return f"cannot import what streamstate needs ({lines[-1] if lines else done.returncode})"


#: the probe a Connect server's Python worker runs: source compiled as ``__main__`` so that
#: cloudpickle ships it by value (the server may not have streamstate to import it from)
_PROBE_SOURCE = """
def probe(_, modules=MODULES):
    import importlib, json, os, sys
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:
            missing.append([name, type(exc).__name__ + ": " + str(exc)])
    return json.dumps({"python": sys.executable, "missing": missing,
                       "pyspark_python": os.environ.get("PYSPARK_PYTHON")})
"""

#: what Spark Connect says when a Python worker of the server could not start at all
_WORKER_DID_NOT_START = (
    "failed to connect back",
    "Python worker exited unexpectedly",
    "PYTHON_WORKER_",
    "ModuleNotFoundError",
)

#: Connect client sessions already checked (by session id)
_CHECKED_SESSIONS: set[str] = set()


def _probe_function() -> Any:
    namespace: dict[str, Any] = {"__name__": "__main__"}
    source = _PROBE_SOURCE.replace("MODULES", repr(WORKER_MODULES))
    exec(compile(source, "<streamstate worker probe>", "exec"), namespace)
    return namespace["probe"]


def check_connect_server_python(spark: Any) -> None:
    """Raise :class:`WorkerPythonError` if the Python that a Spark Connect server runs its
    workers with cannot import what streamstate needs (once per client session)."""
    import json

    session = str(getattr(spark, "session_id", "") or id(spark))
    if session in _CHECKED_SESSIONS:
        return
    from pyspark.sql.types import StringType

    from streamstate.spark.driver.session import functions_for

    probe = functions_for(spark).udf(_probe_function(), StringType(), useArrow=False)
    remedy = (
        "Start the server with PYSPARK_PYTHON set to a Python that has streamstate and its "
        "dependencies installed (e.g. PYSPARK_PYTHON=/opt/venv/bin/python "
        "$SPARK_HOME/sbin/start-connect-server.sh; docs/spark/connect.md, 'Starting a Spark "
        "Connect server for streamstate')"
    )
    try:
        rows = spark.range(1).select(probe("id").alias("report")).collect()
    except Exception as exc:
        text = str(exc)
        if not any(m in text for m in _WORKER_DID_NOT_START):
            raise
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        cause = next((line for line in lines if "Error" in line), lines[0] if lines else text)
        raise WorkerPythonError(
            f"the Spark Connect server's Python workers could not start or could not run "
            f"Python code ({cause[:300]}). {remedy}"
        ) from exc
    report = json.loads(rows[0]["report"])
    if report["missing"]:
        source = (
            f"PYSPARK_PYTHON={report['pyspark_python']}"
            if report.get("pyspark_python")
            else "PYSPARK_PYTHON is not set on the server, so Spark runs python3 from its PATH"
        )
        names = ", ".join(name for name, _ in report["missing"])
        raise WorkerPythonError(
            f"the Spark Connect server's Python workers run {report['python']!r} ({source}), "
            f"which cannot import what streamstate needs: {names} "
            f"({report['missing'][0][1]}). {remedy}"
        )
    _CHECKED_SESSIONS.add(session)


def ensure_worker_path(spark: Any) -> None:
    """Make Python workers find this ``streamstate`` (a source checkout is not installed):
    functions (and data sources) created from now on carry its directory in their
    PYTHONPATH."""
    if is_connect(spark):
        # no sparkContext: the server's Python workers must import streamstate themselves
        # (installed there; docs/spark/connect.md), which is checked once
        check_worker_python(spark)
        return
    sc = spark.sparkContext
    here = src_path()
    current = sc.environment.get("PYTHONPATH", "")
    if here not in current.split(os.pathsep):
        sc.environment["PYTHONPATH"] = os.pathsep.join(p for p in (here, current) if p)
    check_worker_python(spark, sc.environment["PYTHONPATH"])
