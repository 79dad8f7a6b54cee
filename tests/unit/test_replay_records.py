"""Flight record encoding, reading order, slot planning and rate limiting of the replayer."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tqdm import tqdm

from keyshift.data.replay import (
    RECORD_FIELDS,
    TokenBucket,
    _Job,
    _run_workers,
    encode_values,
    event_time_ms,
    iter_flight_batches,
    plan_slots,
    replay_flights,
    split_partitions,
)
from keyshift.errors import ConfigurationError, DataError, StackError
from keyshift.placement.strategies import HashStrategy
from keyshift.settings import Settings


def flights_table(rows: list[tuple[datetime, int, int, str, str]]) -> pa.Table:
    dates, delays, distances, origins, destinations = zip(*rows) if rows else ([], [], [], [], [])
    return pa.table(
        {
            "date": pa.array(dates, pa.timestamp("us")),
            "delay": pa.array(delays, pa.int64()),
            "distance": pa.array(distances, pa.int64()),
            "origin": pa.array(origins, pa.large_string()),
            "destination": pa.array(destinations, pa.large_string()),
        }
    )


# The first three rows of flights-3m, as the file holds them.
HEAD = [
    (datetime(2001, 1, 1, 0, 1), 33, 2176, "LAS", "PHL"),
    (datetime(2001, 1, 1, 0, 1), 19, 215, "ATL", "SAV"),
    (datetime(2001, 1, 1, 0, 1), -13, 2345, "ANC", "LAX"),
]


def test_values_carry_every_field_with_its_type() -> None:
    values = encode_values(flights_table(HEAD), np.arange(3))
    records = [json.loads(v) for v in values]
    assert all(isinstance(v, bytes) for v in values)
    assert [list(r) for r in records] == [list(RECORD_FIELDS)] * 3
    assert records[0] == {
        "event_id": 0,
        "origin": "LAS",
        "destination": "PHL",
        "delay_min": 33,
        "distance_mi": 2176,
        "event_time": 978307260000,  # 2001-01-01T00:01:00Z in epoch ms
    }
    assert records[2]["delay_min"] == -13  # early flights keep their sign
    for record in records:
        assert [type(record[f]) for f in RECORD_FIELDS] == [int, str, str, int, int, int]


def test_values_are_compact_json() -> None:
    (value,) = encode_values(flights_table(HEAD[:1]), np.array([7]))
    assert value == (
        b'{"event_id":7,"origin":"LAS","destination":"PHL","delay_min":33,"distance_mi":2176,"event_time":978307260000}'
    )


@pytest.mark.parametrize(
    ("date", "expected_ms"),
    [
        (datetime(1970, 1, 1), 0),  # the epoch itself
        (datetime(2001, 1, 1, 0, 1), 978_307_260_000),  # first flight of the file
        (datetime(2001, 7, 1), 993_945_600_000),  # last flight of the file
        (datetime(2001, 4, 1, 2, 30), 986_092_200_000),  # inside the US DST gap: naive means UTC, no shift
        (datetime(2001, 1, 1, 0, 0, 0, 999), 978_307_200_000),  # sub-millisecond part floored
    ],
)
def test_event_time_is_epoch_ms_utc(date: datetime, expected_ms: int) -> None:
    assert event_time_ms(pa.array([date], pa.timestamp("us"))).tolist() == [expected_ms]


def test_event_time_of_zoned_timestamps_is_utc() -> None:
    zoned = pa.array([datetime(2001, 1, 1, 0, 1, tzinfo=UTC)], pa.timestamp("ms", tz="America/Chicago"))
    assert event_time_ms(zoned).tolist() == [978_307_260_000]


def test_event_time_refuses_non_timestamps() -> None:
    with pytest.raises(DataError, match="must be a timestamp"):
        event_time_ms(pa.array([1, 2]))


def test_strings_are_json_escaped() -> None:
    odd = [(datetime(2001, 1, 1), 0, 1, 'A"B', "Zürich\\\n")]
    (value,) = encode_values(flights_table(odd), np.array([0]))
    record = json.loads(value)
    assert (record["origin"], record["destination"]) == ('A"B', "Zürich\\\n")


@pytest.mark.parametrize(
    ("table", "ids", "message"),
    [
        (flights_table(HEAD), np.arange(2), "2 event ids for 3 rows"),  # ids and rows disagree
        (flights_table(HEAD).drop_columns(["delay"]), np.arange(3), "lacks column 'delay'"),  # schema drift
        (
            flights_table(HEAD).set_column(4, "destination", pa.array(["A", None, "B"], pa.large_string())),
            np.arange(3),
            "'destination' holds 1 nulls",
        ),
    ],
)
def test_encode_refuses_bad_batches(table: pa.Table, ids: np.ndarray, message: str) -> None:
    with pytest.raises(DataError, match=message):
        encode_values(table, ids)


def test_empty_batch_encodes_to_nothing() -> None:
    assert encode_values(flights_table(HEAD).slice(0, 0), np.arange(0)) == []


@pytest.fixture
def small_file(tmp_path: Path) -> Path:
    rng = np.random.default_rng(3)
    airports = ["ORD", "ATL", "DFW", "LAX", "SEA"]
    rows = [
        (
            datetime(2001, 1, 1, i // 60, i % 60),
            int(rng.integers(-30, 90)),
            100 + i,
            airports[i % 5],
            airports[(i + 1) % 5],
        )
        for i in range(1000)
    ]
    path = tmp_path / "flights.parquet"
    pq.write_table(flights_table(rows), path, row_group_size=300)
    return path


@pytest.mark.parametrize("batch_rows", [1, 7, 300, 1000, 5000])
def test_event_ids_are_row_numbers_whatever_the_batching(small_file: Path, batch_rows: int) -> None:
    ids, origins = [], []
    for first, batch in iter_flight_batches(small_file, batch_rows=batch_rows):
        values = encode_values(batch, np.arange(first, first + batch.num_rows))
        ids += [json.loads(v)["event_id"] for v in values]
        origins += batch.column("origin").to_pylist()
    assert ids == list(range(1000))
    assert origins == pq.read_table(small_file).column("origin").to_pylist()


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        (0, 0),  # zero events: nothing read
        (1, 1),  # one event
        (301, 301),  # crosses a row group boundary
        (5000, 1000),  # more than the file holds: the whole file
    ],
)
def test_limit_stops_after_n_rows(small_file: Path, limit: int, expected: int) -> None:
    batches = list(iter_flight_batches(small_file, limit=limit, batch_rows=256))
    assert sum(b.num_rows for _, b in batches) == expected


def test_unsorted_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "unsorted.parquet"
    pq.write_table(flights_table([HEAD[0], (datetime(2000, 12, 31), 0, 1, "ORD", "ATL")]), path)
    with pytest.raises(DataError, match="not sorted by date near row 0"):
        list(iter_flight_batches(path))


def test_unsorted_across_batches_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "unsorted.parquet"
    pq.write_table(flights_table([HEAD[0], (datetime(2000, 12, 31), 0, 1, "ORD", "ATL")]), path)
    with pytest.raises(DataError, match="near row 1"):
        list(iter_flight_batches(path, batch_rows=1))


def test_plan_places_each_key_and_counts_events(small_file: Path) -> None:
    strategy = HashStrategy(partitions=8)
    slot_by_key, counts = plan_slots(small_file, strategy, limit=10)
    assert slot_by_key == {k: strategy.slot_of(k) for k in ["ORD", "ATL", "DFW", "LAX", "SEA"]}
    expected = np.zeros(8, dtype=np.int64)
    for key in ["ORD", "ATL", "DFW", "LAX", "SEA"] * 2:
        expected[strategy.slot_of(key)] += 1
    assert counts.tolist() == expected.tolist()


@pytest.mark.parametrize(
    ("counts", "workers", "expected"),
    [
        ([5, 5, 5, 5], 1, [(0, 1, 2, 3)]),  # one worker owns every partition
        ([9, 1, 1, 1, 6], 2, [(0,), (1, 2, 3, 4)]),  # the heaviest partition alone, the rest together
        ([4, 3, 3, 2], 2, [(0, 3), (1, 2)]),  # greedy: 6 and 6
        ([7, 0, 0], 3, [(0,)]),  # workers without events are dropped
        ([0, 0], 2, []),  # zero events: no worker needed
        ([1, 1], 4, [(0,), (1,)]),  # more workers than partitions
    ],
)
def test_split_partitions(counts: list[int], workers: int, expected: list[tuple[int, ...]]) -> None:
    assert split_partitions(np.array(counts), workers) == expected


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept += seconds
        self.now += seconds


@pytest.mark.parametrize(
    ("rate", "burst", "takes", "expected_s"),
    [
        (100, 10, [10], 0.0),  # within the burst: no wait
        (100, 10, [10, 100], 1.0),  # 100 events beyond an empty bucket: 1 s at 100 events/s
        (1000, 1, [1] * 1001, 1.0),  # one at a time: 1000 events after the first take 1 s
        (50, 50, [50, 50, 50], 2.0),  # burst spent, then 100 events at 50 events/s
    ],
)
def test_token_bucket_holds_the_rate(rate: float, burst: float, takes: list[int], expected_s: float) -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate, burst=burst, clock=clock, sleep=clock.sleep)
    for n in takes:
        bucket.take(n)
    assert clock.slept == pytest.approx(expected_s)


@pytest.mark.parametrize(
    ("rate", "burst"),
    [
        (0, None),  # zero rate would never send
        (-5, None),  # negative rate
        (10, 0.5),  # a bucket smaller than one event
    ],
)
def test_token_bucket_refuses(rate: float, burst: float | None) -> None:
    with pytest.raises(ConfigurationError):
        TokenBucket(rate, burst=burst)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"limit": -1}, "limit must be an int >= 0"),  # negative count of events
        ({"limit": True}, "limit must be an int >= 0"),  # bool is not a count
        ({"rate": 0}, "rate must be > 0 events/s"),  # zero rate would never finish
        ({"rate": -10.0}, "rate must be > 0 events/s"),
        ({"workers": 0}, "workers must be an int >= 1"),
    ],
)
def test_replay_refuses_bad_arguments_before_touching_anything(tmp_path: Path, options: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        replay_flights(Settings(home=tmp_path, kafka_port=1, redis_port=1), "flights", **options)


def test_job_travels_as_json() -> None:
    job = _Job(
        kafka={"bootstrap_servers": "127.0.0.1:9092", "client_id": "x", "bootstrap_timeout_ms": 10},
        path="/tmp/flights.parquet",
        topic="flights",
        limit=None,
        slot_by_key={"ORD": 3, "Zürich": 1},
        partitions=8,
        mine=(1, 3),
        rate=12.5,
    )
    assert _Job.from_json(job.to_json()) == job


def test_a_failing_worker_process_fails_the_replay(small_file: Path) -> None:
    job = _Job(
        kafka={"bootstrap_servers": "127.0.0.1:1", "client_id": "keyshift-test", "bootstrap_timeout_ms": 200},
        path=str(small_file),
        topic="flights",
        limit=10,
        slot_by_key={},
        partitions=8,
        mine=(0,),
        rate=None,
    )
    expected = "replay worker 0 failed: StackError: cannot start a Kafka producer"
    with tqdm(disable=True) as bar, pytest.raises(StackError, match=expected):
        _run_workers([job], bar)
