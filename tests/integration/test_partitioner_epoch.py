"""A long-lived producer follows a newly published assignment (real Kafka and Redis; `keyshift stack up`)."""

from __future__ import annotations

import time
import uuid

import pytest
from kafka import KafkaProducer

from keyshift.placement.assignment_store import AssignmentStore, CachedAssignment
from keyshift.placement.kafka_partitioner import KafkaPartitioner
from keyshift.settings import Settings
from keyshift.topics import create_topics, delete_topics, end_offsets

pytestmark = pytest.mark.integration

PARTITIONS = 8
POLL_SECONDS = 0.2


@pytest.fixture
def topic(settings: Settings):
    name = f"keyshift-it-epoch-{uuid.uuid4().hex[:8]}"
    create_topics(settings, [name], PARTITIONS)
    yield name
    delete_topics(settings, [name])
    AssignmentStore.from_settings(settings, name).delete()


def test_producer_follows_a_new_epoch_without_restart(settings: Settings, topic: str, read_topic) -> None:
    store = AssignmentStore.from_settings(settings, topic)
    assert store.publish("least_count", PARTITIONS, {"ORD": 2, "ATL": 6}, [0, 0, 20, 0, 0, 0, 10, 0]) == 1
    partitioner = KafkaPartitioner(CachedAssignment(store, poll_seconds=POLL_SECONDS))
    producer = KafkaProducer(bootstrap_servers=settings.bootstrap_servers, acks="all", partitioner=partitioner)
    try:
        first = [producer.send(topic, key=key, value=b"epoch-1") for key in [b"ORD"] * 20 + [b"ATL"] * 10]
        producer.flush()
        assert {f.get(timeout=30).partition for f in first[:20]} == {2}
        assert {f.get(timeout=30).partition for f in first[20:]} == {6}
        assert end_offsets(settings, topic) == {p: {2: 20, 6: 10}.get(p, 0) for p in range(PARTITIONS)}

        # a new assignment moves ORD from slot 2 to slot 5; the producer keeps running
        assert store.publish("least_count", PARTITIONS, {"ORD": 5, "ATL": 6}, [0, 0, 0, 0, 0, 20, 10, 0]) == 2
        time.sleep(POLL_SECONDS * 1.5)  # one poll interval: the view sees epoch 2 on its next use
        second = [producer.send(topic, key=key, value=b"epoch-2") for key in [b"ORD"] * 20 + [b"ATL"] * 5 + [b"NEW"] * 3]
        producer.flush()
        assert partitioner.epoch == 2
        assert {f.get(timeout=30).partition for f in second[:20]} == {5}
        assert {f.get(timeout=30).partition for f in second[20:25]} == {6}
        new_slot = store.slot_of("NEW")  # placed once by the atomic assign under epoch 2
        assert new_slot is not None and {f.get(timeout=30).partition for f in second[25:]} == {new_slot}
    finally:
        producer.close()

    expected = {2: 20, 5: 20, 6: 15}
    expected[new_slot] = expected.get(new_slot, 0) + 3
    assert end_offsets(settings, topic) == {p: expected.get(p, 0) for p in range(PARTITIONS)}
    placed: dict[tuple[bytes, bytes], set[int]] = {}
    for record in read_topic(topic):
        placed.setdefault((record.key, record.value), set()).add(record.partition)
    assert placed == {
        (b"ORD", b"epoch-1"): {2},
        (b"ATL", b"epoch-1"): {6},
        (b"ORD", b"epoch-2"): {5},
        (b"ATL", b"epoch-2"): {6},
        (b"NEW", b"epoch-2"): {new_slot},
    }
