"""Parsing and validation of flight records (real Spark, batch DataFrames of Kafka-shaped rows)."""

import base64
import json

import pytest

from keyshift.jobs.flight_delays import FLIGHT_DELAYS
from keyshift.topics import end_of_input_marker
from keyshift.processing.operators.records import (
    MAX_CODE_BYTES, canonical_record_pattern, expected_variant_schema, parse_records, reasons, validate_records,
)

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
    (b"ORD", raw(value()), None), # a plain valid flight
    (b"ORD", raw(value(delay_min=1688)), None), # the data set's extreme delay is real, not malformed
    (b"ORD", raw(value(delay_min=-1116)), None), # a very early departure too
    (b"ORD", raw(value(distance_mi=0)), None), # zero distance is odd but well-formed
    (b"ORD", raw(value(comment="extra fields are allowed")), None), # a producer may add fields
    (b"ORD", raw('{"event_id":7,"origin":"ORD","destination":"LGA","delay_min":-12,"distance_mi":733,"event_time":978307260000}'), None),
    (CODE_AT_LIMIT.encode(), raw(value(origin=CODE_AT_LIMIT)), None), # exactly at the code limit
    (b"ORD", raw(value(destination="S\u00e3o")), None), # a non-ASCII code, valid UTF-8
    (b"ORD", None, "empty value"), # tombstone
    (b"ORD", b"", "empty value"), # zero bytes
    (b"ORD", b"   ", "empty value"),
    (b"ORD", b" \n\t\r\n", "empty value"), # JSON whitespace only
    (b"ORD", raw(value()) + b"\r\n", None), # a line-delimited producer's newline is whitespace
    (b"ORD", b'{"event_id": 7, "origin": "\xff\xfe"}', "invalid UTF-8"), # issue 8: crashed the Python worker
    (b"ORD", b"\xc3\x28", "invalid UTF-8"), # an invalid 2-byte sequence
    (b"ORD", b"not json", "malformed JSON"),
    (b"ORD", raw(value())[:-1], "malformed JSON"), # truncated object
    (b"ORD", raw(value()) + b" trailing", "malformed JSON"), # Spark's from_json alone accepts this
    (b"ORD", raw(value()).replace(b"-12", b"NaN"), "malformed JSON"), # NaN is not JSON
    (b"ORD", raw(value()).replace(b"-12", b"Infinity"), "malformed JSON"),
    (b"ORD", raw(value())[:-1] + b', "event_id": 8}', "malformed JSON"), # a field given twice
    (b"ORD", raw(value(origin="ORD")).replace(b'"ORD"', b'"\\ud800"'), "malformed JSON"), # lone surrogate
    (b"ORD", b"[1, 2]", "not a JSON object"),
    (b"ORD", b"[" + raw(value()) + b"]", "not a JSON object"), # a flight wrapped in an array
    (b"ORD", b"42", "not a JSON object"),
    (b"ORD", b'"ORD"', "not a JSON object"),
    (b"ORD", b"null", "not a JSON object"),
    (b"ORD", b"{}", "missing event_id"),
    (b"ORD", raw(value(event_id=...)), "missing event_id"),
    (b"ORD", raw(value(destination=...)), "missing destination"),
    (b"ORD", raw(value(origin=None)), "null origin"),
    (b"ORD", raw(value(event_time=None)), "null event_time"),
    (b"ORD", raw(value(delay_min="late")), "wrong type for delay_min"),
    (b"ORD", raw(value(delay_min="12")), "wrong type for delay_min"), # a number in a string
    (b"ORD", raw(value(event_time=1.5)), "wrong type for event_time"),
    (b"ORD", raw(value(distance_mi=1e400)).replace(b"Infinity", b"1e400"), "wrong type for distance_mi"),
    (b"ORD", raw(value(event_id=2**63)), "wrong type for event_id"), # outside the 64-bit range
    (b"ORD", raw(value(origin={"code": "ORD"})), "wrong type for origin"), # Spark would read the object as text
    (b"ORD", raw(value(destination=123)), "wrong type for destination"), # ... and a number as text
    (b"", raw(value(origin="")), "empty origin"),
    (b"ORD", raw(value(destination=" ")), "empty destination"),
    (LONG_CODE.encode(), raw(value(origin=LONG_CODE)), f"origin over {MAX_CODE_BYTES} bytes"),
    (b"ORD", raw(value(destination=LONG_CODE)), f"destination over {MAX_CODE_BYTES} bytes"),
    (b"ORD", raw(value(event_id=-1)), "negative event_id"),
    (b"ORD", raw(value(distance_mi=-5)), "negative distance_mi"),
    (b"ORD", raw(value(event_time=-1)), "negative event_time"),
    (b"LGA", raw(value()), "key does not match origin"), # placement relies on key = origin
    (None, raw(value()), "key does not match origin"),
    (b"\xff", raw(value()), "key does not match origin"), # a key that is not UTF-8 at all
    (b"ORD ", raw(value()), "key does not match origin"), # bytes compared, no trimming
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


