"""The options of the ``streamstate`` and ``streamstate-metadata`` formats, read once.

Spark hands a data source its options as strings, with case-insensitive names;
:func:`read_options` turns them into one :class:`ReadOptions` (clear errors for a bad value), which
the planning and every partition use.

>>> opts = read_options({"path": "/ck/job", "state": "count", "checkpointid": "7"})
>>> opts.state, opts.checkpoint_id, opts.operator, opts.read_change_feed
('count', 7, 'keyed-process', False)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import msgspec

__all__ = ["DEFAULT_OPERATOR", "ReadOptions", "read_options"]

DEFAULT_OPERATOR = "keyed-process"
"""The operator name ``keyed_process`` and the ``LocalRunner`` give a job by default."""

_STORAGE_PREFIX = "storage."


class ReadOptions(msgspec.Struct, frozen=True, kw_only=True):
    """What to read (see docs/checkpoints/state-source.md for each option)."""

    #: a job's checkpoint directory, a ``chk-<id>`` directory or a savepoint directory
    path: str
    #: a keyed state or a timer queue (``_timers.<service>.<event|processing>``)
    state: str | None = None
    #: an operator list, union list or broadcast state
    operator_state: str | None = None
    operator: str = DEFAULT_OPERATOR
    #: a checkpoint of the job directory ``path`` (None: its latest complete one)
    checkpoint_id: int | None = None
    include_expired: bool = False
    #: processing time (ms) against which TTL expiry is judged (None: the clock at planning)
    now: int | None = None
    read_change_feed: bool = False
    change_start: int | None = None
    change_end: int | None = None
    #: fsspec options of the checkpoint storage
    storage_options: dict[str, Any] = {}


_NAMES = {
    "path": "path",
    "state": "state",
    "operatorstate": "operator_state",
    "operator": "operator",
    "checkpointid": "checkpoint_id",
    "includeexpired": "include_expired",
    "now": "now",
    "readchangefeed": "read_change_feed",
    "changestartcheckpointid": "change_start",
    "changeendcheckpointid": "change_end",
}
_SPELLING = {
    "checkpoint_id": "checkpointId",
    "include_expired": "includeExpired",
    "now": "now",
    "read_change_feed": "readChangeFeed",
    "change_start": "changeStartCheckpointId",
    "change_end": "changeEndCheckpointId",
}
_INTEGERS = ("checkpoint_id", "now", "change_start", "change_end")
_BOOLEANS = ("include_expired", "read_change_feed")


def read_options(options: Mapping[str, str], *, format_name: str = "streamstate") -> ReadOptions:
    """The :class:`ReadOptions` of a data source's options (names in any case). Storage options
    are ``storageOptions`` (a JSON object) and ``storage.<name>`` (one each; a value that reads
    as JSON is taken as such: ``true``, ``3``, ``{...}``)."""
    fields: dict[str, Any] = {}
    storage: dict[str, Any] = {}
    unknown = []
    for raw_name, value in options.items():
        name = raw_name.lower()
        if name == "storageoptions":
            storage.update(_json_object(value))
        elif name.startswith(_STORAGE_PREFIX):
            storage[raw_name[len(_STORAGE_PREFIX) :]] = _json_or_text(value)
        elif name in _NAMES:
            fields[_NAMES[name]] = value
        else:
            unknown.append(raw_name)
    if unknown:
        known = ", ".join(
            sorted({"path", "state", "operatorState", "operator", *_SPELLING.values()})
        )
        raise ValueError(
            f"format {format_name!r} has no option {', '.join(map(repr, sorted(unknown)))}; "
            f"its options: {known}, storageOptions and storage.<fsspec option>"
        )
    if not fields.get("path"):
        raise ValueError(
            f"format {format_name!r} reads a checkpoint: give its directory to load(PATH) (a "
            "job's checkpoint directory, a chk-<id> directory or a savepoint directory)"
        )
    for name in _INTEGERS:
        if name in fields:
            fields[name] = _integer(fields[name], _SPELLING[name])
    for name in _BOOLEANS:
        if name in fields:
            fields[name] = _boolean(fields[name], _SPELLING[name])
    return ReadOptions(**fields, storage_options=storage)


def _integer(value: Any, option: str) -> int:
    try:
        return int(str(value).strip())
    except ValueError:
        raise ValueError(f"option {option!r} must be an integer, got {value!r}") from None


def _boolean(value: Any, option: str) -> bool:
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", ""):
        return False
    raise ValueError(f"option {option!r} must be true or false, got {value!r}")


def _json_object(value: str) -> dict[str, Any]:
    try:
        out = json.loads(value)
    except ValueError:
        out = None
    if not isinstance(out, dict):
        raise ValueError(f"option 'storageOptions' must be a JSON object, got {value!r}")
    return out


def _json_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value
