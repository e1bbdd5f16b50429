"""KeyedProcessOperator.process_elements: the per-batch loop equals process_element per record."""

from __future__ import annotations

from typing import Any

import pytest

from streamstate import KeyedProcessFunction, ValueStateDescriptor
from streamstate.keygroups import assign_to_key_group
from streamstate.runtime.operator import KeyedProcessOperator
from streamstate.serializers import StrSerializer


class Mixed(KeyedProcessFunction):
    """Counts per key; yields, returns a list, or returns None depending on the value."""

    def open(self, ctx: Any) -> None:
        self.n = ctx.get_state(ValueStateDescriptor("n", int, default=0))

    def process_element(self, value: Any, ctx: Any) -> Any:
        n = self.n.value() + 1
        self.n.update(n)
        if value == "boom":
            raise ValueError("bad record")
        if value == "list":
            return [(ctx.get_current_key(), n, ctx.timestamp())]
        if value == "none":
            return None
        return self._gen(ctx.get_current_key(), n, ctx.timestamp())

    @staticmethod
    def _gen(key: Any, n: int, ts: Any) -> Any:
        yield key, n, ts


def _op() -> KeyedProcessOperator:
    op = KeyedProcessOperator(Mixed(), StrSerializer(), max_parallelism=8)
    op.open()
    return op


def test_process_elements_equals_process_element_per_record() -> None:
    keys = ["a", "b", "a", "c", "a", "b"]
    values = ["gen", "list", "none", "gen", "list", "gen"]
    stamps = [1, 2, None, 4, 5, 6]
    kgs = [assign_to_key_group(k, 8) for k in keys]
    one = _op()
    for record in zip(keys, values, stamps, kgs, strict=True):
        one.process_element(*record)
    many = _op()
    many.process_elements(keys, iter(values), stamps, kgs)
    assert many.drain_output() == one.drain_output()
    assert many.drain_output() == []


def test_process_elements_notes_the_failing_key_and_record() -> None:
    op = _op()
    with pytest.raises(ValueError, match="bad record") as info:
        op.process_elements(["a", "b"], ["gen", "boom"], [None, None], [None, None])
    assert any("key 'b', record 'boom'" in n for n in info.value.__notes__)
    assert op.drain_output() == [("a", 1, None)]  # the records before it were processed


def test_a_bad_return_value_names_process_element() -> None:
    class Bad(Mixed):
        def process_element(self, value: Any, ctx: Any) -> Any:
            return "not a list"

    op = KeyedProcessOperator(Bad(), StrSerializer(), max_parallelism=8)
    op.open()
    with pytest.raises(Exception, match="process_element returned a str"):
        op.process_elements(["a"], ["x"], [None], [None])
