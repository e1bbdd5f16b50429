"""The compiled copy-on-write map entry (``_entry.c``) against its pure-Python reference.

The map's behaviour with either entry type is covered by test_copy_on_write.py (every test
runs with both); this file checks the type itself: same attributes, constructor, ``hash``,
repr, pickling and copying, that it is built and used, untracked by the cyclic GC, smaller,
and freed without recursion however long a chain is.
"""

from __future__ import annotations

import copy
import gc
import os
import pickle
import subprocess
import sys

import pytest

# the README's setup compiles it (gcc is required): a silent fallback to the pure-Python entry
# would cost 16 bytes per entry and go unnoticed, so its absence fails here
from streamstate.backends.heap import _entry
from streamstate.backends.heap import copy_on_write as cow
from streamstate.backends.heap.copy_on_write import PyStateMapEntry

Compiled = _entry.StateMapEntry


@pytest.mark.skipif(
    os.environ.get("STREAMSTATE_PURE_PYTHON", "") not in ("", "0"),
    reason="STREAMSTATE_PURE_PYTHON selects the reference",
)
def test_the_compiled_entry_is_the_one_maps_use() -> None:
    assert cow.StateMapEntry is Compiled


@pytest.mark.subprocess
def test_pure_python_is_selected_by_the_environment_variable() -> None:
    code = (
        "from streamstate.backends.heap import copy_on_write as c; "
        "print(c.StateMapEntry is c.PyStateMapEntry)"
    )
    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(cow.__file__))))
    for value, expected in (("1", "True"), ("0", "False"), ("", "False")):
        env = {**os.environ, "STREAMSTATE_PURE_PYTHON": value, "PYTHONPATH": src}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == expected, value


@pytest.mark.parametrize("cls", [PyStateMapEntry, Compiled], ids=["python", "compiled"])
def test_same_interface(cls: type) -> None:
    tail = cls("t", "ns", [1], None, 0, 0)
    e = cls(("a", 1), "ns", {"x": 1}, tail, 3, 4)
    assert (e.key, e.namespace, e.state, e.next, e.entry_version, e.state_version) == (
        ("a", 1),
        "ns",
        {"x": 1},
        tail,
        3,
        4,
    )
    assert e.hash == hash((("a", 1), "ns"))
    assert repr(tail) == "StateMapEntry('t', 'ns', [1], entry_version=0, state_version=0)"
    e.state = "changed"
    e.next = None
    assert (e.state, e.next) == ("changed", None)
    for clone in (copy.deepcopy(e), pickle.loads(pickle.dumps(e))):
        assert type(clone) is cls
        assert (clone.key, clone.namespace, clone.state, clone.entry_version) == (
            ("a", 1),
            "ns",
            "changed",
            3,
        )
    bare = object.__new__(cls)  # how the map creates entries (no __init__ frame)
    with pytest.raises(AttributeError):
        _ = bare.key
    bare.key, bare.namespace = 1, "ns"
    assert bare.hash == hash((1, "ns"))
    with pytest.raises(AttributeError):
        e.no_such_field = 1  # fixed fields, like __slots__


def test_unhashable_key_raises_type_error_from_hash() -> None:
    with pytest.raises(TypeError):
        _ = Compiled([1], "ns", 0, None, 0, 0).hash


def test_untracked_by_the_cyclic_gc_and_smaller() -> None:
    py = PyStateMapEntry(10**6, "ns", 10**6, None, 0, 0)
    c = Compiled(10**6, "ns", 10**6, None, 0, 0)
    assert gc.is_tracked(py) and not gc.is_tracked(c)
    # tracemalloc also counts the GC header of tracked objects, which getsizeof includes
    assert sys.getsizeof(c) + 16 <= sys.getsizeof(py)
    assert sys.getsizeof(c) == 64


def test_a_chain_of_millions_is_freed_without_recursion() -> None:
    gc.collect()
    base = _entry.live_entries()
    head = None
    for i in range(2_000_000):  # a colliding bucket of an adversarial input, at worst
        e = object.__new__(Compiled)
        e.key, e.next = i, head
        head = e
    del e
    assert _entry.live_entries() - base == 2_000_000
    del head  # would overflow the C stack if each entry freed the next recursively
    assert _entry.live_entries() == base


def test_shared_tails_survive_their_first_holder() -> None:
    gc.collect()
    base = _entry.live_entries()
    tail = None
    for i in range(10):
        tail = Compiled(i, "ns", i, tail, 0, 0)
    copied_head = Compiled("copy", "ns", 0, tail, 1, 1)  # a chain copy shares the tail
    assert _entry.live_entries() - base == 11
    del copied_head
    assert _entry.live_entries() - base == 10
    assert [e.key for e in _walk(tail)] == list(range(9, -1, -1))
    del tail
    assert _entry.live_entries() == base


def _walk(e: object) -> list[object]:
    out = []
    while e is not None:
        out.append(e)
        e = e.next  # type: ignore[attr-defined]
    return out
