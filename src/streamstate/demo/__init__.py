"""The main job: page views per app per hour (the seeds' example), and the demo that runs it.

* :mod:`streamstate.demo.job`: the keyed function (an hourly event-time window per app, the
  hour being the namespace of the app's counter) and generators of page-view events.
* :mod:`streamstate.demo.streaming`: the demo on embedded Spark, a streaming query over
  generated input files with a local checkpoint directory; a second run resumes from it.
* :mod:`streamstate.demo.local`: the same job on the in-process LocalRunner.

Run it with ``streamstate demo`` (``make demo``; ``--fresh`` starts over, ``--runner local``
runs without Spark).
"""

from streamstate.demo.job import (
    HOUR_MS,
    CountViews,
    EmitHour,
    generate_events,
    page_view_batch,
    page_views_per_hour,
)
from streamstate.demo.local import run_local
from streamstate.demo.streaming import DEFAULT_DIRECTORY, DemoRun, run_streaming

__all__ = [
    "DEFAULT_DIRECTORY",
    "HOUR_MS",
    "CountViews",
    "DemoRun",
    "EmitHour",
    "generate_events",
    "page_view_batch",
    "page_views_per_hour",
    "run_local",
    "run_streaming",
]
