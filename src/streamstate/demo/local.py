"""The main job on the in-process :class:`~streamstate.runtime.local.LocalRunner` (no Spark).

It counts the same page views as a fresh ``streamstate demo`` on Spark (the same slices of the
same generated stream, the same watermark delay), so both print the same closed hours.
"""

from __future__ import annotations

from typing import Any

from streamstate.demo.job import page_view_batch, page_views_per_hour
from streamstate.runtime.local import LocalRunner

__all__ = ["run_local"]


def run_local(
    events: int = 200_000,
    parallelism: int = 2,
    console: Any = None,
    state_backend: str = "heap",
    batches: int = 8,
    apps: int = 5,
    seed: int = 7,
) -> list[tuple[str, int, int]]:
    """Count ``events`` generated page views (``batches`` slices of the demo's stream) per app
    per hour with ``parallelism`` subtasks in this process on ``state_backend``; prints a table
    and returns the ``(app, hour, views)`` results of the hours the watermark closed."""
    from rich.console import Console
    from rich.table import Table

    from streamstate.demo.streaming import (
        DISORDER_MS,
        SLICE_MS,
        STREAM_START_MS,
        WATERMARK_DELAY_MS,
        hour_label,
    )

    console = console or Console()
    runner = LocalRunner(
        page_views_per_hour(),
        key_selector=lambda e: e[0],
        parallelism=parallelism,
        timestamp_assigner=lambda e: e[1],
        watermark_delay=WATERMARK_DELAY_MS,
        state_backend=state_backend,
    )
    per_slice = events // batches
    views = [
        view
        for i in range(batches)
        for view in page_view_batch(
            i,
            per_slice,
            start_ms=STREAM_START_MS,
            span_ms=SLICE_MS,
            apps=apps,
            seed=seed,
            disorder_ms=DISORDER_MS,
        )
    ]
    try:
        with console.status(f"processing {len(views):,} page views with {parallelism} subtasks"):
            # as the streaming query, the hours still open at the end stay in state
            results = runner.run(views, final_watermark=False)
        table = Table(title="page views per app per hour (local runner, closed hours)")
        table.add_column("app")
        table.add_column("hour (UTC)")
        table.add_column("views", justify="right")
        for app, hour, views_in_hour in sorted(results, key=lambda r: (r[1], r[0])):
            table.add_row(app, hour_label(hour), f"{views_in_hour:,}")
        console.print(table)
        open_entries = sum(op.keyed_backend.num_entries() for op in runner.subtasks)
        console.print(
            f"{len(results)} hourly results from the same {len(views):,} views as a fresh "
            f"`streamstate demo`; state entries of the hours still open: {open_entries}"
        )
    finally:
        runner.close()
    return results
