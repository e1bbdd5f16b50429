"""The query of ``tests/support/stream_driver.py`` started in a test's own Spark session: what a
driver started after another one (killed, or fenced off) runs on the same checkpoint."""

from __future__ import annotations

from typing import Any

from streamstate.spark import FileSink, keyed_process

__all__ = ["restart", "start_stream_query"]


def start_stream_query(
    spark: Any, cfg: dict[str, Any], function: Any, sink: FileSink, **options: Any
) -> Any:
    """Start, in ``spark``, the ``availableNow`` query of a ``stream_driver.py`` config
    (``input``, ``checkpoint``, ``parallelism``): ``function`` keyed by ``user`` over one input
    file per micro-batch, into ``sink``. ``options`` go to ``keyed_process`` (the output schema
    defaults to ``user string, n long``). Returns the running query."""
    options.setdefault("output_schema", "user string, n long")
    return keyed_process(
        spark.readStream.schema("user string, v long")
        .option("maxFilesPerTrigger", 1)
        .parquet(cfg["input"]),
        key="user",
        function=function,
        checkpoint=cfg["checkpoint"],
        parallelism=cfg["parallelism"],
        **options,
    ).write_stream(sink, trigger={"availableNow": True})


def restart(spark: Any, cfg: dict[str, Any], function: Any, **options: Any) -> list[int]:
    """Run the query of ``stream_driver.py``'s ``cfg`` (input, checkpoint, sink, parallelism)
    to the end in ``spark``, as a driver restarted after a kill does; the ids of the batches
    it delivered to the sink, in order. ``options`` go to ``keyed_process``."""
    delivered: list[int] = []

    class RecordingSink(FileSink):
        def write(self, batch: Any) -> None:
            super().write(batch)
            delivered.append(batch.batch_id)

    query = start_stream_query(spark, cfg, function, RecordingSink(cfg["sink"]), **options)
    query.await_termination()  # raises the error of a failed micro-batch; stops the hosts
    return delivered
