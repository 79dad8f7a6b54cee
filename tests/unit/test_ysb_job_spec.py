"""The YSB job as a spec of the keyed window engine: keep views only (the others counted as
filtered), the campaign looked up from the ad (executor-side, cached, refreshed on a new
version), dead letters for unknown ads and wrong keys, and the accounting through Local Merge,
the processor and the sink."""

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql.streaming.tws_tester import TwsTester

from keyshift.errors import ConfigurationError
from keyshift.jobs import job_spec
from keyshift.jobs.ysb import YSB
from keyshift.placement.tokens import slot_tokens
from keyshift.processing.operators.key_lookup import KeyMapCache, resolve_keys
from keyshift.processing.operators.local_merge import input_columns, partials_arrow, partials_of
from keyshift.processing.operators.processor import KeyedWindowProcessor
from keyshift.processing.operators.records import FILTERED, parse_records, reasons
from keyshift.jobs.spec import window_columns
from keyshift.processing.outputs.sinks import KeyedWindowSink
from keyshift.jobs.spec import JobSpec, Keep, KeyLookup, RecordField

T0 = 1_700_000_000_000
TOKENS = slot_tokens(4)
MAP = {"ad-1": "camp-a", "ad-2": "camp-a", "ad-3": "camp-b"}


def record(event_id, ad_id="ad-1", event_type="view", event_time=T0, **changes):
    fields = {"event_id": event_id, "user_id": "u", "page_id": "p", "ad_id": ad_id, "ad_type": "banner",
              "event_type": event_type, "event_time": event_time, "ip_address": "1.2.3.4", **changes}
    return json.dumps(fields).encode()


def test_the_ysb_spec_is_registered_and_shaped_like_the_published_job():
    assert job_spec("ysb") is YSB
    assert window_columns(YSB) == ("campaign_id", "window_start", "window_end", "count", "slot", "epoch")
    assert [f.name for f in YSB.payload] == ["ad_id"]  # projected: ad_id and the event time
    assert YSB.window_ms == 10_000 and YSB.alert is None and YSB.topics.alerts is None
    assert {"unknown ad_id", "key does not match campaign_id"} <= set(reasons(YSB))


FIELDS = (RecordField("event_id", "long"), RecordField("ad", "string"), RecordField("kind", "string"),
          RecordField("t", "long", column="event_time_ms"))


@pytest.mark.parametrize("options, message", [
    (dict(key="ad", keep=Keep("nope", ("x",))), "keep needs a string field 'nope'"),  # filter on a field the record lacks
    (dict(key="ad", keep=Keep("event_id", ("1",))), "keep needs a string field 'event_id'"),  # a long field
    (dict(key="ad", key_lookup=KeyLookup("kind", str, str)), "must not also be a record field"),  # the key both looked up and a field
    (dict(key="campaign", key_lookup=KeyLookup("ad", str, str), carry=("kind",)), "carry must include the lookup field"),
    (dict(key="ad", carry=("nope",)), "carry names fields the record lacks"),
    (dict(key="campaign"), "needs a string field with column 'campaign'"),  # no lookup: the key must be a field
])
def test_bad_options_are_refused_naming_the_problem(options, message):
    with pytest.raises(ConfigurationError, match=message):
        JobSpec(name="bad", fields=FIELDS, aggregates=(), outputs={}, derive=lambda c, a: {}, table_columns=("count",),
                topics=YSB.topics, **options)


