"""The YSB generator's pure parts: campaign map, event stream, Zipf popularity, window counts, placement."""

from __future__ import annotations

import json
import math
import uuid

import numpy as np
import pandas as pd
import pytest

from keyshift.data.replay import event_slots, place_keys
from keyshift.data.ysb import (
    AD_TYPES,
    EVENT_TYPES,
    GENERATE_BATCH,
    POOL_SIZE,
    RECORD_FIELDS,
    WINDOW_MS,
    EventStream,
    ViewCounter,
    ad_popularity,
    campaign_counts,
    campaign_map,
    count_views,
    event_times_ms,
    generate_ysb,
    window_start_ms,
)
from keyshift.errors import ConfigurationError
from keyshift.placement.strategies import HashStrategy, RoundRobinStrategy
from keyshift.settings import Settings

START_MS = 1_700_000_000_000


def stream(seed: int = 7, rate: float = 1000.0, zipf: float | None = None, campaigns: int = 100, ads: int = 10) -> EventStream:
    return EventStream(campaign_map(campaigns, ads, seed), seed, START_MS, rate, zipf)


def values(source: EventStream, events: int) -> list[bytes]:
    return [value for batch in source.batches(events) for value in source.values(batch)]


def sample(source: EventStream, events: int) -> pd.DataFrame:
    return pd.concat([source.frame(batch) for batch in source.batches(events)], ignore_index=True)


# determinism


def test_same_seed_same_map_and_events() -> None:
    assert campaign_map(100, 10, 3) == campaign_map(100, 10, 3)
    assert values(stream(seed=3), 20_000) == values(stream(seed=3), 20_000)


def test_another_seed_other_ids_and_events() -> None:
    assert set(campaign_map(100, 10, 3).campaigns).isdisjoint(campaign_map(100, 10, 4).campaigns)
    assert values(stream(seed=3), 100) != values(stream(seed=4), 100)


def test_a_shorter_run_is_a_prefix_of_a_longer_one() -> None:
    events = GENERATE_BATCH + 5  # crosses a batch boundary
    longer = values(stream(), 3 * GENERATE_BATCH)
    assert values(stream(), events) == longer[:events]
    assert sum(len(batch) for batch in stream().batches(events)) == events
    assert list(stream().batches(0)) == []


def test_zipf_stream_is_deterministic_too() -> None:
    assert values(stream(zipf=1.2), 10_000) == values(stream(zipf=1.2), 10_000)
    assert values(stream(zipf=1.2), 1_000) != values(stream(), 1_000)  # the ads differ


# the record: fields, types, values


def test_record_fields_types_and_values() -> None:
    source = stream(rate=3000.0)
    cmap = source.cmap
    ad_campaign = cmap.ad_campaign()
    records = [json.loads(value) for value in values(source, 2_000)]
    for n, record in enumerate(records):
        assert tuple(record) == RECORD_FIELDS  # every field, in order, nothing else
        assert record["event_id"] == n
        for name in ("user_id", "page_id", "ad_id"):
            assert isinstance(record[name], str) and uuid.UUID(record[name]).version == 4
        assert record["user_id"] in source.users and record["page_id"] in source.pages
        assert record["ad_id"] in ad_campaign
        assert record["ad_type"] in AD_TYPES and record["event_type"] in EVENT_TYPES
        assert type(record["event_time"]) is int
        assert record["event_time"] == START_MS + math.floor(n * 1000 / 3000)  # 1000/rate ms apart
        assert record["ip_address"] == "1.2.3.4"
    assert len(source.users) == len(source.pages) == POOL_SIZE


def test_frame_matches_the_json_values() -> None:
    source = stream()
    batch = next(source.batches(500))
    frame = source.frame(batch)
    parsed = pd.DataFrame([json.loads(value) for value in source.values(batch)])
    pd.testing.assert_frame_equal(frame[list(RECORD_FIELDS)], parsed, check_dtype=False)
    ad_campaign = source.cmap.ad_campaign()
    assert (frame["campaign_id"] == frame["ad_id"].map(ad_campaign)).all()  # the key is the ad's campaign


@pytest.mark.parametrize(
    ("rate", "ids", "expected"),
    [
        (1000.0, [0, 1, 999], [0, 1, 999]),  # one event per millisecond
        (3.0, [0, 1, 2, 3], [0, 333, 666, 1000]),  # floor(n * 1000 / rate)
        (2500.0, [0, 1, 2, 5], [0, 0, 0, 2]),  # several events per millisecond
    ],
)
def test_event_times_are_spaced_by_1000_over_rate(rate: float, ids: list[int], expected: list[int]) -> None:
    assert event_times_ms(START_MS, rate, np.array(ids)).tolist() == [START_MS + t for t in expected]


