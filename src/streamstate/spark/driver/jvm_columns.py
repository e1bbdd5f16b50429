"""Columns of a classic session's JVM, built once per JVM and reused by every job.

Every keyed job builds the same few Spark expressions: its key groups, the subtask of a key
group, the sort of batch execution. Through PySpark's Column API each costs several Py4J round
trips (about 0.1-0.3 ms each on a quiet machine, 2-10 ms on a loaded one, plus one more when its
Python proxy is collected) and a parse in the JVM, for every job and every micro-batch. An
*unresolved* Column is reusable: it names columns but is bound to no DataFrame, session or
setting (each Dataset resolves and checks it in its own analysis, under the session's settings
of that moment). So the driver builds each once per JVM, keyed by what it is made of, and hands
the same Java object to every Dataset that needs it.

Nothing here can go stale: an entry is a pure function of its key (the SQL text or the column
names and numbers it was built from) and of the JVM it lives in, and the cache is per Py4J
gateway client (a new JVM has a new client, and a new, empty cache). It holds at most
:data:`MAX_ENTRIES` Columns per JVM (a driver running jobs over many different columns keeps the
most recent).
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["MAX_ENTRIES", "jvm_column"]

#: Columns kept per JVM
MAX_ENTRIES = 64

_CACHES: weakref.WeakKeyDictionary[Any, OrderedDict[Hashable, Any]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def jvm_column(spark: Any, key: Hashable, build: Callable[[Any], Any]) -> Any:
    """The Java object ``build(jvm)`` made for ``key`` in the JVM of ``spark`` (a classic
    session), made on the first call for that key and JVM and returned as it is afterwards.

    ``build`` must make an unresolved, immutable object (a Column, or a Scala ``Seq`` of
    Columns) from ``key`` alone: what it returns is shared by every later caller."""
    jvm = spark._jvm
    client = jvm._gateway_client
    with _LOCK:
        cache = _CACHES.setdefault(client, OrderedDict())
        found = cache.get(key)
        if found is not None:
            cache.move_to_end(key)
            return found
    made = build(jvm)  # outside the lock: Py4J round trips
    with _LOCK:
        cache[key] = made
        cache.move_to_end(key)
        while len(cache) > MAX_ENTRIES:
            cache.popitem(last=False)
    return made
