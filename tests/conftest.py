"""Shared fixtures: keyed state backends of every kind, so behaviour tests run on all of them;
and how `make test` deals the tests out to its pytest-xdist workers."""

from __future__ import annotations

import gc
import json
import os
import shutil
import tempfile
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


@pytest.fixture(autouse=True)
def _no_gc_policy_left_behind() -> Iterator[None]:
    """A test that runs a Spark subtask in this process installs the heap's GC policy
    (``gc_freeze``, ``streamstate.spark.subtask``); left installed, it freezes the objects of
    later tests, and those counting live objects (``gc.get_objects`` omits frozen ones) fail
    depending on which tests their worker ran before. Uninstalled and unfrozen after the test
    that installed it."""
    from streamstate.backends.heap import copy_on_write

    installed = copy_on_write._gc_policy_callback in gc.callbacks
    yield
    if not installed and copy_on_write._gc_policy_callback in gc.callbacks:
        copy_on_write.uninstall_gc_policy()
        gc.unfreeze()


#: fixtures that start another process (tests using them are marked ``subprocess``)
SUBPROCESS_FIXTURES = frozenset({"s3_server", "s3_bucket"})


#: test modules sharing a standalone cluster (the session's, or their module's)
CLUSTER_MODULES = (
    "tests/spark_cluster/test_cluster.py",
    "tests/spark_cluster/test_netns_faults.py",
)
#: the test module of the Spark Connect server (``connect_spark``, ``tests/spark/conftest.py``)
CONNECT_MODULE = "tests/spark/driver/query/test_connect.py"
#: other tests on the Spark Connect server (``connect_server``) whose node ids do not say so
CONNECT_TESTS = (
    "tests/spark/test_record_types.py::test_record_types_of_the_job_script_through_spark_connect",
)
#: tests that share a module-scoped child process, by the start of their node ids (a module's
#: ``path::`` or a test's ``path::name``): each group runs in one worker, which starts it once
SHARED_PROCESS_TESTS = (
    # the older driver of every fencing case (``driver_a``)
    "tests/spark/driver/query/test_spark_fencing.py::"
    "test_a_second_driver_fences_the_first_and_the_job_stays_exact",
    # the state host of the attacks (``host``)
    "tests/spark/host/test_host_security.py::",
)


def xdist_scope(nodeid: str) -> str:
    """The unit of work a pytest-xdist worker takes whole under ``make test`` (``--dist
    loadgroup``, scheduled by :func:`pytest_xdist_make_scheduler`): ``cluster`` for the tests
    of the two standalone clusters (one worker runs them, one cluster after the other: with
    two at once on a loaded 2-core machine a driver timed out waiting for a batch), ``connect``
    for the tests on the Spark Connect server (the ``connect`` and ``connect_spark`` parameters
    of ``any_spark`` and ``session``, ``test_connect.py`` and :data:`CONNECT_TESTS`), so that
    one worker starts it; the tests of a group of :data:`SHARED_PROCESS_TESTS` together (one
    worker starts the process they share); any other test alone (each worker starts its own
    local SparkSession when a Spark test first needs one)."""
    module = nodeid.partition("::")[0]
    if module in CLUSTER_MODULES:
        return "cluster"
    test, _, params = nodeid.partition("[")
    cases = params.rstrip("]").split("-")
    if module == CONNECT_MODULE or test in CONNECT_TESTS or {"connect", "connect_spark"} & {*cases}:
        return "connect"
    return next((group for group in SHARED_PROCESS_TESTS if nodeid.startswith(group)), nodeid)


#: the ``workerinput`` key naming the directory where the workers write which of their tests
#: need the worker's local SparkSession (:func:`pytest_collection_modifyitems`)
_SESSION_USERS_KEY = "streamstate_local_session_users"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    if node.config.getvalue("dist") == "loadgroup":
        directory = getattr(node.config, "_streamstate_session_users", None)
        if directory is None:
            directory = node.config._streamstate_session_users = tempfile.mkdtemp(
                prefix="streamstate-xdist-"
            )
        node.workerinput[_SESSION_USERS_KEY] = directory


def pytest_unconfigure(config: Any) -> None:
    directory = getattr(config, "_streamstate_session_users", None)
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