# uniform draws, as published


def test_event_types_ad_types_and_ads_are_uniform() -> None:
    events = 300_000
    frame = sample(stream(seed=11), events)
    # share of each of k values: 1/k; the bounds are about 6 standard deviations of a share
    for column, names in (("event_type", EVENT_TYPES), ("ad_type", AD_TYPES)):
        shares = frame[column].value_counts(normalize=True)
        assert set(shares.index) == set(names)
        assert (shares - 1 / len(names)).abs().max() < 0.005, shares
    per_ad = frame["ad_id"].value_counts()
    assert len(per_ad) == 1000 and per_ad.between(300 - 120, 300 + 120).all()  # 300 expected, sd about 17
    per_campaign = frame["campaign_id"].value_counts()
    assert len(per_campaign) == 100 and per_campaign.between(3000 - 400, 3000 + 400).all()


# Zipf popularity


@pytest.mark.parametrize("s", [0.5, 1.0, 1.5])
def test_zipf_popularity_is_r_to_the_minus_s(s: float) -> None:
    weights = ad_popularity(1000, s, seed=2)
    assert weights.sum() == pytest.approx(1.0)
    by_rank = np.sort(weights)[::-1]
    expected = np.arange(1, 1001, dtype=float) ** -s
    np.testing.assert_allclose(by_rank, expected / expected.sum())
    assert not np.all(np.diff(weights) <= 0)  # ranks are dealt to ads at random, not in ad order


def test_without_zipf_every_ad_is_equally_popular() -> None:
    np.testing.assert_array_equal(ad_popularity(1000, None), np.full(1000, 0.001))


def test_zipf_skews_the_drawn_ads_and_campaigns() -> None:
    events = 100_000
    skewed = stream(seed=5, zipf=1.0)
    frame = sample(skewed, events)
    top = int(np.argmax(skewed.popularity))
    share = (frame["ad_id"] == skewed.cmap.ads[top]).mean()
    assert share == pytest.approx(skewed.popularity[top], abs=0.005)  # about 13.4 % for s = 1 over 1000 ads
    assert share > 50 * (1 / 1000)
    uniform_campaigns = sample(stream(seed=5), events)["campaign_id"].value_counts()
    skewed_campaigns = frame["campaign_id"].value_counts()
    assert skewed_campaigns.max() / skewed_campaigns.mean() > 3 * uniform_campaigns.max() / uniform_campaigns.mean()


# the campaign map


@pytest.mark.parametrize(
    ("campaigns", "ads"),
    [
        (1, 1),  # the smallest map
        (3, 7),  # few campaigns, odd ad count
        (100, 10),  # the published benchmark's
    ],
)
def test_every_ad_has_one_campaign_and_each_campaign_its_ads(campaigns: int, ads: int) -> None:
    cmap = campaign_map(campaigns, ads, seed=1)
    ad_campaign = cmap.ad_campaign()
    assert len(cmap.campaigns) == len(set(cmap.campaigns)) == campaigns
    assert len(cmap.ads) == len(set(cmap.ads)) == len(ad_campaign) == campaigns * ads  # one campaign per ad
    assert set(ad_campaign.values()) == set(cmap.campaigns)
    assert pd.Series(ad_campaign).value_counts().eq(ads).all()  # each campaign has exactly A ads
    assert all(uuid.UUID(i).version == 4 for i in cmap.campaigns + cmap.ads)
    assert cmap.campaign_index(np.arange(campaigns * ads)).tolist() == [i // ads for i in range(campaigns * ads)]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: campaign_map(0, 10, 0), "campaigns must be an int >= 1, got 0"),  # no campaign
        (lambda: campaign_map(100, 0, 0), "ads_per_campaign must be an int >= 1, got 0"),  # no ad
        (lambda: campaign_map(100, 10, -1), "seed must be an int >= 0, got -1"),  # negative seed
        (lambda: ad_popularity(10, 0.0), "zipf must be a finite number > 0"),  # s = 0 is uniform: leave it unset
        (lambda: ad_popularity(10, -1.0), "zipf must be a finite number > 0"),  # negative exponent
        (lambda: ad_popularity(10, float("inf")), "zipf must be a finite number > 0"),  # not finite
        (lambda: stream(rate=0.0), "rate must be a finite number > 0 events/s, got 0.0"),  # no rate
        (lambda: EventStream(campaign_map(), 0, -5, 10.0), "start_ms must be an int >= 0, got -5"),  # before 1970
        (lambda: list(stream().batches(-1)), "events must be an int >= 0, got -1"),  # negative count
    ],
)
def test_bad_parameters_are_refused(call, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        call()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"duration": 0}, "duration must be a finite number > 0 s, got 0"),  # nothing to generate
        ({"rate": 1.0, "duration": 0.5}, r"makes no event"),  # floor(0.5) = 0 events
        ({"run_id": "../x"}, "run id must be letters, digits"),  # no path outside runs/
        ({"start_ms": -1}, "start_ms must be an int >= 0, got -1"),  # before 1970
    ],
)
def test_generate_refuses_before_touching_a_service(tmp_path, options: dict, message: str) -> None:
    arguments = {"rate": 100.0, "duration": 1.0, "run_id": "t1", "start_ms": START_MS, **options}
    with pytest.raises(ConfigurationError, match=message):
        generate_ysb(Settings(runs_dir=tmp_path), "no-such-topic", progress=False, **arguments)


