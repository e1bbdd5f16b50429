"""Metrics: counters, gauges and bounded histograms in named groups.

A :class:`MetricGroup` is what ``RuntimeContext.get_metrics_group()`` returns. State latency and
size tracking (SPEC §8) report into histograms of the operator's group.

>>> g = MetricGroup("op")
>>> g.counter("records").inc(3)
>>> h = g.histogram("latency", size=4)
>>> for v in (1, 2, 3, 4, 5): h.update(v)
>>> g.snapshot()["op.records"], h.statistics()["count"], h.statistics()["min"]
(3, 5, 2)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["Counter", "Gauge", "Histogram", "MetricGroup", "format_report", "report_rows"]


class Counter:
    """A monotonically adjustable count."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def inc(self, n: int = 1) -> None:
        self.count += n

    def dec(self, n: int = 1) -> None:
        self.count -= n

    def value(self) -> int:
        return self.count


class Gauge:
    """A value read on demand from a callable."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn

    def value(self) -> Any:
        return self.fn()


class Histogram:
    """The last ``size`` samples of a distribution (a ring buffer) plus a total count."""

    __slots__ = ("_next", "_samples", "count", "size")

    def __init__(self, size: int = 128) -> None:
        if size < 1:
            raise ValueError(f"histogram size must be >= 1, got {size}")
        self.size = size
        self._samples: list[float] = []
        self._next = 0
        self.count = 0

    def update(self, value: float) -> None:
        if len(self._samples) < self.size:
            self._samples.append(value)
        else:
            self._samples[self._next] = value
            self._next = (self._next + 1) % self.size
        self.count += 1

    def statistics(self) -> dict[str, float]:
        s = sorted(self._samples)
        if not s:
            return {
                "count": self.count,
                "min": 0,
                "max": 0,
                "mean": 0,
                "p50": 0,
                "p95": 0,
                "p99": 0,
            }

        def q(p: float) -> float:
            return s[min(len(s) - 1, int(p * len(s)))]

        return {
            "count": self.count,
            "min": s[0],
            "max": s[-1],
            "mean": sum(s) / len(s),
            "p50": q(0.5),
            "p95": q(0.95),
            "p99": q(0.99),
        }

    def value(self) -> dict[str, float]:
        return self.statistics()


class MetricGroup:
    """A named group of metrics and sub-groups."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        self._metrics: dict[str, Counter | Gauge | Histogram] = {}
        self._groups: dict[str, MetricGroup] = {}

    def add_group(self, name: str) -> MetricGroup:
        g = self._groups.get(name)
        if g is None:
            g = self._groups[name] = MetricGroup(name)
        return g

    def counter(self, name: str) -> Counter:
        m = self._metrics.get(name)
        if not isinstance(m, Counter):
            m = self._metrics[name] = Counter()
        return m

    def gauge(self, name: str, fn: Callable[[], Any]) -> Gauge:
        g = self._metrics[name] = Gauge(fn)
        return g

    def histogram(self, name: str, size: int = 128) -> Histogram:
        m = self._metrics.get(name)
        if not isinstance(m, Histogram):
            m = self._metrics[name] = Histogram(size)
        return m

    def metrics(self, prefix: str | None = None) -> dict[str, Counter | Gauge | Histogram]:
        """Every metric of this group and its sub-groups, by dotted name."""
        base = self.name if prefix is None else prefix
        out: dict[str, Counter | Gauge | Histogram] = {}
        for name, m in self._metrics.items():
            out[f"{base}.{name}" if base else name] = m
        for gname, g in self._groups.items():
            out.update(g.metrics(f"{base}.{gname}" if base else gname))
        return out

    def snapshot(self) -> dict[str, Any]:
        """Current values of every metric, by dotted name."""
        return {name: m.value() for name, m in self.metrics().items()}


# ---------------------------------------------------------------------------------------------
# Reports (``streamstate metrics`` prints these)

_HISTOGRAM_COLUMNS = ("count", "min", "p50", "p95", "p99", "max", "mean")


def report_rows(group: MetricGroup, prefix: str | None = None) -> list[dict[str, Any]]:
    """One JSON-able row per metric of ``group`` (and its sub-groups), sorted by name.

    Histograms give ``count`` (all updates) and statistics over their retained samples; counters
    and gauges give ``value``.

    >>> g = MetricGroup("op")
    >>> g.counter("n").inc(2)
    >>> g.add_group("state").histogram("value_state_get_latency").update(1500)
    >>> [(r["name"], r["type"], r.get("value", r.get("p50"))) for r in report_rows(g)]
    [('op.n', 'counter', 2), ('op.state.value_state_get_latency', 'histogram', 1500)]
    """
    rows: list[dict[str, Any]] = []
    for name, metric in sorted(group.metrics(prefix).items()):
        if isinstance(metric, Histogram):
            stats = metric.statistics()
            rows.append(
                {"name": name, "type": "histogram", **{c: stats[c] for c in _HISTOGRAM_COLUMNS}}
            )
        elif isinstance(metric, Counter):
            rows.append({"name": name, "type": "counter", "value": metric.value()})
        else:
            rows.append({"name": name, "type": "gauge", "value": metric.value()})
    return rows


def _fmt(value: Any, unit: str) -> str:
    if isinstance(value, float) and not value.is_integer():
        text = f"{value:,.1f}"
    elif isinstance(value, (int, float)):
        text = f"{int(value):,}"
    else:
        return str(value)
    return f"{text} {unit}" if unit else text


def format_report(group: MetricGroup, title: str | None = None) -> Table:
    """A ``rich`` table of every metric of ``group``: histograms with count and percentiles
    (latencies in ns, sizes in bytes), counters and gauges with their value.

    >>> from rich.console import Console
    >>> g = MetricGroup("op")
    >>> g.histogram("value_state_get_latency").update(2000)
    >>> console = Console(width=120, record=True)
    >>> with console.capture() as cap:
    ...     console.print(format_report(g))
    >>> "op.value_state_get_latency" in cap.get() and "2,000 ns" in cap.get()
    True
    """
    from rich.table import Table

    table = Table(title=title or f"metrics of {group.name or 'job'}", show_lines=False)
    table.add_column("metric", style="bold", no_wrap=True)
    table.add_column("type")
    for column in _HISTOGRAM_COLUMNS:
        table.add_column(column, justify="right")
    table.add_column("value", justify="right")
    for row in report_rows(group):
        if row["type"] == "histogram":
            name = row["name"]
            unit = "ns" if name.endswith("_latency") else "B" if name.endswith("_size") else ""
            cells = [_fmt(row[c], "" if c == "count" else unit) for c in _HISTOGRAM_COLUMNS]
            table.add_row(name, "histogram", *cells, "")
        else:
            table.add_row(
                row["name"], row["type"], *([""] * len(_HISTOGRAM_COLUMNS)), _fmt(row["value"], "")
            )
    return table
