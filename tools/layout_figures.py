"""The figures of the code's layout that docs/architecture.md holds the Spark runtime to.

Run from a checkout: ``python tools/layout_figures.py [root]`` (default: this checkout). Prints
one line per figure, with its goal:

* modules directly in ``spark/driver/`` (``__init__.py`` not counted);
* ``reports is None``-style branches in ``spark/``: a comparison of something named ``reports``
  with None (how classic sessions and Spark Connect were once told apart);
* untyped messages in ``spark/``: dict literals with a ``"t"`` key (a host-channel message
  that is not a ``msgspec.Struct``);
* ``perf_counter`` call sites in ``spark/driver/``;
* the longest function and the largest module in ``spark/`` (lines);
* the longest page of ``docs/`` (Markdown and reStructuredText, lines);
* lines of ``docs/benchmarks.md`` naming a commit (a hex word of 7 to 40 digits with a letter
  and a digit) or an issue (``issue 12``, ``#12``).

Only the standard library: it reads the source, it imports none of it.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

__all__ = ["figures", "main"]

_COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
_ISSUE = re.compile(r"\bissues? #?\d+\b|(?<![\w&])#\d+\b", re.IGNORECASE)


def _trees(package: Path) -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text(), str(p))) for p in sorted(package.rglob("*.py"))]


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _names_reports(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id.lstrip("_") == "reports"
    if isinstance(node, ast.Attribute):
        return node.attr.lstrip("_") == "reports"
    return False


def _reports_branches(tree: ast.Module) -> int:
    count = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            if not isinstance(node.ops[0], ast.Is | ast.IsNot):
                continue
            left, right = node.left, node.comparators[0]
            if (_names_reports(left) and _is_none(right)) or (
                _names_reports(right) and _is_none(left)
            ):
                count += 1
    return count


def _untyped_messages(tree: ast.Module) -> int:
    return sum(
        1
        for node in ast.walk(tree)
        if isinstance(node, ast.Dict)
        and any(isinstance(k, ast.Constant) and k.value == "t" for k in node.keys)
    )


def _perf_counter_sites(tree: ast.Module) -> int:
    count = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name == "perf_counter":
                count += 1
    return count


def _functions(tree: ast.Module) -> list[tuple[int, str, int]]:
    """(lines, name, first line) of every function and method."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            out.append((node.end_lineno - first + 1, node.name, node.lineno))  # type: ignore[operator]
    return out


def figures(root: Path) -> list[tuple[str, str, str]]:
    """(figure, value, goal) of the checkout at ``root``."""
    spark = root / "src" / "streamstate" / "spark"
    driver = spark / "driver"
    trees = _trees(spark)
    rel = lambda p: str(p.relative_to(root))  # noqa: E731
    direct = [p for p in sorted(driver.glob("*.py")) if p.name != "__init__.py"]
    branches = sum(_reports_branches(t) for _, t in trees)
    untyped = sum(_untyped_messages(t) for _, t in trees)
    perf = sum(_perf_counter_sites(t) for p, t in trees if driver in p.parents)
    longest = max(
        ((n, f"{rel(p)}:{line} {name}") for p, t in trees for n, name, line in _functions(t)),
        default=(0, "-"),
    )
    largest = max(((len(p.read_text().splitlines()), rel(p)) for p, _ in trees), default=(0, "-"))
    pages = [p for p in sorted((root / "docs").rglob("*")) if p.suffix in (".md", ".rst")]
    pages = [p for p in pages if "_build" not in p.parts]
    page = max(((len(p.read_text().splitlines()), rel(p)) for p in pages), default=(0, "-"))
    history = 0
    bench = root / "docs" / "benchmarks.md"
    if bench.exists():
        history = sum(
            1
            for line in bench.read_text().splitlines()
            if _COMMIT.search(line) or _ISSUE.search(line)
        )
    return [
        ("modules directly in spark/driver/", str(len(direct)), "<= 8"),
        ("`reports is (not) None` branches in spark/", str(branches), "0"),
        ('untyped {"t": ...} messages in spark/', str(untyped), "0"),
        ("perf_counter sites in spark/driver/", str(perf), "<= 6"),
        ("longest function in spark/", f"{longest[0]} lines ({longest[1]})", "<= 80"),
        ("largest module in spark/", f"{largest[0]} lines ({largest[1]})", "<= 500"),
        ("longest docs page", f"{page[0]} lines ({page[1]})", "<= 700"),
        ("docs/benchmarks.md lines naming a commit or an issue", str(history), "0"),
    ]


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(__file__).resolve().parents[1]
    rows = figures(root.resolve())
    width = max(len(name) for name, _, _ in rows)
    for name, value, goal in rows:
        print(f"{name:<{width}}  {value}  (goal {goal})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
