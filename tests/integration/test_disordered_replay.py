"""Replay flights with event-time disorder into the real broker and read them back (needs `keyshift stack up`).

What Kafka holds plus the replay's Redis record must be enough to check everything: each
partition holds its records in the plan's arrival order (true time + the origin's delay, ties by
event id), every origin keeps its own order, every flight is there once, written event times are
the true ones shifted by the origin's clock offset (so windows recomputed from Kafka agree with
the file and the record), and the out-of-order fraction of the arrival order is the recorded one.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter, defaultdict

import numpy as np
import pytest
import redis

from keyshift.data.disorder import out_of_order_fraction
from keyshift.data.flights import fetch_flights, flights_path
from keyshift.data.replay import encode_values, event_time_ms, iter_flight_batches, read_replay_record, replay_flights
from keyshift.errors import ConfigurationError
from keyshift.names import redis_replay_key
from keyshift.placement.strategies import strategy_by_name
from keyshift.settings import Settings
from keyshift.topics import create_topics, delete_topics, end_offsets

pytestmark = pytest.mark.integration

PARTITIONS = 8
EVENTS = 20_000
HOUR_MS = 3_600_000


@pytest.fixture(scope="module")
def settings() -> Settings:
    settings = Settings()
    fetch_flights(settings)  # reuses the verified cached copy that `make setup` fetched
    return settings


@pytest.fixture(scope="module")
def flights(settings: Settings) -> dict[str, np.ndarray]:
    """The first EVENTS flights of the file: true event time (ms) and origin, by event id."""
    batches = [batch for _, batch in iter_flight_batches(flights_path(settings), limit=EVENTS)]
    return {
        "time": np.concatenate([event_time_ms(b.column("date")) for b in batches]),
        "origin": np.array([o for b in batches for o in b.column("origin").to_pylist()], dtype=object),
    }


@pytest.fixture
def topic(settings: Settings):
    name = f"keyshift-it-disorder-{uuid.uuid4().hex[:8]}"
    create_topics(settings, [name], PARTITIONS)
    yield name
    delete_topics(settings, [name])
    redis.Redis.from_url(settings.redis_url).delete(redis_replay_key(name))


def by_partition(records) -> dict[int, list[tuple[bytes, dict]]]:
    """partition -> [(key, value parsed), ...] in offset order."""
    out: dict[int, list[tuple[bytes, dict]]] = defaultdict(list)
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        out[record.partition].append((record.key, json.loads(record.value)))
    return out


@pytest.mark.parametrize(
    ("workers", "clock_skew", "rate"),
    [
        (2, 120.0, None),  # two producer processes, skewed clocks, as fast as it goes
        (1, 0.0, 10_000.0),  # one process paced at 10,000 events/s in arrival order, exact clocks
    ],
)
def test_disordered_replay_is_recomputable_from_kafka_and_the_record(
    settings: Settings, topic: str, flights, read_topic, workers: int, clock_skew: float, rate: float | None
) -> None:
    result = replay_flights(
        settings, topic, limit=EVENTS, rate=rate, workers=workers, progress=False,
        disorder=0.5, source_delay=600, clock_skew=clock_skew, seed=7,
    )
    plan = result.disorder
    assert result.events_produced == EVENTS and result.workers == workers
    assert plan is not None and plan.events == EVENTS and abs(plan.out_of_order - 0.5) < 0.01

    # the record says what was done
    stored = read_replay_record(settings, topic)
    assert (stored["disorder"], stored["source_delay_s"], stored["clock_skew_s"], stored["seed"]) == (
        0.5, 600.0, clock_skew, 7,
    )
    assert (stored["out_of_order"], stored["out_of_order_events"]) == (plan.out_of_order, plan.out_of_order_events)
    late = stored["late_sources"]
    assert late == {s: {"delay_ms": plan.delay_ms[s], "offset_ms": plan.offset_ms[s]} for s in plan.delay_ms}

    partitions = by_partition(read_topic(topic))
    values = [value for records in partitions.values() for _, value in records]
    # every flight once, with its own origin, on its hash slot
    assert sorted(v["event_id"] for v in values) == list(range(EVENTS))
    hash_slot = strategy_by_name("hash", PARTITIONS).slot_of
    for partition, records in partitions.items():
        for key, value in records:
            assert key == value["origin"].encode("utf-8") == flights["origin"][value["event_id"]].encode("utf-8")
            assert partition == hash_slot(value["origin"])
    assert {p: len(r) for p, r in partitions.items()} == {p: c for p, c in result.per_partition.items() if c}

    # written event_time = true time + the origin's clock offset (0 on time)
    def offset(origin: str) -> int:
        return late.get(origin, {}).get("offset_ms", 0)

    def delay(origin: str) -> int:
        return late.get(origin, {}).get("delay_ms", 0)

    for value in values:
        assert value["event_time"] == flights["time"][value["event_id"]] + offset(value["origin"])
    if clock_skew:
        assert any(spec["offset_ms"] for spec in late.values())
    # so hourly windows per origin recomputed from Kafka = the file's, shifted by the record
    from_kafka = Counter((v["origin"], v["event_time"] // HOUR_MS) for v in values)
    from_file = Counter(
        (o, (t + offset(o)) // HOUR_MS) for o, t in zip(flights["origin"].tolist(), flights["time"].tolist())
    )
    assert from_kafka == from_file

    # the arrival order, recomputed from Kafka + the record: (true time + delay, event id)
    def arrival(value: dict) -> tuple[int, int]:
        origin = value["origin"]
        return value["event_time"] - offset(origin) + delay(origin), value["event_id"]

    for records in partitions.values():
        keys = [arrival(value) for _, value in records]
        assert keys == sorted(keys)  # each partition in arrival order
        per_origin: dict[str, list[dict]] = defaultdict(list)
        for _, value in records:
            per_origin[value["origin"]].append(value)
        for own in per_origin.values():  # each origin in its own order
            assert [v["event_id"] for v in own] == sorted(v["event_id"] for v in own)
            assert [v["event_time"] for v in own] == sorted(v["event_time"] for v in own)
    arrived = sorted(values, key=arrival)
    written = np.array([v["event_time"] for v in arrived], dtype=np.int64)
    assert out_of_order_fraction(written) == stored["out_of_order"]
    # the file order, read the same way, has none: the disorder is the replay's
    assert out_of_order_fraction(flights["time"]) == 0.0


def test_disorder_zero_replays_the_file_and_clears_an_earlier_plan(settings: Settings, topic: str, read_topic) -> None:
    first = replay_flights(settings, topic, limit=2_000, disorder=0.25, seed=1, progress=False, workers=1)
    assert first.disorder is not None and read_replay_record(settings, topic)["late_sources"]
    result = replay_flights(settings, topic, limit=5_000, disorder=0.0, progress=False, workers=2)
    assert result.disorder is None
    stored = read_replay_record(settings, topic)
    assert (stored["disorder"], stored["out_of_order"], stored["late_sources"], stored["seed"]) == (0.0, 0.0, {}, None)

    # the second replay's records are byte for byte the file order of before
    batches = [batch for _, batch in iter_flight_batches(flights_path(settings), limit=5_000)]
    expected: dict[int, list[bytes]] = defaultdict(list)
    hash_slot = strategy_by_name("hash", PARTITIONS).slot_of
    first_id = 0
    for batch in batches:
        for origin, value in zip(
            batch.column("origin").to_pylist(), encode_values(batch, np.arange(first_id, first_id + batch.num_rows))
        ):
            expected[hash_slot(origin)].append(value)
        first_id += batch.num_rows
    start = {int(p): offset for p, offset in json.loads(stored["start_offsets"]).items()}
    assert start == first.end_offsets  # the second replay follows the first
    got: dict[int, list[bytes]] = defaultdict(list)
    for record in sorted(read_topic(topic), key=lambda r: (r.partition, r.offset)):
        if record.offset >= start[record.partition]:
            got[record.partition].append(record.value)
    assert got == expected


def test_a_disorder_out_of_reach_is_refused_before_anything_is_produced(settings: Settings, topic: str) -> None:
    with pytest.raises(ConfigurationError, match="cannot be reached .* raise --source-delay"):
        replay_flights(settings, topic, limit=EVENTS, disorder=0.5, source_delay=30, progress=False)
    assert end_offsets(settings, topic) == {p: 0 for p in range(PARTITIONS)}
    assert read_replay_record(settings, topic) is None
