"""Every message on the host channel is one typed struct (:mod:`streamstate.spark.wire.messages`),
decoded once by its receiver into its type; anything else is refused before it is used. A
task's acknowledgement is one typed ``TaskAck`` (:mod:`streamstate.spark.wire.acks`), decoded
once on the driver, the function's error in it raised as the function raised it."""

from __future__ import annotations

import os
import socket
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamstate.backends.figures import StateFigures
from streamstate.checkpoint.metadata import SubtaskStateHandle
from streamstate.errors import StateHostError
from streamstate.spark.failures import raise_function_error, task_error_report
from streamstate.spark.wire.acks import (
    ACK_COLUMN,
    TaskAck,
    TaskTimings,
    decode_acks,
    encode_ack,
)
from streamstate.spark.wire.messages import (
    Begun,
    Bye,
    Data,
    Done,
    End,
    Error,
    ErrorReport,
    Hello,
    HostHello,
    HostLocation,
    Ok,
    Ping,
    Pong,
    Shutdown,
)
from streamstate.spark.wire.protocol import (
    CLIENT_RECEIVES,
    HOST_RECEIVES,
    Connection,
    MalformedMessage,
)
from streamstate.spark.wire.results import BatchResult, StagedOutput
from streamstate.spark.wire.security import new_secret, session_keys
from streamstate.spark.wire.step import Begin, StepTask

_text = st.text(max_size=20)
_opt_int = st.none() | st.integers(min_value=-(2**62), max_value=2**62)
_locations = st.builds(
    HostLocation,
    id=_text,
    node=st.none() | _text,
    tcp=st.none() | _text,
    unix=st.none() | _text,
    pid=_opt_int,
)
_reports = st.builds(
    ErrorReport,
    type=_text,
    message=_text,
    notes=st.lists(_text, max_size=3),
    traceback=_text,
    where=_text,
)


def _result(subtask: int = 0, rows: int = 3) -> BatchResult:
    return BatchResult(
        subtask=subtask,
        batch=4,
        version=4,
        attempt=7,
        handle=SubtaskStateHandle(
            operator="op",
            subtask_index=subtask,
            parallelism=2,
            max_parallelism=128,
            key_group_range=(0, 63),
            attempt=7,
            checkpoint_id=4,
        ),
        outputs=StagedOutput(path="outputs/batch-4/part-0.parquet", size=10, rows=rows),
        rows=rows,
        restore="hot",
        stats={"stage_ms": 1.5},
        side_outputs={"late": StagedOutput(path="x", size=1, rows=1)},
        state=StateFigures(rows=5, rows_updated=2),
    )


TO_HOST = st.one_of(
    st.builds(Hello, proto=st.integers(min_value=0, max_value=255)),
    st.builds(
        Begin,
        task=st.builds(
            StepTask,
            job=st.binary(max_size=20),
            batch=st.integers(min_value=0, max_value=2**40),
            base=st.integers(min_value=-1, max_value=2**40),
            lineage=_text,
            new_lineage=_text,
        ),
        subtask=st.integers(min_value=0, max_value=8),
        attempt=st.integers(min_value=0, max_value=2**40),
        schema=st.none() | st.binary(max_size=20),
    ),
    st.just(Data()),
    st.just(End()),
    st.just(Ping()),
    st.builds(Shutdown, reason=_text, pid=_opt_int),
)
TO_CLIENT = st.one_of(
    st.builds(
        HostHello,
        proto=st.integers(min_value=0, max_value=255),
        location=_locations,
        version=_opt_int,
        lineage=st.none() | _text,
        rlimit_as=_opt_int,
        started=st.floats(min_value=0, max_value=2e9),
    ),
    st.builds(Begun, restore=_text, restore_ms=st.floats(min_value=0, max_value=1e6)),
    st.just(Ok()),
    st.builds(Done, result=st.integers(min_value=0, max_value=8).map(_result)),
    st.builds(Pong, version=_opt_int),
    st.builds(Bye, ignored=st.booleans()),
    st.builds(Error, type=_text, message=_text, traceback=_text, report=st.none() | _reports),
)


def _pair() -> tuple[Connection, Connection, Any]:
    """A client's and a host's connection of one socket pair (and the sockets, to close)."""
    secret, nonces = new_secret(), (os.urandom(32), os.urandom(32))
    a, b = socket.socketpair()
    a.settimeout(5)
    b.settimeout(5)
    client = Connection(a, session_keys(secret, "h", *nonces, client=True), CLIENT_RECEIVES)
    host = Connection(b, session_keys(secret, "h", *nonces, client=False), HOST_RECEIVES)
    return client, host, (a, b)


