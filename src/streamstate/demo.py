"""The main job: page views per app per hour (the seeds' example).

A generated stream of page-view events ``(app, timestamp_ms)`` is keyed by app; each app keeps
one counter per hour of event time in the hour's namespace, and an event-time timer at the end
of each hour emits ``(app, hour, views)`` once the watermark passes it and clears that hour's
state. Run it with ``python -m streamstate.demo`` (``make demo``).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from streamstate.api.descriptors import ReducingStateDescriptor
from streamstate.api.functions import KeyedProcessFunction, RuntimeContext
from streamstate.runtime.local import LocalRunner
from streamstate.serializers import Int64Serializer

__all__ = ["PageViewsPerHour", "generate_events", "main"]

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


class PageViewsPerHour(KeyedProcessFunction):
    """Counts views per app per hour; the hour (its start in ms) is the state's namespace."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.views = ReducingStateDescriptor("views", lambda a, b: a + b, int)
        self.backend: Any = runtime_context._backend  # type: ignore[attr-defined]

    def _hour_state(self, hour: int) -> Any:
        return self.backend.get_partitioned_state(hour, Int64Serializer(), self.views)

    def process_element(self, value: tuple[str, int], ctx: Any) -> None:
        hour = value[1] // HOUR_MS * HOUR_MS
        self._hour_state(hour).add(1)
        ctx.timer_service().register_event_time_timer(hour + HOUR_MS - 1)

    def on_timer(self, timestamp: int, ctx: Any) -> Iterator[tuple[str, int, int]]:
        hour = timestamp + 1 - HOUR_MS
        state = self._hour_state(hour)
        yield (ctx.get_current_key(), hour // HOUR_MS, state.get())
        state.clear()


def main(events: int = 200_000, parallelism: int = 2) -> list[tuple[str, int, int]]:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    runner = LocalRunner(
        PageViewsPerHour(),
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
