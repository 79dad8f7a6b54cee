"""Sampling the real Kafka topic: the records that arrived since the previous evaluation.

The scheduled monitor evaluates what actually flows: it reads the topic's beginning and end
offsets (`read_offsets`), takes the records that arrived since the end offsets of the previous
evaluation (`keyshift.monitoring.loads.arrival_ranges`), bounded by a maximum number of events
(the most recent ones, shared among partitions in proportion: `loads.bounded_ranges`), and
offers each record's key to a `Sampler` (every n-th event or a seeded fraction). The key is the
Kafka record key (the replay keys flights by `origin`); records without a key are counted and
left out.

Keys are offered partition by partition in offset order (not in poll order), so the same ranges
and the same sampler keep the same events. kafka-python reads without a consumer group, so the
monitor commits nothing and disturbs no consumer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from keyshift.errors import ConfigurationError, StackError
from keyshift.monitoring.sampling import Sampler
from keyshift.settings import Settings
from keyshift.stack.kafka import broker_unreachable, check_broker
from keyshift.topics import kafka_config

log = logging.getLogger(__name__)

CLIENT_ID = "keyshift-monitor"


@dataclass(frozen=True)
class TopicOffsets:
    """Offsets of every partition of a topic at one moment.

    Attributes:
        beginning: partition -> offset of the oldest record still held.
        end: partition -> offset the next record will get (records ever written, for a topic
            never truncated).
    """

    beginning: dict[int, int]
    end: dict[int, int]


@dataclass(frozen=True)
class TopicSample:
    """What `sample_topic` read.

    Attributes:
        ranges: partition -> (start, end) offsets read.
        read: records read (events). unkeyed: records without a key (not offered to the sampler).
    """

    ranges: dict[int, tuple[int, int]]
    read: int
    unkeyed: int


def _consumer(settings: Settings) -> KafkaConsumer:
    check_broker(settings)
    try:
        return KafkaConsumer(
            **kafka_config(settings, CLIENT_ID),
            group_id=None,
            enable_auto_commit=False,
            allow_auto_create_topics=False,
            auto_offset_reset="earliest",  # a start below the oldest record held reads from there
            max_poll_records=5000,
        )
    except KafkaError as exc:
        raise broker_unreachable(settings, exc) from exc


def read_offsets(settings: Settings, topic: str, timeout_s: float = 30.0) -> TopicOffsets:
    """The beginning and end offsets of every partition of `topic`.

    Raises:
        ConfigurationError: the topic does not exist (create it with `keyshift topics create`).
        StackError: the broker is unreachable or does not answer within `timeout_s` seconds.
    """
    consumer = _consumer(settings)
    try:
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            raise ConfigurationError(f"topic {topic!r} does not exist; create it with `keyshift topics create {topic}`")
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        timeout_ms = int(timeout_s * 1000)
        beginning = consumer.beginning_offsets(tps, timeout_ms=timeout_ms)
        end = consumer.end_offsets(tps, timeout_ms=timeout_ms)
    except KafkaError as exc:
        raise StackError(f"cannot read the offsets of {topic!r}: {exc}") from exc
    finally:
        consumer.close()
    return TopicOffsets({tp.partition: o for tp, o in sorted(beginning.items())}, {tp.partition: o for tp, o in sorted(end.items())})


def sample_topic(
    settings: Settings, topic: str, ranges: Mapping[int, tuple[int, int]], sampler: Sampler, timeout_s: float = 120.0
) -> TopicSample:
    """Read the records of `ranges` from `topic` and offer their keys to `sampler`.

    Args:
        settings: where the broker is.
        topic: the topic to read.
        ranges: partition -> (start, end) offsets to read, end exclusive (e.g. the bounded
            `arrival_ranges`); a start below the partition's beginning offset reads from there.
        sampler: receives one key per keyed record, partition by partition in offset order.
        timeout_s: seconds allowed for the whole read.

    Returns:
        A `TopicSample`; the sampler holds the sampled counts.

    Raises:
        StackError: the broker is unreachable, or the records are not all read within `timeout_s`
            (the message names the partitions and offsets still missing).
    """
    wanted = {TopicPartition(topic, p): (start, end) for p, (start, end) in sorted(ranges.items()) if end > start}
    keys: dict[int, list[str]] = {tp.partition: [] for tp in wanted}
    unkeyed = read = 0
    if wanted:
        consumer = _consumer(settings)
        try:
            consumer.assign(list(wanted))
            for tp, (start, _) in wanted.items():
                consumer.seek(tp, start)
            pending = set(wanted)
            deadline = time.monotonic() + timeout_s
            while pending:
                if time.monotonic() > deadline:
                    missing = {tp.partition: (consumer.position(tp), wanted[tp][1]) for tp in pending}
                    raise StackError(f"read of {topic!r} timed out after {timeout_s:.0f} s; partition -> (position, end) still missing: {missing}")
                for tp, records in consumer.poll(timeout_ms=1000).items():
                    end = wanted[tp][1]
                    for record in records:
                        if record.offset >= end:
                            break
                        read += 1
                        if record.key is None:
                            unkeyed += 1
                        else:
                            keys[tp.partition].append(record.key.decode("utf-8", errors="replace"))
                for tp in list(pending):
                    if consumer.position(tp) >= wanted[tp][1]:
                        pending.discard(tp)
                        consumer.pause(tp)
        except KafkaError as exc:
            raise StackError(f"cannot read {topic!r}: {exc}") from exc
        finally:
            consumer.close()
    for partition in sorted(keys):
        if keys[partition]:
            sampler.offer_batch(keys[partition])
    if unkeyed:
        log.warning("%d of %d records of %r had no key and were not sampled", unkeyed, read, topic)
    log.info("read %d records of %r (%s); sampled %d of %d offered", read, topic, dict(ranges), sampler.sampled, sampler.seen)
    return TopicSample({p: tuple(r) for p, r in ranges.items()}, read, unkeyed)
