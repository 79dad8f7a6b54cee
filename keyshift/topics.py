"""Kafka topic provisioning: create (idempotently), describe, read end offsets, delete; and the
end-of-input marker, the one control record keyshift writes into an input topic.

Topic names are defined once in `keyshift.names` (`FLIGHT_TOPICS`); this module takes names as
arguments and never spells one. All calls go to the broker at `settings.bootstrap_servers`
through kafka-python's `KafkaAdminClient` / `KafkaConsumer`, with the security options of
`keyshift.kafka_clients` (`kafka_config` holds them for every client keyshift builds here).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.errors import KafkaError, TopicAlreadyExistsError

from keyshift.errors import ConfigurationError, StackError
from keyshift.names import END_OF_INPUT_PREFIX
from keyshift.kafka_clients import client_options
from keyshift.settings import Settings
from keyshift.stack.kafka import broker_unreachable, check_broker

log = logging.getLogger(__name__)

BOOTSTRAP_TIMEOUT_MS = 10_000
"""How long a client waits for the first broker connection before keyshift reports it down."""

_LEGAL_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


def end_of_input_marker(run_id: str, event_time_ms: int) -> bytes:
    """The value of an end-of-input marker for `run_id` (see `END_OF_INPUT_PREFIX`).

    Args:
        run_id: the run whose watermark the marker moves.
        event_time_ms: the marker's event time, ms since the epoch (UTC).

    Returns:
        The UTF-8 JSON value, bytes, starting with `END_OF_INPUT_PREFIX`.
    """
    return (END_OF_INPUT_PREFIX + f', "run_id": {json.dumps(run_id)}, "event_time": {int(event_time_ms)}}}').encode()


@dataclass(frozen=True)
class TopicInfo:
    """What the broker reports about one topic.

    Attributes:
        name: topic name.
        partitions: partition count P.
        replication: replicas per partition (of partition 0).
        leaders: partition id -> broker id of its leader (-1 while none is elected).
    """

    name: str
    partitions: int
    replication: int
    leaders: dict[int, int]


def kafka_config(settings: Settings, client_id: str) -> dict[str, object]:
    """Common kafka-python client settings: bootstrap servers, client id, bootstrap timeout (ms),
    and the security options of `keyshift.kafka_clients.client_options` (SASL/PLAIN when on).

    Raises:
        ConfigurationError: for half-set SASL credentials.
    """
    return {
        "bootstrap_servers": settings.bootstrap_servers,
        "client_id": client_id,
        "bootstrap_timeout_ms": BOOTSTRAP_TIMEOUT_MS,
        **client_options(settings),
    }


@contextmanager
def admin_client(settings: Settings) -> Iterator[KafkaAdminClient]:
    """A connected `KafkaAdminClient`, closed on exit.

    Raises:
        StackError: if nothing listens at the broker's address, no broker answers within
            `BOOTSTRAP_TIMEOUT_MS`, or it refuses the SASL login.
    """
    check_broker(settings)
    try:
        admin = KafkaAdminClient(**kafka_config(settings, "keyshift-admin"))
    except KafkaError as exc:
        raise broker_unreachable(settings, exc) from exc
    try:
        yield admin
    finally:
        admin.close()


def check_topic_names(names: Iterable[str]) -> list[str]:
    """Validate topic names (Kafka's rule: 1..249 characters from `[a-zA-Z0-9._-]`).

    Returns:
        The names as a list, duplicates removed, order kept.

    Raises:
        ConfigurationError: if no name is given or a name is illegal (the message names it).
    """
    unique = list(dict.fromkeys(names))
    if not unique:
        raise ConfigurationError("no topic names given")
    for name in unique:
        if not isinstance(name, str) or not _LEGAL_NAME.match(name) or name in {".", ".."}:
            raise ConfigurationError(f"illegal Kafka topic name {name!r}: use 1..249 characters of [a-zA-Z0-9._-]")
    return unique


def _describe(admin: KafkaAdminClient, names: list[str] | None) -> dict[str, TopicInfo]:
    """Describe existing topics among `names` (all topics when None); absent ones are left out."""
    found: dict[str, TopicInfo] = {}
    for topic in admin.describe_topics(names):
        if topic.get("error_code", 0) != 0 or not topic.get("partitions"):
            continue
        parts = sorted(topic["partitions"], key=lambda p: p["partition_index"])
        found[topic["name"]] = TopicInfo(
            name=topic["name"],
            partitions=len(parts),
            replication=len(parts[0].get("replica_nodes") or []),
            leaders={p["partition_index"]: p.get("leader_id", -1) for p in parts},
        )
    return found


def _wait(condition, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            raise StackError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.1)


def create_topics(
    settings: Settings,
    names: Iterable[str],
    partitions: int,
    replication: int | None = None,
    recreate: bool = False,
    timeout_s: float = 30.0,
) -> dict[str, str]:
    """Create topics with P partitions, idempotently; return what happened to each.

    An existing topic with P partitions is left as it is (`"exists"`). An existing topic with
    another partition count is an error, unless `recreate`. With `recreate`, every existing topic
    among `names` is deleted (its records are lost), keyshift waits until the broker no longer
    lists it, and creates it again (`"recreated"`). New topics are `"created"`; keyshift returns
    only once every partition of every topic has a leader.

    Args:
        settings: where the broker is (`settings.bootstrap_servers`).
        names: topic names (e.g. `keyshift.names.FLIGHT_TOPICS`).
        partitions: P >= 1, partitions per topic (the number of slots).
        replication: replicas per partition, >= 1; None: the stack's (`Settings.kafka_replication`:
            1 on one broker, 3 on three; `min.insync.replicas` is the brokers' default).
        recreate: delete and create again topics that already exist.
        timeout_s: seconds to wait for deletion and for leaders, each.

    Returns:
        name -> `"created"`, `"exists"` or `"recreated"`, in the order given.

    Raises:
        ConfigurationError: illegal names, P < 1, replication < 1, or an existing topic with a
            different partition count and `recreate` False (the message says how to fix it).
        StackError: the broker is unreachable, refuses a request, or a wait times out.
    """
    names = check_topic_names(names)
    if replication is None:
        replication = settings.kafka_replication[0]
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise ConfigurationError(f"partitions must be an int >= 1, got {partitions!r}")
    if isinstance(replication, bool) or not isinstance(replication, int) or replication < 1:
        raise ConfigurationError(f"replication must be an int >= 1, got {replication!r}")
    outcome: dict[str, str] = {}
    with admin_client(settings) as admin:
        try:
            existing = _describe(admin, names)
            if not recreate:
                wrong = {n: t.partitions for n, t in existing.items() if t.partitions != partitions}
                if wrong:
                    listed = ", ".join(f"{n} has {p}" for n, p in wrong.items())
                    raise ConfigurationError(
                        f"topics exist with another partition count ({listed}; wanted {partitions}); "
                        "pass --recreate (recreate=True) to delete and create them again, losing their records"
                    )
                for name in existing:
                    outcome[name] = "exists"
                    log.info("topic %s exists with %d partitions", name, partitions)
            else:
                _delete(admin, list(existing), timeout_s)
            missing = [n for n in names if n not in outcome]
            if missing:
                _create(admin, missing, partitions, replication, timeout_s)
                for name in missing:
                    outcome[name] = "recreated" if name in existing else "created"
                    log.info("topic %s %s with %d partitions", name, outcome[name], partitions)
                _wait(
                    lambda: _all_led(admin, missing, partitions),
                    f"leaders of {', '.join(missing)}",
                    timeout_s,
                )
        except KafkaError as exc:
            raise StackError(f"Kafka refused to provision topics {names}: {exc}") from exc
    return {name: outcome[name] for name in names}


def _create(admin: KafkaAdminClient, names: list[str], partitions: int, replication: int, timeout_s: float) -> None:
    """Create topics, retrying while a just-deleted topic of the same name is still going away."""
    deadline = time.monotonic() + timeout_s
    spec = {"num_partitions": partitions, "replication_factor": replication}
    pending = list(names)
    while pending:
        try:
            admin.create_topics({name: spec for name in pending}, timeout_ms=int(timeout_s * 1000))
            return
        except TopicAlreadyExistsError:
            if time.monotonic() >= deadline:
                raise
            pending = [n for n in pending if n not in _describe(admin, pending)]
            time.sleep(0.2)


def _all_led(admin: KafkaAdminClient, names: list[str], partitions: int) -> bool:
    found = _describe(admin, names)
    return all(
        name in found and found[name].partitions == partitions and min(found[name].leaders.values()) >= 0
        for name in names
    )


def _delete(admin: KafkaAdminClient, names: list[str], timeout_s: float) -> None:
    """Delete topics and wait until the broker no longer lists them."""
    if not names:
        return
    log.info("deleting topics %s", ", ".join(names))
    admin.delete_topics(names, timeout_ms=int(timeout_s * 1000))
    _wait(lambda: not set(names) & set(admin.list_topics()), f"deletion of {', '.join(names)}", timeout_s)


def delete_topics(settings: Settings, names: Iterable[str], timeout_s: float = 30.0) -> list[str]:
    """Delete those of `names` that exist and wait until they are gone; return the deleted ones.

    Raises:
        ConfigurationError: illegal names.
        StackError: the broker is unreachable, refuses, or the wait times out.
    """
    names = check_topic_names(names)
    with admin_client(settings) as admin:
        try:
            existing = [n for n in names if n in set(admin.list_topics())]
            _delete(admin, existing, timeout_s)
        except KafkaError as exc:
            raise StackError(f"Kafka refused to delete topics {names}: {exc}") from exc
    return existing


def describe_topics(settings: Settings, names: Iterable[str] | None = None) -> dict[str, TopicInfo]:
    """Describe topics: `names` that exist, or every non-internal topic when `names` is None.

    Returns:
        name -> `TopicInfo`, sorted by name; topics that do not exist are left out.

    Raises:
        ConfigurationError: illegal names.
        StackError: the broker is unreachable or refuses.
    """
    wanted = None if names is None else check_topic_names(names)
    with admin_client(settings) as admin:
        try:
            found = _describe(admin, wanted)
        except KafkaError as exc:
            raise StackError(f"Kafka refused to describe topics: {exc}") from exc
    if wanted is None:
        found = {n: t for n, t in found.items() if not n.startswith("__")}
    return dict(sorted(found.items()))


def end_offsets(settings: Settings, topic: str) -> dict[int, int]:
    """The end offset of every partition of `topic`: the offset the next record will get.

    For a topic written once from empty, the end offset of a partition is its record count.

    Returns:
        partition id -> end offset (records), for partitions 0..P-1.

    Raises:
        ConfigurationError: the topic does not exist (create it with `keyshift topics create`).
        StackError: the broker is unreachable or does not answer in time.
    """
    check_broker(settings)
    try:
        consumer = KafkaConsumer(
            **kafka_config(settings, "keyshift-offsets"), enable_auto_commit=False, allow_auto_create_topics=False
        )
    except KafkaError as exc:
        raise broker_unreachable(settings, exc) from exc
    try:
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            raise ConfigurationError(f"topic {topic!r} does not exist; create it with `keyshift topics create {topic}`")
        offsets = consumer.end_offsets([TopicPartition(topic, p) for p in sorted(partitions)], timeout_ms=30_000)
    except KafkaError as exc:
        raise StackError(f"cannot read end offsets of {topic!r}: {exc}") from exc
    finally:
        consumer.close()
    return {tp.partition: offset for tp, offset in sorted(offsets.items())}


def read_committed(settings: Settings, topic: str, timeout_s: float = 60.0) -> list:
    """Every committed record of `topic`, from its beginning to its end offsets at the call.

    Reads with `read_committed` (a transactional writer's aborted records are skipped, and its
    commit markers take offsets of their own, so a partition can hold fewer records than its end
    offset) and stops when every partition's position reaches its end offset, not after a pause
    between records: a busy broker or machine can stall a fetch for seconds.

    Returns:
        kafka-python `ConsumerRecord`s (partition, offset, key, value as bytes ...), partition by
        partition in the order the consumer hands them.

    Raises:
        ConfigurationError: the topic does not exist. StackError: the broker is unreachable, or
        the topic was not read to its end offsets within `timeout_s`.
    """
    ends = end_offsets(settings, topic)
    consumer = KafkaConsumer(bootstrap_servers=settings.bootstrap_servers, enable_auto_commit=False, group_id=None,
                             isolation_level="read_committed", **client_options(settings))
    try:
        partitions = [TopicPartition(topic, p) for p in ends]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        records, deadline = [], time.monotonic() + timeout_s
        while any(consumer.position(tp) < ends[tp.partition] for tp in partitions):
            if time.monotonic() > deadline:
                raise StackError(f"could not read {topic!r} to its end offsets {ends} in {timeout_s:.0f} s")
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend(batch)
        return records
    finally:
        consumer.close()


def count_end_of_input_markers(settings: Settings, topic: str, ranges: dict[int, tuple[int, int]]) -> dict[int, int]:
    """Count the end-of-input markers (`END_OF_INPUT_PREFIX`) in offset ranges of `topic`.

    A producer that checks its own writes against a partition's end-offset growth (the replays'
    `check_growth`) uses this to tell a bounded run's markers, written into the topic while it
    produced, from another writer's records. Reads every record of each range once.

    Args:
        settings: broker location.
        topic: an existing topic.
        ranges: partition -> (first offset, end offset), end exclusive; empty ranges are skipped.

    Returns:
        partition -> markers found in its range (records), for every partition of `ranges`.

    Raises:
        StackError: the broker is unreachable, or a range could not be read within 60 s.
    """
    wanted = {p: (lo, hi) for p, (lo, hi) in ranges.items() if hi > lo}
    counts = {p: 0 for p in ranges}
    if not wanted:
        return counts
    prefix = END_OF_INPUT_PREFIX.encode()
    try:
        consumer = KafkaConsumer(**kafka_config(settings, "keyshift-markers"), enable_auto_commit=False,
                                 allow_auto_create_topics=False)
    except KafkaError as exc:
        raise broker_unreachable(settings, exc) from exc
    try:
        parts = {p: TopicPartition(topic, p) for p in wanted}
        consumer.assign(list(parts.values()))
        for p, tp in parts.items():
            consumer.seek(tp, wanted[p][0])
        left = dict(wanted)
        deadline = time.monotonic() + 60
        while left:
            if time.monotonic() > deadline:
                raise StackError(f"could not read offsets {left} of {topic!r} within 60 s")
            for tp, records in consumer.poll(timeout_ms=1_000).items():
                end = wanted[tp.partition][1]
                for record in records:
                    if record.offset < end and record.value is not None and record.value.startswith(prefix):
                        counts[tp.partition] += 1
                if consumer.position(tp) >= end:
                    left.pop(tp.partition, None)
                    consumer.pause(tp)
    except KafkaError as exc:
        raise StackError(f"cannot read {topic!r} to count end-of-input markers: {exc}") from exc
    finally:
        consumer.close()
    return counts
