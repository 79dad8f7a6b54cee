"""Parsing and validation of flight records (real Spark, batch DataFrames of Kafka-shaped rows)."""

import base64
import json

import pytest

from keyshift.jobs.flight_delays import FLIGHT_DELAYS
from keyshift.processing.records import MAX_CODE_BYTES, end_of_input_marker, expected_variant_schema, parse_records, reasons

EXPECTED_VARIANT_SCHEMA = expected_variant_schema(FLIGHT_DELAYS)
REASONS = reasons(FLIGHT_DELAYS)

GOOD = {"event_id": 7, "origin": "ORD", "destination": "LGA", "delay_min": -12, "distance_mi": 733, "event_time": 978307260000}


def value(**changes):
    record = {**GOOD, **changes}
    return json.dumps({k: v for k, v in record.items() if v is not ...})


def raw(text: str) -> bytes:
    return text.encode()


LONG_CODE = "A" * (MAX_CODE_BYTES + 1)
CODE_AT_LIMIT = "B" * MAX_CODE_BYTES

CASES = [
    # (kafka key, value bytes, expected reason)
    (b"ORD", raw(value()), None),  # a plain valid flight
    (b"ORD", raw(value(delay_min=1688)), None),  # the data set's extreme delay is real, not malformed
    (b"ORD", raw(value(delay_min=-1116)), None),  # a very early departure too
    (b"ORD", raw(value(distance_mi=0)), None),  # zero distance is odd but well-formed
    (b"ORD", raw(value(comment="extra fields are allowed")), None),  # a producer may add fields
    (b"ORD", raw('{"event_id":7,"origin":"ORD","destination":"LGA","delay_min":-12,"distance_mi":733,"event_time":978307260000}'), None),
    (CODE_AT_LIMIT.encode(), raw(value(origin=CODE_AT_LIMIT)), None),  # exactly at the code limit
    (b"ORD", raw(value(destination="S\u00e3o")), None),  # a non-ASCII code, valid UTF-8
    (b"ORD", None, "empty value"),  # tombstone
    (b"ORD", b"", "empty value"),  # zero bytes
    (b"ORD", b"   ", "empty value"),
    (b"ORD", b" \n\t\r\n", "empty value"),  # JSON whitespace only
    (b"ORD", raw(value()) + b"\r\n", None),  # a line-delimited producer's newline is whitespace
    (b"ORD", b'{"event_id": 7, "origin": "\xff\xfe"}', "invalid UTF-8"),  # issue 8: crashed the Python worker
    (b"ORD", b"\xc3\x28", "invalid UTF-8"),  # an invalid 2-byte sequence
    (b"ORD", b"not json", "malformed JSON"),
    (b"ORD", raw(value())[:-1], "malformed JSON"),  # truncated object
    (b"ORD", raw(value()) + b" trailing", "malformed JSON"),  # Spark's from_json alone accepts this
    (b"ORD", raw(value()).replace(b"-12", b"NaN"), "malformed JSON"),  # NaN is not JSON
    (b"ORD", raw(value()).replace(b"-12", b"Infinity"), "malformed JSON"),
    (b"ORD", raw(value())[:-1] + b', "event_id": 8}', "malformed JSON"),  # a field given twice
    (b"ORD", raw(value(origin="ORD")).replace(b'"ORD"', b'"\\ud800"'), "malformed JSON"),  # lone surrogate
    (b"ORD", b"[1, 2]", "not a JSON object"),
    (b"ORD", b"[" + raw(value()) + b"]", "not a JSON object"),  # a flight wrapped in an array
    (b"ORD", b"42", "not a JSON object"),
    (b"ORD", b'"ORD"', "not a JSON object"),
    (b"ORD", b"null", "not a JSON object"),
    (b"ORD", b"{}", "missing event_id"),
    (b"ORD", raw(value(event_id=...)), "missing event_id"),
    (b"ORD", raw(value(destination=...)), "missing destination"),
    (b"ORD", raw(value(origin=None)), "null origin"),
    (b"ORD", raw(value(event_time=None)), "null event_time"),
    (b"ORD", raw(value(delay_min="late")), "wrong type for delay_min"),
    (b"ORD", raw(value(delay_min="12")), "wrong type for delay_min"),  # a number in a string
    (b"ORD", raw(value(event_time=1.5)), "wrong type for event_time"),
    (b"ORD", raw(value(distance_mi=1e400)).replace(b"Infinity", b"1e400"), "wrong type for distance_mi"),
    (b"ORD", raw(value(event_id=2**63)), "wrong type for event_id"),  # outside the 64-bit range
    (b"ORD", raw(value(origin={"code": "ORD"})), "wrong type for origin"),  # Spark would read the object as text
    (b"ORD", raw(value(destination=123)), "wrong type for destination"),  # ... and a number as text
    (b"", raw(value(origin="")), "empty origin"),
    (b"ORD", raw(value(destination=" ")), "empty destination"),
    (LONG_CODE.encode(), raw(value(origin=LONG_CODE)), f"origin over {MAX_CODE_BYTES} bytes"),
    (b"ORD", raw(value(destination=LONG_CODE)), f"destination over {MAX_CODE_BYTES} bytes"),
    (b"ORD", raw(value(event_id=-1)), "negative event_id"),
    (b"ORD", raw(value(distance_mi=-5)), "negative distance_mi"),
    (b"ORD", raw(value(event_time=-1)), "negative event_time"),
    (b"LGA", raw(value()), "key does not match origin"),  # placement relies on key = origin
    (None, raw(value()), "key does not match origin"),
    (b"\xff", raw(value()), "key does not match origin"),  # a key that is not UTF-8 at all
    (b"ORD ", raw(value()), "key does not match origin"),  # bytes compared, no trimming
]


