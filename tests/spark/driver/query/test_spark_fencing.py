"""Two real drivers racing on one checkpoint directory: the newer one takes the job over (an
epoch), the older one is fenced before its next commit, no committed ``_metadata`` is ever
replaced, and the surviving job's sink, state and checkpoints equal the oracle."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from streamstate.checkpoint.storage import FileSystemCheckpointStorage
from streamstate.cli import app
from streamstate.spark import FileSink, read_state
from support.jvm import JAVA_OPTIONS
from support.killed_driver import STREAM_DRIVER, driver_env
from support.spark_data import final_counts, make_batches, running_counts, write_batches
from support.spark_functions import Count, SlowCount
from support.stream_query import start_stream_query

pytestmark = pytest.mark.spark


class Driver:
    """``stream_driver.py`` serving queries as a child process (``serve``): one JVM for the
    cases of :func:`test_a_second_driver_fences_the_first_and_the_job_stays_exact`; its stdout
    and stderr lines are collected as they come."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                STREAM_DRIVER,
                json.dumps({"java_options": JAVA_OPTIONS, "serve": True}),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=os.path.dirname(STREAM_DRIVER),
            env=driver_env(),
        )
        self.lines: list[str] = []
        self.err: list[str] = []
        self.requests = 0
        assert self.proc.stdout is not None and self.proc.stderr is not None
        out, err = self.proc.stdout, self.proc.stderr
        self._threads = [
            threading.Thread(target=lambda: self.lines.extend(map(str.strip, out))),
            threading.Thread(target=lambda: self.err.extend(err)),
        ]
        for t in self._threads:
            t.start()

    def wait_for(self, condition: Any, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"driver did not get there: {self.lines}")
            time.sleep(0.05)

    def run(self, cfg: dict[str, Any]) -> Run:
        """Send the driver the query of ``cfg`` (it starts once the driver's earlier ones ended)."""
        assert self.proc.stdin is not None
        run = Run(self, self.requests)
        self.proc.stdin.write(json.dumps(cfg) + "\n")
        self.proc.stdin.flush()
        self.requests += 1
        return run

    def stop(self) -> None:
        """End the driver (at the end of its input; killed if it does not end)."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()  # our own child, by its handle
                self.proc.wait()
        for t in self._threads:
            t.join()


class Run:
    """One query of a serving :class:`Driver`: the lines it printed, its end."""

    def __init__(self, driver: Driver, index: int) -> None:
        self.driver, self.start, self.end = driver, f"START {index}", f"END {index} "

    @property
    def lines(self) -> list[str]:
        """What the driver printed for this query (from its ``START`` to its ``END``)."""
        lines = self.driver.lines
        if self.start not in lines:
            return []
        out = lines[lines.index(self.start) + 1 :]
        ends = [i for i, ln in enumerate(out) if ln.startswith(self.end)]
        return out[: ends[0] + 1] if ends else out

    @property
    def err(self) -> str:
        """What the driver printed on stderr for this query (a query that failed: its
        traceback)."""
        err = [ln.strip() for ln in self.driver.err]
        return "".join(self.driver.err[err.index(self.start) + 1 :]) if self.start in err else ""

    def wait_for(self, condition: Any, timeout: float = 240) -> None:
        """Wait until ``condition()`` holds while the query runs."""

        def ended() -> bool:
            if any(ln.startswith(self.end) for ln in self.lines):
                raise AssertionError(f"the query ended first: {self.lines}")
            return False

        self.driver.wait_for(lambda: condition() or ended(), timeout)

    def finish(self, timeout: float = 300) -> str:
        """Wait for the query's end: ``DONE``, ``FENCED`` or ``FAILED`` (``stream_driver.py``)."""
        self.driver.wait_for(lambda: any(ln.startswith(self.end) for ln in self.lines), timeout)
        return next(ln for ln in self.lines if ln.startswith(self.end))[len(self.end) :]


@pytest.fixture(scope="module")
def driver_a() -> Iterator[Driver]:
    """A, the older driver of the fencing cases: one process serving them all (each case
    used to start a JVM of its own, ~40 s on a loaded machine; ``xdist_scope`` in
    tests/conftest.py runs the cases in one worker)."""
    d = Driver()
    try:
        d.wait_for(lambda: "SERVING" in d.lines, timeout=300)
        yield d
    finally:
        d.stop()


