"""Job records: the JSON value a producer writes, its Spark schema, parsing and validation.

The rules below are what a job's records must satisfy. A running job applies them in its ingest
stage (`keyshift.processing.operators.ingest`, Python, on the raw bytes); `validate_records` here states
them as Spark expressions, the reference the ingest stage is tested against record by record,
also used by the demo's built-in comparison job (`keyshift.processing.builtin`).

A record is one event as a JSON object whose fields a job's spec lists
(`keyshift.jobs.spec.JobSpec.fields`), Kafka key = the key field (UTF-8). For the flights
(`keyshift.jobs.flight_delays`): `{"event_id": 17, "origin": "ORD", "destination": "LGA",
"delay_min": -3, "distance_mi": 733, "event_time": 978307260000}` with `event_time` in epoch
milliseconds UTC. Names below are the flights'; each job has its own.

Validation rejects malformed records, never unusual values: negative delays are early departures
and extreme delays are real. Each rejected record gets one reason, the first rule it breaks, in
this order (`REASONS` lists them):

1. `empty value`: no value (a tombstone), zero bytes, or only JSON whitespace;
2. `invalid UTF-8`: the bytes are not UTF-8 (checked before any string column is made of them:
   the value of such a record never becomes a string);
3. `malformed JSON`: not strict JSON (RFC 8259, as Spark's `try_parse_json` reads it): garbage,
   a truncated object, NaN or Infinity, a duplicated field name, a lone UTF-16 surrogate escape;
   also an object followed by more text that does not end in `}` (Spark's parsers stop after the
   first value and ignore the rest, so only this textual check sees it; `{...} x}` or two
   objects in one value pass it and are read as the first object);
4. `not a JSON object`: valid JSON of another kind (an array, a number, a string, null, a bool);
5. per field F of the spec, in order: `missing F`, `null F`, `wrong type for F` (a string
   where an integer belongs, an object or a number where a string belongs, 1.5, an integer
   outside the 64-bit range);
6. `empty F` and `F over 1024 bytes` (`MAX_CODE_BYTES`) for the string fields marked
   `non_empty` (flights: origin, destination), `negative F` for the long fields marked
   `non_negative` (flights: event_id, distance_mi, event_time);
7. `key does not match <key>`: the Kafka key's bytes differ from the key field's UTF-8 bytes
   (placement relies on the key).

A spec with `keep` (`keyshift.jobs.spec.Keep`) marks a record that passes every rule but
does not match it with the reason `FILTERED`: not a dead letter, not an event; Local Merge folds
such records into one row per Kafka partition and the sink counts them as `filtered`. A spec
with `key_lookup` has no key field: its key column holds the Kafka key as text (the key the
producer claims), and rule 7 is checked, with `unknown <field>`, once the key is looked up
(`keyshift.processing.operators.key_lookup`, in Local Merge).

Event-time plausibility (`keyshift.eventtime.plausibility`) and duplicated event ids
(`keyshift.processing.operators.processor`) add their own reasons later in the pipeline.

A dead letter keeps its raw bytes: `raw_value` holds the value as text when it is valid UTF-8
(`raw_encoding` = `utf-8`), else its base64 (`raw_encoding` = `base64`); a tombstone has neither
(`raw_encoding` NULL). `raw_key_base64` is the Kafka key's base64 (NULL without a key).
"""

from __future__ import annotations

import re

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from keyshift.jobs.spec import JobSpec
from keyshift.names import END_OF_INPUT_PREFIX

CORRUPT_COLUMN = "_corrupt_record"

JSON_WHITESPACE = " \t\r\n"
"""The characters JSON allows around a value (RFC 8259 §2)."""

_VARIANT_TYPE = {"bigint": "BIGINT", "string": "STRING"}

MAX_CODE_BYTES = 1024
"""A `non_empty` string field (a key, an airport code) longer than this many UTF-8 bytes is
rejected: keys live in state and in every output row, and real codes have 3 letters."""

EMPTY_VALUE = "empty value"
INVALID_UTF8 = "invalid UTF-8"
MALFORMED_JSON = "malformed JSON"
NOT_AN_OBJECT = "not a JSON object"
FILTERED = "filtered"
"""The reason column's value for a valid record that the spec's `keep` rule leaves out: it is
counted as filtered, never as a dead letter (module docstring)."""


def expected_variant_schema(spec: JobSpec) -> str:
    """What Spark's `schema_of_variant` says of a well-formed record with no extra field (fields
    sorted by name). Only a shortcut: a record whose schema string differs is checked field by
    field, so the result never depends on this string, only the speed does."""
    return "OBJECT<" + ", ".join(f"{f.name}: {_VARIANT_TYPE[f.spark_type.simpleString()]}" for f in sorted(spec.fields, key=lambda f: f.name)) + ">"


