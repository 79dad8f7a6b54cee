"""The processor's output rows as one frame per handler call (`keyshift.processing.operators.output_rows`):
the combined frame must convert to the same Arrow rows as the pieces converted one by one,
which is what Spark did before they were combined."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql import types as T
from pyspark.sql.conversion import PandasToArrowConversion

from keyshift.jobs.flight_delays import FLIGHT_DELAYS
from keyshift.processing.operators.output_rows import OutputRows, rows_frame
from keyshift.processing.operators.processor import KeyedWindowProcessor, output_schema


def _arrow(frame: pd.DataFrame, schema: T.StructType) -> pa.Table:
    """`frame` converted as transformWithStateInPandas converts a handler's output."""
    wrapped = T.StructType([T.StructField("row", schema)])
    batch = PandasToArrowConversion.convert([frame], wrapped, timezone="UTC", safecheck=True, arrow_cast=True)
    return pa.Table.from_batches([batch])


def _pieces(processor: KeyedWindowProcessor) -> list[OutputRows]:
    keys = ["ATL", "ORD", "SEA"]
    aggregates = np.arange(3 * len(FLIGHT_DELAYS.aggregates), dtype=np.int64).reshape(len(FLIGHT_DELAYS.aggregates), 3)
    return [
        processor._load(2, 1, 120, 3_600_000),
        processor._watermark_rows(2, 1, keys, [7_200_000, 3_600_000, 0], 3_600_000),
        processor._windows(2, 1, keys, np.array([0, 3_600_000, 7_200_000]), np.array([4, 1, 9]), aggregates,
                           [7_200_000] * 3, 3_600_000),
        OutputRows("dead_letter", 2, {"slot": [2, 2], "dead_letter_reason": ["not JSON", "no key"],
                                      "raw_value": ["{", "{}"], "kafka_partition": [0, 3], "kafka_offset": [17, 4]}),
    ]


def test_one_frame_converts_to_the_rows_of_the_pieces_one_by_one():
    schema = output_schema(FLIGHT_DELAYS)
    processor = KeyedWindowProcessor(FLIGHT_DELAYS, (11, 12, 13))
    pieces = _pieces(processor)
    columns = schema.fieldNames()
    separate = pa.concat_tables([_arrow(rows_frame([piece], columns), schema) for piece in pieces])
    combined = _arrow(rows_frame(pieces, columns), schema)
    assert combined.num_rows == 1 + 3 + 3 + 2
    assert combined.equals(separate)
    rows = combined.column("row").to_pylist()
    assert [r["kind"] for r in rows] == ["load"] + ["watermark"] * 3 + ["window"] * 3 + ["dead_letter"] * 2
    assert rows[0]["count"] == 120 and rows[1]["count"] is None and rows[4]["count"] == 4


def test_columns_some_pieces_lack_stay_typed():
    frame = rows_frame([OutputRows("a", 2, {"x": [1, 2], "y": [0.5, 1.5], "z": [True, False], "s": ["p", "q"]}),
                        OutputRows("b", 1, {})], ["x", "y", "z", "s", "kind"])
    assert str(frame["x"].dtype) == "Int64" and frame["x"].isna().tolist() == [False, False, True]
    assert str(frame["y"].dtype) == "Float64" and str(frame["z"].dtype) == "boolean"
    assert frame["s"].tolist() == ["p", "q", None]
    assert frame["kind"].tolist() == ["a", "a", "b"]
    assert list(frame.columns) == ["x", "y", "z", "s", "kind"]


def test_a_column_of_two_kinds_keeps_every_value_exact():
    big = 2**53 + 1  # a float64 would round it
    frame = rows_frame([OutputRows("a", 1, {"x": [big]}), OutputRows("b", 1, {"x": [0.5]})], ["x", "kind"])
    assert frame["x"].tolist() == [big, 0.5] and type(frame["x"].tolist()[0]) is int


def test_no_piece_gives_an_empty_frame_with_every_column():
    frame = rows_frame([], ["kind", "slot"])
    assert len(frame) == 0 and list(frame.columns) == ["kind", "slot"]


def test_a_column_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match="has 1 values for 2 rows"):
        rows_frame([OutputRows("a", 2, {"x": [1]})], ["x"])
