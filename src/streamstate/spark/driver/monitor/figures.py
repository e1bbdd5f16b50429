"""What the driver measures of a streaming query, and the figures it makes of it (SPEC §13.5).

One small recorder, :class:`Spans` (named spans in milliseconds from a start), measures a
query's fixed costs (``query.timings``) and each step's phases: planning, placing the
micro-batch, the Spark job, the driver's delivery, the commit, the sinks. The step's figures are
made here and nowhere else, from its plan, the subtasks' acknowledgements and its spans
(``step_entry``: one dict of ``query.batches``, its ``state`` the figures of Spark's progress,
``state_figures``), and a Spark micro-batch's progress figures from its steps'
(:func:`micro_batch_figures`).

The figure names of the progress follow Spark's ``StateOperatorProgress`` where one exists
(``numRowsTotal``, ``numRowsUpdated``, ``numRowsRemoved``, ``memoryUsedBytes``,
``numRowsDroppedByWatermark``); docs/spark/monitoring.md lists them all.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from streamstate.spark.wire.acks import TaskAck
from streamstate.spark.wire.results import BatchResult, StagedOutput

__all__ = [
    "FIGURES",
    "TOTALS",
    "Spans",
    "micro_batch_figures",
    "state_figures",
    "step_entry",
]

#: every figure of a micro-batch, in the order of the observed row (all ``long``; null when
#: unknown). Levels (the state after the micro-batch) and totals (summed over its steps):
FIGURES = (
    "checkpointId",  # level: the last checkpoint the micro-batch committed
    "numSteps",  # total: checkpoints committed (1 + the no-data micro-batches run with it)
    "numInputRows",  # total: records the subtasks processed
    "numOutputRows",  # total: rows given to the sink
    "numRowsTotal",  # level: state entries over every subtask (streamstate.format.entries)
    "numRowsUpdated",  # total: state entries written
    "numRowsRemoved",  # total: state entries removed
    "stateBytes",  # level: RocksDB's live data and memtables (null on the heap backend)
    "memoryUsedBytes",  # level: resident memory of the processes holding the state
    "numRowsDroppedByWatermark",  # total: late records the windows dropped
    "numTimersPending",  # level: event- and processing-time timers
    "numTimersFired",  # total
    "numHotSubtasks",  # total: subtask steps that found their state in memory
    "numReloadedSubtasks",  # total: subtask steps that reloaded it from the checkpoint
    "checkpointBytes",  # total: bytes of the files the checkpoints wrote
    "checkpointFullBytes",  # level: bytes of every file the last checkpoint references
    "checkpointDurationMs",  # total: slowest subtask's checkpoint plus the driver's commit
    "watermarkMs",  # level: the event-time watermark the last step ran with (null: none)
)
#: figures that add up over the steps of one micro-batch (the others: the last step's)
TOTALS = frozenset(
    {
        "numSteps",
        "numInputRows",
        "numOutputRows",
        "numRowsUpdated",
        "numRowsRemoved",
        "numRowsDroppedByWatermark",
        "numTimersFired",
        "numHotSubtasks",
        "numReloadedSubtasks",
        "checkpointBytes",
        "checkpointDurationMs",
    }
)
_MIN_WATERMARK = -(1 << 63)
#: what a step's entry keeps of a task's timings, per subtask
_TASK_TIMINGS = ("connect_ms", "spawn_ms", "stream_ms")


class Spans:
    """Named spans in milliseconds (``name_ms``), and marks of the time since :meth:`restart`
    (or since it was made).

    >>> spans = Spans()
    >>> with spans.span("commit"):
    ...     pass
    >>> spans.mark("batch")
    >>> sorted(spans.ms), spans.ms["commit_ms"] <= spans.ms["batch_ms"]
    (['batch_ms', 'commit_ms'], True)
    """

    __slots__ = ("_start", "ms")

    def __init__(self) -> None:
        self._start = time.perf_counter()
        #: the spans and marks so far, by name (``commit_ms``)
        self.ms: dict[str, float] = {}

    def restart(self) -> None:
        """Start again from now, with no span (a new step)."""
        self._start = time.perf_counter()
        self.ms = {}

    def elapsed(self) -> float:
        """Milliseconds since the start."""
        return (time.perf_counter() - self._start) * 1e3

    def mark(self, name: str) -> None:
        """``name_ms``: the time since the start, unless marked already."""
        self.ms.setdefault(f"{name}_ms", self.elapsed())

    @contextlib.contextmanager
    def span(self, name: str) -> Iterator[None]:
        """``name_ms``: how long the ``with`` block took (added up if it runs again)."""
        start = self.elapsed()
        try:
            yield
        finally:
            key = f"{name}_ms"
            self.ms[key] = self.ms.get(key, 0.0) + self.elapsed() - start


def _sum(values: Iterable[int | None]) -> int | None:
    """The sum, or None when any value is unknown."""
    total = 0
    for v in values:
        if v is None:
            return None
        total += v
    return total


def state_figures(
    results: Sequence[BatchResult], checkpoint_id: int, watermark: int | None, output_rows: int
) -> dict[str, int | None]:
    """One step's figures of Spark's progress from the subtasks' results;
    ``checkpointDurationMs`` leaves out the driver's commit (:func:`step_entry` adds it)."""
    states = [r.state for r in results]
    known = [s for s in states if s is not None]
    complete = len(known) == len(states)
    restores = [r.restore for r in results]
    return {
        "checkpointId": checkpoint_id,
        "numSteps": 1,
        "numInputRows": sum(r.rows for r in results),
        "numOutputRows": output_rows,
        "numRowsTotal": sum(s.rows for s in known) if complete else None,
        "numRowsUpdated": _sum(s.rows_updated for s in known) if complete else None,
        "numRowsRemoved": _sum(s.rows_removed for s in known) if complete else None,
        "stateBytes": _sum(s.state_bytes for s in known) if complete else None,
        "memoryUsedBytes": _sum(r.memory_bytes for r in results),
        "numRowsDroppedByWatermark": sum(r.late_records_dropped for r in results),
        "numTimersPending": sum(r.timers for r in results),
        "numTimersFired": sum(r.timers_fired for r in results),
        "numHotSubtasks": restores.count("hot"),
        "numReloadedSubtasks": restores.count("reload"),
        "checkpointBytes": sum(r.checkpoint_bytes for r in results),
        "checkpointFullBytes": sum(r.checkpoint_full_bytes for r in results),
        "checkpointDurationMs": int(
            max(
                (r.stats.get("stage_ms", 0.0) + r.stats.get("checkpoint_wait_ms", 0.0))
                for r in results
            )
            if results
            else 0
        ),
        "watermarkMs": None if watermark is None or watermark <= _MIN_WATERMARK else watermark,
    }