def value_schema(spec: JobSpec) -> T.StructType:
    """Schema `from_json` parses a value with; the corrupt-record column catches type errors."""
    return T.StructType([T.StructField(f.name, f.spark_type, True) for f in spec.fields] + [T.StructField(CORRUPT_COLUMN, T.StringType(), True)])


def key_mismatch(spec: JobSpec) -> str:
    """The reason of a record whose Kafka key differs from its key field."""
    return f"key does not match {spec.key}"


def reasons(spec: JobSpec) -> tuple[str, ...]:
    """Every reason validation can give for `spec`'s records, in rule order (module docstring)."""
    return (
        EMPTY_VALUE,
        INVALID_UTF8,
        MALFORMED_JSON,
        NOT_AN_OBJECT,
        *(f"{what} {f.name}" for f in spec.fields for what in ("missing", "null")),
        *(f"wrong type for {f.name}" for f in spec.fields),
        *(f"empty {f.name}" for f in spec.fields if f.non_empty),
        *(f"{f.name} over {MAX_CODE_BYTES} bytes" for f in spec.fields if f.non_empty),
        *(f"negative {f.name}" for f in spec.fields if f.non_negative),
        *((spec.key_lookup.missing_reason,) if spec.key_lookup is not None else ()),
        key_mismatch(spec),
    )


def record_columns(spec: JobSpec) -> tuple[str, ...]:
    """The record's columns as the engine carries them: key, payload fields, event time, event id."""
    return (spec.key, *(f.col for f in spec.payload), spec.event_time, spec.event_id)


_CONTROL_COLUMNS = ("dead_letter_reason", "kafka_partition", "kafka_offset", "is_control", "control_run_id")


def validated_columns(spec: JobSpec) -> tuple[str, ...]:
    """Columns of `validate_records`' result, in order."""
    return (*record_columns(spec), *_CONTROL_COLUMNS, "raw_value_bytes", "raw_key_bytes")


def parsed_columns(spec: JobSpec) -> tuple[str, ...]:
    """Columns of `parse_records`' (and `with_dead_letter_payload`'s) result, in order."""
    return (*record_columns(spec), "dead_letter_reason", "raw_value", "raw_encoding", "raw_key_base64",
            "kafka_partition", "kafka_offset", "is_control", "control_run_id")


def _field_reason(variant: Column, name: str, dtype: T.DataType) -> Column:
    """`missing F`, `null F` or `wrong type for F` for field `name` of a JSON object, else NULL."""
    field = F.try_variant_get(variant, f"$.{name}", "variant")
    return (
        F.when(field.isNull(), F.lit(f"missing {name}"))
        .when(F.is_variant_null(field), F.lit(f"null {name}"))
        .when(F.schema_of_variant(field) != F.lit(_VARIANT_TYPE[dtype.simpleString()]), F.lit(f"wrong type for {name}"))
    )


def _value_reason(spec: JobSpec, key: Column, parsed: Column) -> Column:
    """The value rules (6, 7 of the module docstring) of a record whose fields are well typed."""
    reason = F.when(F.lit(False), F.lit(None).cast("string"))
    for f in spec.fields:
        if f.non_empty:
            reason = reason.when(F.trim(parsed[f.name]) == "", F.lit(f"empty {f.name}")).when(
                F.octet_length(parsed[f.name]) > MAX_CODE_BYTES, F.lit(f"{f.name} over {MAX_CODE_BYTES} bytes")
            )
    for f in spec.fields:
        if f.non_negative:
            reason = reason.when(parsed[f.name] < 0, F.lit(f"negative {f.name}"))
    if spec.key_lookup is None:  # a looked-up key is checked where it is looked up
        key_name = next(f.name for f in spec.fields if f.col == spec.key)
        # the Kafka key's bytes against the field's UTF-8 bytes: a binary-to-string cast copies
        # no byte and string equality is bytewise (UTF8_BINARY), so no encoded copy is made
        matches = key.isNotNull() & (key.cast("string") == parsed[key_name])
        reason = reason.when(~matches, F.lit(key_mismatch(spec)))
    # from_json agrees with the strict parse on every record that got this far; kept as a guard
    return reason.when(parsed[CORRUPT_COLUMN].isNotNull(), F.lit(MALFORMED_JSON))


_JAVA_JSON_WHITESPACE = r"[ \t\r\n]*+"
_JAVA_JSON_VALUE = {
    # a JSON integer of at most 18 digits: always inside the 64-bit range; `-0` is left to the
    # strict path
    "bigint": r"(?:0|-?[1-9][0-9]{0,17}+)",
    # a JSON string without escapes: RFC 8259's unescaped characters are U+0020-U+10FFFF but
    # '"' and '\\' (the bytes are valid UTF-8 by then, so no lone surrogate can appear)
    "string": r'"[^"\\\x00-\x1F]*+"',
}


