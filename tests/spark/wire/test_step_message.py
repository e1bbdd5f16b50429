"""A step's task from the driver to a state host (:mod:`streamstate.spark.wire.step`): the
driver's plan becomes one ``StepTask`` whose fields reach the host unchanged inside a ``Begin``,
and a BEGIN of the earlier, flat shape is refused as malformed."""

from __future__ import annotations

import os
import socket
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamstate.spark.driver.step.commit import BatchPlan
from streamstate.spark.wire.protocol import CLIENT_RECEIVES, HOST_RECEIVES, Connection
from streamstate.spark.wire.security import new_secret, session_keys
from streamstate.spark.wire.step import Begin, StepTask

_ints = st.integers(min_value=-(2**62), max_value=2**62)


@st.composite
def plans(draw: Any) -> BatchPlan:
    p = draw(st.integers(min_value=1, max_value=8))
    return BatchPlan(
        batch=draw(st.integers(min_value=0, max_value=2**40)),
        base=draw(st.integers(min_value=-1, max_value=2**40)),
        lineage=draw(st.text(max_size=20)),
        new_lineage=draw(st.text(max_size=20)),
        base_attempts=draw(
            st.dictionaries(st.integers(min_value=0, max_value=p - 1), _ints, max_size=p)
        ),
        watermark=draw(_ints),
        processing_time=draw(_ints),
        max_timestamp=draw(_ints),
        no_data=draw(st.booleans()),
        during_batch=draw(st.none() | st.integers(min_value=0, max_value=2**40)),
    )


@given(plan=plans(), subtask=st.integers(min_value=0, max_value=7), job=st.binary(max_size=64))
def test_the_plan_reaches_the_host_field_for_field(
    plan: BatchPlan, subtask: int, job: bytes
) -> None:
    step = plan.task(job)
    secret, nonces = new_secret(), (os.urandom(32), os.urandom(32))
    a, b = socket.socketpair()
    with a, b:
        sent = Begin(task=step, subtask=subtask, attempt=7, schema=b"s")
        client_keys = session_keys(secret, "h1", *nonces, client=True)
        Connection(a, client_keys, CLIENT_RECEIVES).send(sent)
        host_keys = session_keys(secret, "h1", *nonces, client=False)
        got, body = Connection(b, host_keys, HOST_RECEIVES).recv()
    assert isinstance(got, Begin) and body is None
    assert got.task == step and (got.subtask, got.attempt, got.schema) == (subtask, 7, b"s")
    # what the host uses, by the driver's own names
    assert got.task.job == job
    assert (got.task.batch, got.task.base, got.task.lineage, got.task.new_lineage) == (
        plan.batch,
        plan.base,
        plan.lineage,
        plan.new_lineage,
    )
    assert (got.task.watermark, got.task.processing_time) == (plan.watermark, plan.processing_time)
    assert got.base_attempt == plan.base_attempts.get(subtask)
    assert (got.task.spark_batch, got.task.no_data) == (plan.during_batch, plan.no_data)


def test_a_begin_of_the_flat_shape_is_malformed() -> None:
    """Protocol version 3's BEGIN (the step's fields at the top, ``base_attempt`` for one
    subtask): a host of version 4 that got one past the handshake refuses it as data."""
    old = {
        "t": "BEGIN",
        "job": b"x",
        "batch": 1,
        "base": 0,
        "lineage": "a",
        "new_lineage": "b",
        "base_attempt": 3,
        "attempt": 4,
        "subtask": 0,
    }
    with pytest.raises(msgspec.ValidationError, match="task"):
        msgspec.convert(old, Begin)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({**old, "t": "DATA"}, Begin)


def test_a_step_pickles_with_the_task_closure() -> None:
    """Spark ships the step inside the task's closure (cloudpickle)."""
    import cloudpickle

    step = StepTask(job=b"j", batch=2, base=1, lineage="a", new_lineage="b", base_attempts={0: 9})
    assert cloudpickle.loads(cloudpickle.dumps(step)) == step
