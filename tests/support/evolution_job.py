"""The job of the schema-evolution tests (tests/evolution/): it declares the states it is given,
writes the values records carry and reads every state back."""

from __future__ import annotations

import dataclasses
from typing import Any

from streamstate import (
    AggregateFunction,
    AggregatingStateDescriptor,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)

TTL_MS = 5_000


@dataclasses.dataclass(frozen=True)
class Spec:
    """One declared state."""

    name: str
    kind: str
    type: Any
    ttl: bool = False
    previous_name: str | None = None

    def descriptor(self) -> Any:
        prev = {"previous_name": self.previous_name}
        if self.kind == "value":
            d: Any = ValueStateDescriptor(self.name, self.type, **prev)
        elif self.kind == "list":
            d = ListStateDescriptor(self.name, self.type, **prev)
        elif self.kind == "map":
            d = MapStateDescriptor(self.name, str, self.type, **prev)
        elif self.kind == "reducing":
            d = ReducingStateDescriptor(self.name, lambda a, b: b, self.type, **prev)
        else:
            d = AggregatingStateDescriptor(self.name, LastValue(), self.type, **prev)
        if self.ttl:
            d.enable_time_to_live(StateTtlConfig(ttl=TTL_MS))
        return d


class LastValue(AggregateFunction):
    """Keeps the last value added (its accumulator is the value's type)."""

    def create_accumulator(self) -> Any:
        return None

    def add(self, value: Any, accumulator: Any) -> Any:
        return value

    def get_result(self, accumulator: Any) -> Any:
        return accumulator

    def merge(self, a: Any, b: Any) -> Any:
        return b


class Job(KeyedProcessFunction):
    """Records ``(key, "write", {state: value})`` write (a list state's value is its list, a
    map state's its dict); ``(key, "read", None)`` emits ``(key, {state: what it reads})``."""

    def __init__(self, specs: list[Spec]) -> None:
        self.specs = specs

    def open(self, ctx: Any) -> None:
        self.states = {}
        for spec in self.specs:
            d = spec.descriptor()
            getter = {
                "value": ctx.get_state,
                "list": ctx.get_list_state,
                "map": ctx.get_map_state,
                "reducing": ctx.get_reducing_state,
                "aggregating": ctx.get_aggregating_state,
            }[spec.kind]
            self.states[spec.name] = (spec.kind, getter(d))

    def process_element(self, record: Any, ctx: Any) -> Any:
        key, op, payload = record
        if op == "write":
            for name, value in payload.items():
                kind, state = self.states[name]
                if kind == "value" or kind == "list":
                    state.update(value)
                elif kind == "map":
                    state.put_all(value)
                else:
                    state.add(value)
            return
        out = {}
        for name, (kind, state) in self.states.items():
            if kind == "value":
                out[name] = state.value()
            elif kind == "list":
                out[name] = list(state.get())
            elif kind == "map":
                out[name] = dict(state.items())
            else:
                out[name] = state.get()
        yield key, out
