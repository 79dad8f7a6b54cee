"""The column-wise transformWithStateInPandas input gives the processor what pyspark's gives."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql.pandas.serializers import TransformWithStateInPandasSerializer

from keyshift.processing.operators import tws_input
from keyshift.processing.operators.tws_input import key_runs, load_stream_by_columns


def _stream(batches: list[pa.RecordBatch]) -> io.BytesIO:
    """What the JVM writes to the worker: an Arrow IPC stream of the batches."""
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, batches[0].schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    sink.seek(0)
    return sink


def _serializer() -> TransformWithStateInPandasSerializer:
    ser = TransformWithStateInPandasSerializer(timezone="UTC", safecheck=False, assign_cols_by_name=True, prefer_int_ext_dtype=False,
                                               arrow_max_records_per_batch=10_000, arrow_max_bytes_per_batch=2**31 - 1,
                                               int_to_decimal_coercion_enabled=False)
    ser.key_offsets = [0]
    return ser


def _groups(load_stream, batches) -> list[tuple]:
    """(mode, key, one frame of the key's rows) per yielded item, frames concatenated."""
    out = []
    for mode, key, pairs in load_stream(_serializer(), _stream(batches)):
        if pairs is None:
            out.append((mode, key, None))
            continue
        frames = [frame for _key, frame in pairs]
        out.append((mode, key, pd.concat(frames, ignore_index=True)))
    return out


def _batches(rng: np.random.Generator) -> list[pa.RecordBatch]:
    tokens = np.repeat(np.array([11, 5, 5, 42], dtype=np.int32), [3, 4000, 2500, 1])  # key 5 spans two batches
    n = len(tokens)
    lengths = rng.integers(1, 4, n)
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
    table = pa.table({
        "token": pa.array(tokens),
        "origin": pa.array(rng.choice(np.array(["ORD", "ATL", "LGA"]), n)),
        "event_time_ms": pa.array(rng.integers(0, 10**12, n)),
        "dead_letter_reason": pa.array([None if i % 7 else "malformed JSON" for i in range(n)], pa.string()),
        "event_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(rng.integers(0, 10**9, int(offsets[-1])))),
    })
    return table.to_batches(max_chunksize=4096)


def test_the_same_keys_rows_and_values_reach_the_processor_as_with_pyspark_s_own_input():
    pyspark_own = TransformWithStateInPandasSerializer.__dict__["load_stream"]
    if pyspark_own is load_stream_by_columns:
        pyspark_own = tws_input.pyspark_load_stream
    batches = _batches(np.random.default_rng(3))
    expected, actual = _groups(pyspark_own, batches), _groups(load_stream_by_columns, batches)
    assert [(m, k) for m, k, _ in actual] == [(m, k) for m, k, _ in expected]
    assert [k for _m, k, _ in actual][:3] == [(11,), (5,), (42,)] and type(actual[0][1][0]) is int
    for (_, _, want), (_, _, got) in zip(expected, actual):
        if want is None:
            assert got is None
            continue
        assert list(got.columns) == list(want.columns) and len(got) == len(want)
        for column in ("token", "event_time_ms"):
            assert got[column].to_numpy(np.int64).tolist() == want[column].to_numpy(np.int64).tolist()
        assert got["origin"].tolist() == want["origin"].tolist()
        assert got["dead_letter_reason"].tolist() == want["dead_letter_reason"].tolist()
        assert [list(x) for x in got["event_ids"]] == [list(x) for x in want["event_ids"]]


def test_key_runs_split_where_any_key_column_changes():
    assert key_runs([np.array([1, 1, 2, 2, 2, 1])], 6) == [(0, 2), (2, 5), (5, 6)]
    assert key_runs([np.array([1, 1, 1]), np.array(["a", "b", "b"], dtype=object)], 3) == [(0, 1), (1, 3)]
    assert key_runs([np.array([7])], 1) == [(0, 1)] and key_runs([np.array([], dtype=np.int64)], 0) == []


def test_unpickling_a_processor_installs_the_column_wise_input():
    from keyshift.eventtime.watermarks import WatermarkPolicy
    from keyshift.jobs.flight_delays import FLIGHT_DELAYS
    from keyshift.placement.tokens import slot_tokens
    from keyshift.processing.operators.processor import KeyedWindowProcessor

    from pyspark import cloudpickle  # what Spark ships a UDF with

    processor = pickle.loads(cloudpickle.dumps(KeyedWindowProcessor(FLIGHT_DELAYS, slot_tokens(4), policy=WatermarkPolicy(mode="key"))))
    assert processor._policy.mode == "key" and processor._slot_of_token
    assert TransformWithStateInPandasSerializer.load_stream is load_stream_by_columns
    assert tws_input.install() is True  # once per process


def test_another_pyspark_keeps_its_own_input(monkeypatch):
    import pyspark

    monkeypatch.setattr(tws_input, "_installed", None)
    monkeypatch.setattr(pyspark, "__version__", "9.9.9")
    own = TransformWithStateInPandasSerializer.__dict__["load_stream"]
    assert tws_input.install() is False
    assert TransformWithStateInPandasSerializer.__dict__["load_stream"] is own
