"""Build of the optional compiled parts (everything else is in pyproject.toml).

* ``streamstate.backends.heap._entry``: the copy-on-write state map's entry in C (64 bytes and
  untracked by the cyclic GC, against 80 for the pure-Python entry);
* ``streamstate.backends.heap._value_state``: the heap value state's ``value()`` and
  ``update()`` on their common path;
* ``streamstate.runtime._record_loop``: the record loop (per record the current key, the call
  of ``process_element`` and its outputs collected);
* ``streamstate._key_groups``: a key's key group (Java's ``hashCode`` and Flink's murmur hash)
  for int, str, bytes, bool, float and tuple keys;
* ``streamstate.backends.decorators._sampling``: the metrics decorators' unsampled path.

All are optional: if one cannot be compiled the install still succeeds and its pure-Python
reference is used (``STREAMSTATE_PURE_PYTHON=1`` forces the references).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "streamstate.backends.heap._entry",
            ["src/streamstate/backends/heap/_entry.c"],
            depends=["src/streamstate/backends/heap/_entry.h"],
            optional=True,
        ),
        Extension(
            "streamstate.backends.heap._value_state",
            ["src/streamstate/backends/heap/_value_state.c"],
            depends=["src/streamstate/backends/heap/_entry.h"],
            optional=True,
        ),
        Extension(
            "streamstate.runtime._record_loop",
            ["src/streamstate/runtime/_record_loop.c"],
            include_dirs=["src/streamstate"],
            depends=["src/streamstate/_java_hash.h"],
            optional=True,
        ),
        Extension(
            "streamstate._key_groups",
            ["src/streamstate/_key_groups.c"],
            depends=["src/streamstate/_java_hash.h"],
            optional=True,
        ),
        Extension(
            "streamstate.backends.decorators._sampling",
            ["src/streamstate/backends/decorators/_sampling.c"],
            optional=True,
        ),
    ]
)
