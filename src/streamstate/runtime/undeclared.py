"""The warning about checkpointed keyed state a program no longer declares (SPEC §14.1).

A restore keeps every state of the checkpoint, declared or not, and writes the undeclared ones
into every later checkpoint unchanged (so that a program declaring them again, or the previous
code, still finds them). Nothing reads them, though: a state renamed without its
``previous_name`` silently starts empty. After the function was opened, the runtime (the
``LocalRunner``, the Spark driver at the query's start) reports each such state once, with its
entries, in one :class:`~streamstate.errors.UndeclaredStateWarning`.

>>> print(undeclared_message("keyed-process", {"minute-counts": 1122}))  # doctest: +ELLIPSIS
operator 'keyed-process': the checkpoint holds keyed state the program does not declare when \
it opens: 'minute-counts' (1,122 entries). It is kept, unread, ...
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping

from streamstate.errors import UndeclaredStateWarning

__all__ = ["merge_counts", "undeclared_message", "warn_undeclared_states"]


def undeclared_message(operator: str, counts: Mapping[str, int | None]) -> str:
    """The warning's text for the undeclared states ``counts`` (name → entries, None when
    not counted)."""
    states = ", ".join(f"{name!r} ({_entries(n)})" for name, n in sorted(counts.items()))
    return (
        f"operator {operator!r}: the checkpoint holds keyed state the program does not "
        f"declare when it opens: {states}. It is kept, unread, in every later checkpoint. If "
        "a state was renamed, declare it with previous_name=<its old name> to keep its entries "
        '(docs: "Upgrading a job"); a state that is gone for good can be dropped with a '
        "savepoint rewrite; a state the function creates later, on its first use (a window "
        "trigger's, say), is read again once it does"
    )


def _entries(n: int | None) -> str:
    if n is None:
        return "entries not counted"
    return f"{n:,} {'entry' if n == 1 else 'entries'}"


def merge_counts(parts: Iterable[Mapping[str, int | None]]) -> dict[str, int | None]:
    """The entries per state over every subtask (None if a subtask could not count them)."""
    total: dict[str, int | None] = {}
    for part in parts:
        for name, n in part.items():
            before = total.get(name, 0)
            total[name] = None if before is None or n is None else before + n
    return total


def warn_undeclared_states(operator: str, counts: Mapping[str, int | None]) -> None:
    """Warn once about the undeclared states of ``counts`` that hold entries (an empty one
    loses nothing; nothing is said when none holds any)."""
    holding = {name: n for name, n in counts.items() if n != 0}
    if holding:
        warnings.warn(undeclared_message(operator, holding), UndeclaredStateWarning, stacklevel=3)
