"""The import rules of docs/architecture.md, checked on every module of ``src/streamstate``.

Every import statement counts, wherever it stands: at module level or inside a function (a lazy
import is still a dependency). Three rules:

1. **Layers.** A module imports only modules of its own layer or of a lower one (:data:`LAYERS`,
   bottom first), type-only imports (``if TYPE_CHECKING:``) included. The parts of one layer are
   independent: none imports another. ``streamstate.spark`` is layered by process
   (docs/architecture.md, "spark/ by process"): the state host (``spark.host``) imports neither
   the driver's modules nor a task's, a task (``spark.task``) does not import the driver's, and
   both import only ``spark.wire`` and the shared top-level modules. The driver is layered by
   the life of a micro-batch, and the offline tools (``spark.offline``) sit below its query
   API, which registers their state formats. No runtime module imports the development tools
   (``streamstate.devtools``, above every runtime layer).
2. **No cycle** between modules: the graph of the imports that run (all but the type-only ones)
   has no strongly connected component of more than one module, except the ones listed in
   :data:`KNOWN_CYCLES` (none now; one listed there is scheduled to go). A package's ``__init__``
   that re-exports its modules is a module too.
3. **No private name crosses a module**: ``from x import _name`` is refused; a name another
   module needs is public.

A part may be narrowed further (:data:`NARROW`): the offline tools (``spark.offline``) import, of
the driver, only the modules directly in ``spark/driver/``.

Run: ``python tools/check_imports.py`` (``make lint`` does); exit status 1 on any violation,
each printed as ``file:line: rule: what``. Imports made with ``importlib`` by name (the backend
registry, ``streamstate.backends.registry``) are not statically visible and not checked.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "streamstate"

#: the modules directly in spark/driver/: what all of the driver and the offline tools use
DRIVER_BASE = [
    "streamstate.spark.driver",
    "streamstate.spark.driver.session",
    "streamstate.spark.driver.jvm_columns",
    "streamstate.spark.driver.environment",
    "streamstate.spark.driver.sinks",
    "streamstate.spark.driver.reports",
    "streamstate.spark.driver.spark_checkpoint",
]

#: bottom first; a layer is a list of parts, each a list of module prefixes; the parts of one
#: layer are independent of each other
LAYERS: list[list[list[str]]] = [
    [
        ["streamstate._compiled"],
        ["streamstate.errors"],
        ["streamstate.namespace"],
        ["streamstate.metrics"],
        ["streamstate.lazy_exports"],
    ],
    [["streamstate.keygroups", "streamstate.serializers"]],
    [["streamstate.api"]],
    [["streamstate.format"]],
    [["streamstate.backends"]],
    [["streamstate.timers"]],
    [["streamstate.windows"]],
    [["streamstate.checkpoint"]],
    [["streamstate.runtime"]],
    # spark/ by process (docs/architecture.md, "spark/ by process"): what crosses a process
    # boundary, then what more than one process runs, then the host and the task (independent:
    # neither imports the other), then the driver, then the package's public names
    [["streamstate.spark.wire"]],
    [
        [
            "streamstate.spark.job",
            "streamstate.spark.records",
            "streamstate.spark.output_columns",
            "streamstate.spark.partials",
            "streamstate.spark.partial_fold",
            "streamstate.spark.columns",
            "streamstate.spark.record_batches",
            "streamstate.spark.staging",
            "streamstate.spark.subtask",
            "streamstate.spark.failures",
        ]
    ],
    [["streamstate.spark.host"], ["streamstate.spark.task"]],
    # the driver by the life of a micro-batch (docs/architecture.md, "The driver"): the modules
    # directly in driver/ that all of it and the offline tools use (the session's kind, the
    # workers' Python, the sinks, the reports' interfaces, Spark's checkpoint), then what is
    # planned once at start, what is measured, the steps of each micro-batch, the offline
    # tools (which take of the driver only its base: NARROW) and the public query API, which
    # registers the offline tools' state formats
    [DRIVER_BASE],
    [["streamstate.spark.driver.plan"]],
    [["streamstate.spark.driver.monitor"]],
    [["streamstate.spark.driver.step"]],
    [["streamstate.spark.offline"]],
    [["streamstate.spark.driver.query"]],
    [["streamstate.spark"]],
    # the local cluster, Connect server and network namespaces: above every runtime module,
    # so none imports them
    [["streamstate.devtools"]],
    [["streamstate.demo"]],
    [["streamstate.cli"]],
    [["streamstate.__main__", "streamstate.demo.__main__", "streamstate"]],
]

#: parts that may import, of a package below them, only some of its modules: (the importing
#: part's prefix, the package's prefix, the modules allowed). The offline tools take of the
#: driver only its base (the session, the workers' Python, the sinks), nothing that plans,
#: measures or runs a micro-batch, and nothing of the query API above them
NARROW: list[tuple[str, str, list[str]]] = [
    ("streamstate.spark.offline", "streamstate.spark.driver", DRIVER_BASE),
]

#: cycles that exist and are scheduled to go (each a sorted list of modules)
KNOWN_CYCLES: list[list[str]] = []


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}


def _resolve(node: ast.ImportFrom, current: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = current.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _type_only_lines(tree: ast.Module) -> set[int]:
    """Lines of the statements under ``if TYPE_CHECKING:``."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (
            (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
            or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")
        ):
            for stmt in node.body:
                lines.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
    return lines


