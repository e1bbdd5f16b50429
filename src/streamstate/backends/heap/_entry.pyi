from typing import Any

class StateMapEntry:
    key: Any
    namespace: Any
    state: Any
    next: StateMapEntry | None
    entry_version: int
    state_version: int
    def __init__(
        self,
        key: Any,
        namespace: Any,
        state: Any,
        next_: StateMapEntry | None,
        entry_version: int,
        state_version: int,
    ) -> None: ...
    @property
    def hash(self) -> int: ...

def live_entries() -> int: ...