def test_validation_filters_non_views_and_carries_the_claimed_key(spark):
    rows = [
        (b"camp-a", record(0), 0, 0),                                # a view: valid, key = the Kafka key
        (b"camp-a", record(1, event_type="click"), 0, 1),           # a click: filtered, no payload
        (b"camp-a", record(2, event_type="purchase"), 0, 2),
        (b"camp-a", b"{garbage", 0, 3),                             # malformed: a dead letter whatever its type
        (b"camp-a", record(4, event_type="click", event_time="x"), 0, 4),  # a bad click is a dead letter
        (None, record(5), 0, 5),                                    # no key: the lookup will reject it
    ]
    frame = spark.createDataFrame(rows, "key BINARY, value BINARY, partition INT, offset LONG")
    for fast in (True, False):
        from keyshift.processing.operators.records import validate_records, with_dead_letter_payload

        out = with_dead_letter_payload(validate_records(frame, YSB, canonical_fast_path=fast), YSB).toPandas().sort_values("kafka_offset")
        assert out["dead_letter_reason"].tolist() == [None, FILTERED, FILTERED, "malformed JSON", "wrong type for event_time", None]
        assert out["campaign_id"].tolist()[0] == "camp-a" and out["ad_id"].tolist()[0] == "ad-1"
        assert out["raw_value"].isna().tolist() == [False, True, True, False, False, False]  # a view keeps its payload for the lookup
        assert pd.isna(out["campaign_id"].iloc[5])
    assert parse_records(frame, YSB).columns[:4] == ["campaign_id", "ad_id", "event_time_ms", "event_id"]


def events_table(rows):
    """Local Merge input of YSB rows: (campaign claimed, ad_id, time, id, reason, partition)."""
    columns = input_columns(YSB)
    frame = pd.DataFrame([{"campaign_id": c, "ad_id": a, "event_time_ms": t, "event_id": i, "dead_letter_reason": r,
                           "raw_value": f"raw-{i}", "raw_encoding": "utf-8", "raw_key_base64": "a2V5",
                           "kafka_partition": p, "kafka_offset": i} for c, a, t, i, r, p in rows], columns=list(columns))
    return frame


def test_resolve_keys_joins_ads_to_campaigns_and_rejects_unknown_ads_and_wrong_keys():
    table = pa.Table.from_pandas(events_table([
        ("camp-a", "ad-1", T0, 0, None, 0),        # good
        ("camp-b", "ad-3", T0, 1, None, 0),        # good
        ("camp-b", "ad-1", T0, 2, None, 0),        # ad-1 belongs to camp-a
        ("camp-a", "ad-9", T0, 3, None, 0),        # not in the map
        (None, "ad-1", T0, 4, None, 0),            # no Kafka key
        (None, None, None, 5, "malformed JSON", 1),  # already rejected: untouched
    ]), preserve_index=False)
    values, keys = pa.array(list(MAP)), pa.array(list(MAP.values()))
    out = resolve_keys(table, YSB, values, keys).to_pandas()
    assert out["dead_letter_reason"].tolist() == [None, None, "key does not match campaign_id", "unknown ad_id",
                                                  "key does not match campaign_id", "malformed JSON"]
    assert out["campaign_id"].tolist()[:2] == ["camp-a", "camp-b"] and out["campaign_id"].iloc[2:].isna().all()


class FakeRedis:
    """The three calls KeyMapCache makes, counted."""

    def __init__(self, mapping, version="1"):
        self.mapping, self.version, self.calls = dict(mapping), version, []

    def get(self, key):
        self.calls.append("get")
        return self.version

    def hgetall(self, key):
        self.calls.append("hgetall")
        return dict(self.mapping)

    def hmget(self, key, fields):
        self.calls.append("hmget")
        return [self.mapping.get(f) for f in fields]


def test_the_cache_reloads_only_on_a_new_version_and_asks_for_misses():
    redis = FakeRedis(MAP)
    cache = KeyMapCache(redis, "map", "version")
    values, keys = cache.arrays_for(pa.array(["ad-1", "ad-3"]))
    assert dict(zip(values.to_pylist(), keys.to_pylist())) == MAP
    cache.arrays_for(pa.array(["ad-2"]))
    assert redis.calls == ["get", "hgetall", "get"]  # same version: no reload, no miss
    redis.mapping["ad-4"] = "camp-c"  # grown without a new version: found by HMGET on the miss
    values, keys = cache.arrays_for(pa.array(["ad-4", None]))
    assert redis.calls[-2:] == ["get", "hmget"] and "ad-4" in values.to_pylist()
    redis.mapping, redis.version = {"ad-1": "camp-z"}, "2"  # a new map: reloaded whole
    values, keys = cache.arrays_for(pa.array(["ad-1"]))
    assert dict(zip(values.to_pylist(), keys.to_pylist())) == {"ad-1": "camp-z"} and cache.reloads == 2


