"""Build of the optional compiled parts (everything else is in pyproject.toml).

``streamstate.backends.heap._entry`` is the copy-on-write state map's entry in C (64 bytes and
untracked by the cyclic GC, against 80 for the pure-Python entry). It is optional: if it cannot
be compiled the install still succeeds and the pure-Python reference is used (see
``streamstate.backends.heap.copy_on_write``; ``STREAMSTATE_PURE_PYTHON=1`` forces it).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "streamstate.backends.heap._entry",
            ["src/streamstate/backends/heap/_entry.c"],
            optional=True,
        )
    ]
)
