"""Which per-record path this process runs: the compiled one or the pure-Python reference.

The per-record path has two compiled parts, each with a pure-Python reference that behaves the
same: the record loop (``runtime/_record_loop.c``, reference ``process_records``,
``KeyedProcessOperator.process_runs`` and ``LocalRunner._routed``) and the heap value state's
``value()`` / ``update()``, and batch execution's (``backends/heap/_value_state.c``, references
``HeapValueState`` and ``BatchValueState``).
``STREAMSTATE_PURE_PYTHON=1`` selects the references for a whole process
(``streamstate._compiled``); :func:`record_path` switches both within one process, so that a test
or a benchmark compares the two side by side.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from streamstate.api.descriptors import StateKind
from streamstate.backends.batch import states as batch_states
from streamstate.backends.heap import states as heap_states
from streamstate.runtime.operator import RECORD_LOOPS, use_record_loop

__all__ = ["COMPILED_PATH_AVAILABLE", "record_path"]

#: whether both compiled parts are built and selected (not ``STREAMSTATE_PURE_PYTHON``)
COMPILED_PATH_AVAILABLE = (
    len(RECORD_LOOPS) > 1
    and len(heap_states.VALUE_STATE_TYPES) > 1
    and len(batch_states.VALUE_STATE_TYPES) > 1
)


@contextmanager
def record_path(compiled: bool) -> Iterator[None]:
    """Within the block, operators and runners created or run use the compiled per-record path
    (``compiled=True``, where it is available) or the pure-Python reference. The value state
    type is chosen when a state is first registered: create the runner inside the block."""
    loop = RECORD_LOOPS[-1] if compiled else RECORD_LOOPS[0]
    which = -1 if compiled else 0
    heap = heap_states.STATE_FACTORIES
    batch = batch_states.STATE_FACTORIES
    previous = (use_record_loop(loop), heap[StateKind.VALUE], batch[StateKind.VALUE])
    heap[StateKind.VALUE] = heap_states.VALUE_STATE_TYPES[which]
    batch[StateKind.VALUE] = batch_states.VALUE_STATE_TYPES[which]
    try:
        yield
    finally:
        use_record_loop(previous[0])
        heap[StateKind.VALUE], batch[StateKind.VALUE] = previous[1], previous[2]
