"""Placement: send every record to the Spark partition of the subtask that owns its key group.

Records are routed exactly as the :class:`~streamstate.runtime.local.LocalRunner` routes them
(SPEC §3, §11): ``kg = murmur(java_hash(key)) % max_p``, ``subtask = kg * p // max_p``, and
``DataFrame.repartitionById(p, subtask)`` puts subtask ``i``'s rows in partition ``i``. The key
group travels on as the column ``_kg`` so that nothing downstream hashes a key again.

Two ways to compute ``_kg``, both exact and vectorized:

* a single integer or string key: Spark SQL, no Python round trip. A string's Java hash
  (``String.hashCode``, Flink's for a ``String`` key) is ``java.util.Objects.hashCode`` called
  through ``reflect``; an integer's (``Long.hashCode`` of the value as a BIGINT, whatever the
  column's width) is two SQL operations. Flink's ``MathUtils.murmurHash(code)`` is exactly
  ``Murmur3_x86_32.hashInt(code, 0)`` of Spark's own ``spark-unsafe`` (the same mix, the same
  finalization with length 4), which is what Spark's own ``Murmur3Hash`` expression computes for
  one INT with seed 0. SQL names that expression ``hash`` and fixes its seed at 42, so a classic
  session builds it with seed 0 in the JVM (:func:`key_group_column_classic`): code-generated and
  deterministic, where ``reflect`` is interpreted per row (a boxed call, its result as a string
  parsed back) and makes the shuffle nondeterministic; at 100k rows it halves the time of the
  placement's stage. The Column is built once per JVM
  (:mod:`~streamstate.spark.driver.jvm_columns`), so a classic DataFrame is placed in 2 calls into
  the JVM. A Spark Connect client cannot build a JVM expression: it calls ``hashInt`` through
  ``reflect`` (:func:`key_group_sql_reflect`), one short expression in one projection, as does a
  classic session where the expression cannot be built. If ``reflect`` cannot find the class (a
  Spark without it), the pure-SQL steps (:func:`key_group_sql_steps`) are used, which Spark
  analyzes in 0.2-0.4 s of driver time per micro-batch (the analyzer resolving 13 chained lateral
  aliases):
  Every intermediate value is an unsigned 32-bit number held in a BIGINT and every 32x32-bit
  multiplication is split into 16-bit halves, so nothing overflows even with
  ``spark.sql.ansi.enabled=true``. Each step is its own lateral column alias: reusing a Column
  object inside a larger expression duplicates it, and the murmur mix would grow the plan to
  megabytes.
* every other key type (composite keys, binary, ...), or a Spark whose ``reflect`` cannot
  call ``Objects.hashCode`` for a string: a ``mapInArrow`` pre-pass that runs
  :func:`streamstate.keygroups.assign_key_groups_for_columns` over each Arrow batch.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Any

from streamstate.spark.job import KEY_GROUP_COLUMN

__all__ = [
    "KEY_GROUP_COLUMN",
    "is_integer_key",
    "is_string_key",
    "java_hash_sql",
    "key_group_column_classic",
    "key_group_sql_reflect",
    "key_group_sql_steps",
    "place",
    "with_key_group",
]

log = logging.getLogger(__name__)

#: the names of the key group's intermediate steps (dropped at the end)
_STEP_PREFIX = "__streamstate_kg_step"
_M32 = 0xFFFFFFFF


def _mul32(x: str, c: int) -> str:
    lo, hi = c & 0xFFFF, c >> 16
    return f"((({x} * {lo}) + shiftleft(({x} * {hi}) & 65535, 16)) & {_M32})"


def _rotl32(x: str, r: int) -> str:
    return f"((shiftleft({x}, {r}) | shiftright({x}, {32 - r})) & {_M32})"


def key_group_sql_steps(column: str, max_parallelism: int) -> list[str]:
    """SQL expressions computing the key group of the integer column ``column``.

    Step 0 reads ``column``; every later step reads the previous one as ``_h``; the last step is
    the key group as INT.

    >>> steps = key_group_sql_steps("k", 128)
    >>> steps[0]
    '((CAST(`k` AS BIGINT) ^ shiftrightunsigned(CAST(`k` AS BIGINT), 32)) & 4294967295)'
    >>> steps[-1]
    'CAST(_h % 128 AS INT)'
    """
    # Long.hashCode of the value as a 64-bit integer, whatever the column's width: the Python
    # runtime hashes every int as a long (SPEC §3). Without the cast, a shift of an INT,
    # SMALLINT or TINYINT by 32 is a shift by 0 (Java masks the distance), the hash is 0 and
    # every key lands in one key group (key group placement 1: streamstate.checkpoint.placement)
    k = f"CAST(`{column}` AS BIGINT)"
    return [
        f"(({k} ^ shiftrightunsigned({k}, 32)) & {_M32})",
        _mul32("_h", 0xCC9E2D51),
        _rotl32("_h", 15),
        _mul32("_h", 0x1B873593),
        _rotl32("_h", 13),
        f"((_h * 5 + {0xE6546B64}) & {_M32}) ^ 4",
        "_h ^ shiftright(_h, 16)",
        _mul32("_h", 0x85EBCA6B),
        "_h ^ shiftright(_h, 13)",
        _mul32("_h", 0xC2B2AE35),
        "_h ^ shiftright(_h, 16)",
        # to a signed int32, abs, Integer.MIN_VALUE -> 0
        f"CASE WHEN _h = {1 << 31} THEN 0 WHEN _h > {1 << 31} THEN {1 << 32} - _h ELSE _h END",
        f"CAST(_h % {max_parallelism} AS INT)",
    ]


#: Spark's Murmur3 (spark-unsafe, on the classpath of every Spark driver and executor)
MURMUR3_CLASS = "org.apache.spark.unsafe.hash.Murmur3_x86_32"


#: ``Objects.hashCode(Object)``: a string's ``String.hashCode`` through ``reflect``
JAVA_OBJECTS_CLASS = "java.util.Objects"


def java_hash_sql(column: str, string: bool = False) -> str:
    """One SQL expression: the Java hash code (a signed INT) of the integer (or, with ``string``,
    string) column ``column``, as Flink hashes the key before its murmur mix.

    ``Long.hashCode`` is the same 32-bit value as the first of :func:`key_group_sql_steps`,
    turned into a signed INT (no overflow under ANSI mode); a string's is ``String.hashCode``
    (UTF-16 code units, as Flink hashes a ``String``), called through ``reflect``.

    >>> java_hash_sql("k", string=True)
    "CAST(reflect('java.util.Objects', 'hashCode', `k`) AS INT)"
    """
    if string:
        return f"CAST(reflect('{JAVA_OBJECTS_CLASS}', 'hashCode', `{column}`) AS INT)"
    code = key_group_sql_steps(column, 1)[0]
    return f"CAST(CASE WHEN {code} >= {1 << 31} THEN {code} - {1 << 32} ELSE {code} END AS INT)"


def key_group_sql_reflect(column: str, max_parallelism: int, string: bool = False) -> str:
    """One SQL expression: the key group (INT) of the integer (or, with ``string``, string)
    column ``column``.

    The Java hash (:func:`java_hash_sql`), then ``hashInt(code, 0)``, Flink's mix and
    finalization (Murmur3 x86_32 of one 4-byte block, seed 0), called through ``reflect``; then
    Flink's sign fix (``abs``, with ``Integer.MIN_VALUE`` -> 0) as ``abs(BIGINT h) % 2^31`` (no
    overflow, and 2^31 becomes 0) and the modulo. The murmur call appears once: no projection in
    between.

    >>> "hashInt" in key_group_sql_reflect("k", 128)
    True
    """
    signed = java_hash_sql(column, string)
    murmur = f"CAST(reflect('{MURMUR3_CLASS}', 'hashInt', {signed}, 0) AS BIGINT)"
    group = f"CAST(abs({murmur}) % {1 << 31} % {max_parallelism} AS INT)"
    # a null key has no key group (as in the SQL steps): reflect would fail on a null int
    return f"CASE WHEN `{column}` IS NULL THEN NULL ELSE {group} END"


#: Spark's Murmur3 expression (SQL's ``hash``), whose seed a classic session can choose
MURMUR3_EXPRESSION = "org.apache.spark.sql.catalyst.expressions.Murmur3Hash"


def key_group_column_classic(
    jvm: Any, column: str, max_parallelism: int, string: bool = False
) -> Any:
    """The Column (a Java object of the classic session's JVM) of the key group (INT) of the
    integer (or, with ``string``, string) column ``column``: :func:`key_group_sql_reflect`'s
    value, with ``hashInt(code, 0)`` computed by Spark's ``Murmur3Hash`` expression of seed 0
    (code-generated and deterministic) instead of through ``reflect``. Unresolved: one serves
    every DataFrame with that column. Raises whatever Py4J raises where Spark has no such
    expression."""
    functions = _functions(jvm)
    expressions = getattr(jvm, "org.apache.spark.sql.classic.ExpressionUtils")
    code = expressions.expression(functions.expr(java_hash_sql(column, string)))
    python_utils = getattr(jvm, "org.apache.spark.api.python.PythonUtils")
    murmur = getattr(jvm, MURMUR3_EXPRESSION)(python_utils.toSeq([code]), 0)
    unsigned = functions.abs(expressions.column(murmur).cast("bigint")).mod(functions.lit(1 << 31))
    group = unsigned.mod(functions.lit(max_parallelism)).cast("int")
    # a null key has no key group: without an otherwise, when() is NULL where the test fails
    # (Murmur3Hash skips a null input and would give the seed's group)
    return functions.when(functions.expr(f"`{column}` IS NOT NULL"), group)


def is_integer_key(df: Any, key_columns: list[str]) -> bool:
    """True if the key is one column of an integral Spark type (SQL placement applies)."""
    from pyspark.sql.types import ByteType, IntegerType, LongType, ShortType

    if len(key_columns) != 1:
        return False
    dtype = df.schema[key_columns[0]].dataType
    return isinstance(dtype, ByteType | ShortType | IntegerType | LongType)


def is_string_key(df: Any, key_columns: list[str]) -> bool:
    """True if the key is one string column (SQL placement applies through ``reflect``)."""
    from pyspark.sql.types import StringType

    if len(key_columns) != 1:
        return False
    return isinstance(df.schema[key_columns[0]].dataType, StringType)


def _check_columns(df: Any, key_columns: list[str]) -> None:
    if KEY_GROUP_COLUMN in df.columns:
        raise ValueError(f"the input already has a column named {KEY_GROUP_COLUMN!r}")
    for name in key_columns:
        if name not in df.columns:
            raise ValueError(f"key column {name!r} is not in the input (columns: {df.columns})")


def with_key_group(df: Any, key_columns: list[str], max_parallelism: int) -> Any:
    """``df`` plus the INT column ``_kg``, the key group of each row's key."""
    from streamstate.spark.driver.session import functions_for

    sf = functions_for(df)
    _check_columns(df, key_columns)
    string = is_string_key(df, key_columns)
    if string or is_integer_key(df, key_columns):
        try:
            # one projection, one analysis: the input's columns and the key group
            kg = sf.expr(key_group_sql_reflect(key_columns[0], max_parallelism, string))
            return df.select(sf.col("*"), kg.alias(KEY_GROUP_COLUMN))
        except Exception as exc:  # any analysis error: the SQL steps or the Python pass below
            log.debug("reflect(%s) failed, key groups without it: %r", MURMUR3_CLASS, exc)
    cols = [sf.col(f"`{c}`") for c in df.columns]
    if is_integer_key(df, key_columns):
        steps = key_group_sql_steps(key_columns[0], max_parallelism)
        names = [f"{_STEP_PREFIX}{i}" for i in range(len(steps))]
        if not set(names) & set(df.columns):
            # one select, each step reading the previous one as a lateral column alias: the
            # analyzer builds the same chain of projections as one select per step, but
            # PySpark analyzes 2 DataFrames instead of 14 (~10 ms each through py4j, every
            # micro-batch)
            exprs = [
                sf.expr(re.sub(r"\b_h\b", names[i - 1], step) if i else step).alias(names[i])
                for i, step in enumerate(steps)
            ]
            out = df.select(*cols, *exprs)
            return out.select(*cols, sf.col(names[-1]).alias(KEY_GROUP_COLUMN))
        out = df.select(*cols, sf.expr(steps[0]).alias("_h"))
        for step in steps[1:-1]:
            out = out.select(*cols, sf.expr(step).alias("_h"))
        return out.select(*cols, sf.expr(steps[-1]).alias(KEY_GROUP_COLUMN))
    from pyspark.sql.types import IntegerType, StructField, StructType

    schema = StructType([*df.schema.fields, StructField(KEY_GROUP_COLUMN, IntegerType(), False)])
    return df.mapInArrow(_key_group_pass(list(key_columns), max_parallelism), schema)


def _key_group_pass(key_columns: list[str], max_parallelism: int) -> Any:
    def add_key_group(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        from streamstate.keygroups import assign_key_groups_for_columns

        for batch in batches:
            kgs = assign_key_groups_for_columns(
                [batch.column(c) for c in key_columns], max_parallelism
            )
            yield pa.RecordBatch.from_arrays(
                [*batch.columns, pa.array(kgs, pa.int32())],
                names=[*batch.schema.names, KEY_GROUP_COLUMN],
            )

    return add_key_group


def place(df: Any, key_columns: list[str], parallelism: int, max_parallelism: int) -> Any:
    """``df`` with ``_kg``, repartitioned so that partition ``i`` holds exactly the rows of
    subtask ``i`` (``parallelism`` partitions, some possibly empty)."""
    from streamstate.spark.driver.session import functions_for

    subtask_sql = f"CAST(({KEY_GROUP_COLUMN} * {parallelism}) div {max_parallelism} AS INT)"
    fast = _place_sql_key_classic(df, key_columns, parallelism, max_parallelism, subtask_sql)
    if fast is not None:
        return fast
    sf = functions_for(df)
    placed = with_key_group(df, key_columns, max_parallelism)
    return placed.repartitionById(parallelism, sf.expr(subtask_sql))


def _place_sql_key_classic(
    df: Any, key_columns: list[str], parallelism: int, max_parallelism: int, subtask_sql: str
) -> Any:
    """:func:`place` of a classic DataFrame with an integer or string key in 2 calls into the
    JVM (``withColumn``, ``repartitionById``), their Columns built once per JVM; None when it
    does not apply (Spark Connect, other keys, neither Spark's ``Murmur3Hash`` nor ``reflect``
    analyzing).

    Each micro-batch places a new DataFrame, and each py4j round trip costs 0.1-1 ms on a quiet
    machine and 2-10 ms on a loaded one: PySpark's Column API took ~50 round trips here
    (active-session checks, call-site origins, list conversions), 0.2-0.5 s per micro-batch
    under load. Same key groups as :func:`with_key_group`.
    """
    from streamstate.spark.driver.jvm_columns import jvm_column
    from streamstate.spark.driver.session import is_connect

    if is_connect(df):
        return None
    string = is_string_key(df, key_columns)
    if not string and not is_integer_key(df, key_columns):
        return None
    _check_columns(df, key_columns)
    from pyspark.sql.dataframe import DataFrame

    spark = df.sparkSession
    column = key_columns[0]
    reflect_sql = key_group_sql_reflect(column, max_parallelism, string)
    ways = [
        # each Column under a key naming everything it is built from
        (
            (
                "Murmur3Hash",
                MURMUR3_EXPRESSION,
                java_hash_sql(column, string),
                column,
                max_parallelism,
            ),
            lambda jvm: key_group_column_classic(jvm, column, max_parallelism, string),
        ),
        (("expr", reflect_sql), lambda jvm: _functions(jvm).expr(reflect_sql)),
    ]
    placed = None
    for key, build in ways:
        try:
            placed = df._jdf.withColumn(KEY_GROUP_COLUMN, jvm_column(spark, key, build))
            break
        except Exception as exc:  # any build or analysis error: the next way, else the SQL steps
            log.debug("key groups by %s failed: %r", key[0], exc)
    if placed is None:
        return None
    subtask = jvm_column(
        spark, ("expr", subtask_sql), lambda jvm: _functions(jvm).expr(subtask_sql)
    )
    return DataFrame(placed.repartitionById(parallelism, subtask), spark)


def _functions(jvm: Any) -> Any:
    """``org.apache.spark.sql.functions`` of a classic session's JVM."""
    return getattr(jvm, "org.apache.spark.sql.functions")
