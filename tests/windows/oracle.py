"""A brute-force model of event-time windows with EventTimeTrigger, allowed lateness and the
LocalRunner's bounded-out-of-orderness watermarks (the oracle of the window tests)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streamstate.windows import TimeWindow

MIN = -(1 << 63)


class Oracle:
    """Feeds records one by one; ``out`` collects (key, window, elements) per firing."""

    def __init__(self, lateness: int, delay: int, session_gap: int | None = None) -> None:
        self.lateness = lateness
        self.delay = delay
        self.gap = session_gap
        self.watermark = MIN
        self.max_ts = MIN
        self.windows: dict[tuple[Any, TimeWindow], list[Any]] = {}
        self.fired: list[tuple[Any, TimeWindow, list[Any]]] = []
        self.late: list[Any] = []

    def _fire(self, key: Any, window: TimeWindow) -> None:
        self.fired.append((key, window, list(self.windows[(key, window)])))

    def advance(self, watermark: int) -> None:
        old = self.watermark
        if watermark <= old:
            return
        for key, w in sorted(self.windows, key=lambda kw: kw[1].max_timestamp()):
            if old < w.max_timestamp() <= watermark:
                self._fire(key, w)
        for kw in [kw for kw in self.windows if kw[1].max_timestamp() + self.lateness <= watermark]:
            del self.windows[kw]
        self.watermark = watermark

    def _is_late(self, w: TimeWindow) -> bool:
        return w.max_timestamp() + self.lateness <= self.watermark

    def _session_window(self, key: Any, ts: int) -> list[TimeWindow]:
        """Merge the new session window with the key's sessions (Flink's greedy merge)."""
        new = TimeWindow(ts, ts + self.gap)
        mine = [w for (k, w) in self.windows if k == key]
        group = [new]
        cover = new
        # transitive closure of intersection with the growing cover
        changed = True
        while changed:
            changed = False
            for w in mine:
                if w not in group and cover.intersects(w):
                    group.append(w)
                    cover = cover.cover(w)
                    changed = True
        if len(group) > 1:
            elements: list[Any] = []
            for w in group[1:]:
                elements.extend(self.windows.pop((key, w)))
            self.windows[(key, cover)] = elements
        return [cover]

    def process(self, record: Any, key: Any, ts: int, assign: Callable[[int], list[TimeWindow]]):
        windows = self._session_window(key, ts) if self.gap else assign(ts)
        added = False
        for w in windows:
            if self._is_late(w):
                continue
            added = True
            self.windows.setdefault((key, w), []).append(record)
            if w.max_timestamp() <= self.watermark:
                self._fire(key, w)  # late firing within the allowed lateness
        if not added and ts + self.lateness <= self.watermark:
            self.late.append(record)
        if ts > self.max_ts:
            self.max_ts = ts
            self.advance(ts - self.delay - 1)
