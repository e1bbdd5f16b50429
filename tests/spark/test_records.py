"""Outputs are cast to the declared output schema without losing information silently."""

from __future__ import annotations

import datetime as dt
import decimal
from collections import namedtuple

import numpy as np
import pyarrow as pa
import pytest

from streamstate.errors import OutputSchemaError
from streamstate.spark.records import OutputConverter


def converter(*fields: tuple[str, pa.DataType]) -> OutputConverter:
    return OutputConverter(pa.schema([("k", pa.string()), *fields]))


def column(conv: OutputConverter, values: list[object]) -> list[object]:
    batch = conv.to_batch([(f"k{i}", v) for i, v in enumerate(values)])
    return batch.column(1).to_pylist()


@pytest.mark.parametrize("bad", [1.7, -2.9, 0.5, decimal.Decimal("2.5"), np.float64(1.7)])
@pytest.mark.parametrize("type_", [pa.int64(), pa.int32(), pa.int16(), pa.int8()])
def test_a_float_with_a_fraction_into_an_integer_column_raises(bad, type_):
    conv = converter(("n", type_))
    with pytest.raises(OutputSchemaError) as e:
        column(conv, [1, bad])  # the bad value is output #1, behind a good one
    text = str(e.value)
    assert "output column 'n'" in text and "output #1" in text and repr(bad) in text


@pytest.mark.parametrize("type_", [pa.int64(), pa.int32(), pa.int8()])
def test_integral_floats_nulls_and_numpy_ints_fill_an_integer_column(type_):
    conv = converter(("n", type_))
    assert column(conv, [1, 2.0, None, np.int32(3), decimal.Decimal("4")]) == [1, 2, None, 3, 4]


@pytest.mark.parametrize(
    "type_, bad",
    [
        (pa.int32(), 2**31),
        (pa.int32(), 3e9),
        (pa.int16(), 2**15),
        (pa.int8(), 300),
        (pa.int8(), -129),
        (pa.int64(), 2**63),
        (pa.int64(), float("nan")),
        (pa.int64(), float("inf")),
        (pa.int64(), True),
        (pa.int64(), "7"),
    ],
)
def test_values_that_do_not_fit_an_integer_column_raise(type_, bad):
    conv = converter(("n", type_))
    with pytest.raises(OutputSchemaError, match=r"output column 'n' .* output #1"):
        column(conv, [1, bad])


def test_integers_into_a_double_column_must_be_exact():
    conv = converter(("x", pa.float64()))
    assert column(conv, [1, 2**53, 0.5]) == [1.0, 2.0**53, 0.5]
    with pytest.raises(OutputSchemaError, match=r"output column 'x' .* output #1"):
        column(conv, [1, 2**53 + 1])


def test_a_finite_double_must_not_overflow_a_float_column():
    conv = converter(("x", pa.float32()))
    assert column(conv, [1.5, float("inf"), None]) == [1.5, float("inf"), None]
    with pytest.raises(OutputSchemaError, match=r"output column 'x' .* 1e\+300 .* output #1"):
        column(conv, [1.5, 1e300])