def _take_over(spark: Any, cfg: dict[str, Any]) -> Any:
    """Start the query of ``stream_driver.py``'s ``cfg`` in ``spark`` (the test's own session,
    a second driver on the checkpoint): it takes the job over (a new epoch) as it starts.
    Returns the running query."""
    function = SlowCount(cfg["delay"]) if cfg.get("delay") else Count()
    return start_stream_query(
        spark, cfg, function, FileSink(cfg["sink"]), state_backend=cfg["state_backend"]
    )


#: A, the older driver, is one child process for every case (``driver_a``); B, the driver that
#: takes the job over, is the test's own session: by default both orders once, on one backend
#: each; STREAMSTATE_FENCING_REPEAT=n runs every order on every backend n times
_REPEAT = int(os.environ.get("STREAMSTATE_FENCING_REPEAT", "0"))
_CASES = (
    [(b, w, i) for i in range(_REPEAT) for b in ("heap", "rocksdb") for w in ("inside", "between")]
    if _REPEAT
    else [("heap", "inside", 0), ("rocksdb", "between", 0)]
)


@pytest.mark.parametrize(("state_backend", "when", "round_"), _CASES)
def test_a_second_driver_fences_the_first_and_the_job_stays_exact(
    spark: Any, driver_a: Driver, tmp_path: Any, state_backend: str, when: str, round_: int
) -> None:
    batches = make_batches(5, 60, users=12, seed=17 + round_)
    write_batches(str(tmp_path / "in"), batches)
    checkpoint = str(tmp_path / "ck")
    marker = str(tmp_path / "in-flight")
    cfg = {
        "input": str(tmp_path / "in"),
        "checkpoint": checkpoint,
        "sink": str(tmp_path / "out"),
        "parallelism": 2,
        "state_backend": state_backend,
        "delay": 0.02,  # a micro-batch takes ~0.6 s per subtask: the drivers overlap
        "marker": marker,
        "marker_at": batches[2][30][1],  # a record in the middle of batch 2
    }
    go = str(tmp_path / "go")
    epochs = os.path.join(checkpoint, "_epochs")
    b_error = ""
    try:
        if when == "inside":  # A's host waits inside batch 2 until B has taken the job over
            a = driver_a.run({**cfg, "go": go})
            a.wait_for(lambda: os.path.exists(marker))
        else:  # A waits after delivering batch 1, before Spark logs it and A plans batch 2
            a = driver_a.run({**cfg, "marker": None, "pause_after_batch": 1, "go": go})
            a.wait_for(lambda: "BATCH 1" in a.lines)
        assert len(os.listdir(epochs)) == 1, "B took the job over before it was told to"
        # B, the newer driver, starts its query (and so takes the job over) only now
        b = _take_over(spark, cfg)
        try:
            a.wait_for(lambda: len(os.listdir(epochs)) >= 2)
        finally:
            with open(go, "w"):
                pass
        try:
            b.await_termination()
        except Exception as exc:  # Spark's commit log refused B: checked below
            b_error = str(exc)
    finally:
        with open(go, "w"):
            pass  # a failure above must not leave A's query waiting
    end_a = a.finish()
    if when == "inside":
        # A's batch 2 finished after B took over: its commit was refused (fenced), and B ran
        # batch 2 again and every later one
        assert end_a == "FENCED", (a.lines, a.err[-3000:])
        fenced = next(ln for ln in a.lines if ln.startswith("FENCED"))
        assert "was fenced off" in fenced and "took over the job" in fenced, fenced
        assert not b_error, b_error[-3000:]
    else:
        # A is fenced when it plans batch 2, unless Spark's own commit log (shared by both
        # drivers) refused one of them first ("concurrent update"); either way it stops
        assert end_a != "DONE", a.lines
        assert end_a == "FENCED" or "concurrent" in a.err.lower(), a.err[-3000:]
        if b_error:
            assert "concurrent" in b_error.lower(), b_error[-3000:]
            _take_over(spark, {**cfg, "delay": 0}).await_termination()
    # the sink has every record's count exactly once, the state equals the oracle
    out = FileSink(cfg["sink"]).read_arrow().to_pylist()
    assert sorted((r["user"], r["n"]) for r in out) == running_counts(batches)
    state = read_state(spark, checkpoint, state="n").collect()
    assert {r.key: r.value for r in state} == final_counts(batches)
    # no driver committed after a newer one took over: epochs never go down along the
    # committed checkpoints, and every retained one is intact
    storage = FileSystemCheckpointStorage(checkpoint, "")
    committed = storage.complete_checkpoints(deep=True)
    assert committed and committed[-1].checkpoint_id == 4
    epochs = [cp.metadata.properties["epoch"] for cp in committed]
    assert epochs == sorted(epochs) and len(storage.epoch_numbers()) >= 2
    result = CliRunner().invoke(app, ["checkpoints", "verify", os.path.join(checkpoint)])
    assert result.exit_code == 0, result.output
    time.sleep(0.5)


