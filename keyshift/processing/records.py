"""Flight records: the JSON value a producer writes, its Spark schema, parsing and validation.

A record is one flight as JSON, Kafka key = origin (UTF-8):
`{"event_id": 17, "origin": "ORD", "destination": "LGA", "delay_min": -3, "distance_mi": 733,
"event_time": 978307260000}` with `event_time` in epoch milliseconds UTC.

Validation rejects malformed records, never unusual values: negative delays are early departures
and extreme delays are real. A record is malformed when it is empty, is not a JSON object, lacks
a field or has one of the wrong type, has an empty airport code, a negative id, distance or event
time, or a Kafka key that differs from its origin (placement relies on the key). Each rejected
record gets one reason, the first rule it breaks, and goes to the dead-letter topic.
"""

from __future__ import annotations

import json

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

CORRUPT_COLUMN = "_corrupt_record"

FLIGHT_FIELDS: tuple[tuple[str, T.DataType], ...] = (
    ("event_id", T.LongType()),
    ("origin", T.StringType()),
    ("destination", T.StringType()),
    ("delay_min", T.LongType()),
    ("distance_mi", T.LongType()),
    ("event_time", T.LongType()),
)
"""Required fields of a flight record and their Spark types (all integers are JSON integers)."""

FLIGHT_VALUE_SCHEMA = T.StructType(
    [T.StructField(name, dtype, True) for name, dtype in FLIGHT_FIELDS]
    + [T.StructField(CORRUPT_COLUMN, T.StringType(), True)]
)
"""Schema `from_json` parses a value with; the corrupt-record column catches type errors."""

END_OF_INPUT_PREFIX = '{"control": "end_of_input"'
"""Values starting with this are end-of-input markers, not events: `{"control": "end_of_input",
"run_id": RUN, "event_time": MS}`. A bounded run writes them after draining its input so that the
watermark passes every open window; they move the watermark of their own run only and are then
dropped, never counted as events."""


def end_of_input_marker(run_id: str, event_time_ms: int) -> bytes:
    """The value of an end-of-input marker for `run_id` (see `END_OF_INPUT_PREFIX`)."""
    return (END_OF_INPUT_PREFIX + f', "run_id": {json.dumps(run_id)}, "event_time": {int(event_time_ms)}}}').encode()

PARSED_COLUMNS = (
    "origin",
    "destination",
    "delay_min",
    "distance_mi",
    "event_time_ms",
    "event_id",
    "dead_letter_reason",
    "raw_value",
    "kafka_partition",
    "kafka_offset",
    "is_control",
    "control_run_id",
)
"""Columns of `parse_flight_records`' result, in order."""


def _reason(value: Column, key: Column, parsed: Column) -> Column:
    """The first validation rule a record breaks, or NULL when it is valid."""
    corrupt = parsed[CORRUPT_COLUMN]
    field_names = [name for name, _ in FLIGHT_FIELDS]
    all_null = F.lit(True)
    for name in field_names:
        all_null = all_null & parsed[name].isNull()
    reason = F.when(value.isNull() | (F.trim(value) == ""), F.lit("empty value")).when(
        all_null, F.lit("not a JSON object with flight fields")
    )
    for name in field_names:
        present = F.get_json_object(value, f"$.{name}").isNotNull()
        reason = reason.when(
            parsed[name].isNull() & present, F.lit(f"wrong type for {name}")
        ).when(parsed[name].isNull(), F.lit(f"missing {name}"))
    reason = (
        reason.when(F.trim(parsed["origin"]) == "", F.lit("empty origin"))
        .when(F.trim(parsed["destination"]) == "", F.lit("empty destination"))
        .when(parsed["event_id"] < 0, F.lit("negative event_id"))
        .when(parsed["distance_mi"] < 0, F.lit("negative distance_mi"))
        .when(parsed["event_time"] < 0, F.lit("negative event_time"))
        .when(key.isNull() | (key != parsed["origin"]), F.lit("key does not match origin"))
    )
    # A value with every field right but extra garbage is still flagged by from_json.
    return reason.when(corrupt.isNotNull(), F.lit("malformed JSON"))


def parse_flight_records(kafka_rows: DataFrame) -> DataFrame:
    """Parse and validate raw Kafka rows into flight columns plus a dead-letter reason.

    Args:
        kafka_rows: a DataFrame with the Kafka source's columns `key`, `value` (binary),
            `partition` (int) and `offset` (long); batch or streaming.

    Returns:
        A DataFrame with `PARSED_COLUMNS`: flight fields (`event_time_ms` long, epoch ms UTC),
        `dead_letter_reason` (NULL when valid), `raw_value` (the value as text, kept only for
        rejected records, NULL otherwise), `kafka_partition` (int), `kafka_offset` (long) and
        `is_control` (true for an end-of-input marker, whose `event_time_ms` is set and whose
        reason is meaningless) with `control_run_id` (the marker's run, NULL for events).
        Every input row yields exactly one output row.
    """
    value = F.col("value").cast("string")
    key = F.col("key").cast("string")
    parsed = F.from_json(value, FLIGHT_VALUE_SCHEMA, {"columnNameOfCorruptRecord": CORRUPT_COLUMN})
    staged = kafka_rows.select(
        value.alias("_value"),
        key.alias("_key"),
        parsed.alias("_parsed"),
        F.col("partition").cast("int").alias("kafka_partition"),
        F.col("offset").cast("long").alias("kafka_offset"),
    )
    reason = _reason(F.col("_value"), F.col("_key"), F.col("_parsed"))
    is_control = F.coalesce(F.col("_value").startswith(END_OF_INPUT_PREFIX), F.lit(False))
    return staged.select(
        F.col("_parsed.origin").alias("origin"),
        F.col("_parsed.destination").alias("destination"),
        F.col("_parsed.delay_min").alias("delay_min"),
        F.col("_parsed.distance_mi").alias("distance_mi"),
        F.col("_parsed.event_time").alias("event_time_ms"),
        F.col("_parsed.event_id").alias("event_id"),
        reason.alias("dead_letter_reason"),
        F.when(reason.isNotNull(), F.col("_value")).alias("raw_value"),
        "kafka_partition",
        "kafka_offset",
        is_control.alias("is_control"),
        F.when(is_control, F.get_json_object(F.col("_value"), "$.run_id")).alias("control_run_id"),
    )
