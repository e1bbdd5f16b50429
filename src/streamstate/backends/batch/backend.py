"""The keyed state backend of batch execution: the state of one key at a time (SPEC §13.3).

Flink's ``BatchExecutionKeyedStateBackend``. Records reach a subtask sorted by key, so when the
current key changes, the previous key is finished for good:

1. the timer services run first, while the finished key is still current and its state still
   there: they fire the key's timers (``runtime/batch.py``; skipped when the key registered
   none);
2. with a savepoint to write, the key's entries go to the :class:`KeyGroupSpool`
   (``snapshot.py``);
3. every state drops its values and the timer queues are emptied.

Memory is therefore that of one key, whatever the number of keys; a state access touches an
attribute of the state object (``states.py``): no state map, no key-group index, no copy-on-write
versions, no change tracking. The backend cannot restore a checkpoint (a batch run starts from
nothing, as Flink's BATCH mode) and takes exactly one snapshot, at the end of the input, from its
spool: the savepoint.

>>> from streamstate.api.descriptors import ValueStateDescriptor
>>> from streamstate.keygroups import KeyGroupRange
>>> from streamstate.serializers import StrSerializer
>>> from streamstate.namespace import VOID_NAMESPACE
>>> backend = BatchExecutionKeyedStateBackend(StrSerializer(), 128, KeyGroupRange(0, 127))
>>> n = backend.get_partitioned_state(VOID_NAMESPACE, None, ValueStateDescriptor("n", int, 0))
>>> backend.set_current_key("a"); n.update(n.value() + 1); n.update(n.value() + 1); n.value()
2
>>> backend.set_current_key("b"); n.value()     # "a" is finished: its state is gone
0
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from streamstate.api.descriptors import StateDescriptor
from streamstate.api.state import InternalKvState
from streamstate.backends.base import Clock, KeyedStateBackend, RestoreInput
from streamstate.backends.batch.snapshot import BatchKeyedStateSnapshot, KeyGroupSpool
from streamstate.backends.batch.states import STATE_FACTORIES, BatchState, guard
from streamstate.backends.batch.timer_queue import SingleKeyTimerQueue
from streamstate.backends.decorators.ttl_cleanup import TtlCleanupHook
from streamstate.backends.timer_queues import KeyGroupedTimerQueue
from streamstate.errors import (
    KeyGroupOutOfRangeError,
    StateBackendError,
    UnsupportedKeyTypeError,
)
from streamstate.format.meta import TIMER_STATE_KIND, StateMetaInfo
from streamstate.format.restore import KeyedStateRestore
from streamstate.keygroups import KeyGroupRange, assign_to_key_group
from streamstate.serializers import Int64Serializer
from streamstate.serializers.base import TypeSerializer

__all__ = ["BatchExecutionKeyedStateBackend"]


class BatchExecutionKeyedStateBackend(KeyedStateBackend):
    """Keyed state of one subtask in batch execution: one key at a time (module docstring).

    Parameters (besides the common ones of :class:`KeyedStateBackend`):
        spool: where finished keys' entries go for the savepoint written at the end (None: no
            savepoint; finished keys' state is simply dropped).
    """

    backend_name = "batch"

    def __init__(
        self,
        key_serializer: TypeSerializer[Any],
        max_parallelism: int,
        key_group_range: KeyGroupRange,
        *,
        clock: Clock | None = None,
        latency_tracking: bool = False,
        size_tracking: bool = False,
        metric_group: Any = None,
        spool: KeyGroupSpool | None = None,
    ) -> None:
        super().__init__(
            key_serializer,
            max_parallelism,
            key_group_range,
            clock=clock,
            latency_tracking=latency_tracking,
            size_tracking=size_tracking,
            metric_group=metric_group,
        )
        self._spool = spool
        #: the raw states (below the TTL and metrics decorators) and their meta data
        self._raw: list[BatchState] = []
        self._metas: dict[str, StateMetaInfo] = {}
        #: timer queue name -> (queue, meta data)
        self._queues: dict[str, tuple[SingleKeyTimerQueue, StateMetaInfo]] = {}
        self._queue_list: list[SingleKeyTimerQueue] = []
        #: queues no timer service fires (emptied when a key ends)
        self._unfired_queues: list[KeyGroupedTimerQueue] = []
        #: timers added to any queue since the current key began (shared with the queues)
        self._timers_added = [0]
        #: what fires a finished key's timers (add_timer_service)
        self._timer_services: list[Callable[[Any], object]] = []
        #: keys finished so far
        self.keys_done = 0

    # ---- current key -------------------------------------------------------------------------

    def set_current_key(self, key: Any, key_group: int | None = None) -> None:
        """Make ``key`` the current key; if another key was current, it is finished first (its
        timers fire through the key-selection listeners, its state is spooled and dropped).
        Setting the current key again is a no-op."""
        ctx = self.ctx
        current = ctx.key
        if current is not None and (key is current or key == current):
            return
        if key is None:
            raise UnsupportedKeyTypeError("the current key must not be None")
        if key_group is None:
            key_group = assign_to_key_group(key, self.max_parallelism)
        index = key_group - self._range_start
        if index < 0 or index >= self._num_key_groups:
            raise KeyGroupOutOfRangeError(
                f"key {key!r} belongs to key group {key_group}, which is outside this backend's "
                f"range {self.key_group_range} (max_parallelism={self.max_parallelism}); the key "
                "was routed to the wrong subtask — is its hash non-deterministic?"
            )
        if current is None:
            for state in self._raw:
                guard(state, False)
        else:
            # _finish_key(current), inlined: a key change is a per-key cost of every batch run
            if self.key_selected_listeners:
                for listener in self.key_selected_listeners:
                    listener(current)
            added = self._timers_added
            if added[0]:
                for fire in self._timer_services:
                    fire(current)
                for queue in self._unfired_queues:
                    queue.clear()
                added[0] = 0
            if self._spool is not None:
                self._spool_key(current)
            for state in self._raw:
                state.drop_key()
            self.keys_done += 1
        ctx.key = key
        ctx.kg_index = index

    def end_of_input(self) -> None:
        """The input ended: the last key is finished (timers, spool, drop) and the spool
        encodes what it still collects. State access fails from now on."""
        ctx = self.ctx
        if ctx.key is not None:
            self._finish_key(ctx.key)
            ctx.key = None
            ctx.kg_index = self._num_key_groups
            for state in self._raw:
                guard(state, True)
        if self._spool is not None:
            self._spool.finish()

    def clear_current_key(self) -> None:
        """Forget the current key without finishing it (its state is dropped unspooled and its
        timers do not fire)."""
        ctx = self.ctx
        if ctx.key is None:
            return
        for state in self._raw:
            state.drop_key()
            guard(state, True)
        for queue in self._queue_list:
            queue.clear()
        self._timers_added[0] = 0
        ctx.key = None
        ctx.kg_index = self._num_key_groups

    def _finish_key(self, key: Any) -> None:
        """``key`` (still current) ends: its timers fire, its entries are spooled, its state
        is dropped (:meth:`set_current_key` does the same inline)."""
        listeners = self.key_selected_listeners
        if listeners:
            for listener in listeners:
                listener(key)
        added = self._timers_added
        if added[0]:
            for fire in self._timer_services:
                fire(key)
            for queue in self._unfired_queues:
                queue.clear()
            added[0] = 0
        if self._spool is not None:
            self._spool_key(key)
        for state in self._raw:
            state.drop_key()
        self.keys_done += 1

    def _spool_key(self, key: Any) -> None:
        """Hand the entries of ``key`` (still current) to the spool."""
        spool = self._spool
        assert spool is not None
        kg = self.ctx.key_group
        for state in self._raw:
            if len(state):
                spool.add(kg, key, state.descriptor.name, state.entries())
        spool.key_done()

    def add_timer_service(
        self, fire: Callable[[Any], object], queues: Sequence[KeyGroupedTimerQueue]
    ) -> None:
        """Register a timer service: ``fire(key)`` is called when a key that registered timers
        ends, while it is still the current key and its state still there (Flink's batch time
        service manager, a key-selection listener of the batch backend), and empties
        ``queues``, the service's queues (any other queue is emptied by the backend)."""
        self._timer_services.append(fire)
        fired = {id(q) for q in queues}
        self._unfired_queues = [q for q in self._unfired_queues if id(q) not in fired]

    # ---- states --------------------------------------------------------------------------------

    def _create_internal_state(
        self, namespace_serializer: TypeSerializer[Any], descriptor: StateDescriptor
    ) -> InternalKvState:
        name = descriptor.name
        ttl = descriptor.ttl_config.to_dict() if descriptor.ttl_config is not None else None
        meta = StateMetaInfo(
            name, descriptor.kind.value, namespace_serializer, descriptor.serializer, ttl
        )
        state = STATE_FACTORIES[descriptor.kind](self.ctx, descriptor, namespace_serializer)
        if self.ctx.key is None:
            guard(state, True)
        self._raw.append(state)
        self._metas[name] = meta
        if self._spool is not None:
            self._spool.register(meta)
        return state  # type: ignore[return-value]

    def get_keys(self, state_name: str, namespace: Any) -> Iterator[Any]:
        """The current key, if it has state ``state_name`` under ``namespace`` (the backend holds
        no other key)."""
        key = self.ctx.key
        for state in self._raw:
            if state.descriptor.name == state_name:
                if key is not None and state.has_namespace(namespace):
                    return iter((key,))
                break
        return iter(())

    def num_entries(self, state_name: str | None = None) -> int:
        """Entries (namespaces with a value) of the current key."""
        return sum(
            len(s) for s in self._raw if state_name is None or s.descriptor.name == state_name
        )

    def state_entries(self) -> dict[str, int]:
        """The entries of every state over the keys finished so far (what a savepoint of them
        holds; ``streamstate.format.entries``); {} without a spool (no savepoint)."""
        return {} if self._spool is None else dict(self._spool.counts)

    # ---- timers --------------------------------------------------------------------------------

    def create_timer_queue(
        self, name: str, namespace_serializer: TypeSerializer[Any]
    ) -> KeyGroupedTimerQueue:
        """The timers of the current key for the queue ``name`` (emptied at every key change)."""
        self._check_open()
        entry = self._queues.get(name)
        if entry is not None:
            return entry[0]
        queue = SingleKeyTimerQueue(self._timers_added)
        meta = StateMetaInfo(name, TIMER_STATE_KIND, namespace_serializer, Int64Serializer())
        self._queues[name] = (queue, meta)
        self._queue_list.append(queue)
        self._unfired_queues.append(queue)
        return queue

    # ---- snapshot, restore ---------------------------------------------------------------------

    def snapshot(self, checkpoint_id: int) -> BatchKeyedStateSnapshot:
        """The savepoint of the run: every finished key's entries, from the spool.

        Only once the input ended (:meth:`end_of_input`) and with a spool: a batch run takes no
        checkpoints (as Flink's BATCH mode) and keeps no finished key in memory.
        """
        self._check_open()
        if self._spool is None:
            raise StateBackendError(
                "the batch execution backend keeps no finished key: it can write a savepoint "
                "only when created with a spool (keyed_process(..., savepoint=...))"
            )
        if self.ctx.key is not None:
            raise StateBackendError(
                f"the batch execution backend can be snapshotted only at the end of the input "
                f"(key {self.ctx.key!r} is still being processed)"
            )
        self._spool.finish()
        states = [*self._metas.values(), *(meta for _, meta in self._queues.values())]
        return BatchKeyedStateSnapshot(
            self.key_serializer,
            self.max_parallelism,
            self.key_group_range,
            states,
            self._spool,
            checkpoint_id,
        )

    def restore(self, source: RestoreInput | Sequence[KeyedStateRestore]) -> None:
        """Refused: a batch run starts without state (Flink's BATCH mode restores nothing)."""
        raise StateBackendError(
            "the batch execution backend cannot restore a checkpoint or savepoint: a batch run "
            "starts from no state; run the job in streaming execution mode "
            "(execution_mode='streaming') to start from initial_state"
        )

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Nothing to do: the savepoint references nothing."""

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Nothing to do: the savepoint references nothing."""

    # ---- TTL, lifecycle ------------------------------------------------------------------------

    def register_ttl_cleanup(self, hook: TtlCleanupHook) -> Callable[[], object] | None:
        """A key's state dies with the key, so no incremental cleanup runs; the full-snapshot
        cleanup (``cleanup_full_snapshot``) filters what the savepoint gets."""
        if self._spool is not None:
            self._spool.set_transform(
                hook.state_name, hook.transform if hook.cleanup_full_snapshot else None
            )
        return None

    def dispose(self) -> None:
        self._raw.clear()
        self._metas.clear()
        self._queues.clear()
        self._queue_list.clear()
        self._unfired_queues.clear()
        if self._spool is not None:
            self._spool.close()
            self._spool = None
        super().dispose()
