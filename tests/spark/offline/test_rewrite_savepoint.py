"""``streamstate.spark.rewrite_savepoint``: a state converted with DataFrame operations from
``read_state`` replaces the old one, every key moves to a key of a new type, and the new code
starting from the savepoint (at another parallelism, on either backend) continues as a replay of
the whole input by the new code from scratch (SPEC §14.3)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from streamstate import StateMigrationException, ValueStateDescriptor
from streamstate.checkpoint.storage import FileSystemCheckpointStorage
from streamstate.runtime.local import LocalRunner
from support.checkpoint import runner_content
from support.payments import LastV2, Payments, PaymentsV2, payment_records


def _runner(function: Any, backend: str, path: Path, p: int, **kw: Any) -> LocalRunner:
    return LocalRunner(
        function,
        key_selector=lambda r: r[0],
        parallelism=p,
        max_parallelism=32,
        state_backend=backend,
        checkpoint_storage=FileSystemCheckpointStorage(str(path), durable=False),
        timestamp_assigner=lambda r: r[2],
        watermark_delay=10,
        **kw,
    )


def _as_int(records: list[Any]) -> list[Any]:
    return [(int(r[0]), *r[1:]) for r in records]


# the old job's checkpoint of either backend is read in Spark tasks that decode its records by
# the checkpoint's own schema (no class imported); the new code restores at parallelism 3
@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_a_rewrite_from_dataframes_continues_as_a_replay(
    spark: Any, tmp_path: Path, backend: str
) -> None:
    from pyspark.sql import functions as F  # noqa: N812

    from streamstate.spark import read_state, rewrite_savepoint

    before, after = payment_records(6, 5, 0), payment_records(6, 4, 1_000)
    old = _runner(Payments(), backend, tmp_path / "old", 2)
    old.run(before, final_watermark=False)
    old.checkpoint()
    old.close()
    job = str(tmp_path / "old" / "job")

    last = read_state(spark, job, state="last")  # records as structs
    amount, note = F.col("value.amount"), F.col("value.note")
    converted = last.select(
        F.col("key").cast("long").alias("key"),
        F.struct(amount.alias("amount"), F.length(note).cast("long").alias("note_len")).alias(
            "value"
        ),
    )
    url = rewrite_savepoint(
        job,
        str(tmp_path / "v2"),
        replace={"last": (ValueStateDescriptor("last", LastV2), converted)},
        rekey=int,
        key_type=int,
    )

    new = _runner(PaymentsV2(), backend, tmp_path / "new", 3, key_type=int)
    with pytest.raises(StateMigrationException, match="the key type"):
        new.restore(job)  # the old checkpoint itself is refused
    new.restore(url)
    continued = new.run(_as_int(after))
    replay = _runner(PaymentsV2(), backend, tmp_path / "replay", 1, key_type=int)
    replay.run(_as_int(before), final_watermark=False)
    assert sorted(continued) == sorted(replay.run(_as_int(after)))
    assert {o[0] for o in continued} == {"payment", "timer"}
    assert runner_content(new) == runner_content(replay)
    new.close()
    replay.close()
