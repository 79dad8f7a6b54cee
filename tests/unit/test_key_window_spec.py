"""A job spec chooses its window: tumbling (the default) or sliding windows computed with key
windows (paper 003). Validation of that choice, the registered sliding flights job, the engine
pieces of the key-window path that run without a query (slot tokens per row, dead letters and
retired events out of KeyWindowProcessor, native rows counted from updates), and the CLI."""

import dataclasses

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from pyspark.sql.streaming.tws_tester import TwsTester

from keyshift.errors import ConfigurationError
from keyshift.eventtime.key_windows import SlidingWindow, expand_updates, key_window_updates_by_key
from keyshift.eventtime.watermarks import WatermarkPolicy
from keyshift.jobs import job_names, job_spec
from keyshift.jobs.flight_delays import FLIGHT_DELAYS
from keyshift.jobs.flight_delays_sliding import FLIGHT_DELAYS_SLIDING, MINUTE_MS
from keyshift.placement.spark_tokens import token_lookup
from keyshift.processing.job_config import JobConfig
from keyshift.processing.operators.key_window_processor import END_OF_INPUT_EVENT_TIME_MS, KeyWindowProcessor
from keyshift.processing.outputs.key_window_sink import native_window_rows
from keyshift.processing.operators.key_window_stream import (
    check_key_window_run, key_window_columns, key_window_input_schema, tokens_of_rows,
)
from keyshift.jobs.spec import Aggregate

HOUR_MS = 60 * MINUTE_MS
T0 = 978_307_200_000


def sliding(**changes):
    """The sliding flights spec with `changes` (dataclasses.replace re-runs the validation)."""
    return dataclasses.replace(FLIGHT_DELAYS_SLIDING, **changes)


# --------------------------------------------------------------------------- spec validation


def test_the_default_window_is_tumbling_and_unchanged():
    assert FLIGHT_DELAYS.window == "tumbling" and FLIGHT_DELAYS.slide_ms is None and not FLIGHT_DELAYS.key_windows
    with pytest.raises(ConfigurationError, match="no single value field"):
        FLIGHT_DELAYS.value_field


def test_the_sliding_flights_job_is_registered_with_the_flights_records_and_topics():
    assert job_names() == ("flight_delays", "flight_delays_sliding", "ysb")
    spec = job_spec("flight_delays_sliding")
    assert spec.key_windows and (spec.window_ms, spec.slide_ms) == (HOUR_MS, MINUTE_MS)
    assert spec.fields == FLIGHT_DELAYS.fields and spec.key == "origin" and spec.topics == FLIGHT_DELAYS.topics
    assert spec.value_field == "delay_min" and spec.alert is None and not spec.outputs
    assert JobConfig(run_id="r", job="flight_delays_sliding").spec is spec


@pytest.mark.parametrize(
    "changes, message",
    [
        # an unknown window name
        (dict(window="hopping"), "unknown window 'hopping'"),
        # key windows without a slide
        (dict(slide_ms=None), "need slide_ms"),
        # a slide of zero
        (dict(slide_ms=0), "slide_ms must be > 0"),
        # the size is not a multiple of the slide
        (dict(slide_ms=7 * MINUTE_MS), "not a multiple of its slide"),
        # min is not computed by key windows
        (dict(aggregates=(Aggregate("low", "min", "delay_min"),), table_columns=("count", "low")), "sum and/or max of ONE long field"),
        # sum and max of two different fields
        (dict(aggregates=(Aggregate("s", "sum", "delay_min"), Aggregate("m", "max", "distance_mi")), table_columns=("count", "s", "m")),
         "sum and/or max of ONE long field"),
        # the same op twice
        (dict(aggregates=(Aggregate("a", "sum", "delay_min"), Aggregate("b", "sum", "delay_min")), table_columns=("count", "a", "b")),
         "sum and/or max of ONE long field"),
        # no aggregate at all: nothing names the value field
        (dict(aggregates=(), table_columns=("count",)), "got aggregates none"),
        # derived outputs and alerts are for tumbling windows
        (dict(outputs={"alert": "boolean"}, alert="alert", table_columns=("count", "sum_delay_min", "max_delay_min", "alert")),
         "drop the outputs"),
    ],
)
def test_key_window_specs_that_the_processor_cannot_compute_are_refused(changes, message):
    with pytest.raises(ConfigurationError, match=message):
        sliding(**changes)


def test_a_tumbling_spec_refuses_a_slide():
    with pytest.raises(ConfigurationError, match="slide_ms is for window='key_windows'"):
        dataclasses.replace(FLIGHT_DELAYS, slide_ms=MINUTE_MS)


@pytest.mark.parametrize("aggregates", [("sum",), ("max",), ("max", "sum")])
def test_sum_or_max_or_both_of_one_field_are_accepted(aggregates):
    spec = sliding(aggregates=tuple(Aggregate(op, op, "delay_min") for op in aggregates), table_columns=("count", *aggregates))
    assert spec.value_field == "delay_min"


