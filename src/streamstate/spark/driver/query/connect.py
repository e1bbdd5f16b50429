"""How the server side of a Spark Connect query reports to its client.

A query started from a Spark Connect client runs its micro-batches in a Python process of the
server (:class:`~streamstate.spark.driver.micro_batches.MicroBatchRunner`, pickled there). The
client cannot reach that process; both reach the checkpoint's storage. The server writes, under
``connect/<start ms>-<run id>/``:

* ``batches/<checkpoint>-<n>.json``: the figures of each step (``query.batches`` on the client);
* ``memory/<sink>/...``: what a memory sink received (the client's ``MemorySink`` mirrors it);
* ``failure.json``: the error that failed a micro-batch (the client raises it).

The client writes ``stopped`` when it stops the query: the server's idle ticker then runs no
more no-data micro-batches. Each report is written once, atomically.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from streamstate.spark.driver.sinks import MemorySink, Sink
from streamstate.spark.failures import error_from_report

__all__ = ["CONNECT_DIR", "CONNECT_REPORTS_KEPT", "ConnectReports"]

log = logging.getLogger(__name__)

#: the directory of the checkpoint that holds the reports, one directory per query run
CONNECT_DIR = "connect"
#: the Connect query runs whose reports a checkpoint keeps: a Connect query deletes older ones
#: when it starts (the reports are the client's only copy of the figures, memory-sink outputs
#: and errors of a run; an earlier run's client may still be reading them)
CONNECT_REPORTS_KEPT = 3


class ConnectReports:
    """The reports of one Connect query run, in the checkpoint's ``storage`` under
    ``directory``."""

    def __init__(self, storage: Any, directory: str) -> None:
        self.storage = storage
        self.directory = directory
        #: the batch reports the client read so far, by file name (each is written once)
        self._read: dict[str, Any] = {}

    @classmethod
    def start(cls, storage: Any, run_id: str) -> ConnectReports:
        """The reports of a query run starting now: ``connect/<start ms>-<run id>``, after
        deleting all but the last ``CONNECT_REPORTS_KEPT - 1`` earlier runs' (their directory
        names start with their start time)."""
        runs = sorted(n.rsplit("/", 1)[-1] for n, is_dir in storage.list_dir(CONNECT_DIR) if is_dir)
        for name in runs[: max(0, len(runs) - (CONNECT_REPORTS_KEPT - 1))]:
            storage.delete(f"{CONNECT_DIR}/{name}")
        return cls(storage, f"{CONNECT_DIR}/{time.time_ns() // 1_000_000:013d}-{run_id}")

    def mirror_memory_sinks(self, sinks: dict[str, Sink]) -> None:
        """Let the memory sinks among ``sinks`` (by name) mirror what they receive here."""
        for name, sink in sinks.items():
            if isinstance(sink, MemorySink):
                sink.mirror_to(self.storage, f"{self.directory}/memory/{name}")

    # ---- the server writes ---------------------------------------------------------------------

    def write_batch(self, figures: dict[str, Any], count: int) -> None:
        """Report one step's figures (the ``count``-th step of this run)."""
        self.storage.put_atomic(
            f"{self.directory}/batches/{figures['checkpoint']:012d}-{count:06d}.json",
            json.dumps(figures, default=str).encode(),
        )

    def write_failure(self, report: bytes) -> None:
        """Report what failed a micro-batch (``streamstate.spark.failures.failure_report``); a
        report that cannot be written is logged: Spark's own error still reaches the client."""
        try:
            self.storage.put_atomic(f"{self.directory}/failure.json", report)
        except Exception as report_error:
            log.warning("could not report the failure to the client: %r", report_error)

    def stopped(self) -> bool:
        """The client stopped the query."""
        return self.storage.size(f"{self.directory}/stopped") is not None

    # ---- the client reads ----------------------------------------------------------------------

    def mark_stopped(self) -> None:
        """Tell the server's idle ticker to run no no-data micro-batch from now on."""
        try:
            self.storage.put_atomic(f"{self.directory}/stopped", b"")
        except Exception as exc:
            log.warning("could not tell the server's idle ticker to stop: %r", exc)

    def failure(self) -> BaseException | None:
        """The error the server reported, None if it reported none (a torn or unreadable report
        raises)."""
        path = f"{self.directory}/failure.json"
        if self.storage.size(path) is None:
            return None
        return error_from_report(self.storage.read_bytes(path))

    def batches(self) -> list[dict[str, Any]]:
        """The figures of every step the server reported so far, in order (only reports not
        read before are read)."""
        prefix = f"{self.directory}/batches"
        # (a report being written is a ``.json.tmp-*`` file beside them: not read)
        names = sorted(
            name
            for n, is_dir in self.storage.list_dir(prefix)
            if not is_dir and (name := n.rsplit("/", 1)[-1]).endswith(".json")
        )
        read = self._read
        for n in names:
            if n not in read:
                read[n] = json.loads(self.storage.read_bytes(f"{prefix}/{n}"))
        return [read[n] for n in names]