def uses_local_session(item: Any) -> bool:
    """Whether a test needs its worker's local SparkSession (the ``spark`` fixture, also as
    ``any_spark``'s or a ``session`` parameter's classic case), whose start and first queries
    cost a worker about 10 s."""
    if "spark" in getattr(item, "fixturenames", ()):
        return True
    params = getattr(getattr(item, "callspec", None), "params", {})
    return "spark" in params.values() or params.get("any_spark") == "classic"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: Any, log: Any) -> Any:
    """``--dist loadgroup`` by :func:`xdist_scope`: pytest-xdist 3.8 names a test's group by
    suffixing its node id, which pytest 9 no longer allows (``xdist_group`` marks are lost).

    Units are dealt in the workers' order (:func:`pytest_collection_modifyitems`: the cluster
    and Connect units first), with one preference: the worker of the ``cluster`` unit starts no
    local SparkSession of its own while there is other work for it (the cluster tests run child
    drivers), so it takes the units that need none first (processes of their own, no Spark),
    and the other workers take those that need one first; each takes the other kind when its
    own kind runs out. Which tests need one, the workers write at collection
    (:func:`uses_local_session`)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def __init__(self, config: Any, log: Any) -> None:
            super().__init__(config, log)
            self.session_users: set[str] | None = None
            self.cluster_node: Any = None

        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

        def _needs_session(self, unit: dict[str, bool]) -> bool:
            assert self.session_users is not None
            return any(nodeid in self.session_users for nodeid in unit)

        def _assign_work_unit(self, node: Any) -> None:
            if self.session_users is None:
                self.session_users = _read_session_users(config)
            scope = next(iter(self.workqueue))
            if self.session_users and scope not in ("cluster", "connect"):
                # the cluster node prefers units without the local session, the others those
                # with it (when there is no cluster unit, every node is one of the others)
                wanted = node is not self.cluster_node
                scope = next(
                    (s for s, u in self.workqueue.items() if self._needs_session(u) == wanted),
                    scope,
                )
            if scope == "cluster":
                self.cluster_node = node
            self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return GroupScheduling(config, log)


def _read_session_users(config: Any) -> set[str]:
    """The node ids of the tests that need the local SparkSession, as the workers wrote them
    (empty when they did not: every unit is then dealt in order)."""
    directory = getattr(config, "_streamstate_session_users", None)
    users: set[str] = set()
    for name in os.listdir(directory) if directory else ():
        if name.endswith(".json"):
            with open(os.path.join(directory, name)) as f:
                users.update(json.load(f))
    return users


def _cost_rank(item: Any) -> int:
    """Where a test is dealt out under ``make test``, the likely longest first: 0 the cluster
    tests, 1 the Connect tests, then among the other tests that start Spark or other
    processes: 2 a test starting a standalone cluster of its own (the cluster demo: about a
    minute), 3 the ``slow`` ones (a model-based test, a whole Sphinx build, a driver of their
    own), 4 the other Spark tests, 5 the other ``subprocess`` tests (a state host, an S3
    server, a child killed on purpose: seconds each, they fill the workers' last minutes);
    6 else."""
    scope = xdist_scope(item.nodeid)
    if scope in ("cluster", "connect"):
        return 0 if scope == "cluster" else 1
    if item.get_closest_marker("cluster") is not None:
        return 2
    if item.get_closest_marker("slow") is not None:
        return 3
    if {"spark", "connect_spark", "any_spark"} & set(getattr(item, "fixturenames", ())) or (
        item.get_closest_marker("spark") is not None
    ):
        return 4
    if item.get_closest_marker("subprocess") is not None:
        return 5
    return 6


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    for item in items:
        if SUBPROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.subprocess)
    if hasattr(config, "workerinput"):
        # on pytest-xdist workers (``make test`` runs ``--no-loadscope-reorder``, which deals
        # the units out in this order): the longest work first, so that the workers finish
        # together rather than one waiting on the cluster tests dealt out last; a stable sort
        # keeps each module's own order
        items.sort(key=_cost_rank)
        directory = config.workerinput.get(_SESSION_USERS_KEY)
        if directory is not None:  # for the scheduler (pytest_xdist_make_scheduler)
            path = os.path.join(directory, config.workerinput["workerid"])
            with open(path + ".tmp", "w") as f:
                json.dump([item.nodeid for item in items if uses_local_session(item)], f)
            os.replace(path + ".tmp", path + ".json")


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
