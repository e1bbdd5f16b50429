"""The main job on the in-process :class:`~streamstate.runtime.local.LocalRunner` (no Spark)."""

from __future__ import annotations

from typing import Any

from streamstate.demo.job import generate_events, page_views_per_hour
from streamstate.runtime.local import LocalRunner

__all__ = ["run_local"]


def run_local(
    events: int = 200_000,
    parallelism: int = 2,
    console: Any = None,
    state_backend: str = "heap",
) -> list[tuple[str, int, int]]:
    """Count ``events`` generated page views per app per hour with ``parallelism`` subtasks in
    this process on ``state_backend``; prints a table and returns the ``(app, hour, views)``
    results."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    runner = LocalRunner(
        page_views_per_hour(),
        key_selector=lambda e: e[0],
        parallelism=parallelism,
        timestamp_assigner=lambda e: e[1],
        watermark_delay=120_000,
        state_backend=state_backend,
    )
    try:
        with console.status(f"processing {events:,} page views with {parallelism} subtasks"):
            results = runner.run(generate_events(events))
        table = Table(title="page views per app per hour (local runner)")
        table.add_column("app")
        table.add_column("hour", justify="right")
        table.add_column("views", justify="right")
        for app, hour, views in sorted(results):
            table.add_row(app, str(hour), f"{views:,}")
        console.print(table)
        leftover = sum(op.keyed_backend.num_entries() for op in runner.subtasks)
        console.print(
            f"{len(results)} hourly results; state entries left after the last watermark: "
            f"{leftover}"
        )
    finally:
        runner.close()
    return results
