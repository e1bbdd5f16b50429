"""A classic session's Columns built once per JVM (``spark/driver/jvm_columns.py``): one build per
key and JVM, a new build when anything the key names changes or the JVM is another, at most
``MAX_ENTRIES`` kept. No Spark: a session is anything with ``_jvm._gateway_client``."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from streamstate.spark.driver import jvm_columns
from streamstate.spark.driver.jvm_columns import MAX_ENTRIES, jvm_column


class FakeJvm:
    def __init__(self) -> None:
        self._gateway_client = object.__new__(type("GatewayClient", (), {}))


class FakeSession:
    def __init__(self, jvm: FakeJvm) -> None:
        self._jvm = jvm


class Builder:
    """Counts its builds; each build is a new object, as a Py4J call returns a new proxy."""

    def __init__(self) -> None:
        self.built: list[tuple[Any, Any]] = []
        self._ids = itertools.count()

    def __call__(self, key: Any) -> Any:
        def build(jvm: Any) -> Any:
            made = (key, next(self._ids))
            self.built.append((jvm, made))
            return made

        return build


def test_a_column_is_built_once_per_key_and_jvm() -> None:
    jvm = FakeJvm()
    spark, same_jvm = FakeSession(jvm), FakeSession(jvm)
    builder = Builder()
    key = ("expr", "CAST(k % 128 AS INT)")
    first = jvm_column(spark, key, builder(key))
    # another session of the same JVM finds it
    assert jvm_column(same_jvm, key, builder(key)) is first
    assert builder.built == [(jvm, first)]


@pytest.mark.parametrize(
    "changed",
    [
        ("expr", "CAST(k % 256 AS INT)"),  # another SQL text
        ("sortWithinPartitions", "k", "ts"),  # more columns
        ("sortWithinPartitions", "ts", "k"),  # the same columns in another order
    ],
)
def test_any_change_of_what_a_column_is_built_from_builds_it_again(changed: Any) -> None:
    spark = FakeSession(FakeJvm())
    builder = Builder()
    for key in (("expr", "CAST(k % 128 AS INT)"), ("sortWithinPartitions", "k")):
        jvm_column(spark, key, builder(key))
    before = len(builder.built)
    made = jvm_column(spark, changed, builder(changed))
    assert len(builder.built) == before + 1 and made[0] == changed
    assert jvm_column(spark, changed, builder(changed)) is made


def test_another_jvm_builds_its_own_and_a_gone_jvm_takes_its_columns_with_it() -> None:
    key = ("expr", "k")
    builder = Builder()
    first_jvm, second_jvm = FakeJvm(), FakeJvm()
    a = jvm_column(FakeSession(first_jvm), key, builder(key))
    b = jvm_column(FakeSession(second_jvm), key, builder(key))
    assert a is not b and [jvm for jvm, _ in builder.built] == [first_jvm, second_jvm]
    caches = len(jvm_columns._CACHES)
    builder.built.clear()
    del first_jvm
    assert len(jvm_columns._CACHES) == caches - 1  # weakly keyed by the JVM's gateway client


def test_at_most_max_entries_are_kept_the_least_recently_used_go_first() -> None:
    spark = FakeSession(FakeJvm())
    builder = Builder()
    keys = [("expr", f"k % {n}") for n in range(MAX_ENTRIES + 1)]
    for key in keys[:MAX_ENTRIES]:
        jvm_column(spark, key, builder(key))
    jvm_column(spark, keys[0], builder(keys[0]))  # used again: now the most recent
    jvm_column(spark, keys[MAX_ENTRIES], builder(keys[MAX_ENTRIES]))  # evicts keys[1]
    builds = len(builder.built)
    jvm_column(spark, keys[0], builder(keys[0]))
    assert len(builder.built) == builds
    jvm_column(spark, keys[1], builder(keys[1]))
    assert len(builder.built) == builds + 1


def test_a_failed_build_is_not_kept() -> None:
    spark = FakeSession(FakeJvm())

    def broken(jvm: Any) -> Any:
        raise RuntimeError("no such expression")

    with pytest.raises(RuntimeError):
        jvm_column(spark, ("Murmur3Hash", "k"), broken)
    assert jvm_column(spark, ("Murmur3Hash", "k"), lambda jvm: "built") == "built"
