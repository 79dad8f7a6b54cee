"""Local Merge on Arrow (`partials_arrow`, what the job runs) gives exactly `partials_of`'s rows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from keyshift.eventtime.windows import HOUR_MS
from keyshift.jobs.flight_delays import FLIGHT_DELAYS
from keyshift.placement.tokens import slot_tokens
from keyshift.processing.local_merge import arrow_partial_schema, input_columns, partials_arrow, partials_of

T0 = 978_307_200_000
TOKENS = np.array(slot_tokens(8), dtype=np.int32)
HOME = {"ORD": 1, "LGA": 2, "SFO": 6, "ÅRE": 3}


def token_of(origin: str) -> int:
    return int(TOKENS[HOME[origin]])


def events(n: int, seed: int, dead_share: float) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    dead = rng.random(n) < dead_share
    origins = rng.choice(list(HOME), size=n).astype(object)
    frame = pd.DataFrame(
        {
            "origin": origins,
            "destination": rng.choice(["JFK", "BOS", "ÖST"], size=n).astype(object),
            "delay_min": rng.integers(-20, 120, size=n),
            "distance_mi": rng.integers(0, 3_000, size=n),
            "event_time_ms": T0 + rng.integers(0, 6 * HOUR_MS, size=n),  # out of order within the slice
            "event_id": rng.permutation(n).astype(np.int64),
            "dead_letter_reason": np.where(dead, "malformed JSON", None),
            "raw_value": np.where(dead, "{oops", None),
            "raw_encoding": np.where(dead, "utf-8", None),
            "raw_key_base64": np.where(dead, "T1JE", None),
            "kafka_partition": np.int32(seed % 8),
            "kafka_offset": np.arange(n, dtype=np.int64) + 1_000,
        },
        columns=list(input_columns(FLIGHT_DELAYS)),
    )
    for column in ("origin", "destination", "delay_min", "distance_mi", "event_time_ms", "event_id"):
        frame[column] = frame[column].astype(object).where(~dead, None)
    return frame


def as_comparable(frame: pd.DataFrame) -> list[tuple]:
    def norm(v):
        if isinstance(v, (list, np.ndarray)):
            return tuple(int(x) if isinstance(x, (int, np.integer)) else x for x in v)
        if v is None or (isinstance(v, float) and np.isnan(v)):
            return None
        return int(v) if isinstance(v, (np.integer,)) else v
    return [tuple(norm(v) for v in row) for row in frame.itertuples(index=False)]


def arrow_input(frame: pd.DataFrame) -> pa.Table:
    schema = pa.schema([("origin", pa.string()), ("destination", pa.string()), ("delay_min", pa.int64()),
                        ("distance_mi", pa.int64()), ("event_time_ms", pa.int64()), ("event_id", pa.int64()),
                        ("dead_letter_reason", pa.string()), ("raw_value", pa.string()), ("raw_encoding", pa.string()),
                        ("raw_key_base64", pa.string()), ("kafka_partition", pa.int32()), ("kafka_offset", pa.int64())])
    return pa.Table.from_pandas(frame, schema=schema, preserve_index=False)


@pytest.mark.parametrize(("seed", "dead_share", "split"), [(0, 0.0, False), (1, 0.1, False), (2, 0.05, True), (3, 1.0, False)])
def test_arrow_partials_equal_the_pandas_definition(seed, dead_share, split):
    frame = events(3_000, seed, dead_share)
    split_tokens = {"ORD": TOKENS[[1, 5, 0]]} if split else None
    expected = partials_of(frame, FLIGHT_DELAYS, token_of, TOKENS, HOUR_MS, split_tokens)
    got = partials_arrow(arrow_input(frame), FLIGHT_DELAYS, token_of, TOKENS, HOUR_MS, split_tokens)
    assert got.schema == arrow_partial_schema(FLIGHT_DELAYS)
    assert got.num_rows == len(expected) and sum(got.column("count").to_pylist()) == 3_000
    assert as_comparable(got.to_pandas()) == as_comparable(expected)


def test_an_empty_slice_gives_an_empty_table_of_the_schema():
    got = partials_arrow(arrow_input(events(0, 0, 0.0)), FLIGHT_DELAYS, token_of, TOKENS, HOUR_MS)
    assert got.num_rows == 0 and got.schema == arrow_partial_schema(FLIGHT_DELAYS)
