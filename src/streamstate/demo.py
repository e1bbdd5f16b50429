"""The main job: page views per app per hour (the seeds' example).

A generated stream of page-view events ``(app, timestamp_ms)`` is keyed by app; each app keeps
one counter per hour of event time, with the hour's window as the state's namespace; when the
watermark passes the end of an hour, ``(app, hour, views)`` is emitted and that hour's state and
timers are cleared. Run it with ``python -m streamstate.demo`` (``make demo``).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from streamstate.api.functions import AggregateFunction
from streamstate.runtime.local import LocalRunner
from streamstate.windows import ProcessWindowFunction, TumblingEventTimeWindows, window

__all__ = ["CountViews", "EmitHour", "generate_events", "main", "page_views_per_hour"]

HOUR_MS = 3_600_000


def generate_events(
    n: int, apps: int = 5, hours: int = 6, seed: int = 7, disorder_ms: int = 60_000
) -> Iterator[tuple[str, int]]:
    """``n`` page views over ``hours`` hours, roughly in time order (bounded disorder)."""
    rnd = random.Random(seed)
    span = hours * HOUR_MS
    for i in range(n):
        ts = i * span // n + rnd.randrange(-disorder_ms, disorder_ms + 1)
        yield (f"app-{rnd.randrange(apps)}", max(0, ts))


class CountViews(AggregateFunction):
    """Counts the views of one app in one hour."""

    def create_accumulator(self) -> int:
        return 0

    def add(self, value: Any, accumulator: int) -> int:
        return accumulator + 1

    def get_result(self, accumulator: int) -> int:
        return accumulator

    def merge(self, acc_a: int, acc_b: int) -> int:
        return acc_a + acc_b


class EmitHour(ProcessWindowFunction):
    """Emits ``(app, hour number, views)`` when an hour's window fires."""

    def process(self, key: str, context: Any, counts: Any) -> Iterator[tuple[str, int, int]]:
        yield key, context.window().start // HOUR_MS, counts[0]


def page_views_per_hour() -> Any:
    """The keyed function of the job: hourly tumbling event-time windows per app.

    Each window (the hour) is the namespace of the app's counter state; when the watermark
    passes the end of the hour the window fires and its state and timers are removed.
    """
    return window(TumblingEventTimeWindows.of(HOUR_MS)).aggregate(CountViews(), EmitHour())


def main(events: int = 200_000, parallelism: int = 2) -> list[tuple[str, int, int]]:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    runner = LocalRunner(
        page_views_per_hour(),
        key_selector=lambda e: e[0],
        parallelism=parallelism,
        timestamp_assigner=lambda e: e[1],
        watermark_delay=120_000,
    )
    with console.status(f"processing {events:,} page views with {parallelism} subtasks"):
        results = runner.run(generate_events(events))
    table = Table(title="page views per app per hour")
    table.add_column("app")
    table.add_column("hour", justify="right")
    table.add_column("views", justify="right")
    for app, hour, views in sorted(results):
        table.add_row(app, str(hour), f"{views:,}")
    console.print(table)
    leftover = sum(op.keyed_backend.num_entries() for op in runner.subtasks)
    console.print(
        f"{len(results)} hourly results; state entries left after the last watermark: {leftover}"
    )
    runner.close()
    return results


if __name__ == "__main__":
    main()
