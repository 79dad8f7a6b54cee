"""Parsing and validation of flight records (real Spark, batch DataFrames of Kafka-shaped rows)."""

import json

import pytest

from keyshift.processing.records import end_of_input_marker, parse_flight_records

GOOD = {"event_id": 7, "origin": "ORD", "destination": "LGA", "delay_min": -12, "distance_mi": 733, "event_time": 978307260000}


def value(**changes):
    record = {**GOOD, **changes}
    return json.dumps({k: v for k, v in record.items() if v is not ...})


CASES = [
    # (kafka key, value, expected reason)
    ("ORD", value(), None),  # a plain valid flight
    ("ORD", value(delay_min=1688), None),  # the data set's extreme delay is real, not malformed
    ("ORD", value(delay_min=-1116), None),  # a very early departure too
    ("ORD", value(distance_mi=0), None),  # zero distance is odd but well-formed
    ("ORD", None, "empty value"),  # tombstone
    ("ORD", "   ", "empty value"),
    ("ORD", "not json", "not a JSON object with flight fields"),
    ("ORD", "[1, 2]", "not a JSON object with flight fields"),
    ("ORD", value(event_id=...), "missing event_id"),
    ("ORD", value(delay_min="late"), "wrong type for delay_min"),
    ("ORD", value(event_time=1.5), "wrong type for event_time"),
    ("ORD", value(destination=...), "missing destination"),
    ("", value(origin=""), "empty origin"),
    ("ORD", value(event_id=-1), "negative event_id"),
    ("ORD", value(distance_mi=-5), "negative distance_mi"),
    ("ORD", value(event_time=-1), "negative event_time"),
    ("LGA", value(), "key does not match origin"),  # placement relies on key = origin
    (None, value(), "key does not match origin"),
]


@pytest.fixture(scope="module")
def parsed(spark):
    rows = [(k.encode() if k is not None else None, v.encode() if v is not None else None, 3, i) for i, (k, v, _) in enumerate(CASES)]
    frame = spark.createDataFrame(rows, "key BINARY, value BINARY, partition INT, offset LONG")
    return {row.kafka_offset: row for row in parse_flight_records(frame).collect()}


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c[2] or f"valid-{i}" for i, c in enumerate(CASES)])
def test_reason(parsed, index):
    key, raw, reason = CASES[index]
    row = parsed[index]
    assert row.dead_letter_reason == reason
    assert row.kafka_partition == 3
    assert row.raw_value == (raw if reason else None)  # raw text kept for dead letters only
    assert row.is_control is False


def test_valid_fields(parsed):
    row = parsed[0]
    assert (row.event_id, row.origin, row.destination, row.delay_min, row.distance_mi, row.event_time_ms) == (
        7, "ORD", "LGA", -12, 733, 978307260000,
    )


def test_end_of_input_marker(spark):
    frame = spark.createDataFrame([(None, end_of_input_marker("run-1", 5_000), 0, 0)], "key BINARY, value BINARY, partition INT, offset LONG")
    row = parse_flight_records(frame).collect()[0]
    assert row.is_control is True
    assert row.control_run_id == "run-1"
    assert row.event_time_ms == 5_000
