"""Every message on the host channel, one ``msgspec.Struct`` each, tagged by its ``t`` field.

A message is a msgpack header (one of these structs) and, for :class:`Data`, a body (one Arrow
record batch, :mod:`streamstate.spark.wire.protocol`). A state host receives
:data:`ToHost` and its client (a task, or the driver) :data:`ToClient`; each side decodes a
header once, into its type, and a header that is not one of them is refused as malformed
before anything in it is used. The BEGIN message, the step's task, is in
:mod:`streamstate.spark.wire.step`; the result in DONE in :mod:`streamstate.spark.wire.results`.
"""

from __future__ import annotations

import msgspec

from streamstate.spark.wire.results import BatchResult
from streamstate.spark.wire.step import Begin

__all__ = [
    "Begun",
    "Bye",
    "Data",
    "Done",
    "End",
    "Error",
    "ErrorReport",
    "Hello",
    "HostHello",
    "HostLocation",
    "Ok",
    "Ping",
    "Pong",
    "Shutdown",
    "ToClient",
    "ToHost",
]


class HostLocation(msgspec.Struct, frozen=True, kw_only=True):
    """Where a state host lives (its HELLO says it; the acknowledgement carries it to the
    driver, which sends the next step's task of the subtask there)."""

    #: the host's id (:func:`~streamstate.spark.wire.hosts.host_id`)
    id: str
    #: the node's id (:func:`~streamstate.spark.wire.security.node_id`)
    node: str | None = None
    #: its TCP address (``host:port``; None: it listens on its Unix socket only)
    tcp: str | None = None
    #: its Unix socket's path on its node
    unix: str | None = None
    pid: int | None = None


class ErrorReport(msgspec.Struct, frozen=True, kw_only=True):
    """A function error as plain data (:func:`~streamstate.spark.failures.task_error_report`):
    it travels in an ERROR message and in a task's acknowledgement, and the driver raises it
    once (:func:`~streamstate.spark.failures.error_from_task_report`)."""

    #: the class's qualified name (``module.Class``; a built-in's bare name)
    type: str
    message: str
    notes: list[str] = []
    #: the frames of the traceback (the error's own line and notes are above them)
    traceback: str = ""
    #: where it was raised (``in the state host of 'op' subtask 0 (micro-batch 3)``)
    where: str = ""


class _Message(msgspec.Struct, frozen=True, kw_only=True, tag_field="t"):
    """A header on the host channel (``t`` names it)."""


# ---- client -> host ----------------------------------------------------------------------------


class Hello(_Message, frozen=True, tag="HELLO"):
    """The client's first message: the protocol it speaks."""

    proto: int


class Data(_Message, frozen=True, tag="DATA"):
    """One Arrow record batch of the subtask's records follows as the body."""


class End(_Message, frozen=True, tag="END"):
    """The step's records are all sent."""


class Ping(_Message, frozen=True, tag="PING"):
    """Is the host there, and which version does it hold?"""


class Shutdown(_Message, frozen=True, tag="SHUTDOWN"):
    """Exit (with ``pid``: only if the host is still that process)."""

    reason: str = ""
    pid: int | None = None


# ---- host -> client ----------------------------------------------------------------------------


class HostHello(_Message, frozen=True, tag="HELLO"):
    """The host's answer to HELLO: who and where it is, and what it holds."""

    proto: int
    location: HostLocation
    #: the state version it holds (None: none) and its lineage
    version: int | None = None
    lineage: str | None = None
    #: its address-space limit (``RLIMIT_AS``, bytes; None: unlimited)
    rlimit_as: int | None = None
    #: when it started (seconds since the epoch)
    started: float = 0.0


class Begun(_Message, frozen=True, tag="BEGUN"):
    """The host holds the step's base version (how it got it) and takes the records."""

    restore: str
    restore_ms: float


class Ok(_Message, frozen=True, tag="OK"):
    """One DATA was processed."""


class Done(_Message, frozen=True, tag="DONE"):
    """The step ended: the subtask's result (its checkpoint written, its outputs staged)."""

    result: BatchResult


class Pong(_Message, frozen=True, tag="PONG"):
    version: int | None = None


class Bye(_Message, frozen=True, tag="BYE"):
    """The host exits (``ignored``: the SHUTDOWN named another process; it does not)."""

    ignored: bool = False


class Error(_Message, frozen=True, tag="ERROR"):
    """What went wrong; with ``report``, a function error the driver raises once."""

    type: str
    message: str
    traceback: str = ""
    report: ErrorReport | None = None


#: what a state host receives
ToHost = Hello | Begin | Data | End | Ping | Shutdown
#: what a host's client receives
ToClient = HostHello | Begun | Ok | Done | Pong | Bye | Error