def imports(
    name: str, path: Path, known: dict[str, Path]
) -> Iterator[tuple[int, str, list[str], bool]]:
    """``(line, imported module, imported names, type only)`` of every import of a module."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    type_only = _type_only_lines(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    yield node.lineno, alias.name, [], node.lineno in type_only
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(node, name, is_package)
            if target.split(".")[0] != PACKAGE:
                continue
            names = [a.name for a in node.names]
            submodules = [f"{target}.{n}" for n in names if f"{target}.{n}" in known]
            rest = [n for n in names if f"{target}.{n}" not in known]
            typed = node.lineno in type_only
            for sub in submodules:
                yield node.lineno, sub, [], typed
            if rest or not submodules:
                yield node.lineno, target, rest, typed


def layer_of(module: str) -> tuple[int, int]:
    """(layer index, part index) of a module: the longest matching prefix wins."""
    best: tuple[int, int, int] | None = None
    for i, layer in enumerate(LAYERS):
        for j, part in enumerate(layer):
            for prefix in part:
                matches = module == prefix or module.startswith(prefix + ".")
                if matches and (best is None or len(prefix) > best[2]):
                    best = (i, j, len(prefix))
    if best is None:
        raise SystemExit(f"{module}: in no layer of tools/check_imports.py (add it)")
    return best[0], best[1]


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in graph:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def main() -> int:
    known = modules()
    graph: dict[str, set[str]] = {m: set() for m in known}
    problems: list[str] = []
    where: dict[tuple[str, str], str] = {}
    for name, path in known.items():
        rel = path.relative_to(ROOT.parent)
        src_layer = layer_of(name)
        for line, target, names, type_only in imports(name, path, known):
            if target not in known:
                problems.append(f"{rel}:{line}: unknown module {target}")
                continue
            if target == name:
                continue
            if not type_only:
                graph[name].add(target)
            where.setdefault((name, target), f"{rel}:{line}")
            dst_layer = layer_of(target)
            if dst_layer[0] > src_layer[0]:
                problems.append(f"{rel}:{line}: upward import: {name} imports {target}")
            elif dst_layer[0] == src_layer[0] and dst_layer[1] != src_layer[1]:
                problems.append(f"{rel}:{line}: independent parts: {name} imports {target}")
            problems.extend(
                f"{rel}:{line}: narrow import: {name} imports {target} (of {package} only "
                f"{', '.join(allowed)})"
                for part, package, allowed in NARROW
                if _under(name, part) and _under(target, package) and target not in allowed
            )
            problems.extend(
                f"{rel}:{line}: private name: {name} imports {target}.{n}"
                for n in names
                if n.startswith("_") and not n.startswith("__")
            )
    for component in cycles(graph):
        if component in KNOWN_CYCLES:
            continue
        edges = [
            where[(a, b)] + f" {a} -> {b}"
            for a in component
            for b in sorted(graph[a])
            if b in component
        ]
        problems.append("import cycle: " + ", ".join(component) + "\n    " + "\n    ".join(edges))
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} import rule violation(s); see docs/architecture.md (Layers)")
        return 1
    print(f"imports: {len(known)} modules, {sum(map(len, graph.values()))} imports: all rules hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
