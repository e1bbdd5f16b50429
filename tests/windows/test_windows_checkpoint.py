"""Session windows across LocalRunner checkpoints, with rescaling: same results, no leak.

Needs ``LocalRunner.checkpoint``/``restore``; skipped where they are not there yet.
"""

from __future__ import annotations

import pytest

from streamstate import LocalRunner
from streamstate.windows import (
    EventTimeSessionWindows,
    ProcessWindowFunction,
    TumblingEventTimeWindows,
    window,
)

if not hasattr(LocalRunner, "checkpoint"):  # pragma: no cover - depends on the branch
    pytest.skip("LocalRunner has no checkpoints here", allow_module_level=True)


class Summary(ProcessWindowFunction):
    def process(self, key, context, elements):
        w = context.window()
        yield (key, w.start, w.end, sorted(e[2] for e in elements))


def sessions():
    return (
        window(EventTimeSessionWindows.with_gap(10))
        .allowed_lateness(5)
        .process(Summary(), element_type=tuple[str, int, int])
    )


def runner(parallelism, state_backend="heap"):
    return LocalRunner(
        sessions(),
        key_selector=lambda r: r[0],
        parallelism=parallelism,
        timestamp_assigner=lambda r: r[1],
        watermark_delay=25,
        state_backend=state_backend,
    )


@pytest.mark.parametrize(
    ("backend_before", "backend_after"),
    [("heap", "heap"), ("rocksdb", "rocksdb"), ("rocksdb", "heap"), ("heap", "rocksdb")],
)
@pytest.mark.parametrize(("before", "after"), [(1, 1), (2, 3), (3, 1)])
def test_sessions_survive_checkpoint_restore_and_rescale(
    before, after, backend_before, backend_after, tmp_path
):
    first = [("a", 1, 1), ("b", 2, 2), ("a", 8, 3), ("a", 30, 4), ("b", 5, 5)]
    second = [("a", 22, 6), ("b", 9, 7), ("a", 60, 8), ("b", 61, 9)]
    expected = runner(1).run(first + second)

    r1 = runner(before, backend_before)
    out = r1.run(first, final_watermark=False)
    cp = r1.checkpoint(str(tmp_path))
    r2 = runner(after, backend_after)
    r2.restore(cp)
    out += r2.run(second)
    assert sorted(out) == sorted(expected)
    assert all(op.keyed_backend.num_entries() == 0 for op in r2.subtasks)
    assert all(op.num_timers() == 0 for op in r2.subtasks)


class Elements(ProcessWindowFunction):
    def process(self, key, context, elements):
        w = context.window()
        yield (key, w.start, w.end, sorted(e[2] for e in elements))


def _tumbling(kind):
    ws = window(TumblingEventTimeWindows.of(10))
    if kind == "process":
        return ws.process(Elements())  # no element_type: inferred from the first element
    return ws.reduce(lambda a, b: (a[0], a[1], a[2] + b[2]))


@pytest.mark.parametrize("backend_after", ["heap", "rocksdb"])
@pytest.mark.parametrize("backend_before", ["heap", "rocksdb"])
@pytest.mark.parametrize("kind", ["process", "reduce"])
def test_windows_fire_after_restore_before_any_new_element(
    kind, backend_before, backend_after, tmp_path
):
    # the element serializer comes back from the checkpoint's state meta data, so a watermark
    # alone fires the pending windows (no new element needed to infer it)
    def make(backend):
        return LocalRunner(
            _tumbling(kind),
            key_selector=lambda r: r[0],
            parallelism=2,
            timestamp_assigner=lambda r: r[1],
            watermark_delay=0,
            state_backend=backend,
        )

    r1 = make(backend_before)
    fired = r1.run(
        [("a", 1, 1), ("b", 2, 2), ("a", 3, 3), ("b", 12, 4), ("a", 15, 5)], final_watermark=False
    )
    assert len(fired) == 2  # [0, 10) of a and b; [10, 20) of both is pending
    cp = r1.checkpoint(str(tmp_path))
    r2 = make(backend_after)
    r2.restore(cp)
    out = r2.advance_watermark(100)
    if kind == "process":
        assert sorted(out) == [("a", 10, 20, [5]), ("b", 10, 20, [4])]
    else:
        assert sorted(out) == [("a", 15, 5), ("b", 12, 4)]
    assert all(op.keyed_backend.num_entries() == 0 for op in r2.subtasks)
    assert all(op.num_timers() == 0 for op in r2.subtasks)