def test_a_fenced_query_stops_only_its_own_state_hosts(spark: Any, tmp_path: Any) -> None:
    """Hosts belong to one query run: the fenced query's shutdown leaves the newer query's
    hosts serving it."""
    from streamstate.spark import keyed_process
    from streamstate.spark.task.host_client import ping

    batches = make_batches(4, 50, users=5)
    write_batches(str(tmp_path / "in"), batches[:2])

    def start() -> Any:
        from support.spark_functions import Count

        return keyed_process(
            spark.readStream.schema("user string, v long")
            .option("maxFilesPerTrigger", 1)
            .parquet(str(tmp_path / "in")),
            key="user",
            function=Count(),
            output_schema="user string, n long",
            checkpoint=str(tmp_path / "ck"),
            parallelism=2,
        ).write_stream("memory", trigger={"availableNow": True})

    older = start()
    older.query.awaitTermination()  # Spark's own wait: the hosts stay up
    write_batches(str(tmp_path / "in"), batches[2:], start=2)
    newer = start()  # takes the job over (epoch 2) and runs the new files on its own hosts
    newer.query.awaitTermination()
    assert [b["batch"] for b in newer.batches] == [2, 3]

    def alive(query: Any) -> list[bool]:
        return [ping(query.hosts.spec(i), query.hosts.secret) is not None for i in range(2)]

    assert alive(older) == [True, True]
    assert alive(newer) == [True, True]
    assert older.shutdown_hosts() == 2  # its own run's hosts
    assert alive(older) == [False, False]
    assert alive(newer) == [True, True]
    assert newer.shutdown_hosts() == 2
    assert alive(newer) == [False, False]


def test_a_batch_an_older_run_committed_first_is_adopted_by_the_newer_run(tmp_path: Any) -> None:
    """The window between an older run's last epoch check and its commit: it commits batch 1
    while the newer run computes batch 1 too. The newer run's commit finds ``chk-1`` and, as
    the holder of the newest epoch, continues from it (same input, same base) instead of
    failing; nothing is overwritten and the counts stay exact."""
    from streamstate.spark.driver.step.commit import CheckpointLog
    from support.spark_functions import Count
    from support.state_host import Driver

    d = Driver(tmp_path, Count())
    try:
        storage = d.log.storage
        old = CheckpointLog(storage, "op", 1, epoch=storage.acquire_epoch(driver="old"))
        d.log = old
        d.batch(0, ["a", "b", "a"])
        new = CheckpointLog(storage, "op", 1, epoch=storage.acquire_epoch(driver="new"))
        plan = new.plan(1)  # from chk-0
        # the older run passed its last epoch check before the takeover, and commits chk-1
        check = storage.check_epoch
        storage.check_epoch = lambda *a, **k: None  # type: ignore[method-assign]
        d.batch(1, ["a", "c"])
        storage.check_epoch = check  # type: ignore[method-assign]
        chk1 = storage.load(1)
        new.plan = lambda b: plan  # type: ignore[method-assign]
        d.log = new
        d.batch(1, ["a", "c"])  # the newer run's commit of batch 1 adopts the older one
        assert storage.load(1).metadata.properties == chk1.metadata.properties  # not replaced
        del new.plan
        r2 = d.batch(2, ["a", "b"])
        assert sorted(d.outputs(r2)) == [("a", 4), ("b", 2)]
        assert storage.load(2).metadata.properties["epoch"] == new.epoch.number
    finally:
        d.close()
