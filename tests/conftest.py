"""Shared fixtures: keyed state backends of every kind, so behaviour tests run on all of them."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from streamstate.backends.base import Clock, KeyedStateBackend
from streamstate.backends.registry import state_backend_from
from streamstate.keygroups import KeyGroupRange
from streamstate.serializers import serializer_for

#: every keyed backend the behavioural suites run against
BACKEND_KINDS = ["heap", "heap-nested", "rocksdb"]
if os.environ.get("STREAMSTATE_TEST_BACKENDS"):
    BACKEND_KINDS = os.environ["STREAMSTATE_TEST_BACKENDS"].split(",")


class ManualClock(Clock):
    """A processing-time clock the test moves by hand."""

    def __init__(self, start: int = 1_000) -> None:
        self.time = start

    def now(self) -> int:
        return self.time

    def advance(self, ms: int) -> None:
        self.time += ms


#: fixtures that start another process (tests using them are marked ``subprocess``)
SUBPROCESS_FIXTURES = frozenset({"s3_server", "s3_bucket"})


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    for item in items:
        if SUBPROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.subprocess)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(params=BACKEND_KINDS)
def backend_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


BackendFactory = Callable[..., KeyedStateBackend]


@pytest.fixture
def make_backend(backend_kind: str, tmp_path: Any) -> Iterator[BackendFactory]:
    """``make_backend(key_type=str, max_parallelism=128, key_group_range=None, clock=None)``."""
    created: list[KeyedStateBackend] = []

    def factory(
        key_type: Any = str,
        max_parallelism: int = 128,
        key_group_range: KeyGroupRange | None = None,
        clock: Clock | None = None,
        **options: Any,
    ) -> KeyedStateBackend:
        sb = state_backend_from(backend_kind)
        if hasattr(sb, "working_dir"):
            sb.working_dir = str(tmp_path / f"rocksdb-{len(created)}")  # type: ignore[attr-defined]
        for name, value in options.items():
            setattr(sb, name, value)
        backend = sb.create_keyed_backend(
            serializer_for(key_type),
            max_parallelism,
            key_group_range or KeyGroupRange(0, max_parallelism - 1),
            clock=clock,
            subtask_index=len(created),
        )
        created.append(backend)
        return backend

    yield factory
    for b in created:
        b.dispose()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """moto's S3 server on a free 127.0.0.1 port for the whole session (stopped by pid)."""
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    from support.s3_server import start

    server = start(str(tmp_path_factory.mktemp("moto") / "moto.log"))
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(s3_server: Any) -> tuple[str, dict[str, Any]]:
    """A new bucket: (``s3://<bucket>``, storage_options)."""
    return f"s3://{s3_server.bucket()}", s3_server.storage_options
