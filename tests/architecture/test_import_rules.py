"""The import rules of docs/architecture.md (``tools/check_imports.py``, run by ``make lint``):
the source tree obeys them, and the checker finds what breaks them."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_imports", ROOT / "tools/check_imports.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_imports"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def checker() -> ModuleType:
    return _checker()


def test_the_source_tree_obeys_the_rules(
    checker: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert checker.main() == 0, capsys.readouterr().out


def test_a_cycle_is_found_and_an_acyclic_graph_passes(checker: ModuleType) -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert checker.cycles(graph) == [["a", "b", "c"]]
    assert checker.cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_layers_are_found_by_the_longest_prefix(checker: ModuleType) -> None:
    demo_main = checker.layer_of("streamstate.demo.__main__")
    assert (
        demo_main[0]
        > checker.layer_of("streamstate.cli")[0]
        > checker.layer_of("streamstate.demo")[0]
    )
    assert (
        checker.layer_of("streamstate.format.codec")[0]
        < checker.layer_of("streamstate.backends.base")[0]
    )
    assert (
        checker.layer_of("streamstate.backends.base")[0]
        < checker.layer_of("streamstate.checkpoint.writer")[0]
    )


def test_an_upward_private_or_lazy_import_is_reported(
    checker: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    package = tmp_path / "streamstate"
    (package / "format").mkdir(parents=True)
    (package / "runtime").mkdir()
    for init in (package, package / "format", package / "runtime"):
        (init / "__init__.py").write_text("")
    (package / "runtime" / "local.py").write_text("def _hidden():\n    return 1\n")
    (package / "format" / "codec.py").write_text(
        "def f():\n"
        "    from streamstate.runtime.local import _hidden  # lazy, upward and private\n"
        "    return _hidden\n"
    )
    monkeypatch.setattr(checker, "ROOT", tmp_path)
    assert checker.main() == 1
    out = capsys.readouterr().out
    assert re.search(r"codec\.py:2: upward import: streamstate\.format\.codec imports", out)
    assert "private name: streamstate.format.codec imports streamstate.runtime.local._hidden" in out


def test_the_processes_of_spark_import_only_what_they_may(
    checker: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The host imports neither the driver nor a task, a task does not import the driver, no
    runtime module imports the development tools; the driver may import a task's functions."""
    package = tmp_path / "streamstate"
    for sub in ("", "spark", "spark/driver", "spark/task", "spark/host", "spark/wire", "devtools"):
        (package / sub).mkdir(parents=True, exist_ok=True)
        (package / sub / "__init__.py").write_text("")
    (package / "devtools" / "local_cluster.py").write_text("")
    (package / "spark" / "wire" / "protocol.py").write_text("")
    (package / "spark" / "driver" / "streaming.py").write_text(
        "def f():\n    from streamstate.devtools import local_cluster\n"
        "    from streamstate.spark.task import tasks\n"
    )
    (package / "spark" / "task" / "tasks.py").write_text(
        "from streamstate.spark.wire import protocol\n"
        "def f():\n    from streamstate.spark.driver import streaming\n"
    )
    (package / "spark" / "host" / "state_host.py").write_text(
        "from streamstate.spark.wire import protocol\n"
        "def f():\n    from streamstate.spark.task import tasks\n"
        "    from streamstate.spark.driver import streaming\n"
    )
    monkeypatch.setattr(checker, "ROOT", tmp_path)
    assert checker.main() == 1
    found = sorted(
        line.split(": ", 2)[1] + ": " + line.split(": ", 2)[2]
        for line in capsys.readouterr().out.splitlines()
        if ": upward import: " in line or ": independent parts: " in line
    )
    assert found == [
        "independent parts: streamstate.spark.host.state_host imports streamstate.spark.task.tasks",
        "upward import: streamstate.spark.driver.streaming imports streamstate.devtools."
        "local_cluster",
        "upward import: streamstate.spark.host.state_host imports streamstate.spark.driver."
        "streaming",
        "upward import: streamstate.spark.task.tasks imports streamstate.spark.driver.streaming",
    ]


def test_the_driver_is_layered_by_the_life_of_a_micro_batch_and_offline_tools_below_its_query(
    checker: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Planning does not reach the steps of a micro-batch, the steps do not reach the query
    API, the offline tools take of the driver only the modules directly in ``spark/driver/``
    (not the query API, which registers their formats); what each may import passes."""
    package = tmp_path / "streamstate"
    subs = ("", "spark", "spark/driver", "spark/driver/plan", "spark/driver/step")
    for sub in (*subs, "spark/driver/query", "spark/offline"):
        (package / sub).mkdir(parents=True, exist_ok=True)
        (package / sub / "__init__.py").write_text("")
    files = {
        "spark/driver/sinks.py": "",
        "spark/driver/query/streaming.py": "from streamstate.spark.driver.step import runner\n"
        "from streamstate.spark.offline import reader\n",
        "spark/driver/step/runner.py": "from streamstate.spark.driver.plan import options\n"
        "from streamstate.spark.driver.query import streaming\n",
        "spark/driver/plan/options.py": "from streamstate.spark.driver import sinks\n"
        "from streamstate.spark.driver.step import runner\n",
        "spark/offline/reader.py": "from streamstate.spark.driver import sinks\n"
        "from streamstate.spark.driver.plan import options\n"
        "from streamstate.spark.driver.query import streaming\n",
    }
    for path, text in files.items():
        (package / path).write_text(text)
    monkeypatch.setattr(checker, "ROOT", tmp_path)
    assert checker.main() == 1
    out = capsys.readouterr().out
    found = sorted(
        line.split(": ", 1)[1]
        for line in out.splitlines()
        if re.match(r"\S+\.py:\d+: (upward|independent|narrow)", line)
    )
    assert found == [
        "narrow import: streamstate.spark.offline.reader imports "
        "streamstate.spark.driver.plan.options (of streamstate.spark.driver only "
        + ", ".join(checker.DRIVER_BASE)
        + ")",
        "narrow import: streamstate.spark.offline.reader imports "
        "streamstate.spark.driver.query.streaming (of streamstate.spark.driver only "
        + ", ".join(checker.DRIVER_BASE)
        + ")",
        "upward import: streamstate.spark.driver.plan.options imports "
        "streamstate.spark.driver.step.runner",
        "upward import: streamstate.spark.driver.step.runner imports "
        "streamstate.spark.driver.query.streaming",
        "upward import: streamstate.spark.offline.reader imports "
        "streamstate.spark.driver.query.streaming",
    ]


@pytest.mark.subprocess
def test_a_state_host_and_a_task_load_none_of_the_drivers_modules() -> None:
    """``streamstate.spark``'s public names load on first use, so the processes that import
    ``spark.host`` or ``spark.task`` start without the driver's modules (or pyspark)."""
    code = (
        "import sys\n"
        "import streamstate.spark.host.state_host, streamstate.spark.task.tasks\n"
        "print(sorted(m for m in sys.modules if m.startswith('streamstate.spark.driver')"
        " or m.split('.')[0] == 'pyspark'))\n"
        "import streamstate.spark\n"
        "print(streamstate.spark.keyed_process.__module__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split("\n")
    assert out[0] == "[]"
    assert out[1] == "streamstate.spark.driver.query.keyed"
