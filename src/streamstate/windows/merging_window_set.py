"""The per-key set of in-flight merging windows (session windows, SPEC §9).

When windows merge, their contents are merged into the state of *one* of them, so the state of
the merged window keeps living under an older window's namespace: the *state window*. The
:class:`MergingWindowSet` maps every in-flight window of the current key to its state window. It
is read from and written back to a keyed list state of ``(window, state_window)`` pairs in the
void namespace, so it is snapshotted, restored and rescaled with the key like any other state.
This is Flink's ``MergingWindowSet``.

>>> from streamstate.windows.assigners import EventTimeSessionWindows
>>> from streamstate.serializers.window_namespaces import TimeWindow
>>> class ListHolder:                        # stands in for the keyed list state
...     def __init__(self): self.value = []
...     def get(self): return self.value
...     def update(self, v): self.value = list(v)
>>> holder = ListHolder()
>>> s = MergingWindowSet(EventTimeSessionWindows.with_gap(10), holder)
>>> merges = []
>>> on_merge = lambda result, merged, state_window, merged_states: merges.append(
...     (result, merged, state_window, merged_states))
>>> s.add_window(TimeWindow(0, 10), on_merge), s.add_window(TimeWindow(30, 40), on_merge)
(TimeWindow(start=0, end=10), TimeWindow(start=30, end=40))
>>> s.add_window(TimeWindow(8, 18), on_merge)
TimeWindow(start=0, end=18)
>>> merges   # the new window merged into [0, 10): its state stays there
[(TimeWindow(start=0, end=18), [TimeWindow(start=0, end=10)], TimeWindow(start=0, end=10), [])]
>>> s.get_state_window(TimeWindow(0, 18))
TimeWindow(start=0, end=10)
>>> s.persist(); sorted(holder.value)[0]
(TimeWindow(start=0, end=18), TimeWindow(start=0, end=10))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streamstate.errors import StateAccessError

__all__ = ["MergeFunction", "MergingWindowSet"]

MergeFunction = Callable[[Any, list[Any], Any, list[Any]], None]
"""``merge(merge_result, merged_windows, state_window_of_result, merged_state_windows)``: called
for every merge, before the mapping is used; it moves triggers/timers and merges the state of
``merged_state_windows`` into ``state_window_of_result``."""


class MergingWindowSet:
    """The in-flight windows of the current key and their state windows."""

    __slots__ = ("_assigner", "_initial", "_state", "mapping")

    def __init__(self, assigner: Any, state: Any) -> None:
        self._assigner = assigner
        self._state = state
        #: window -> the window whose namespace holds its state
        self.mapping: dict[Any, Any] = {w: sw for w, sw in state.get() or ()}
        self._initial = dict(self.mapping)

    def persist(self) -> None:
        """Write the mapping back to keyed state if it changed (an empty mapping removes the
        entry, so a key without windows leaves nothing behind)."""
        if self.mapping != self._initial:
            self._state.update(list(self.mapping.items()))
            self._initial = dict(self.mapping)

    def get_state_window(self, window: Any) -> Any:
        """The state window of an in-flight ``window``, or None if it is not in flight."""
        return self.mapping.get(window)

    def retire_window(self, window: Any) -> None:
        """Forget ``window`` (it was cleaned up, or dropped as late)."""
        if self.mapping.pop(window, None) is None:
            raise StateAccessError(f"window {window!r} is not in the in-flight window set")

    def add_window(self, new_window: Any, merge_function: MergeFunction) -> Any:
        """Add ``new_window``, merging it with in-flight windows as the assigner says.

        Returns the window ``new_window`` ended up in (itself or a merge result). For every
        merge ``merge_function`` is called first (see :data:`MergeFunction`).
        """
        mapping = self.mapping
        windows = [*mapping, new_window]
        merge_results: list[tuple[Any, list[Any]]] = []

        class _Callback:
            @staticmethod
            def merge(to_be_merged: Any, merge_result: Any) -> None:
                merge_results.append((merge_result, list(to_be_merged)))

        self._assigner.merge_windows(windows, _Callback())

        result_window = new_window
        merged_new_window = False
        for merge_result, merged_windows in merge_results:
            if new_window in merged_windows:
                merged_new_window = True
                merged_windows.remove(new_window)
                result_window = merge_result
            # the merge result keeps the state window of one of the merged windows
            state_window = mapping[merged_windows[0]]
            merged_state_windows = []
            for w in merged_windows:
                sw = mapping.pop(w, None)
                if sw is not None:
                    merged_state_windows.append(sw)
            mapping[merge_result] = state_window
            merged_state_windows.remove(state_window)
            # a window merged into itself (the new window lay inside it) needs no merge
            if not (len(merged_windows) == 1 and merged_windows[0] == merge_result):
                merge_function(merge_result, merged_windows, state_window, merged_state_windows)
        if not merge_results or (result_window == new_window and not merged_new_window):
            mapping[result_window] = result_window
        return result_window

    def __len__(self) -> int:
        return len(self.mapping)

    def __repr__(self) -> str:
        return f"MergingWindowSet({self.mapping!r})"
