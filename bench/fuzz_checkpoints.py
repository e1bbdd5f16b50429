"""The long fuzz run of every checkpoint decoder (SPEC §14.5; the short one is
``tests/checkpoint/test_decoder_fuzz.py``).

Builds real checkpoints of both backends and the host channel's messages
(:mod:`streamstate.devtools.fuzzing`), then mutates and decodes them for ``--seconds``, and
prints per decoder the inputs tried, how decoding ended (``ok`` or the error's class), the peak
of Python's traced allocations for one input against the bound for its size, and every finding:
an error that is not one of the decoder's documented errors, memory over the bound, a file read
or written outside the checkpoint, an input slower than ``--slow`` seconds. Writes everything,
findings with their inputs, to ``bench/results/fuzz_checkpoints.json``; exits 1 on a finding.

    python bench/fuzz_checkpoints.py [--seconds 600] [--seed 1] [--targets keyed,manifest]
                                     [--trace-every 1] [--dir /tmp/...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from streamstate.devtools.fuzzing import FuzzReport, build_corpus, fuzz, memory_limit, targets

RESULTS = os.path.join(os.path.dirname(__file__), "results", "fuzz_checkpoints.json")


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def _print(report: FuzzReport) -> None:
    print(f"\n{report.total:,} inputs in {report.seconds:.0f} s (seed {report.seed})")
    print(f"{'decoder':18} {'inputs':>8}  {'peak (input)':>22}  outcomes")
    for name in sorted(report.inputs):
        peak, size = report.peak.get(name, (0, 0))
        outcomes = ", ".join(f"{k} {v:,}" for k, v in report.outcomes[name].most_common())
        where = f"{_mib(peak)} ({size:,} B)" if peak else "-"
        print(f"{name:18} {report.inputs[name]:>8,}  {where:>22}  {outcomes}")
    bound = ", ".join(
        f"{name} {_mib(memory_limit(size))}"
        for name, (_, size) in sorted(report.peak.items())
        if size
    )
    print(f"bound for those inputs (16 MiB + 256 x size): {bound}")
    print(f"findings: {len(report.findings)}")
    for f in report.findings[:20]:
        print(f"  {f.target} {f.problem} ({f.origin}): {f.detail.strip().splitlines()[-1][:200]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--targets", default="", help="comma-separated decoders (default: all)")
    parser.add_argument(
        "--trace-every", type=int, default=1, help="trace allocations of every n-th input"
    )
    parser.add_argument("--slow", type=float, default=20.0)
    parser.add_argument("--dir", default=None, help="where the corpus is written (temporary)")
    args = parser.parse_args()
    directory = args.dir or tempfile.mkdtemp(prefix="streamstate-fuzz-")
    t0 = time.perf_counter()
    corpus = build_corpus(directory)
    built = time.perf_counter() - t0
    names = [t.name for t in targets(corpus)]
    only = [n for n in args.targets.split(",") if n] or None
    seeds = {name: len(seeds) for name, seeds in corpus.seeds.items()}
    print(f"corpus: {seeds} seeds in {built:.1f} s; decoders: {', '.join(only or names)}")

    def progress(report: FuzzReport) -> None:
        print(
            f"  {report.total:,} inputs, {time.perf_counter() - t0:.0f} s, "
            f"{len(report.findings)} findings",
            flush=True,
        )

    try:
        report = fuzz(
            corpus,
            seed=args.seed,
            seconds=args.seconds,
            only=only,
            trace_memory=args.trace_every,
            slow_seconds=args.slow,
            progress=progress,
        )
    finally:
        if args.dir is None:
            shutil.rmtree(directory, ignore_errors=True)
    _print(report)
    document: dict[str, Any] = {
        "benchmark": "fuzz_checkpoints",
        "command": " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]]),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "corpus_seeds": seeds,
        "trace_every": args.trace_every,
        "memory_bound": "16 MiB + 256 x input bytes",
        **report.to_json(),
    }
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump(document, f, indent=1)
    print(f"written: {RESULTS}")
    return 1 if report.findings else 0


if __name__ == "__main__":
    raise SystemExit(main())
