"""Which Python Spark's workers run, and whether it can run streamstate.

PySpark starts its Python workers with ``PYSPARK_PYTHON`` (read when the ``SparkContext``
starts; ``spark.pyspark.python`` for ``spark-submit``), and without it with ``python3`` from
``PATH`` — not the interpreter of the driver. A driver started as ``.venv/bin/python job.py``
without activating the virtualenv therefore gets workers without ``pyarrow`` and fails deep
inside a worker, behind some 200 lines of Java and Python traces. :func:`check_worker_python`
finds this before the first job: on a local master (where the workers run on this machine) it
asks the worker interpreter, once per driver process, to import what streamstate needs, and
raises :class:`WorkerPythonError` naming the interpreter, what it lacks and ``PYSPARK_PYTHON``.
On a cluster the executors' Python cannot be checked from here (docs/spark.md, "Running on a
cluster").
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from typing import Any

from streamstate.errors import StreamStateError

__all__ = ["WORKER_MODULES", "WorkerPythonError", "check_worker_python"]

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
    from streamstate.spark.session import is_connect

    if is_connect(spark):
        return  # the workers run on the Connect server, with its Python
    sc = spark.sparkContext
    if not str(sc.master).startswith("local"):
        return
    configured = sc.getConf().get("spark.pyspark.python", None)
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