def canonical_record_pattern(spec: JobSpec) -> str:
    """A Java regular expression (Spark's `rlike`) matching the records written in the spec's
    canonical shape: one JSON object with exactly the spec's fields, in the spec's order, each
    once, of the spec's type (a long as an integer of at most 18 digits, a string without escape
    sequences), JSON whitespace allowed where RFC 8259 allows it.

    Every record it matches passes rules 1 to 5 of the module docstring (it is non-empty, strict
    JSON, an object, each field present, non-null and well typed, nothing after the object), and
    `from_json` reads its fields exactly, so validation judges it by rules 6 and 7 alone, without
    the variant parse that rules 3 to 5 need (about 2 s of the 2 cores per 500,000 records). A
    record it does not match (another field order, an extra field, an escape, a marker, anything
    malformed) takes the strict path, so the pattern changes speed, never a result.
    """
    ws = _JAVA_JSON_WHITESPACE
    members = f"{ws},{ws}".join(
        f'"{re.escape(f.name)}"{ws}:{ws}{_JAVA_JSON_VALUE[f.spark_type.simpleString()]}' for f in spec.fields
    )
    return rf"\A{ws}\{{{ws}{members}{ws}\}}{ws}\z"


def _reason(spec: JobSpec, value: Column, key: Column, text: Column, variant: Column, parsed: Column,
            canonical: Column | None = None) -> Column:
    """The first validation rule a record breaks, or NULL when it is valid (see module docstring).

    Spark evaluates a CASE branch only when it is reached, so a record matching `canonical`
    (true for `canonical_record_pattern(spec)`) is judged by the value rules alone, and the
    per-field checks run only for records whose variant schema is not
    `expected_variant_schema(spec)`.
    """
    schema = F.schema_of_variant(variant)
    per_field = F.coalesce(*[_field_reason(variant, f.name, f.spark_type) for f in spec.fields], _value_reason(spec, key, parsed))
    reason = (
        F.when(value.isNull() | (F.octet_length(value) == 0), F.lit(EMPTY_VALUE))
        .when(~F.is_valid_utf8(value.cast("string")), F.lit(INVALID_UTF8))
    )
    if canonical is not None:
        reason = reason.when(canonical, _value_reason(spec, key, parsed))
    return (
        reason.when(F.btrim(text, F.lit(JSON_WHITESPACE)) == "", F.lit(EMPTY_VALUE))
        .when(variant.isNull(), F.lit(MALFORMED_JSON))
        .when(~schema.startswith("OBJECT<"), F.lit(NOT_AN_OBJECT))
        .when(~F.rtrim(text, F.lit(JSON_WHITESPACE)).endswith("}"), F.lit(MALFORMED_JSON))
        .when(schema == F.lit(expected_variant_schema(spec)), _value_reason(spec, key, parsed))
        .otherwise(per_field)
    )