def test_generate_refuses_an_existing_run_folder(tmp_path) -> None:
    (tmp_path / "ysb-t1").mkdir()
    with pytest.raises(ConfigurationError, match="exists already; choose another --run-id"):
        generate_ysb(Settings(runs_dir=tmp_path), "no-such-topic", rate=10.0, duration=1.0, run_id="t1", start_ms=0)


# windows and the record of views


@pytest.mark.parametrize(
    ("time_ms", "start"),
    [
        (0, 0),  # the epoch starts a window
        (9_999, 0),  # last millisecond of the first window
        (10_000, 10_000),  # the next window starts at its own time
        (START_MS + 12_345, START_MS + 10_000),  # epoch-aligned, not run-aligned
    ],
)
def test_window_start(time_ms: int, start: int) -> None:
    assert window_start_ms(np.array([time_ms])).tolist() == [start]
    assert start % WINDOW_MS == 0


def test_view_counter_counts_views_per_campaign_and_window() -> None:
    cmap = campaign_map(2, 1, seed=0)
    a, b = cmap.campaigns
    view, click, purchase = (EVENT_TYPES.index(name) for name in ("view", "click", "purchase"))
    counter = ViewCounter(cmap)
    counter.add(np.array([0, 0, 0, 1, 1]), np.array([view, view, click, view, purchase]), np.array([0, 9_999, 5, 10_000, 10_001]))
    counter.add(np.array([0]), np.array([view]), np.array([19_999]))  # a later batch adds to its window
    counter.add(np.array([], dtype=np.int64), np.array([], dtype=np.int64), np.array([], dtype=np.int64))  # nothing
    expected = pd.DataFrame(
        {"campaign_id": [a, a, b], "window_start_ms": [0, 10_000, 10_000], "views": [2, 1, 1]}
    ).sort_values(["campaign_id", "window_start_ms"], ignore_index=True)
    pd.testing.assert_frame_equal(counter.frame(), expected, check_dtype=False)
    assert counter.totals() == {"view": 4, "click": 1, "purchase": 1}
    assert (counter.first_ms, counter.last_ms) == (0, 19_999)


def test_view_counter_equals_pandas_on_a_generated_stream() -> None:
    source = stream(rate=700.0, zipf=0.8)
    counter = ViewCounter(source.cmap)
    for batch in source.batches(30_000):
        counter.add_batch(batch)
    frame = sample(source, 30_000)
    recounted = count_views(frame)
    pd.testing.assert_frame_equal(counter.frame(), recounted)
    assert recounted["views"].sum() == (frame["event_type"] == "view").sum() == counter.totals()["view"]
    assert sum(counter.totals().values()) == 30_000


# placement of the campaign keys


def test_records_are_placed_by_their_campaign_or_round_robin() -> None:
    source = stream()
    batch = next(source.batches(GENERATE_BATCH))
    keys = list(source.cmap.campaigns)
    hashed = HashStrategy(partitions=8)
    slot_by_key, split = place_keys(hashed, keys)
    slots = event_slots(keys, batch.campaigns, batch.event_ids, slot_by_key, split)
    assert slots.tolist() == [hashed.slot_of(keys[c]) for c in batch.campaigns.tolist()]
    slot_by_key, split = place_keys(RoundRobinStrategy(partitions=8), keys)
    slots = event_slots(keys, batch.campaigns, batch.event_ids, slot_by_key, split)
    assert slots.tolist() == (batch.event_ids % 8).tolist()


def test_campaign_counts_are_the_heads_campaigns_in_arrival_order() -> None:
    source = stream(zipf=1.0)
    counts = campaign_counts(source, 5_000)
    head = sample(source, 5_000)
    assert list(counts) == list(pd.unique(head["campaign_id"]))  # first appearance order
    assert counts == head["campaign_id"].value_counts().to_dict()
    assert campaign_counts(source, 0) == {}