def local_merge_rows():
    return events_table([
        ("camp-a", "ad-1", T0 + 1, 0, None, 0),
        ("camp-a", "ad-2", T0 + 9_999, 1, None, 0),
        ("camp-a", "ad-1", T0 + 10_000, 2, None, 0),  # next 10 s window
        (None, None, None, 3, FILTERED, 0),
        (None, None, None, 4, FILTERED, 0),
        (None, None, None, 5, FILTERED, 1),
        (None, None, None, 6, "malformed JSON", 1),
        ("camp-b", "ad-3", T0 + 5, 7, None, 1),
    ])


def test_local_merge_folds_filtered_records_into_one_row_per_partition_in_both_definitions():
    frame = local_merge_rows()
    token_of = lambda key: TOKENS[1]  # noqa: E731
    pandas = partials_of(frame, YSB, token_of, np.array(TOKENS), YSB.window_ms)
    arrow = partials_arrow(pa.Table.from_pandas(frame, preserve_index=False), YSB, token_of, np.array(TOKENS), YSB.window_ms).to_pandas()
    for out in (pandas, arrow):
        assert int(out["count"].sum()) == len(frame)
        filtered = out[out["dead_letter_reason"] == FILTERED]
        assert filtered["kafka_partition"].tolist() == [0, 1] and filtered["count"].tolist() == [2, 1]
        assert [list(o) for o in filtered["kafka_offsets"]] == [[3], [5]]
        assert (out["dead_letter_reason"] == "malformed JSON").sum() == 1
        windows = out[out["dead_letter_reason"].isna()].sort_values(["campaign_id", "window_start_ms"])
        assert windows[["campaign_id", "window_start_ms", "count"]].values.tolist() == [
            ["camp-a", T0, 2], ["camp-a", T0 + 10_000, 1], ["camp-b", T0, 1]]


class Batch:
    """What the sink calls on a micro-batch: toPandas()."""

    def __init__(self, frame):
        self.frame = frame

    def toPandas(self):
        return self.frame


class Writer:
    def __init__(self):
        self.written = []

    def write(self, windows):
        self.written.append(windows[["campaign_id", "window_start_ms", "count"]].values.tolist())


@pytest.mark.parametrize("mode", ["global", "key"])
def test_processor_and_sink_count_views_filtered_and_dead_letters_exactly(tmp_path, mode):
    from keyshift.eventtime.watermarks import WatermarkPolicy

    token_of = lambda key: TOKENS[1]  # noqa: E731
    partials = partials_of(local_merge_rows(), YSB, token_of, np.array(TOKENS), YSB.window_ms)
    tester = TwsTester(KeyedWindowProcessor(YSB, TOKENS, policy=WatermarkPolicy(mode=mode, bound_ms=0)),
                       timeMode="EventTime", eventTimeExtractor=lambda row: 2**62)
    out = tester.testInPandas(TOKENS[1], partials)
    closed = tester.setWatermark(T0 + 60_000)  # past every window: the slot's timer closes what is open
    writer = Writer()
    sink = KeyedWindowSink(YSB, tmp_path, "r1", 0, 4, redis_windows=writer)
    sink(Batch(pd.concat([out, closed], ignore_index=True)), 0)
    counters = sink.counters
    assert counters.processed_events == 8
    assert counters.filtered_events == 3 and counters.dead_letters == 1
    assert counters.dead_letters_by_reason == {"malformed JSON": 1}
    windows = pd.read_parquet(tmp_path / "windows")
    expected = [["camp-a", T0, 2], ["camp-a", T0 + 10_000, 1], ["camp-b", T0, 1]]
    assert counters.accounted_events == counters.processed_events == 8  # 4 in windows + 3 filtered + 1 dead letter
    starts = [int(t.timestamp() * 1000) for t in windows["window_start"]]
    assert sorted(map(list, zip(windows["campaign_id"], starts, windows["count"]))) == expected
    assert sorted(writer.written[0]) == expected  # the same windows went to Redis