def test_a_run_refuses_split_keys_and_the_timeout_fallback():
    with pytest.raises(ConfigurationError, match="split keys"):
        check_key_window_run(FLIGHT_DELAYS_SLIDING, {"ORD": (0, 1)}, WatermarkPolicy())
    with pytest.raises(ConfigurationError, match="idle-fallback global only"):
        check_key_window_run(FLIGHT_DELAYS_SLIDING, None, WatermarkPolicy(mode="key", idle_fallback="timeout"))
    check_key_window_run(FLIGHT_DELAYS_SLIDING, None, WatermarkPolicy(mode="key"))


# --------------------------------------------------------------------------- engine pieces


def test_events_get_their_keys_token_and_dead_letters_their_partitions_slot():
    token_of, tokens = token_lookup("hash", 4)
    rows = pd.DataFrame({"origin": ["ORD", None, "ATL", "ORD"], "dead_letter_reason": [None, "malformed JSON", None, None],
                         "kafka_partition": [0, 6, 1, 2]})
    got = tokens_of_rows(rows, "origin", token_of, tokens)
    assert got.tolist() == [token_of("ORD"), int(tokens[6 % 4]), token_of("ATL"), token_of("ORD")]
    assert got.dtype == np.int32
    assert key_window_input_schema(FLIGHT_DELAYS_SLIDING).fieldNames()[:4] == ["token", "origin", "event_time_ms", "delay_min"]


def _input(events, dead=()):
    """Processor input rows: events (origin, time, delay) then dead letters (reason)."""
    names = key_window_input_schema(FLIGHT_DELAYS_SLIDING).fieldNames()
    records = [(1, o, t, v, i, 0, i, None, None, None, None) for i, (o, t, v) in enumerate(events)]
    records += [(1, None, None, None, None, 2, 100 + j, reason, "raw", "utf-8", None) for j, reason in enumerate(dead)]
    return pd.DataFrame(records, columns=names)


def test_key_window_processor_passes_dead_letters_and_counts_retired_events():
    window = SlidingWindow(HOUR_MS, MINUTE_MS)
    processor = KeyWindowProcessor([1, 2], window, WatermarkPolicy(bound_ms=MINUTE_MS), key_window_columns(FLIGHT_DELAYS_SLIDING))
    tester = TwsTester(processor, timeMode="EventTime", eventTimeExtractor=lambda row: 2**62)
    events = [("ORD", T0 + i * 7 * MINUTE_MS, i) for i in range(20)] + [("ATL", T0 + 5 * MINUTE_MS, 3)]
    out = tester.testInPandas(1, _input(events, dead=["malformed JSON", "missing origin"]))
    dead = out[out["kind"] == "dead_letter"]
    assert dead["dead_letter_reason"].tolist() == ["malformed JSON", "missing origin"]
    assert dead["kafka_offset"].tolist() == [100, 101] and (dead["slot"] == 0).all()
    assert out[out["kind"] == "load"]["count"].tolist() == [len(events)]  # dead letters are no events
    outputs = [out, tester.setWatermark(END_OF_INPUT_EVENT_TIME_MS)]
    frames = pd.concat([o for o in outputs if len(o)], ignore_index=True)
    assert int(frames.loc[frames["kind"] == "retired", "count"].sum()) == len(events)  # all retired once flushed
    updates = frames[frames["kind"] == "key_window"][["origin", "start_ms", "count", "sum", "max"]]
    updates = updates.astype({"start_ms": np.int64, "count": np.int64, "sum": np.int64, "max": "Int64"})
    updates = updates.sort_values(["origin", "start_ms"], ignore_index=True)
    frame = pd.DataFrame(events, columns=["origin", "event_time_ms", "delay_min"])
    expected = key_window_updates_by_key(frame, window, key="origin", time="event_time_ms", value="delay_min")
    pd.testing.assert_frame_equal(updates, expected.astype({"origin": object}), check_dtype=False)
    assert native_window_rows(updates, "origin", MINUTE_MS) == len(expand_updates(updates, window))


def test_native_rows_of_no_updates_is_zero():
    assert native_window_rows(pd.DataFrame(columns=["origin", "start_ms", "count"]), "origin", MINUTE_MS) == 0


# --------------------------------------------------------------------------- CLI


def test_job_run_takes_a_registered_job_by_option_and_refuses_two_names():
    from keyshift.cli.job import command

    result = CliRunner().invoke(command, ["run", "flight_delays", "--job", "flight_delays_sliding"])
    assert result.exit_code == 2 and "give one" in result.output
    result = CliRunner().invoke(command, ["run", "--job", "hopping"])
    assert result.exit_code == 2 and "flight_delays_sliding" in result.output


def test_a_switch_of_a_key_window_run_is_refused(tmp_path):
    import json

    from keyshift.migration.switch import request_switch
    from keyshift.settings import Settings

    run_dir = tmp_path / "kw-run"
    run_dir.mkdir()
    (run_dir / "job.json").write_text(json.dumps({"config": {"run_id": "kw-run", "job": "flight_delays_sliding"}}))
    with pytest.raises(ConfigurationError, match="switching a key-window job is not supported"):
        request_switch(Settings(runs_dir=tmp_path), "kw-run", "least_count")
