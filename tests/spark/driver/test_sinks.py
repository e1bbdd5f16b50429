"""Sink construction (no SparkSession needed)."""

from __future__ import annotations

from typing import Any

import pytest

from streamstate.spark.driver.sinks import FileSink, MemorySink, sink_from


def test_parquet_sink_gets_the_storage_options(tmp_path: Any) -> None:
    sink = sink_from("parquet", str(tmp_path / "out"), storage_options={"auto_mkdir": True})
    assert isinstance(sink, FileSink)
    assert sink.fs.storage_options == {"auto_mkdir": True}


def test_sink_names_and_errors(tmp_path: Any) -> None:
    assert isinstance(sink_from("memory"), MemorySink)
    given = MemorySink()
    assert sink_from(given) is given
    with pytest.raises(ValueError, match="needs path="):
        sink_from("parquet")
    with pytest.raises(ValueError, match="unknown sink 'kafka'"):
        sink_from("kafka")
