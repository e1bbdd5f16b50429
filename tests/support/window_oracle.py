"""A brute-force model of event-time windows with EventTimeTrigger, allowed lateness and the
LocalRunner's bounded-out-of-orderness watermarks (the oracle of the window tests)."""

from __future__ import annotations

import math
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


class EvictingOracle(Oracle):
    """The oracle of evicting windows: at each firing ``evict`` (elements -> kept elements, in
    arrival order) runs before the function (or after it, with ``after``), and what it keeps
    replaces the window's elements."""

    def __init__(
        self,
        lateness: int,
        delay: int,
        session_gap: int | None,
        evict: Callable[[list[Any]], list[Any]],
        after: bool,
    ) -> None:
        super().__init__(lateness, delay, session_gap)
        self.evict = evict
        self.after = after

    def _fire(self, key: Any, window: TimeWindow) -> None:
        elements = list(self.windows[(key, window)])
        if not elements:
            return  # an empty window does not fire
        if not self.after:
            elements = self.evict(elements)
        self.fired.append((key, window, list(elements)))
        if self.after:
            elements = self.evict(elements)
        self.windows[(key, window)] = elements


def java_rem(a: int, b: int) -> int:
    """Java's ``a % b`` (the sign of ``a``)."""
    return int(math.fmod(a, b))  # exact for the small timestamps of the tests


class ContinuousOracle(Oracle):
    """Event-time windows (not sessions) with ``ContinuousEventTimeTrigger.of(interval)``: every
    window keeps the set of its pending timers and its next fire time, as Flink's trigger does."""

    def __init__(self, lateness: int, delay: int, interval: int) -> None:
        super().__init__(lateness, delay, None)
        self.interval = interval
        self.next_fire: dict[tuple[Any, TimeWindow], int] = {}
        self.timers: dict[tuple[Any, TimeWindow], set[int]] = {}

    def advance(self, watermark: int) -> None:
        if watermark <= self.watermark:
            return
        while True:
            due = [
                (t, kw[1].start, kw[1].end, kw)
                for kw, ts in self.timers.items()
                for t in ts
                if t <= watermark
            ]
            if not due:
                break
            t, _, _, kw = min(due, key=lambda d: d[:3])
            self.timers[kw].discard(t)
            w = kw[1]
            if t == w.max_timestamp():
                self._fire(*kw)
            elif self.next_fire.get(kw) == t:
                nxt = min(t + self.interval, w.max_timestamp())
                self.next_fire[kw] = nxt
                self.timers[kw].add(nxt)
                self._fire(*kw)
        for kw in [kw for kw in self.windows if kw[1].max_timestamp() + self.lateness <= watermark]:
            del self.windows[kw]
            self.next_fire.pop(kw, None)
            self.timers.pop(kw, None)
        self.watermark = watermark

    def process(self, record: Any, key: Any, ts: int, assign: Callable[[int], list[TimeWindow]]):
        added = False
        for w in assign(ts):
            if self._is_late(w):
                continue
            added = True
            kw = (key, w)
            self.windows.setdefault(kw, []).append(record)
            if w.max_timestamp() <= self.watermark:
                self._fire(key, w)
                continue
            timers = self.timers.setdefault(kw, set())
            timers.add(w.max_timestamp())
            if kw not in self.next_fire:
                first = min(ts - java_rem(ts, self.interval) + self.interval, w.max_timestamp())
                self.next_fire[kw] = first
                timers.add(first)
        if not added and ts + self.lateness <= self.watermark:
            self.late.append(record)
        if ts > self.max_ts:
            self.max_ts = ts
            self.advance(ts - self.delay - 1)
