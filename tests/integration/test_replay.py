"""Replay real flights into the real broker and read them back (needs `keyshift stack up`)."""

from __future__ import annotations

import json
import uuid
from collections import Counter, defaultdict

import pytest
import redis
from kafka import KafkaProducer

from keyshift.data.flights import fetch_flights, flights_path
from keyshift.data.replay import check_growth, read_replay_record, replay_flights
from keyshift.errors import ConfigurationError, StackError
from keyshift.names import redis_replay_key
from keyshift.placement.assignment_store import AssignmentStore
from keyshift.placement.learning import learn_and_publish, learning_counts
from keyshift.placement.kafka_partitioner import KafkaPartitioner
from keyshift.placement.strategies import LeastCountStrategy, strategy_by_name
from keyshift.settings import Settings
from keyshift.topics import create_topics, delete_topics, end_of_input_marker, end_offsets

pytestmark = pytest.mark.integration

PARTITIONS = 8
EVENTS = 10_000


@pytest.fixture(scope="module")
def settings() -> Settings:
    settings = Settings()
    fetch_flights(settings)  # reuses the verified cached copy that `make setup` fetched
    return settings


@pytest.fixture
def topic(settings: Settings):
    name = f"keyshift-it-replay-{uuid.uuid4().hex[:8]}"
    create_topics(settings, [name], PARTITIONS)
    yield name
    delete_topics(settings, [name])
    redis.Redis.from_url(settings.redis_url).delete(redis_replay_key(name))
    AssignmentStore.from_settings(settings, name).delete()


def consume_all(read_topic, topic: str) -> list[tuple[int, int, bytes, dict]]:
    """Every record of the topic as (partition, offset, key, value parsed from JSON)."""
    return [(r.partition, r.offset, r.key, json.loads(r.value)) for r in read_topic(topic)]


@pytest.mark.parametrize("workers", [1, 2])
def test_replayed_flights_land_on_their_hash_slot_in_event_time_order(
    settings: Settings, topic: str, workers: int, read_topic
) -> None:
    result = replay_flights(settings, topic, limit=EVENTS, progress=False, workers=workers)
    assert result.events_produced == EVENTS
    assert result.partitions == PARTITIONS
    assert result.workers == workers

    records = consume_all(read_topic, topic)
    assert len(records) == EVENTS
    hash_slot = strategy_by_name("hash", PARTITIONS).slot_of
    for partition, _, key, value in records:
        assert key == value["origin"].encode("utf-8")
        assert partition == hash_slot(value["origin"])
    # every event exactly once, ids 0..N-1
    assert sorted(value["event_id"] for *_, value in records) == list(range(EVENTS))
    # counts per partition agree with the result, the end offsets and Redis
    counted = Counter(partition for partition, *_ in records)
    assert dict(counted) == {p: c for p, c in result.per_partition.items() if c}
    assert result.end_offsets == {p: result.per_partition[p] for p in range(PARTITIONS)}
    stored = read_replay_record(settings, topic)
    assert stored["events_produced"] == EVENTS
    assert stored["end_offsets"] == result.end_offsets
    assert stored["finished_at"]
    # within a partition, offsets follow the file: event time never decreases, event ids grow
    by_partition = defaultdict(list)
    for partition, offset, _, value in sorted(records, key=lambda r: (r[0], r[1])):
        by_partition[partition].append(value)
    for values in by_partition.values():
        times = [v["event_time"] for v in values]
        ids = [v["event_id"] for v in values]
        assert times == sorted(times)
        assert ids == sorted(ids)


def test_kafka_partitioner_adapter_places_like_kafka_pythons_default(settings: Settings, topic: str) -> None:
    keys = [f"key-{i}".encode() for i in range(500)] + ["Zürich".encode(), b"ORD", b"ATL"]
    ours = KafkaProducer(
        bootstrap_servers=settings.bootstrap_servers, partitioner=KafkaPartitioner(strategy_by_name("hash", PARTITIONS))
    )
    theirs = KafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    try:
        for key in keys:
            placed = ours.send(topic, key=key, value=b"ours").get(timeout=30).partition
            assert placed == theirs.send(topic, key=key, value=b"theirs").get(timeout=30).partition
    finally:
        ours.close()
        theirs.close()


def test_learned_least_count_replays_through_the_published_assignment(settings: Settings, topic: str, read_topic) -> None:
    learned = learn_and_publish(settings, topic, "least_count", PARTITIONS, limit=EVENTS, flights=flights_path(settings))
    result = replay_flights(settings, topic, limit=EVENTS, strategy="least_count", progress=False, workers=2)
    assert (result.strategy, result.epoch) == ("least_count", learned.epoch)
    mapping = AssignmentStore.from_settings(settings, topic).snapshot()["mapping"]  # incl. keys placed since
    records = consume_all(read_topic, topic)
    assert len(records) == EVENTS
    for partition, _, key, value in records:
        assert partition == mapping[value["origin"]], value