@pytest.fixture(scope="module")
def parsed(spark):
    rows = [(k, v, 3, i) for i, (k, v, _) in enumerate(CASES)]
    frame = spark.createDataFrame(rows, "key BINARY, value BINARY, partition INT, offset LONG")
    return {row.kafka_offset: row for row in parse_records(frame, FLIGHT_DELAYS).collect()}


@pytest.mark.parametrize("index", range(len(CASES)), ids=[f"{i}-{c[2] or 'valid'}" for i, c in enumerate(CASES)])
def test_reason(parsed, index):
    key, raw_value, reason = CASES[index]
    row = parsed[index]
    assert row.dead_letter_reason == reason
    assert reason is None or reason in REASONS
    assert row.kafka_partition == 3
    assert row.is_control is False
    if reason is None:
        assert (row.raw_value, row.raw_encoding, row.raw_key_base64) == (None, None, None)
        assert row.origin == key.decode() and row.event_time_ms is not None
        return
    # a dead letter keeps its raw bytes (text when UTF-8, base64 otherwise) and no parsed field
    assert (row.origin, row.destination, row.event_id, row.event_time_ms) == (None, None, None, None)
    assert row.raw_key_base64 == (base64.b64encode(key).decode() if key is not None else None)
    if raw_value is None:
        assert (row.raw_value, row.raw_encoding) == (None, None)
    elif row.raw_encoding == "utf-8":
        assert row.raw_value.encode() == raw_value
    else:
        assert row.raw_encoding == "base64" and reason == "invalid UTF-8"
        assert base64.b64decode(row.raw_value) == raw_value


def test_valid_fields(parsed):
    row = parsed[0]
    assert (row.event_id, row.origin, row.destination, row.delay_min, row.distance_mi, row.event_time_ms) == (
        7, "ORD", "LGA", -12, 733, 978307260000,
    )


def test_the_shortcut_schema_is_what_spark_says_of_a_valid_flight(spark):
    """Not a correctness matter (other schemas are checked field by field), but if Spark wrote
    variant schemas differently every valid record would take the slow path."""
    got = spark.sql(f"SELECT schema_of_variant(parse_json('{value()}')) AS s").first().s
    assert got == EXPECTED_VARIANT_SCHEMA


def test_end_of_input_marker(spark):
    frame = spark.createDataFrame([(None, end_of_input_marker("run-1", 5_000), 0, 0)], "key BINARY, value BINARY, partition INT, offset LONG")
    row = parse_records(frame, FLIGHT_DELAYS).collect()[0]
    assert row.is_control is True
    assert row.control_run_id == "run-1"
    assert row.event_time_ms == 5_000
    assert row.dead_letter_reason is None
