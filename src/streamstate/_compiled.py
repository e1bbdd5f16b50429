"""The optional C extensions and the switch to their pure-Python references.

``setup.py`` builds small extensions (the copy-on-write map's entry, the heap value state's
common path, the record loop, a key's key group, the metrics decorators' unsampled path). Each
has a pure-Python reference next to it that behaves the same
and is tested against it; the reference is used when the extension was not built or when the
environment sets ``STREAMSTATE_PURE_PYTHON`` (to anything but ``0``), e.g. to compare the two.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["compiled", "pure_python"]


def pure_python() -> bool:
    """Whether ``STREAMSTATE_PURE_PYTHON`` selects the pure-Python references."""
    return os.environ.get("STREAMSTATE_PURE_PYTHON", "") not in ("", "0")


def compiled(name: str) -> ModuleType | None:
    """The extension module ``name``, or None when it is not built or
    ``STREAMSTATE_PURE_PYTHON`` is set."""
    if pure_python():
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
