"""What does checking a state's value at every write cost? (docs/benchmarks.md)

Every write of a value, list element, map key and value or reduced value compares the value's
class with the serializer's ``value_class`` (``"x"`` into an ``int`` state then raises where it
is written). The baseline is the same heap state with the write method as it was before the
check; the contender is the state as shipped. Both run ``set_current_key`` + the write over
the same keys, each already holding state (a first, untimed pass inserts them; a list grows by
one element per pass), interleaved run by run, timed in CPU time; medians per write and their
ratio are printed and written to ``bench/results/state_type_check.json``.

Run:  python bench/state_type_check.py [--keys 200000] [--repeat 7]
"""

from __future__ import annotations

import argparse
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

from streamstate import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from streamstate.backends.heap.backend import HeapKeyedStateBackend
from streamstate.keygroups import KeyGroupRange, assign_to_key_group
from streamstate.namespace import VOID_NAMESPACE
from streamstate.serializers import Int64Serializer

MAX_P = 128


def unchecked_value_update(state: Any) -> Callable[[Any], None]:
    """``HeapValueState.update`` without the check (the code before it)."""
    maps, ctx = state._maps, state._ctx

    def update(value: Any) -> None:
        if value is None:
            maps[ctx.kg_index].remove(ctx.key, state._ns)
        else:
            maps[ctx.kg_index].put(ctx.key, state._ns, value)

    return update


def unchecked_list_add(state: Any) -> Callable[[Any], None]:
    maps, ctx = state._maps, state._ctx

    def add(value: Any) -> None:
        if value is None:
            raise ValueError("None")
        m = maps[ctx.kg_index]
        lst = m.get(ctx.key, state._ns)
        if lst is None:
            m.put(ctx.key, state._ns, [value])
        else:
            lst.append(value)

    return add


def unchecked_map_put(state: Any) -> Callable[[Any, Any], None]:
    maps, ctx = state._maps, state._ctx

    def put(key: Any, value: Any) -> None:
        m = maps[ctx.kg_index]
        d = m.get(ctx.key, state._ns)
        if d is None:
            m.put(ctx.key, state._ns, {key: value})
        else:
            d[key] = value

    return put


def workload(op: str, checked: bool, pairs: list[tuple[int, int]]) -> Callable[[], None]:
    backend = HeapKeyedStateBackend(Int64Serializer(), MAX_P, KeyGroupRange(0, MAX_P - 1))
    set_key = backend.set_current_key
    get = backend.get_partitioned_state
    if op == "value update":
        s = get(VOID_NAMESPACE, None, ValueStateDescriptor("v", int))
        write = s.update if checked else unchecked_value_update(s)

        def run() -> None:
            for k, kg in pairs:
                set_key(k, kg)
                write(k)

    elif op == "list add":
        s = get(VOID_NAMESPACE, None, ListStateDescriptor("l", int))
        write = s.add if checked else unchecked_list_add(s)

        def run() -> None:
            for k, kg in pairs:
                set_key(k, kg)
                write(k)

    else:
        s = get(VOID_NAMESPACE, None, MapStateDescriptor("m", str, int))
        put = s.put if checked else unchecked_map_put(s)

        def run() -> None:
            for k, kg in pairs:
                set_key(k, kg)
                put("page", k)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    keys = list(range(args.keys))
    pairs = [(k, assign_to_key_group(k, MAX_P)) for k in keys]
    rows = []
    print(f"{'write':<14} {'unchecked ns':>13} {'checked ns':>11} {'ratio':>6}")
    for op in ("value update", "list add", "map put"):
        times: dict[bool, list[float]] = {False: [], True: []}
        for r in range(args.repeat):  # AB BA AB ...; each run on a fresh backend
            for checked in (False, True) if r % 2 == 0 else (True, False):
                run = workload(op, checked, pairs)
                run()  # first touches (inserts), untimed: the timed pass writes present keys
                t0 = time.process_time()
                run()
                times[checked].append(time.process_time() - t0)
        base = statistics.median(times[False]) / args.keys * 1e9
        cont = statistics.median(times[True]) / args.keys * 1e9
        rows.append({"write": op, "unchecked_ns": base, "checked_ns": cont, "ratio": cont / base})
        print(f"{op:<14} {base:>13.0f} {cont:>11.0f} {cont / base:>5.2f}x")
    out = Path(__file__).resolve().parent / "results" / "state_type_check.json"
    out.write_text(
        json.dumps(
            {
                "command": " ".join(["python", "bench/state_type_check.py", *sys.argv[1:]]),
                "keys": args.keys,
                "repeat": args.repeat,
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "rows": rows,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
