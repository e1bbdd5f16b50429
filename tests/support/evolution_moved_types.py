"""A record type moved to another module: the same name and fields as
``evolution_types.Acc`` (tests/evolution/)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Acc:
    n: int
    tag: str