def test_hot_split_replay_places_split_keys_per_event(settings: Settings, topic: str, read_topic) -> None:
    """Every record of a split key lands on slots[event_id % k], the rule the job uses."""
    counts, _ = learning_counts(flights_path(settings), 1.0, EVENTS)
    base = LeastCountStrategy.from_counts(counts, PARTITIONS)
    hottest = sorted(counts, key=lambda k: -counts[k])[:2]
    first = base.assignment[hottest[0]]
    second = base.assignment[hottest[1]]
    split = {
        hottest[0]: (first, (first + 3) % PARTITIONS, (first + 5) % PARTITIONS),  # three pieces
        hottest[1]: (second, (second + 1) % PARTITIONS),  # two pieces
    }
    epoch = AssignmentStore.from_settings(settings, topic).publish(
        "hot_split", PARTITIONS, base.assignment, base.loads, split=split
    )
    result = replay_flights(settings, topic, limit=EVENTS, strategy="hot_split", progress=False, workers=2)
    assert (result.strategy, result.epoch, result.events_produced) == ("hot_split", epoch, EVENTS)
    assert result.split_keys == {key: list(slots) for key, slots in sorted(split.items())}
    assert read_replay_record(settings, topic)["split_keys"] == result.split_keys
    records = consume_all(read_topic, topic)
    assert sorted(value["event_id"] for *_, value in records) == list(range(EVENTS))
    seen_slots: dict[str, set[int]] = defaultdict(set)
    for partition, _, key, value in records:
        origin, event_id = value["origin"], value["event_id"]
        assert key == origin.encode("utf-8")
        slots = split.get(origin, (base.assignment[origin],))
        assert partition == slots[event_id % len(slots)], (origin, event_id, partition)
        seen_slots[origin].add(partition)
    for origin, slots in split.items():
        assert seen_slots[origin] == set(slots)  # every piece received records
    assert dict(Counter(p for p, *_ in records)) == {p: c for p, c in result.per_partition.items() if c}
    # order within a partition still follows the file for the split keys' pieces
    by_partition = defaultdict(list)
    for partition, offset, _, value in sorted(records, key=lambda r: (r[0], r[1])):
        by_partition[partition].append(value["event_id"])
    assert all(ids == sorted(ids) for ids in by_partition.values())


@pytest.mark.parametrize(
    ("published", "wanted", "message"),
    [
        (None, "least_count", "no least_count assignment is published for topic"),  # nothing published
        (("least_key", PARTITIONS), "least_count", "is least_key over 8 slots"),  # another strategy
        (("hot_split", 4), "hot_split", "is hot_split over 4 slots"),  # another P
    ],
)
def test_learned_replay_without_a_matching_assignment_names_the_fix(
    settings: Settings, topic: str, published, wanted: str, message: str
) -> None:
    if published is not None:
        AssignmentStore.from_settings(settings, topic).publish(published[0], published[1], {"ORD": 0})
    with pytest.raises(ConfigurationError, match=message) as info:
        replay_flights(settings, topic, limit=10, strategy=wanted, progress=False)
    assert f"keyshift topics create --strategy {wanted} --partitions {PARTITIONS} {topic}" in str(info.value)
    assert end_offsets(settings, topic) == {p: 0 for p in range(PARTITIONS)}  # nothing was produced


def test_growth_check_counts_a_bounded_runs_markers_but_not_another_writers_records(settings: Settings, topic: str) -> None:
    # a bounded run reading the topic while it is fed writes end-of-input markers into it once
    # its limit's offsets are there (issue 33); the replay's growth check must not call them
    # another writer, but must still catch a real one
    before = end_offsets(settings, topic)
    sent = {p: 2 if p in (0, 3) else 0 for p in range(PARTITIONS)}
    producer = KafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    try:
        for p in (0, 3):
            producer.send(topic, key=b"ORD", value=b'{"event": 1}', partition=p)
            producer.send(topic, value=end_of_input_marker("run-x", 253_402_300_799_000), partition=p)
            producer.send(topic, key=b"ORD", value=b'{"event": 2}', partition=p)
        producer.flush()
        check_growth(topic, before, end_offsets(settings, topic), sent, settings)  # markers not counted
        with pytest.raises(StackError, match="grew by"):
            check_growth(topic, before, end_offsets(settings, topic), sent)  # without reading back
        producer.send(topic, key=b"ATL", value=b'{"other": "writer"}', partition=3).get(timeout=30)
        with pytest.raises(StackError, match=r"another producer wrote to the topic.*") as info:
            check_growth(topic, before, end_offsets(settings, topic), sent, settings)
        assert "3: 3" in str(info.value)
    finally:
        producer.close()
