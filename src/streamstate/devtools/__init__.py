"""Development tools: a local Spark standalone cluster, a local Spark Connect server and nodes
with their own network addresses (network namespaces), for the tests, the benchmarks and
``streamstate demo --cluster/--remote``; the fuzzer of every checkpoint decoder
(:mod:`streamstate.devtools.fuzzing`).

Not on the runtime path: no module of :mod:`streamstate.spark`, the runtime, the backends or the
checkpoint layer imports it (``tools/check_imports.py``).
"""