# Records the canonical fast path must leave to the strict path, or judge exactly as it would.
CANONICAL = '{"event_id":7,"origin":"ORD","destination":"LGA","delay_min":-12,"distance_mi":733,"event_time":978307260000}'
FAST_PATH_CASES = [
    (b"ORD", raw(CANONICAL), None), # what the replay writes: the fast path
    (b"ORD", raw(" \n" + CANONICAL.replace(",", " ,\t").replace(":", ": ") + "\r\n"), None), # JSON whitespace
    (b"ORD", raw(CANONICAL.replace('"LGA"', '"L\\u0047A"')), None), # an escape: strict path, same value
    (b"ORD", raw(CANONICAL.replace('"LGA"', '"LG\\"A"')), None), # an escaped quote inside a code
    (b"ORD", raw(CANONICAL.replace('"LGA"', '"\\ud800"')), "malformed JSON"), # lone surrogate, escaped
    (b"ORD", raw(CANONICAL.replace('"LGA"', '"L\tA"')), "malformed JSON"), # a raw control character
    (b"ORD", raw(CANONICAL.replace("-12", "-0")), None), # -0: strict path
    (b"ORD", raw(CANONICAL.replace("-12", "012")), "malformed JSON"), # a leading zero
    (b"ORD", raw(CANONICAL.replace("733", "9223372036854775807")), None), # 19 digits, in range: strict path
    (b"ORD", raw(CANONICAL.replace("733", "9223372036854775808")), "wrong type for distance_mi"),
    (b"ORD", raw(CANONICAL.replace("-12", "-12.0")), "wrong type for delay_min"),
    (b"ORD", raw(CANONICAL.replace("-12", "-1e1")), "wrong type for delay_min"),
    (b"ORD", raw(CANONICAL.replace('"origin":"ORD"', '"origin":"ORD","origin":"ORD"')), "malformed JSON"),
    (b"ORD", raw(CANONICAL + "}"), None), # text after the object ending in } passes (module docstring, rule 3)
    (b"ORD", raw(CANONICAL.replace('"ORD"', '""')), "empty origin"), # the value rules still apply, in order
    (b"", raw(CANONICAL.replace('"ORD"', '""')), "empty origin"),
    (b"ORD", raw(CANONICAL.replace("7,", "-7,", 1)), "negative event_id"),
    (b"ORD", raw(CANONICAL.replace("978307260000", "-1")), "negative event_time"),
    (b"LGA", raw(CANONICAL), "key does not match origin"),
]


@pytest.mark.parametrize("cases", [CASES, FAST_PATH_CASES], ids=["validation cases", "fast path cases"])
def test_the_canonical_fast_path_changes_no_result(spark, cases):
    """Records in the replay's canonical shape skip the variant parse; every record gets the same
    row with and without that shortcut, and the expected reason."""
    rows = [(k, v, 3, i) for i, (k, v, _) in enumerate(cases)]
    frame = spark.createDataFrame(rows, "key BINARY, value BINARY, partition INT, offset LONG")
    fast = validate_records(frame, FLIGHT_DELAYS).orderBy("kafka_offset").collect()
    strict = validate_records(frame, FLIGHT_DELAYS, canonical_fast_path=False).orderBy("kafka_offset").collect()
    assert fast == strict
    assert [row.dead_letter_reason for row in fast] == [reason for _, _, reason in cases]


def test_the_canonical_pattern_matches_the_replays_records_only(spark):
    pattern = canonical_record_pattern(FLIGHT_DELAYS)
    texts = [CANONICAL, value(), CANONICAL.replace('"LGA"', '"L\\u0047A"'), CANONICAL.replace("-12", "-0"),
             value(comment="extra"), CANONICAL[:-1], CANONICAL + " x"]
    frame = spark.createDataFrame([(t,) for t in texts], "t STRING")
    assert [r.m for r in frame.select(frame.t.rlike(pattern).alias("m")).collect()] == [True, True, False, False, False, False, False]
