"""The heap keyed state backend: state as Python objects in memory (SPEC §5)."""

from streamstate.backends.heap.copy_on_write import (
    CopyOnWriteStateMap,
    CopyOnWriteStateMapSnapshot,
)
from streamstate.backends.heap.nested_maps import NestedStateMap
from streamstate.backends.heap.state_map import StateMap, StateMapSnapshot

__all__ = [
    "CopyOnWriteStateMap",
    "CopyOnWriteStateMapSnapshot",
    "NestedStateMap",
    "StateMap",
    "StateMapSnapshot",
]