@settings(max_examples=60, deadline=None)
@given(to_host=st.lists(TO_HOST, max_size=4), to_client=st.lists(TO_CLIENT, max_size=4))
def test_each_side_decodes_what_the_other_sends_as_its_type(
    to_host: list[Any], to_client: list[Any]
) -> None:
    client, host, socks = _pair()
    try:
        for message in to_host:
            client.send(message)
            got, body = host.recv()
            assert type(got) is type(message) and got == message and body is None
        for message in to_client:
            host.send(message)
            got, _ = client.recv()
            assert type(got) is type(message) and got == message
    finally:
        for s in socks:
            s.close()


def test_a_header_the_receiver_does_not_take_is_refused_by_its_name_and_the_channel_goes_on() -> (
    None
):
    client, host, socks = _pair()
    try:
        # the host's answer sent to a host, a message of no kind, a BEGIN of the wrong shape
        for wrong, name in (
            (Done(result=_result()), "malformed DONE"),
            ({"t": "LAUNCH", "code": "rm -rf /"}, "malformed LAUNCH"),
            ({"t": "BEGIN", "job": b"\x93", "batch": "zero"}, "malformed BEGIN"),
            ([1, 2, 3], "malformed message"),
        ):
            client.send(wrong)  # type: ignore[arg-type]
            with pytest.raises(MalformedMessage, match=name):
                host.recv()
        client.send(Ping())  # the frames verified: the next message is read as it was sent
        assert host.recv()[0] == Ping()
        # and a task's message sent back to a task
        host.send(Data())
        with pytest.raises(MalformedMessage, match="malformed DATA"):
            client.recv()
    finally:
        for s in socks:
            s.close()


@settings(max_examples=40, deadline=None)
@given(
    location=st.none() | _locations,
    route=st.sampled_from(["unix", "tcp", "fallback"]),
    spawn=st.none() | st.floats(min_value=0, max_value=1e5),
)
def test_an_ack_row_decodes_into_the_ack_the_task_made(
    location: HostLocation | None, route: str, spawn: float | None
) -> None:
    ack = TaskAck(
        subtask=1,
        result=_result(1),
        timings=TaskTimings(connect_ms=2.0, spawn_ms=spawn, route=route, worker_pid=12),
        location=location,
    )
    (got,) = decode_acks([{ACK_COLUMN: encode_ack(ack)}])
    assert got == ack
    assert got.result is not None and got.result.handle.key_group_range == (0, 63)


def test_the_first_failing_subtask_s_error_is_raised_as_the_function_raised_it() -> None:
    def failing(message: str) -> ErrorReport:
        try:
            raise KeyError(message)
        except KeyError as exc:
            exc.add_note(f"streamstate: raised in process_element of key {message!r}")
            return task_error_report(exc, f"in the state host of 'op' subtask for {message}")

    acks = decode_acks(
        [
            {ACK_COLUMN: encode_ack(TaskAck(subtask=2, error=failing("two")))},
            {ACK_COLUMN: encode_ack(TaskAck(subtask=0, result=_result(0)))},
            {ACK_COLUMN: encode_ack(TaskAck(subtask=1, error=failing("one")))},
        ]
    )
    with pytest.raises(KeyError, match="one") as raised:
        raise_function_error(acks)
    notes = "\n".join(raised.value.__notes__)
    assert "process_element of key 'one'" in notes and "subtask for one" in notes
    raise_function_error([a for a in acks if a.error is None])  # no error: nothing raised
    # a class the driver cannot build: a StateHostError naming it
    stranger = ErrorReport(type="their.module.Oops", message="no", where="somewhere")
    with pytest.raises(StateHostError, match=r"their\.module\.Oops: no"):
        raise_function_error([TaskAck(subtask=0, error=stranger)])


def test_a_result_keeps_its_handle_typed_through_the_done_message() -> None:
    result = _result()
    encoded = msgspec.msgpack.encode(Done(result=result))
    got = CLIENT_RECEIVES.decode(encoded)
    assert isinstance(got, Done) and got.result == result
    assert isinstance(got.result.handle, SubtaskStateHandle)