def test_a_timestamp_column_takes_datetimes_and_no_numbers():
    conv = converter(("ts", pa.timestamp("us", tz="UTC")))
    utc = dt.UTC
    aware = dt.datetime(2024, 1, 1, 12, 0, 0, 123456, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    naive = dt.datetime(2024, 1, 1, 12, 0, 0, 654321)
    assert column(conv, [aware, naive, None]) == [
        dt.datetime(2024, 1, 1, 10, 0, 0, 123456, tzinfo=utc),
        dt.datetime(2024, 1, 1, 12, 0, 0, 654321, tzinfo=utc),  # naive: UTC
        None,
    ]
    # a number's unit would be a guess: 1_700_000_000_000 ms was written as microseconds
    for bad in (1_700_000_000_000, 1.5):
        with pytest.raises(OutputSchemaError, match=r"output column 'ts' .* declare the column"):
            column(conv, [naive, bad])
    with pytest.raises(OutputSchemaError, match=r"output column 'ts' .* not date32"):
        column(conv, [naive, dt.date(2024, 1, 1)])
    # nanoseconds do not fit Spark's microseconds
    ns = np.datetime64("2024-01-01T00:00:00.123456789", "ns")
    with pytest.raises(OutputSchemaError, match=r"output column 'ts' .* output #0"):
        column(conv, [ns])
    assert column(conv, [np.datetime64("2024-01-01T00:00:00.123456", "ns")]) == [
        dt.datetime(2024, 1, 1, 0, 0, 0, 123456, tzinfo=utc)
    ]


def test_a_dict_or_row_missing_a_declared_field_raises():
    conv = OutputConverter(pa.schema([("user", pa.string()), ("n", pa.int64())]))
    with pytest.raises(OutputSchemaError, match=r"output #1 has no value for the declared fields"):
        conv.to_batch([{"user": "ann", "n": 1}, {"user": "bob"}])
    with pytest.raises(OutputSchemaError, match=r"\['n'\]"):
        conv.to_batch([{"user": "bob", "m": 1}])
    Partial = namedtuple("Partial", ["user"])
    with pytest.raises(OutputSchemaError, match=r"output #0 has no value .*\['n'\]"):
        conv.to_batch([Partial("ann")])
    # an explicit None is a null
    assert conv.to_batch([{"user": "ann", "n": None}]).to_pylist() == [{"user": "ann", "n": None}]


def test_a_dict_with_an_undeclared_field_still_raises():
    conv = OutputConverter(pa.schema([("user", pa.string()), ("n", pa.int64())]))
    with pytest.raises(OutputSchemaError, match=r"fields \['extra'\] that the output schema"):
        conv.to_batch([{"user": "ann", "n": 1, "extra": 2}])


def test_a_date_column_takes_dates_and_no_datetimes():
    conv = converter(("day", pa.date32()))
    assert column(conv, [dt.date(2024, 1, 2), None]) == [dt.date(2024, 1, 2), None]
    with pytest.raises(OutputSchemaError, match=r"output column 'day' .* output #1 .*time of day"):
        column(conv, [dt.date(2024, 1, 2), dt.datetime(2024, 1, 2, 12, 30)])


def test_array_map_and_struct_columns_take_their_python_forms_and_refuse_lossy_values():
    import pyarrow as pa

    from streamstate.errors import OutputSchemaError
    from streamstate.spark.records import OutputConverter

    conv = OutputConverter(
        pa.schema(
            [
                ("a", pa.list_(pa.int64())),
                ("m", pa.map_(pa.string(), pa.int64())),
                ("s", pa.struct([("x", pa.int64()), ("y", pa.string())])),
            ]
        )
    )
    # lists or tuples; dicts or (key, value) pairs; dicts or tuples (one form per batch)
    batch = conv.to_batch([([1, 2], {"k": 1}, {"x": 1, "y": "a"}), (None,) * 3])
    assert batch.to_pylist() == [
        {"a": [1, 2], "m": [("k", 1)], "s": {"x": 1, "y": "a"}},
        {"a": None, "m": None, "s": None},
    ]
    batch = conv.to_batch([((3,), [("k", 2)], (2, "b"))])
    assert batch.to_pylist() == [{"a": [3], "m": [("k", 2)], "s": {"x": 2, "y": "b"}}]
    for bad, column in [
        (([1.5], {}, {"x": 1, "y": "a"}), "'a'"),  # a fraction into an integer list
        ((["1"], {}, {"x": 1, "y": "a"}), "'a'"),  # a string would be parsed
        (([1], {"k": "x"}, {"x": 1, "y": "a"}), "'m'"),
        (([1], {}, {"x": 1.5, "y": "a"}), "'s'"),
        (([1], {}, {"x": 1, "y": "a", "z": 3}), "'s'"),  # a field not declared
        (([1], {}, {"x": 1}), "'s'"),  # a declared field missing
    ]:
        with pytest.raises(OutputSchemaError, match=f"output column {column}"):
            conv.to_batch([bad])


def test_records_are_outputs_and_struct_values() -> None:
    """A dataclass or msgspec.Struct output fills the columns its fields name; records inside a
    struct or array column become the struct's fields (timestamps kept as they are)."""
    import dataclasses

    import msgspec

    @dataclasses.dataclass
    class At:
        n: int
        t: dt.datetime

    class Alert(msgspec.Struct):
        k: str
        at: At
        seen: list[At]

    when = dt.datetime(2024, 5, 1, 12, 30)
    at_type = pa.struct([("n", pa.int64()), ("t", pa.timestamp("us"))])
    conv = converter(("at", at_type), ("seen", pa.list_(at_type)))
    rows = conv.to_batch([Alert("a", At(1, when), [At(2, when)]), ("b", None, [])]).to_pylist()
    assert rows == [
        {"k": "a", "at": {"n": 1, "t": when}, "seen": [{"n": 2, "t": when}]},
        {"k": "b", "at": None, "seen": []},
    ]
    flat = converter(("n", pa.int64()))
    with pytest.raises(OutputSchemaError, match="has no value for the declared fields"):
        flat.to_batch([At(3, when)])  # no field k
