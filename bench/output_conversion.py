"""What do the lossless-cast checks cost per output? (docs/benchmarks.md)

A subtask's outputs become one Arrow batch of the declared output schema
(:class:`streamstate.spark.records.OutputConverter`). The baseline builds each column with
``pa.array(values, type=declared)``, which truncates floats into integer columns and takes
numbers into timestamp columns; the contender is the converter, which builds integer and
timestamp columns by inference plus a safe cast and checks float overflow. Both split the
outputs (tuples) into columns the same way and convert the same values, interleaved run by run,
timed in CPU time; the medians per output, their difference and their ratio are printed per
schema and written to ``bench/results/output_conversion.json``.

Run:  python bench/output_conversion.py [--outputs 65536] [--repeat 7]
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import pyarrow as pa

from streamstate.spark.records import OutputConverter

SCHEMAS: dict[str, tuple[list[tuple[str, Any]], Callable[[int], tuple[Any, ...]]]] = {
    "string, long": (
        [("user", pa.string()), ("n", pa.int64())],
        lambda i: (f"user-{i % 1000}", i),
    ),
    "string, long, long, double": (
        [("app", pa.string()), ("hour", pa.int64()), ("views", pa.int64()), ("x", pa.float64())],
        lambda i: (f"app-{i % 5}", i // 1000, i, i * 0.5),
    ),
    "string, int, float": (
        [("user", pa.string()), ("n", pa.int32()), ("x", pa.float32())],
        lambda i: (f"user-{i % 1000}", i, i * 0.25),
    ),
    "string, timestamp": (
        [("user", pa.string()), ("ts", pa.timestamp("us", tz="UTC"))],
        lambda i: (
            f"user-{i % 1000}",
            dt.datetime(2024, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=i),
        ),
    ),
}


def baseline(conv: OutputConverter, outputs: list[tuple[Any, ...]]) -> Any:
    """The conversion before the checks: the converter's own split into columns, then one
    ``pa.array`` per column at the declared type."""
    schema = conv.schema
    columns = conv._columns(outputs)
    arrays = [
        pa.array(values, type=f.type, from_pandas=False)
        for f, values in zip(schema, columns, strict=True)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def cpu(fn: Callable[[], Any]) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outputs", type=int, default=65_536)  # a subtask's chunk
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    rows = []
    print(f"{'schema':<28} {'baseline ns':>12} {'checked ns':>11} {'extra':>7} {'ratio':>6}")
    for name, (fields, make) in SCHEMAS.items():
        schema = pa.schema(fields)
        outputs = [make(i) for i in range(args.outputs)]
        conv = OutputConverter(schema)
        assert conv.to_batch(outputs).equals(baseline(conv, outputs))
        base, checked = [], []
        for r in range(args.repeat):  # AB BA AB ...
            pair = [
                functools.partial(baseline, conv, outputs),
                functools.partial(conv.to_batch, outputs),
            ]
            order = (0, 1) if r % 2 == 0 else (1, 0)
            times = {i: cpu(pair[i]) for i in order}
            base.append(times[0])
            checked.append(times[1])
        b = statistics.median(base) / args.outputs * 1e9
        c = statistics.median(checked) / args.outputs * 1e9
        rows.append({"schema": name, "baseline_ns": b, "checked_ns": c, "ratio": c / b})
        print(f"{name:<28} {b:>12.0f} {c:>11.0f} {c - b:>7.0f} {c / b:>5.2f}x")
    out = Path(__file__).resolve().parent / "results" / "output_conversion.json"
    out.write_text(
        json.dumps(
            {
                "command": " ".join(["python", "bench/output_conversion.py", *sys.argv[1:]]),
                "outputs": args.outputs,
                "repeat": args.repeat,
                "python": platform.python_version(),
                "pyarrow": pa.__version__,
                "cpus": os.cpu_count(),
                "rows": rows,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
