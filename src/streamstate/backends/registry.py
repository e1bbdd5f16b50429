"""Finding a backend by name: its configuration (``state_backend="rocksdb"``) and the reader of
its native snapshots (a checkpoint file of kind ``"rocksdb-manifest"``).

A backend is a package ``streamstate.backends.<name>`` whose ``__init__`` declares

* ``STATE_BACKENDS``: ``{name: factory}`` of the names it answers to (``"<name>"`` and
  ``"<name>-<variant>"``), each factory returning a configured
  :class:`~streamstate.backends.factory.StateBackend`;
* ``SNAPSHOT_KINDS``: ``{kind: reader}`` of the file kinds of its native snapshots,
  named ``"<name>-<role>"``; ``reader(location, files, key_groups)`` returns the
  :class:`~streamstate.format.restore.KeyedStateRestore` of one old subtask's snapshot
  (``files``: its entry file first).

The package is found from the name's first part, so checkpoint storage and the runtimes name no
backend, and adding one touches nothing outside its package (docs/architecture.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from streamstate.backends.factory import StateBackend
from streamstate.errors import CheckpointError

if TYPE_CHECKING:
    from streamstate.format.handles import StateFileHandle
    from streamstate.format.restore import KeyedStateRestore, SnapshotLocation
    from streamstate.keygroups import KeyGroupRange

__all__ = [
    "backend_format_restore",
    "backend_package",
    "state_backend_from",
    "state_backend_named",
]

OwnFormatReader = Callable[
    ["SnapshotLocation", "list[StateFileHandle]", "KeyGroupRange"], "KeyedStateRestore"
]


def backend_package(name: str) -> ModuleType | None:
    """The package of the backend a name or file kind ``"<backend>[-...]"`` belongs to, or
    None if there is none."""
    package = name.split("-", 1)[0]
    if not package.isidentifier() or package in ("decorators",):
        return None
    try:
        module = importlib.import_module(f"streamstate.backends.{package}")
    except ModuleNotFoundError as exc:
        if exc.name != f"streamstate.backends.{package}":
            raise  # the package exists but misses a dependency: say so
        return None
    return module if hasattr(module, "STATE_BACKENDS") else None


def state_backend_named(name: str) -> StateBackend:
    """A new :class:`~streamstate.backends.factory.StateBackend` for ``name`` ("heap",
    "rocksdb", ...)."""
    package = backend_package(name)
    factories: dict[str, Callable[[], StateBackend]] = (
        {} if package is None else package.STATE_BACKENDS
    )
    factory = factories.get(name)
    if factory is None:
        raise ValueError(f"unknown state backend {name!r}; use 'heap' or 'rocksdb'")
    return factory()


def state_backend_from(value: StateBackend | str | None) -> StateBackend:
    """A :class:`StateBackend` from a backend's name (``"heap"``, ``"heap-nested"``,
    ``"rocksdb"``), an instance, or None (the heap): ``state_backend=`` everywhere."""
    if isinstance(value, StateBackend):
        return value
    return state_backend_named("heap" if value is None else value)


def backend_format_restore(
    location: Any, files: list[StateFileHandle], key_groups: KeyGroupRange
) -> KeyedStateRestore:
    """The restore file of one old subtask's snapshot in a backend's own format (``files[0]``
    names its kind)."""
    kind = files[0].kind
    package = backend_package(kind)
    readers: dict[str, OwnFormatReader] = {} if package is None else package.SNAPSHOT_KINDS
    reader = readers.get(kind)
    if reader is None:
        raise CheckpointError(
            f"{location.storage.url_of(location.resolve(files[0].path))} is a snapshot file of "
            f"kind {kind!r}, which no state backend of this streamstate reads"
        )
    return reader(location, files, key_groups)