def validate_records(kafka_rows: DataFrame, spec: JobSpec, canonical_fast_path: bool = True) -> DataFrame:
    """Parse and validate raw Kafka rows; keep the raw bytes for a later dead-letter payload.

    Args:
        kafka_rows: a DataFrame with the Kafka source's columns `key`, `value` (binary),
            `partition` (int) and `offset` (long); batch or streaming.
        spec: the job whose records these are.

    Returns:
        A DataFrame with `validated_columns(spec)`: the record's fields (event time as
        `event_time_ms` long, epoch ms UTC; all NULL for a rejected record, so no string of a bad
        record goes further), `dead_letter_reason` (NULL when valid), `kafka_partition` (int),
        `kafka_offset` (long), `is_control` (true for an end-of-input marker, whose
        `event_time_ms` is set and whose reason is meaningless) with `control_run_id` (the
        marker's run, NULL for events), and the raw `raw_value_bytes`, `raw_key_bytes` (binary).
        Every input row yields one row. Call `with_dead_letter_payload` on it (after any
        further rule that adds a reason).

    With `canonical_fast_path` (the default), records matching `canonical_record_pattern(spec)`
    skip the variant parse; False parses every record strictly (same results, slower: the
    tests compare both).
    """
    value = F.col("value")
    utf8 = F.is_valid_utf8(value.cast("string"))
    text = F.when(utf8, value.cast("string"))  # a string column only when the bytes are UTF-8
    staged = kafka_rows.select(
        value.alias("_value"),
        F.col("key").alias("_key"),
        text.alias("_text"),
        F.col("partition").cast("int").alias("kafka_partition"),
        F.col("offset").cast("long").alias("kafka_offset"),
    )
    if canonical_fast_path:
        canonical = F.coalesce(F.col("_text").rlike(canonical_record_pattern(spec)), F.lit(False))
        staged = staged.select("*", canonical.alias("_canonical"))
        variant = F.when(~F.col("_canonical"), F.try_parse_json(F.col("_text")))  # parsed only off the fast path
    else:
        variant = F.try_parse_json(F.col("_text"))
    staged = staged.select(
        "*",
        F.from_json(F.col("_text"), value_schema(spec), {"columnNameOfCorruptRecord": CORRUPT_COLUMN}).alias("_parsed"),
        variant.alias("_variant"),
    )
    reason = _reason(spec, F.col("_value"), F.col("_key"), F.col("_text"), F.col("_variant"), F.col("_parsed"),
                     F.col("_canonical") if canonical_fast_path else None)
    if spec.keep is not None:
        kept = F.col(f"_parsed.{spec.keep.field}").isin(*spec.keep.values)
        reason = F.when(reason.isNull() & ~F.coalesce(kept, F.lit(False)), F.lit(FILTERED)).otherwise(reason)
    is_control = F.coalesce(F.col("_text").startswith(END_OF_INPUT_PREFIX), F.lit(False))
    staged = staged.select("*", reason.alias("dead_letter_reason"), is_control.alias("is_control"))
    valid = F.col("dead_letter_reason").isNull() | F.col("is_control")
    source = {f.col: F.col(f"_parsed.{f.name}") for f in spec.fields}
    if spec.key_lookup is not None:
        source[spec.key] = F.col("_key").cast("string")  # the claimed key, checked after the lookup

    return staged.select(
        *[F.when(valid, source[column]).alias(column) for column in record_columns(spec)],
        F.when(~F.col("is_control"), F.col("dead_letter_reason")).alias("dead_letter_reason"),
        "kafka_partition",
        "kafka_offset",
        "is_control",
        F.when(F.col("is_control"), F.get_json_object(F.col("_text"), "$.run_id")).alias("control_run_id"),
        F.col("_value").alias("raw_value_bytes"),
        F.col("_key").alias("raw_key_bytes"),
    )


def _base64(binary: Column) -> Column:
    """Standard base64 on one line: Spark's `base64` may wrap lines (MIME chunking) by config."""
    return F.translate(F.base64(binary), "\r\n", "")


def with_dead_letter_payload(validated: DataFrame, spec: JobSpec) -> DataFrame:
    """Replace the raw bytes by a dead letter's payload: text when UTF-8, base64 otherwise.

    Args:
        validated: `validate_records` output, possibly with more reasons set since.
        spec: the job whose records these are.

    Returns:
        `parsed_columns(spec)`: the record's fields (NULL for any rejected record), `raw_value`
        (the value as text when it is valid UTF-8, else its base64; NULL for a valid record or a
        tombstone), `raw_encoding` (`utf-8`, `base64`, or NULL with `raw_value`),
        `raw_key_base64` (base64 of the Kafka key of a rejected record, NULL otherwise or
        without a key), and the rest of `validated_columns(spec)` without the raw bytes. A
        `FILTERED` record gets no payload; with a `key_lookup` spec a valid record keeps its
        payload too, since the lookup may still reject it.
    """
    reason = F.col("dead_letter_reason")
    rejected = reason.isNotNull()
    payload = rejected & (reason != F.lit(FILTERED)) if spec.keep is not None else rejected
    if spec.key_lookup is not None:
        payload = payload | ~rejected
    raw = F.col("raw_value_bytes")
    utf8 = F.is_valid_utf8(raw.cast("string"))
    return validated.select(
        *[F.when(~rejected, F.col(name)).alias(name) for name in record_columns(spec)],
        "dead_letter_reason",
        F.when(payload & utf8, raw.cast("string")).when(payload, _base64(raw)).alias("raw_value"),
        F.when(payload & utf8, F.lit("utf-8")).when(payload & raw.isNotNull(), F.lit("base64")).alias("raw_encoding"),
        F.when(payload, _base64(F.col("raw_key_bytes"))).alias("raw_key_base64"),
        "kafka_partition",
        "kafka_offset",
        "is_control",
        "control_run_id",
    )


def parse_records(kafka_rows: DataFrame, spec: JobSpec) -> DataFrame:
    """Validate raw Kafka rows and give each rejected one its dead-letter payload.

    `with_dead_letter_payload(validate_records(kafka_rows, spec), spec)`: see both. Every input
    row yields exactly one row of `parsed_columns(spec)`.
    """
    return with_dead_letter_payload(validate_records(kafka_rows, spec), spec)
