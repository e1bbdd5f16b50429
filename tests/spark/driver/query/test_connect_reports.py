"""The reports of a Spark Connect query's server side, read by its client (no Spark needed)."""

from __future__ import annotations

from typing import Any

from streamstate.checkpoint.storage import FileSystemCheckpointStorage
from streamstate.spark.driver.query.connect import ConnectReports


def test_the_client_reads_only_whole_batch_reports(tmp_path: Any) -> None:
    """A report being written (``put_atomic``'s temporary file beside the reports, still
    empty) is not read as a step: the client sees the reports written whole, in order."""
    storage = FileSystemCheckpointStorage(str(tmp_path / "ck"), "")
    server = ConnectReports(storage, "connect/0000000000001-run", {})
    client = ConnectReports(storage, "connect/0000000000001-run", {})
    server.step({"checkpoint": 0, "rows": 3}, 0)
    in_flight = "connect/0000000000001-run/batches/000000000001-000001.json.tmp-0123abcd"
    with open(tmp_path / "ck" / in_flight, "w"):
        pass
    client.sync()
    assert client.batches() == [{"checkpoint": 0, "rows": 3}]
    server.step({"checkpoint": 1, "rows": 2}, 1)
    client.sync()
    assert client.batches() == [{"checkpoint": 0, "rows": 3}, {"checkpoint": 1, "rows": 2}]


def _parts(tmp_path: Any, sink: Any) -> Any:
    """What runs a query run's steps, as a Connect client pickles it (no session in it)."""
    import msgspec
    import pyarrow as pa
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from streamstate.spark.driver.monitor.figures import Spans
    from streamstate.spark.driver.plan.options import KeyedOptions
    from streamstate.spark.driver.step.commit import CheckpointLog
    from streamstate.spark.driver.step.host_fleet import HostFleet
    from streamstate.spark.driver.step.micro_batches import RunParts
    from streamstate.spark.driver.step.outputs import OutputDelivery
    from streamstate.spark.driver.step.step_tasks import StepTasks
    from streamstate.spark.job import JobSpec, arrow_schema_to_bytes
    from streamstate.spark.subtask import job_storage
    from support.spark_functions import Count

    out = pa.schema([("user", pa.string()), ("n", pa.int64())])
    struct = StructType([StructField("user", StringType()), StructField("n", LongType())])
    options = KeyedOptions(
        df=None,
        key_columns=["user"],
        function=Count(),
        output_struct=struct,
        parallelism=1,
        max_parallelism=128,
        state_backend="heap",
        state_backend_options={},
        checkpoint=str(tmp_path / "ck"),
        event_time=None,
        watermark_delay=None,
        operator_name="op",
        storage_options={},
        initial_state=None,
        max_deltas=16,
        retained_checkpoints=3,
        host_idle_timeout=60.0,
        adaptive=False,
    )
    job = JobSpec(
        operator="op",
        parallelism=1,
        max_parallelism=128,
        key_columns=["user"],
        value_columns=["user", "v"],
        input_schema=arrow_schema_to_bytes(out),
        output_schema=arrow_schema_to_bytes(out),
        checkpoint_url=str(tmp_path / "ck"),
    )
    job_bytes = msgspec.msgpack.encode(job)
    storage = job_storage(job)
    hosts = HostFleet(
        job, job_bytes, run_dir=None, bind="off", connect_timeout=1.0, idle_timeout=60.0
    )
    spans = Spans()
    return RunParts(
        options=options,
        log=CheckpointLog(storage, "op", 1),
        steps=StepTasks(options, job, job_bytes, (b"", ""), hosts, None, spans),
        outputs=OutputDelivery(options, storage, sink, {}, out, {}),
        run_id=hosts.run_id,
        no_data_batches=True,
        idle_interval=0.0,
        spans=spans,
    )


def test_a_connect_run_pickles_as_plain_parts_and_both_ends_talk_through_the_checkpoint(
    tmp_path: Any,
) -> None:
    """The client pickles the run's parts and its reports (no session, no thread, nothing
    dropped on the way); the server's copy makes the runner and reports to the client's copy
    through the checkpoint: a step's figures, a memory sink's batch, a failure, the stop."""
    import cloudpickle
    import pyarrow as pa

    from streamstate.errors import StateAccessError
    from streamstate.spark.driver.query.connect import ServerBatches
    from streamstate.spark.driver.sinks import MemorySink, StagedBatch

    storage = FileSystemCheckpointStorage(str(tmp_path / "ck"), "")
    sink = MemorySink()
    client = ConnectReports.start_run(storage, "run", {"main": sink})
    parts = _parts(tmp_path, sink)
    function = ServerBatches(parts, client)
    server_function = cloudpickle.loads(cloudpickle.dumps(function))  # what the server gets
    server_parts, server = cloudpickle.loads(server_function.blob)
    assert server_parts.steps.spans is server_parts.spans  # one recorder, as on the client
    assert server_parts.options.df is None and server.directory == client.directory
    # the server's end reports a step and a memory sink's batch...
    server.step({"checkpoint": 0, "rows": 2}, 1)
    server_sink = server_parts.outputs.sink
    table = pa.table({"user": ["a"], "n": pa.array([1], pa.int64())})
    batch = StagedBatch(0, [], storage, table.schema, None, None)
    batch.to_arrow = lambda: table  # type: ignore[method-assign]
    server_sink.write(batch)
    assert server.running()
    # ...which the client's end takes in
    assert client.batches() == [] and sink.batches == {}
    client.sync()
    assert client.batches() == [{"checkpoint": 0, "rows": 2}]
    assert sink.batches[0].to_pylist() == [{"user": "a", "n": 1}]
    # a failure of the server's micro-batch: the client raises it as it was raised
    failure = StateAccessError("state 'n' read outside a key")
    server.failed(failure, 3, "op")
    got = client.failure(None)
    assert type(got) is StateAccessError and str(got) == str(failure)
    assert "micro-batch 3 of 'op'" in got.__notes__[-1]
    # the client stops the query: the server's idle ticker runs no more
    client.stop(timeout=0)
    assert not server.running()


def test_each_kind_of_session_implements_both_ends() -> None:
    from streamstate.spark.driver.query.classic import ClassicReports
    from streamstate.spark.driver.reports import QueryReports, StepReports

    for kind in (ClassicReports, ConnectReports):
        assert issubclass(kind, QueryReports) and issubclass(kind, StepReports)
        assert not kind.__abstractmethods__
