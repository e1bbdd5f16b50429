"""The heap keyed state backend: state as Python objects in memory (SPEC §5)."""

from streamstate.backends.heap.copy_on_write import (
    CopyOnWriteStateMap,
    CopyOnWriteStateMapSnapshot,
)
from streamstate.backends.heap.factory import HeapStateBackend
from streamstate.backends.heap.nested_maps import NestedStateMap
from streamstate.backends.heap.state_map import StateMap, StateMapSnapshot

__all__ = [
    "SNAPSHOT_KINDS",
    "STATE_BACKENDS",
    "CopyOnWriteStateMap",
    "CopyOnWriteStateMapSnapshot",
    "HeapStateBackend",
    "NestedStateMap",
    "StateMap",
    "StateMapSnapshot",
]

#: the names this backend answers to (``streamstate.backends.registry``)
STATE_BACKENDS = {
    "heap": HeapStateBackend,
    "heap-nested": lambda: HeapStateBackend(table_kind="nested_maps"),
}
#: the heap backend writes canonical files only
SNAPSHOT_KINDS: dict[str, object] = {}
