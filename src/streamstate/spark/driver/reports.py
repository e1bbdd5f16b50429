"""How a streaming query and the runner of its micro-batches learn of each other: two small
interfaces, one for each end, with one implementation per kind of session, chosen once when
the query starts (``query/start.py``, ``reports_for``).

Spark runs a query's micro-batches in its ``foreachBatch`` function, a
:class:`~streamstate.spark.driver.step.micro_batches.MicroBatchRunner`. In a classic session it
runs in the driver, next to the query
(:class:`~streamstate.spark.driver.query.classic.ClassicReports`: the two ends share the
runner; the figures go into Spark's progress through its observation). Through Spark Connect
it runs in a Python process of the server, which the client cannot reach
(:class:`~streamstate.spark.driver.query.connect.ConnectReports`: both ends are copies of one
object, which talk through report files in the checkpoint).

* :class:`StepReports`, the runner's end: what the runner tells (each step's figures, each
  Spark micro-batch's, what failed) and asks (is the query still running?).
* :class:`QueryReports`, the query's end: how the query starts its runner, and learns its
  steps' figures, its failures and its progress.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

__all__ = ["QueryReports", "StepReports"]


class StepReports(ABC):
    """The runner's end (see the module docstring)."""

    @abstractmethod
    def input(self, df: Any) -> Any:
        """The micro-batch's input ``df`` as its jobs read it."""

    @abstractmethod
    def step(self, figures: dict[str, Any], count: int) -> None:
        """The ``count``-th step of the run was committed and delivered (``figures``: its
        entry of ``query.batches``)."""

    @abstractmethod
    def micro_batch(self, runner: Any, session: Any, steps: list[dict[str, Any]]) -> None:
        """Spark's micro-batch ended after the ``runner`` ran ``steps`` for it (their state
        figures) in ``session``."""

    @abstractmethod
    def failed(self, failure: BaseException, batch_id: int | None, operator: str) -> None:
        """A micro-batch (``batch_id``; None: a no-data micro-batch of the idle ticker) failed
        with ``failure``, as the query should raise it."""

    @abstractmethod
    def running(self) -> bool:
        """The query still runs (the idle ticker asks before a no-data micro-batch)."""

    @abstractmethod
    def input_batch_starting(self) -> bool:
        """Spark is running a trigger that found new input (its step fires what is due)."""

    @abstractmethod
    def stop_query(self) -> None:
        """Stop the query: a no-data micro-batch of the idle ticker failed."""

    @abstractmethod
    def idle_session(self, last: Any) -> Any:
        """The session the idle ticker runs its jobs in (``last``: the last micro-batch's;
        None before the first)."""


class QueryReports(ABC):
    """The query's end (see the module docstring)."""

    @abstractmethod
    def foreach_batch(self, parts: Any, timings: Any, df: Any) -> tuple[Any, Any]:
        """Spark's ``foreachBatch`` function for a run of ``parts`` (what runs its steps,
        ``RunParts``; ``timings``: the query's own
        :class:`~streamstate.spark.driver.monitor.figures.Spans`), and the streaming input
        ``df`` as the query reads it."""

    @abstractmethod
    def start(self, writer: Any, where: str) -> Any:
        """Start Spark's query from its ``DataStreamWriter`` (its own checkpoint at
        ``where``); returns Spark's ``StreamingQuery``."""

    @abstractmethod
    def sync(self, sinks: bool = True) -> None:
        """Take in what the runner reported since (the steps' figures; with ``sinks``, what
        the memory sinks received)."""

    @abstractmethod
    def batches(self) -> list[dict[str, Any]]:
        """The figures of every step the run ran, as of the last :meth:`sync`
        (``query.batches``)."""

    @abstractmethod
    def failure(self, spark_error: BaseException | None) -> BaseException | None:
        """The error a failed micro-batch raised, as the query raises it (None: none known;
        ``spark_error``: Spark's exception, whose text may carry it)."""

    @abstractmethod
    def idle_failure(self) -> BaseException | None:
        """The error of a no-data micro-batch of the idle ticker that stopped the run."""

    @abstractmethod
    def progress(self, progress: list[Any]) -> list[Any]:
        """Spark's ``StreamingQueryProgress`` es, each with its micro-batch's state figures."""

    @abstractmethod
    def stop(self, timeout: float | None) -> None:
        """The query stops: no new no-data micro-batch (one running ends within
        ``timeout`` s, None: waited for)."""

    @abstractmethod
    def log_again(self) -> None:
        """Give Spark's query-failure loggers their levels back, once the query stopped."""