def micro_batch_figures(steps: Sequence[dict[str, int | None]]) -> dict[str, int | None] | None:
    """The figures of the steps one Spark micro-batch ran (its input's and the no-data
    micro-batches after it): totals added up, levels from the last step; None without steps."""
    if not steps:
        return None
    out = dict(steps[-1])
    for name in TOTALS:
        out[name] = _sum(s.get(name) for s in steps)
    return out


def _subtask_entry(ack: TaskAck, result: BatchResult) -> dict[str, Any]:
    timings = ack.timings
    entry: dict[str, Any] = {
        "subtask": result.subtask,
        "restore": result.restore,
        "route": timings.route if ack.location is not None else None,
        "rows": result.rows,
    }
    for name in _TASK_TIMINGS:
        entry[name] = getattr(timings, name)
    if timings.fallback is not None:
        entry["fallback"] = timings.fallback
    entry.update(result.stats)
    if result.state_metrics:
        entry["state_metrics"] = result.state_metrics
    return entry


def step_entry(
    plan: Any,
    spans: dict[str, float],
    *,
    due: str | None = None,
    acks: Sequence[TaskAck] = (),
    pre_aggregated: bool = False,
    side_outputs: dict[str, list[StagedOutput]] | None = None,
) -> dict[str, Any]:
    """One step's entry of ``query.batches``: what it was (``plan``, a
    :class:`~streamstate.spark.driver.step.commit.BatchPlan`; ``due``: why a no-data step
    ran), what its subtasks acknowledged (``acks``: none for a step only delivered again),
    the side outputs delivered (tag id -> staged files) and its ``spans``."""
    entry: dict[str, Any] = {
        "batch": plan.spark_batch,
        "checkpoint": plan.batch,
        "no_data": plan.no_data,
        "replayed": plan.replay,
        "plan_ms": spans.get("plan_ms", 0.0),
    }
    if plan.no_data and not plan.replay:
        entry["due"] = due
        entry["idle"] = plan.during_batch is None
    if acks:
        entry.update(_run_figures(plan, acks, pre_aggregated))
        commit_ms = spans.get("commit_ms", 0.0)
        entry["state"]["checkpointDurationMs"] += int(commit_ms)
    if side_outputs is not None:
        entry["side_output_rows"] = {
            tag: sum(f.rows for f in files) for tag, files in side_outputs.items()
        }
    entry.update(spans)
    return entry


def _run_figures(plan: Any, acks: Sequence[TaskAck], pre_aggregated: bool) -> dict[str, Any]:
    """What the subtasks of a step that ran acknowledged, added up."""
    pairs = sorted(
        ((a, a.result) for a in acks if a.result is not None), key=lambda p: p[0].subtask
    )
    results = [r for _, r in pairs]
    output_rows = sum(r.output_rows for r in results)
    figures: dict[str, Any] = {
        "rows": sum(r.rows for r in results),
        "output_rows": output_rows,
        "late_records_dropped": sum(r.late_records_dropped for r in results),
    }
    if pre_aggregated:
        figures["partials"] = sum(r.partials for r in results)
    figures["side_outputs_dropped"] = sum(r.side_outputs_dropped for r in results)
    figures["restore"] = sorted({r.restore for r in results})
    figures["subtasks"] = [_subtask_entry(a, r) for a, r in pairs]
    figures["routes"] = sorted({a.timings.route for a in acks if a.location is not None})
    figures["watermark"] = plan.watermark
    figures["state"] = state_figures(results, plan.batch, plan.watermark, output_rows)
    return figures
