"""Window functions: what is computed when a window fires (SPEC §9). Names follow PyFlink.

* :class:`ProcessWindowFunction` sees all elements of the window (or the one pre-aggregated
  value when combined with a reduce or aggregate function) and a context with the window.
* :class:`WindowFunction` is the older, context-less form (``apply``).

The ``Internal...`` adapters turn each combination into one call shape for the window operator:
``process(key, window, context, contents) -> iterable of outputs``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

from streamstate.api.functions import Function, KeyedStateStore, OutputTag, RuntimeContext

__all__ = [
    "InternalWindowFunction",
    "ProcessWindowFunction",
    "WindowFunction",
    "internal_window_function",
]


class ProcessWindowFunction(Function, ABC):
    """Processes the contents of one window of one key when it fires.

    >>> class CountPerWindow(ProcessWindowFunction):
    ...     def process(self, key, context, elements):
    ...         w = context.window()
    ...         yield key, w.start, w.end, len(list(elements))
    """

    class Context(ABC):
        """What ``process`` and ``clear`` see."""

        @abstractmethod
        def window(self) -> Any:
            """The window being processed."""

        @abstractmethod
        def current_processing_time(self) -> int: ...

        @abstractmethod
        def current_watermark(self) -> int: ...

        @abstractmethod
        def window_state(self) -> KeyedStateStore:
            """Keyed state scoped to this key and window; clear it in
            :meth:`ProcessWindowFunction.clear`."""

        @abstractmethod
        def global_state(self) -> KeyedStateStore:
            """Keyed state of this key shared by all its windows."""

        @abstractmethod
        def output(self, tag: OutputTag, value: Any) -> None:
            """Emit ``value`` to the side output ``tag``."""

    @abstractmethod
    def process(
        self, key: Any, context: ProcessWindowFunction.Context, elements: Iterable[Any]
    ) -> Iterable[Any] | None:
        """The outputs of one firing of one window."""

    def clear(self, context: ProcessWindowFunction.Context) -> None:
        """Called when the window is cleaned up: clear what was put in ``window_state()``."""


class WindowFunction(Function, ABC):
    """The context-less window function: ``apply(key, window, inputs)``."""

    @abstractmethod
    def apply(self, key: Any, window: Any, inputs: Iterable[Any]) -> Iterable[Any] | None: ...


class InternalWindowFunction:
    """One call shape for the window operator: ``process(key, window, context, contents)``.

    ``single`` says that ``contents`` is one pre-aggregated value rather than the list of
    elements.
    """

    __slots__ = ("_clears", "_process", "function", "single")

    def __init__(self, function: Any, single: bool) -> None:
        self.function = function
        self.single = single
        # decided once: both are called for every window that fires (a million per hour at a
        # million keys), and an isinstance check against an ABC is a Python-level call
        self._process = isinstance(function, ProcessWindowFunction)
        #: whether the function's clear() does anything (the base class's does nothing)
        self._clears = self._process and (
            type(function).clear is not ProcessWindowFunction.clear
            or "clear" in getattr(function, "__dict__", {})
        )

    def open(self, runtime_context: RuntimeContext) -> None:
        if isinstance(self.function, Function):
            self.function.open(runtime_context)

    def close(self) -> None:
        if isinstance(self.function, Function):
            self.function.close()

    def process(self, key: Any, window: Any, context: Any, contents: Any) -> Any:
        fn = self.function
        elements = [contents] if self.single else contents
        if fn is None:
            return elements
        if self._process:
            return fn.process(key, context, elements)
        return fn.apply(key, window, elements)

    def clear(self, window: Any, context: Any) -> None:
        if self._clears:
            self.function.clear(context)


def internal_window_function(function: Any, single: bool) -> InternalWindowFunction:
    """Check ``function`` (a ProcessWindowFunction, a WindowFunction or None for pass-through)
    and wrap it."""
    if function is not None and not isinstance(function, (ProcessWindowFunction, WindowFunction)):
        raise TypeError(
            "a window function must be a ProcessWindowFunction or a WindowFunction, got "
            f"{type(function).__name__}"
        )
    return InternalWindowFunction(function, single)
