"""A keyed function whose declaration changes between two deploys in ways the rules of schema
evolution refuse (its key type, a record type): the savepoint-rewrite tests' job."""

from __future__ import annotations

import dataclasses
from typing import Any

from streamstate import (
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from streamstate.api.functions import CheckpointedFunction


@dataclasses.dataclass
class LastV1:
    amount: int
    note: str


@dataclasses.dataclass
class LastV2:  # not a widening of LastV1: the rewrite converts it
    amount: int
    note_len: int


class Payments(KeyedProcessFunction, CheckpointedFunction):
    """Records ``(user, amount, ts, note)``. Keeps a running total, the last payment, the
    recent amounts and a count per note; an event-time timer 50 ms after each payment reports
    the total. Also counts the records of its subtask in operator state."""

    version = 1

    def open(self, ctx: Any) -> None:
        self.total = ctx.get_state(ValueStateDescriptor("total", int, default=0))
        last = LastV1 if self.version == 1 else LastV2
        self.last = ctx.get_state(ValueStateDescriptor("last", last))
        self.recent = ctx.get_list_state(ListStateDescriptor("recent", int))
        self.by_note = ctx.get_map_state(MapStateDescriptor("by-note", str, int))

    def initialize_state(self, context: Any) -> None:
        self.seen = context.operator_state_store.get_list_state(ListStateDescriptor("seen", int))

    def snapshot_state(self, context: Any) -> None:
        return None

    def process_element(self, record: Any, ctx: Any) -> Any:
        _, amount, ts, note = record
        self.seen.add(1)
        self.total.update(self.total.value() + amount)
        previous = self.last.value()
        if self.version == 1:
            self.last.update(LastV1(amount, note))
            before = None if previous is None else len(previous.note)
        else:
            self.last.update(LastV2(amount, len(note)))
            before = None if previous is None else previous.note_len
        self.recent.add(amount)
        self.by_note.put(note, (self.by_note.get(note) or 0) + 1)
        ctx.timer_service().register_event_time_timer(ts + 50)
        yield (
            "payment",
            ctx.get_current_key(),
            self.total.value(),
            before,
            len(list(self.recent.get())),
            self.by_note.get(note),
        )

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        yield ("timer", ctx.get_current_key(), timestamp, self.total.value())


class PaymentsV2(Payments):
    version = 2


def payment_records(users: int, per_user: int, start: int) -> list[Any]:
    out = []
    for r in range(per_user):
        for u in range(users):
            ts = start + r * 40 + u
            out.append((str(100 + u), u + r, ts, f"note-{(u * r) % 5}" * (1 + u % 3)))
    return out
