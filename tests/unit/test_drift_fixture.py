"""Drift fixtures (keyshift.data.drift): the popularity swap, the partition offsets, the pandas
reference windows and the pure parts of the plain writer (no Kafka)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from keyshift.data.drift import (
    DAY_MS,
    QUIET_MIN_FLIGHTS,
    default_partition,
    offset_days,
    partition_counts,
    record_value,
    shifted_flights,
    split_keys,
    swap_pairs,
    write_plain,
)
from keyshift.data.replay import RECORD_FIELDS
from keyshift.errors import ConfigurationError, DataError
from keyshift.quality.reference import reference_of, reference_windows

# Origin -> flights of the synthetic file. Ranked: A B C D E F G H I J (n = 10, median rank 5 = F).
# swapped=2: busy A, B; eligible quiet (>= 300, not busy): C D E F G H; the first at or below the
# median is F, so the quiet ones are F, G: A <-> F, B <-> G.
COUNTS = {"A": 4000, "B": 3000, "C": 2000, "D": 1000, "E": 800, "F": 600, "G": 500, "H": 400, "I": 100, "J": 50}
START = datetime(2001, 1, 1)
SPAN_MIN = 60 * 24 * 10  # ten days of minutes


def write_flights(path, counts=COUNTS, seed=7):
    """A small flights file like flights-3m: same schema, rows in date order, origins shuffled."""
    rng = np.random.default_rng(seed)
    origins = np.repeat(list(counts), list(counts.values()))
    rng.shuffle(origins)
    minutes = np.sort(rng.integers(0, SPAN_MIN, size=origins.size))
    minutes[0], minutes[-1] = 0, SPAN_MIN  # event-time span exactly [START, START + 10 days]
    dates = np.datetime64(START, "us") + minutes.astype("timedelta64[m]")
    table = pa.table({
        "date": pa.array(dates, pa.timestamp("us")),
        "delay": pa.array(rng.integers(-30, 200, size=origins.size), pa.int64()),
        "distance": pa.array(rng.integers(50, 3000, size=origins.size), pa.int64()),
        "origin": pa.array(origins.tolist(), pa.large_string()),
        "destination": pa.array(rng.choice(["X", "Y", "Z"], size=origins.size).tolist(), pa.large_string()),
    })
    pq.write_table(table, path)
    return table


@pytest.fixture
def flights(tmp_path):
    path = tmp_path / "flights.parquet"
    return path, write_flights(path)


def source_times_ms(table):
    return table.column("date").cast(pa.int64()).to_numpy() // 1000


def test_frame_columns_types_and_ids(flights):
    path, table = flights
    frame = shifted_flights(path, swapped=2)
    assert list(frame.columns) == list(RECORD_FIELDS)
    assert {c: str(t) for c, t in frame.dtypes.items()} == {
        "event_id": "int64", "origin": "object", "destination": "object",
        "delay_min": "int64", "distance_mi": "int64", "event_time": "int64",
    }
    assert frame["event_id"].tolist() == list(range(table.num_rows))
    assert (frame["event_time"].to_numpy() == source_times_ms(table)).all()
    assert frame["delay_min"].tolist() == table.column("delay").to_pylist()
    assert frame["destination"].tolist() == table.column("destination").to_pylist()
    limited = shifted_flights(path, limit=5000, swapped=2)
    assert limited["event_id"].tolist() == list(range(5000))


def test_swap_pairs_rule():
    assert swap_pairs(COUNTS, 2) == [("A", "F"), ("B", "G")]
    # No eligible origin at or below the median: the least busy eligible ones instead.
    few = {"A": 900, "B": 800, "C": 700, "D": 600, "E": 200, "F": 100, "G": 50, "H": 10}
    assert swap_pairs(few, 2) == [("A", "C"), ("B", "D")]
    # Ties are broken by name, so the choice is deterministic.
    assert swap_pairs({"Q": 500, "P": 500, "Z": 900, "Y": 900}, 1) == [("Y", "P")]
    with pytest.raises(DataError, match="quiet"):
        swap_pairs({"A": 900, "B": QUIET_MIN_FLIGHTS - 1}, 1)
    with pytest.raises(ConfigurationError):
        swap_pairs(COUNTS, 0)


def test_popularity_swaps_busy_and_quiet_at_the_midpoint(flights):
    path, table = flights
    frame = shifted_flights(path, swapped=2)
    times = frame["event_time"].to_numpy()
    midpoint = int(source_times_ms(table).min()) + SPAN_MIN * 60_000 // 2
    late = times >= midpoint
    original = np.array(table.column("origin").to_pylist(), dtype=object)
    rename = {"A": "F", "F": "A", "B": "G", "G": "B"}
    expected = original.copy()
    expected[late] = [rename.get(o, o) for o in original[late]]
    assert frame["origin"].tolist() == expected.tolist()
    before = frame.loc[~late, "origin"].value_counts()
    after = frame.loc[late, "origin"].value_counts()
    # A (4000 flights, ~2000 per half) turns quiet; F (600, ~300 per half) turns busy.
    assert before["A"] > 1500 and after["A"] < 500
    assert before["F"] < 500 and after["F"] > 1500
    assert before["B"] > 1000 and after["B"] < 400
    assert before["G"] < 400 and after["G"] > 1000
    # Keys outside the pairs keep every flight; totals per name only move between partners.
    for name in "CDEHIJ":
        assert int((frame["origin"] == name).sum()) == COUNTS[name]
    assert len(frame) == sum(COUNTS.values())


def test_popularity_counts_over_the_first_limit_rows(tmp_path):
    # P is busiest in the first 2,000 rows, Q in the whole file; with limit=2000 P is swapped.
    path = tmp_path / "flights.parquet"
    origins = ["P", "R", "P", "S"] * 500 + ["Q"] * 5000  # first 2,000: P 1000, R 500, S 500
    table = pa.table({
        "date": pa.array([START + timedelta(minutes=i) for i in range(len(origins))], pa.timestamp("us")),
        "delay": pa.array([1] * len(origins), pa.int64()),
        "distance": pa.array([100] * len(origins), pa.int64()),
        "origin": pa.array(origins, pa.large_string()),
        "destination": pa.array(["X"] * len(origins), pa.large_string()),
    })
    pq.write_table(table, path)
    frame = shifted_flights(path, limit=2000, swapped=1)
    assert len(frame) == 2000
    # Ranked P (1000), R (500), S (500); median rank 1 = R: P <-> R from 999.5 minutes (midpoint) on.
    late = frame["event_time"] >= frame["event_time"].min() + 1999 * 60_000 // 2
    assert frame.loc[~late, "origin"].tolist() == origins[:1000]
    assert frame.loc[late, "origin"].tolist() == [{"P": "R", "R": "P"}.get(o, o) for o in origins[1000:2000]]


def test_partition_offsets_shift_by_30_days_per_partition(tmp_path):
    path = tmp_path / "flights.parquet"
    table = write_flights(path, {"abc": 400, "ORD": 300, "LAS": 200, "ATL": 100})
    frame = shifted_flights(path, variant="partition_offsets", partitions=8)
    source = source_times_ms(table)
    assert frame["origin"].tolist() == table.column("origin").to_pylist()
    assert frame["event_id"].tolist() == list(range(table.num_rows))
    # Kafka's UtilsTest: murmur2(b"abc") == 479470107, so "abc" is partition 3 of 8: 90 days later.
    assert default_partition("abc", 8) == 479470107 % 8 == 3
    abc = (frame["origin"] == "abc").to_numpy()
    assert ((frame["event_time"].to_numpy() - source)[abc] == 90 * DAY_MS).all()
    for origin in ("abc", "ORD", "LAS", "ATL"):
        rows = (frame["origin"] == origin).to_numpy()
        partition = (kafka_python_murmur2(origin.encode()) & 0x7FFFFFFF) % 8
        assert ((frame["event_time"].to_numpy() - source)[rows] == partition * 30 * DAY_MS).all()
    assert offset_days(0) == 0 and offset_days(7) == 210
    with pytest.raises(ConfigurationError):
        offset_days(-1)
    with pytest.raises(ConfigurationError):
        shifted_flights(path, variant="partition_offsets", partitions=0)


def test_bad_arguments(flights):
    path, _ = flights
    with pytest.raises(ConfigurationError, match="variant"):
        shifted_flights(path, variant="sideways")
    with pytest.raises(ConfigurationError, match="limit"):
        shifted_flights(path, limit=0)
    with pytest.raises(DataError):
        shifted_flights(path, swapped=6)  # busy A..F leave only G, H with >= 300 flights


def test_reference_of_hand_checked():
    hour = 3_600_000
    frame = pd.DataFrame({
        "event_id": [0, 1, 2, 3, 4],
        "origin": ["X", "Y", "X", "X", "X"],
        "destination": ["Y", "X", "Y", "Y", "Y"],
        "delay_min": [10, -5, 30, 7, -2],
        "distance_mi": [100, 100, 100, 100, 100],
        "event_time": [0, 5 * 60_000, 59 * 60_000, hour, 2 * hour + 1],
    })
    ref = reference_of(frame)
    assert ref["origin"].tolist() == ["X", "X", "X", "Y"]
    assert ref["window_start"].tolist() == [pd.Timestamp(ms, unit="ms", tz="UTC") for ms in (0, hour, 2 * hour, 0)]
    assert ref["count"].tolist() == [2, 1, 1, 1]
    assert ref["sum_delay_min"].tolist() == [40, 7, -2, -5]
    assert ref["max_delay_min"].tolist() == [30, 7, -2, -5]
    two_hours = reference_of(frame, window_ms=2 * hour)
    assert two_hours["count"].tolist() == [3, 1, 1]
    with pytest.raises(ConfigurationError):
        reference_of(frame, window_ms=0)
    with pytest.raises(DataError, match="lacks"):
        reference_of(frame.drop(columns=["delay_min"]))


def test_reference_of_equals_reference_windows_dtypes_and_all(flights):
    path, _ = flights
    unshifted = shifted_flights(path, swapped=1, variant="partition_offsets", partitions=1)  # offset 0
    expected = reference_windows(path)
    ours = reference_of(unshifted)
    pd.testing.assert_frame_equal(ours, expected, check_exact=True)
    assert dict(ours.dtypes) == dict(expected.dtypes)
    limited = reference_of(unshifted.iloc[:3000])
    pd.testing.assert_frame_equal(limited, reference_windows(path, limit=3000), check_exact=True)


def test_record_value_is_default_json_dumps_in_field_order():
    value = record_value(0, "LAS", "PHL", 33, 2176, 978307260000)
    assert value == (b'{"event_id": 0, "origin": "LAS", "destination": "PHL", "delay_min": 33, '
                     b'"distance_mi": 2176, "event_time": 978307260000}')
    assert list(json.loads(value)) == list(RECORD_FIELDS)


def test_partition_counts_and_key_split():
    frame = pd.DataFrame({"origin": ["abc"] * 5 + ["ORD"] * 3 + ["LAS"] * 2})
    counts = partition_counts(frame, 8)
    assert sorted(counts) == list(range(8)) and sum(counts.values()) == 10
    assert counts[3] >= 5  # "abc" -> partition 3
    for key in ("ORD", "LAS"):
        assert counts[(kafka_python_murmur2(key.encode()) & 0x7FFFFFFF) % 8] >= 2
    shares = split_keys({"A": 10, "B": 6, "C": 5, "D": 1}, 2)
    assert shares == [["A", "D"], ["B", "C"]]
    assert sorted(k for share in shares for k in share) == ["A", "B", "C", "D"]
    assert split_keys({"A": 10}, 4) == [["A"]]
    with pytest.raises(ConfigurationError):
        split_keys({"A": 1}, 0)


def test_write_plain_refuses_bad_input_before_connecting():
    frame = pd.DataFrame({name: [1] for name in RECORD_FIELDS if name != "destination"})
    with pytest.raises(DataError, match="destination"):
        write_plain("127.0.0.1:1", "nowhere", frame, 8)
    with pytest.raises(ConfigurationError, match="partitions"):
        write_plain("127.0.0.1:1", "nowhere", frame, 0)
    with pytest.raises(ConfigurationError, match="workers"):
        write_plain("127.0.0.1:1", "nowhere", frame, 8, workers=0)
