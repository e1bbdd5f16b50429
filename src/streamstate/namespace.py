"""Namespaces: the second dimension of keyed state (SPEC §1).

The effective key of every keyed-state entry is ``(key, namespace, state name)``. Windows use the
window as namespace; plain keyed state lives in :data:`VOID_NAMESPACE`.
"""

from __future__ import annotations

import msgspec

__all__ = ["VOID_NAMESPACE", "VoidNamespace"]


class VoidNamespace(msgspec.Struct, frozen=True, array_like=True):
    """The namespace of state that has no namespace. All instances are equal."""

    def __repr__(self) -> str:
        return "VOID_NAMESPACE"


VOID_NAMESPACE = VoidNamespace()
"""The default namespace of keyed state."""
