"""Runs mutated inputs through the decoders and keeps what went wrong.

For each input, :func:`fuzz` records how its decoder ended (``ok`` or the error's class) and
checks three properties; a violation is a :class:`Finding` with the input that caused it:

* **only documented errors**: the error is one of the target's ``allowed`` classes;
* **bounded memory**: the peak of Python's traced allocations while decoding stays below
  :func:`memory_limit` of the input's size (a length field that makes a decoder allocate
  more than the file could hold shows here; ``MemoryError`` is a finding too);
* **nothing outside**: every file the decoder opens, creates, lists, renames or removes (an
  audit hook, :pep:`578`) lies in the corpus, its scratch copies or the run's working and
  temporary directories.

An input that takes longer than ``slow_seconds`` is a finding as well (a count driving a loop).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import tempfile
import threading
import time
import tracemalloc
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from streamstate.devtools.fuzzing.seeds import Corpus, Seed
from streamstate.devtools.fuzzing.targets import Target, targets

__all__ = ["Finding", "FuzzReport", "fuzz", "memory_limit"]


def memory_limit(size: int) -> int:
    """The most a decoder may allocate for an input of ``size`` bytes: 16 MiB plus 256 times
    the input (lz4 expands a block at most 255 times; the fixed part covers a backend and its
    tables)."""
    return (16 << 20) + 256 * size


@dataclass
class Finding:
    """One input that broke a property."""

    target: str
    #: "error" (not an allowed error), "memory", "file" (outside the checkpoint), "slow"
    problem: str
    detail: str
    origin: str
    data: bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "problem": self.problem,
            "detail": self.detail[:2000],
            "origin": self.origin,
            "input_hex": self.data[:4096].hex(),
            "input_bytes": len(self.data),
        }


@dataclass
class FuzzReport:
    """What a run tried and found."""

    seed: int
    seconds: float = 0.0
    #: target -> inputs tried
    inputs: Counter[str] = field(default_factory=Counter)
    #: target -> how decoding ended ("ok" or an error class) -> inputs
    outcomes: dict[str, Counter[str]] = field(default_factory=dict)
    #: target -> the largest traced peak of one input (bytes), and its input's size
    peak: dict[str, tuple[int, int]] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.inputs.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "seconds": round(self.seconds, 2),
            "inputs": self.total,
            "targets": {
                name: {
                    "inputs": self.inputs[name],
                    "outcomes": dict(self.outcomes.get(name, Counter()).most_common()),
                    "peak_bytes": self.peak.get(name, (0, 0))[0],
                    "peak_input_bytes": self.peak.get(name, (0, 0))[1],
                }
                for name in sorted(self.inputs)
            },
            "findings": [f.to_json() for f in self.findings],
        }


# ---- files --------------------------------------------------------------------------------------

_PATH_EVENTS = {
    "open": (0,),
    "os.remove": (0,),
    "os.rename": (0, 1),
    "os.replace": (0, 1),
    "os.mkdir": (0,),
    "os.rmdir": (0,),
    "os.link": (0, 1),
    "os.symlink": (0, 1),
    "os.truncate": (0,),
    "os.chmod": (0,),
    "os.listdir": (0,),
    "os.scandir": (0,),
    "shutil.rmtree": (0,),
    "shutil.copyfile": (0, 1),
    "shutil.move": (0, 1),
}
_CODE = (".py", ".pyc", ".so", ".pyi", ".pth")


class _FileWatch:
    """Records file accesses outside the allowed roots while active (one audit hook per
    process: an audit hook cannot be removed)."""

    active: _FileWatch | None = None
    _installed = False

    def __init__(self, roots: list[str]) -> None:
        self.roots = [os.path.realpath(r) + os.sep for r in roots]
        self.code = {os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix)}
        self.outside: list[str] = []
        self.thread = threading.get_ident()

    @classmethod
    def install(cls) -> None:
        if not cls._installed:
            sys.addaudithook(cls._hook)
            cls._installed = True

    @staticmethod
    def _hook(event: str, args: tuple[Any, ...]) -> None:
        watch = _FileWatch.active
        if watch is None or event not in _PATH_EVENTS:
            return
        if threading.get_ident() != watch.thread:
            return
        for i in _PATH_EVENTS[event]:
            if i < len(args):
                watch._check(event, args[i], args)

    def _check(self, event: str, path: Any, args: tuple[Any, ...]) -> None:
        if isinstance(path, int) or path is None:
            return
        try:
            text = os.fsdecode(path)
        except TypeError:
            return
        if not os.path.isabs(text):
            if ".." in text.split(os.sep):
                self.outside.append(f"{event} {text!r} (relative, with '..')")
            return  # a name in a directory opened by descriptor, or in the working directory
        real = os.path.realpath(text)
        if any((real + os.sep).startswith(r) for r in self.roots):
            return
        reading = event == "open" and isinstance(args[1], str) and "r" in args[1]
        if text.endswith(_CODE) or (reading and any(real.startswith(c) for c in self.code)):
            return  # a module loaded late
        self.outside.append(f"{event} {text!r}")


# ---- a run --------------------------------------------------------------------------------------


class _Slow(Exception):
    pass


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """Interrupt Python code that runs longer than ``seconds`` (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def ring(signum: int, frame: Any) -> None:
        raise _Slow(f"decoding took more than {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _decode(target: Target, data: bytes, seed: Seed, limit: float) -> tuple[str, str | None]:
    """How decoding ended (``ok`` or the error's class) and, for an error the target does not
    allow, its traceback. The error's frames are cleared: a failed restore's locals (a
    database handle) must not outlive it."""
    import traceback

    try:
        with _alarm(limit):
            target.decode(data, seed)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        outcome = type(exc).__name__
        if isinstance(exc, _Slow):
            outcome = "slow"
        allowed = isinstance(exc, target.allowed) and outcome not in ("slow", "MemoryError")
        detail = None if allowed else "".join(traceback.format_exception(exc))
        traceback.clear_frames(exc.__traceback__)
        return outcome, detail
    return "ok", None


def _mutated(target: Target, seed: Seed, rng: random.Random) -> bytes:
    """One mutation of ``seed`` (a byte-level one if a structured mutator cannot parse what it
    was given: that is the mutator's limit, not a finding)."""
    from streamstate.devtools.fuzzing.mutations import mutate_bytes

    try:
        return rng.choice(target.mutators)(seed.data, rng, seed, target.seeds)
    except (ValueError, TypeError, KeyError, IndexError, RecursionError, OverflowError):
        return mutate_bytes(seed.data, rng)


def fuzz(
    corpus: Corpus,
    *,
    seed: int = 0,
    inputs: int | Mapping[str, int] | None = None,
    seconds: float | None = None,
    only: list[str] | None = None,
    trace_memory: bool | int = True,
    slow_seconds: float = 20.0,
    progress: Any = None,
) -> FuzzReport:
    """Mutate the seeds of ``corpus`` and decode them until ``inputs`` inputs were tried (in
    all, or per target: a mapping) or ``seconds`` passed (``only``: these targets).
    ``trace_memory``: trace Python's allocations for every input (``True``), every n-th
    (an int: tracing costs about three times the decoding), or none. ``progress(report)`` is
    called now and then."""
    rng = random.Random(seed)
    wanted = inputs if isinstance(inputs, Mapping) else None
    total = inputs if isinstance(inputs, int) else None
    chosen = [
        t
        for t in targets(corpus)
        if (only is None or t.name in only) and (wanted is None or wanted.get(t.name, 0) > 0)
    ]
    report = FuzzReport(seed)
    for t in chosen:  # the real files decode cleanly, and every module is imported now
        for s in t.seeds:
            outcome, detail = _decode(t, s.data, s, slow_seconds * 3)
            if outcome not in ("ok", "EOFError"):
                report.findings.append(Finding(t.name, "seed", detail or outcome, s.origin, s.data))
    work = os.path.join(corpus.directory, "tmp")
    os.makedirs(work, exist_ok=True)
    os.makedirs(corpus.work_directory, exist_ok=True)
    watch = _FileWatch([corpus.directory, work])
    _FileWatch.install()
    weights: list[float] = [t.weight for t in chosen]
    started = time.perf_counter()
    previous_tmp = tempfile.tempdir
    tempfile.tempdir = work
    every = 0 if trace_memory is False else 1 if trace_memory is True else int(trace_memory)
    external = tracemalloc.is_tracing()  # the caller traces: leave it on
    tracing = external
    last_progress = started
    try:
        while True:
            elapsed = time.perf_counter() - started
            if wanted is not None:
                weights = [max(wanted[t.name] - report.inputs[t.name], 0.0) for t in chosen]
                if not any(weights):
                    break
            elif total is not None and report.total >= total:
                break
            if seconds is not None and elapsed >= seconds:
                break
            target = rng.choices(chosen, weights)[0]
            s = rng.choice(target.seeds)
            data = _mutated(target, s, rng)
            traced = external or (every > 0 and report.total % every == 0)
            if traced != tracing:
                tracing = traced
                if traced:
                    tracemalloc.start()
                else:
                    tracemalloc.stop()
            before = tracemalloc.get_traced_memory()[0] if traced else 0
            if traced:
                tracemalloc.reset_peak()
            watch.outside = []
            _FileWatch.active = watch
            t0 = time.perf_counter()
            try:
                outcome, detail = _decode(target, data, s, slow_seconds)
            finally:
                _FileWatch.active = None
            took = time.perf_counter() - t0
            peak = tracemalloc.get_traced_memory()[1] - before if traced else 0
            report.inputs[target.name] += 1
            report.outcomes.setdefault(target.name, Counter())[outcome] += 1
            if peak > report.peak.get(target.name, (0, 0))[0]:
                report.peak[target.name] = (peak, len(data))
            _check(report, target, s, data, outcome, detail, peak, took, watch, slow_seconds)
            if progress is not None and time.perf_counter() - last_progress > 10:
                last_progress = time.perf_counter()
                progress(report)
    finally:
        tempfile.tempdir = previous_tmp
        if tracing and not external:
            tracemalloc.stop()
    report.seconds = time.perf_counter() - started
    return report


def _check(
    report: FuzzReport,
    target: Target,
    seed: Seed,
    data: bytes,
    outcome: str,
    detail: str | None,
    peak: int,
    took: float,
    watch: _FileWatch,
    slow_seconds: float,
) -> None:
    def found(problem: str, text: str) -> None:
        report.findings.append(Finding(target.name, problem, text, seed.origin, data))

    if outcome == "slow" or took > slow_seconds:
        found("slow", f"{took:.1f} s")
    elif outcome == "MemoryError":
        found("memory", detail or "MemoryError")
    elif detail is not None:
        found("error", detail)
    if peak > memory_limit(len(data)):
        found("memory", f"peak {peak} bytes for a {len(data)}-byte input")
    if watch.outside:
        found("file", "; ".join(watch.outside[:5]))
