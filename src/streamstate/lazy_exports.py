"""Public names of a package imported on first use (PEP 562 module ``__getattr__``).

A package whose names pull in heavy modules (the Spark driver, pyspark) exports them lazily, so
that a process importing one of its light submodules (a state host unpickling a function) does
not import the rest with it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_getattr"]


def lazy_getattr(
    package: str, modules: dict[str, str], namespace: dict[str, Any]
) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: a name of ``modules`` (name -> module that defines
    it) is imported on first use and kept in ``namespace`` (the package's ``globals()``), so
    later lookups do not come back here; any other name raises AttributeError."""

    def load(name: str) -> Any:
        module = modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return load
