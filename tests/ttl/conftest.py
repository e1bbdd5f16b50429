"""Fixtures of the TTL tests, on top of the shared ``make_backend`` and ``clock`` fixtures:
TTL semantics run on every backend kind, heap-specific cleanup tests on heap backends only."""

from __future__ import annotations

import pytest

from streamstate.backends.heap.backend import HeapKeyedStateBackend


@pytest.fixture
def backend(make_backend, clock):
    return make_backend(max_parallelism=8, clock=clock)


@pytest.fixture
def heap_backend(backend):
    if not isinstance(backend, HeapKeyedStateBackend):
        pytest.skip("heap state tables only")
    return backend
