"""The keyed window engine runs any job spec, not only the flights: a made-up sensor job with
another key, a min aggregate and its own output rule goes through validation rules, Local Merge,
the processor (both watermark modes) and the split-window merge unchanged."""

import numpy as np
import pandas as pd
import pytest
from pyspark.sql.streaming.tws_tester import TwsTester

from keyshift.errors import ConfigurationError
from keyshift.eventtime.watermarks import WatermarkPolicy
from keyshift.jobs import job_spec
from keyshift.jobs.flight_delays import FLIGHT_DELAYS
from keyshift.placement.tokens import slot_tokens
from keyshift.processing.operators.local_merge import input_columns, partial_schema, partials_of
from keyshift.processing.operators.processor import KeyedWindowProcessor, output_schema
from keyshift.processing.operators.records import reasons
from keyshift.jobs.spec import window_columns
from keyshift.processing.outputs.sinks import merge_split_windows
from keyshift.jobs.spec import Aggregate, JobSpec, JobTopics, RecordField

MINUTE = 60_000
T0 = 978_307_200_000
TOKENS = slot_tokens(4)
TOKEN = TOKENS[1]


def spread(counts, aggregates):
    return {"spread": aggregates["high"] - aggregates["low"], "hot": aggregates["high"] >= 40}


SENSORS = JobSpec(
    name="sensors",
    fields=(
        RecordField("event_id", "long", non_negative=True),
        RecordField("sensor", "string", non_empty=True),
        RecordField("celsius", "long"),
        RecordField("ts", "long", column="event_time_ms", non_negative=True),
    ),
    key="sensor",
    aggregates=(Aggregate("low", "min", "celsius"), Aggregate("high", "max", "celsius")),
    outputs={"spread": "long", "hot": "boolean"},
    derive=spread,
    table_columns=("count", "low", "high", "spread", "hot"),
    alert="hot",
    topics=JobTopics("sensors", "sensor-alerts", "sensors-late", "sensors-dead-letter"),
    window_ms=10 * MINUTE,
)


def events(*rows, first_id=0):
    frame = pd.DataFrame(
        [{"sensor": s, "celsius": c, "event_time_ms": t, "event_id": first_id + i, "dead_letter_reason": None, "raw_value": None,
          "raw_encoding": None, "raw_key_base64": None, "kafka_partition": 0, "kafka_offset": first_id + i}
         for i, (s, c, t) in enumerate(rows)],
        columns=list(input_columns(SENSORS)),
    )
    return partials_of(frame, SENSORS, lambda key: TOKEN, np.array(TOKENS), SENSORS.window_ms)


def kind(frame, name):
    return frame[frame["kind"] == name].reset_index(drop=True) if "kind" in frame else pd.DataFrame()


def test_a_spec_names_its_columns_everywhere():
    assert window_columns(SENSORS) == ("sensor", "window_start", "window_end", "count", "low", "high", "spread", "hot", "slot", "epoch")
    assert {"sensor", "low", "high", "celsius_list"} <= set(partial_schema(SENSORS).fieldNames())
    assert {"sensor", "low", "high", "spread", "hot", "celsius"} <= set(output_schema(SENSORS).fieldNames())
    assert "key does not match sensor" in reasons(SENSORS) and "negative ts" in reasons(SENSORS)
    assert job_spec("flight_delays") is FLIGHT_DELAYS
    with pytest.raises(ConfigurationError, match="unknown job"):
        job_spec("nope")


@pytest.mark.parametrize("mode", ["global", "key"])
def test_the_engine_computes_a_min_max_window_with_the_specs_output_rule(mode):
    tester = TwsTester(KeyedWindowProcessor(SENSORS, TOKENS, policy=WatermarkPolicy(mode=mode, bound_ms=MINUTE)),
                       timeMode="EventTime", eventTimeExtractor=lambda row: 2**62)
    out = tester.testInPandas(TOKEN, events(("s1", 20, T0 + MINUTE), ("s1", 45, T0 + 2 * MINUTE), ("s2", 5, T0 + MINUTE)))
    assert kind(out, "load")["count"].tolist() == [3]
    out = tester.testInPandas(TOKEN, events(("s1", 31, T0 + 3 * MINUTE), first_id=10))  # a later event of the same window
    closed = kind(tester.setWatermark(T0 + 10 * MINUTE), "window").sort_values("sensor")
    assert closed[["sensor", "count", "low", "high", "spread", "hot"]].values.tolist() == [
        ["s1", 3, 20, 45, 25, True], ["s2", 1, 5, 5, 0, False],
    ]


def test_split_pieces_merge_by_each_aggregates_own_op():
    rows = pd.DataFrame({"sensor": ["s1", "s1"], "window_start_ms": [T0, T0], "window_end_ms": [T0 + 10 * MINUTE] * 2, "count": [2, 1],
                         "low": [3, -4], "high": [9, 7], "spread": [6, 0], "hot": [False, False], "slot": [2, 0]})
    merged, folded = merge_split_windows(rows, SENSORS)
    assert folded == 1 and merged[["count", "low", "high", "spread", "slot"]].values.tolist() == [[3, -4, 9, 13, 0]]


def test_a_spec_without_its_key_or_with_an_unknown_op_is_refused():
    with pytest.raises(ConfigurationError, match="needs a string field"):
        JobSpec(name="x", fields=SENSORS.fields, key="missing", aggregates=(), outputs={}, derive=lambda c, a: {},
                table_columns=("count",), topics=SENSORS.topics)
    with pytest.raises(ConfigurationError, match="unknown aggregate op"):
        JobSpec(name="x", fields=SENSORS.fields, key="sensor", aggregates=(Aggregate("m", "median", "celsius"),), outputs={},
                derive=lambda c, a: {}, table_columns=("count", "m"), topics=SENSORS.topics)


def test_alert_records_carry_each_column_as_its_declared_type(tmp_path):
    """The processor's output reaches the sink through pandas with NULLs in other kinds' rows, so
    longs arrive as floats; an alert record must still say `"count": 5`, not `5.0`."""
    import json

    from keyshift.processing.outputs.sinks import KeyedWindowSink

    sink = KeyedWindowSink(FLIGHT_DELAYS, tmp_path, "r", epoch=3, partitions=2)
    row = next(pd.DataFrame([{"origin": "ORD", "window_start_ms": 0.0, "window_end_ms": 3_600_000.0, "count": 5.0, "sum_delay_min": 200.0,
                              "mean_delay_min": 40.0, "max_delay_min": 90.0, "alert": True}]).itertuples(index=False))
    key, value = sink._alert_record(row)
    record = json.loads(value)
    assert key == b"ORD" and record == {"origin": "ORD", "window_start_ms": 0, "window_end_ms": 3_600_000, "count": 5,
                                        "mean_delay_min": 40.0, "max_delay_min": 90, "run_id": "r", "epoch": 3}
    assert {name: type(record[name]) for name in ("count", "max_delay_min", "mean_delay_min")} == {
        "count": int, "max_delay_min": int, "mean_delay_min": float}
