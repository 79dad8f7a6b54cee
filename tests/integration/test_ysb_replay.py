"""The YSB generator against the real broker and Redis: what Kafka and Redis hold equals what the
generator recorded (needs `keyshift stack up`)."""

from __future__ import annotations

import json
import time
import uuid

import pandas as pd
import pytest
from click.testing import CliRunner

from keyshift.cli.replay import command as replay_command
from keyshift.data.ysb import RECORD_FIELDS, campaign_map, count_views, generate_ysb
from keyshift.names import redis_replay_key, redis_ysb_ad_campaign_key, redis_ysb_campaigns_key
from keyshift.placement.assignment_store import AssignmentStore
from keyshift.placement.strategies import HashStrategy
from keyshift.runs import redis_client
from keyshift.topics import create_topics, delete_topics

pytestmark = pytest.mark.integration

PARTITIONS = 4
START_MS = 1_700_000_000_000


@pytest.fixture
def topic(stack_settings):
    name = f"keyshift-it-ysb-{uuid.uuid4().hex[:8]}"
    create_topics(stack_settings, [name], PARTITIONS)
    yield name
    delete_topics(stack_settings, [name])
    redis_client(stack_settings).delete(
        redis_replay_key(name), redis_ysb_ad_campaign_key(name), redis_ysb_campaigns_key(name)
    )


def read_events(read_topic, topic: str) -> pd.DataFrame:
    """Every record of the topic: partition, key (str), Kafka timestamp (ms) and the JSON fields."""
    rows = []
    for record in read_topic(topic):
        value = json.loads(record.value)
        assert tuple(value) == RECORD_FIELDS
        rows.append({"partition": record.partition, "key": record.key.decode(), "timestamp": record.timestamp, **value})
    return pd.DataFrame(rows)


def test_cli_backfill_lands_on_the_campaigns_slots_and_matches_its_record(
    stack_settings, topic, read_topic, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("KEYSHIFT_RUNS_DIR", str(tmp_path))
    outcome = CliRunner().invoke(
        replay_command,
        ["ysb", "--topic", topic, "--rate", "1000", "--duration", "5", "--start-ms", str(START_MS),
         "--seed", "42", "--run-id", "it1", "--no-progress"],
    )
    assert outcome.exit_code == 0, outcome.output
    assert "produced 5,000 YSB events" in outcome.output

    # Redis: the map of seed 42, and the campaigns set
    client = redis_client(stack_settings)
    cmap = campaign_map(100, 10, 42)
    ad_campaign = client.hgetall(redis_ysb_ad_campaign_key(topic))
    assert ad_campaign == cmap.ad_campaign()
    assert client.smembers(redis_ysb_campaigns_key(topic)) == set(cmap.campaigns)

    # Kafka: every event once, keyed by its ad's campaign (through the Redis map), on that key's hash slot
    events = read_events(read_topic, topic)
    assert sorted(events["event_id"]) == list(range(5_000))
    assert (events["key"] == events["ad_id"].map(ad_campaign)).all()
    hashed = HashStrategy(partitions=PARTITIONS)
    assert (events["partition"] == events["key"].map(hashed.slot_of)).all()
    assert (events["event_time"] == START_MS + events["event_id"]).all()  # 1 ms apart at 1,000 events/s

    # the record: views per campaign and window equal those recomputed from what Kafka holds
    run_dir = tmp_path / "ysb-it1"
    expected = pd.read_parquet(run_dir / "expected_views.parquet")
    recounted = count_views(events.assign(campaign_id=events["ad_id"].map(ad_campaign)))
    pd.testing.assert_frame_equal(expected, recounted, check_dtype=False)
    summary = json.loads((run_dir / "ysb.json").read_text())
    assert summary["events_by_type"] == events["event_type"].value_counts().to_dict()
    assert summary["per_partition"] == {str(p): n for p, n in events["partition"].value_counts().sort_index().items()}
    assert (summary["events"], summary["views"], summary["windows"]) == (5_000, recounted["views"].sum(), len(recounted))
    replay = client.hgetall(redis_replay_key(topic))
    assert (replay["source"], replay["events_produced"], replay["strategy"]) == ("ysb", "5000", "hash")


def test_round_robin_zipf_backfill(stack_settings, topic, read_topic, tmp_path) -> None:
    settings = stack_settings.model_copy(update={"runs_dir": tmp_path})
    result = generate_ysb(
        settings, topic, rate=2_000.0, duration=1.0, seed=3, zipf=1.0, strategy="round_robin",
        start_ms=START_MS, run_id="it2", progress=False,
    )
    events = read_events(read_topic, topic)
    assert len(events) == result.replay.events_produced == 2_000
    assert (events["partition"] == events["event_id"] % PARTITIONS).all()  # whatever the campaign
    assert result.replay.per_partition == {p: 500 for p in range(PARTITIONS)}
    ad_campaign = campaign_map(100, 10, 3).ad_campaign()
    assert (events["key"] == events["ad_id"].map(ad_campaign)).all()
    assert events["key"].value_counts().iloc[0] > 5 * 2_000 / 100  # Zipf: the top campaign far above its even share
    expected = pd.read_parquet(result.run_dir / "expected_views.parquet")
    recounted = count_views(events.assign(campaign_id=events["key"]))
    pd.testing.assert_frame_equal(expected, recounted, check_dtype=False)


def test_wall_clock_run_stamps_its_send_time(stack_settings, topic, read_topic, tmp_path) -> None:
    settings = stack_settings.model_copy(update={"runs_dir": tmp_path})
    before_ms = int(time.time() * 1000)
    result = generate_ysb(settings, topic, rate=500.0, duration=1.0, run_id="it3", progress=False)
    after_ms = int(time.time() * 1000)
    events = read_events(read_topic, topic)
    assert result.wall_clock and len(events) == 500
    assert before_ms <= result.start_ms <= events["event_time"].min() and events["event_time"].max() <= after_ms
    assert after_ms - before_ms >= 900  # paced: 500 events at 500 events/s take about a second
    # each record is sent near its event time (the token bucket allows 0.1 s ahead; 2 s of slack behind)
    assert (events["timestamp"] - events["event_time"]).between(-200, 2_000).all()


def test_learned_least_count_learns_from_the_runs_head_and_places_by_it(stack_settings, topic, read_topic, tmp_path) -> None:
    settings = stack_settings.model_copy(update={"runs_dir": tmp_path})
    result = generate_ysb(
        settings, topic, rate=5_000.0, duration=1.0, seed=9, zipf=1.0, strategy="least_count",
        start_ms=START_MS, run_id="it4", progress=False,
    )
    published = AssignmentStore.from_settings(stack_settings, topic)
    try:
        assert (result.replay.strategy, result.replay.epoch) == ("least_count", published.epoch()) and published.epoch() >= 1
        events = read_events(read_topic, topic)
        assert (events["partition"] == events["key"].map(published.slot_of)).all()  # placed by the published map
        summary = json.loads((result.run_dir / "ysb.json").read_text())
        assert summary["learned_from_events"] == 500  # 10 % of the run's 5,000 events
        # the same events by Kafka's hash: least_count, learned from the skewed head, balances better
        learned_loads = events["partition"].value_counts().reindex(range(PARTITIONS), fill_value=0)
        hashed = HashStrategy(partitions=PARTITIONS)
        hash_loads = events["key"].map(hashed.slot_of).value_counts().reindex(range(PARTITIONS), fill_value=0)
        assert learned_loads.min() / learned_loads.max() > hash_loads.min() / hash_loads.max()
    finally:
        published.delete()
