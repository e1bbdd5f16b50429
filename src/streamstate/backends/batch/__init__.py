"""The keyed state backend of batch execution: the state of one key at a time (SPEC §13.3).

Flink's ``BatchExecutionKeyedStateBackend`` and its companions: records sorted by key reach the
subtask, the backend keeps only the current key's state (``states.py``) and timers
(``timer_queue.py``), and drops them when the key changes; a savepoint is streamed as keys
finish (``snapshot.py``). The batch runtime (``runtime/batch.py``) creates it through
:class:`~streamstate.backends.batch.factory.BatchExecutionStateBackend`.
"""

from streamstate.backends.batch.backend import BatchExecutionKeyedStateBackend
from streamstate.backends.batch.factory import BatchExecutionStateBackend
from streamstate.backends.batch.snapshot import BatchKeyedStateSnapshot, KeyGroupSpool
from streamstate.backends.batch.timer_queue import SingleKeyTimerQueue

__all__ = [
    "SNAPSHOT_KINDS",
    "STATE_BACKENDS",
    "BatchExecutionKeyedStateBackend",
    "BatchExecutionStateBackend",
    "BatchKeyedStateSnapshot",
    "KeyGroupSpool",
    "SingleKeyTimerQueue",
]

#: no name selects it (``streamstate.backends.registry``): ``execution_mode="batch"`` does
STATE_BACKENDS: dict[str, object] = {}
#: its savepoints are canonical files
SNAPSHOT_KINDS: dict[str, object] = {}
