"""Exactly-once side outputs in Kafka: one transaction per micro-batch, the batch id inside it.

Alerts, late events and dead letters go to Kafka topics from the sink, which Spark calls once per
micro-batch and calls again for the same batch id when it replays a batch after a crash (the
batch ran, maybe wrote, but was not committed to the checkpoint). Spark's own rule for exactly
once is "replayable source + checkpoint + idempotent sink"; a Kafka producer is not idempotent
across a restart, so `TransactionalSideOutputs` makes it so, the way Kafka Streams and Flink's
two-phase-commit Kafka sink do (KIP-98 transactions):

- the producer has a `transactional.id` fixed per run (`keyshift-sink-<run_id>`), so the producer
  of a restarted driver fences the crashed one and aborts its open transaction
  (`init_transactions`);
- each micro-batch's records are sent in one transaction, and the same transaction commits the
  offset `batch_id + 1` of the consumer group `keyshift-sink-<run_id>` on partition 0 of the
  topic `SINK_COMMITS_TOPIC` (`send_offsets_to_transaction`): the group's committed offset is
  therefore exactly "the batches whose records are committed", atomically with them;
- before sending batch b, the sink compares b with that offset and skips a batch already
  committed (a replay), so a `read_committed` consumer sees every record exactly once.

A consumer that reads with `isolation_level="read_uncommitted"` (kafka-python's default) also sees
records of aborted transactions: read the side outputs with `read_committed`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from kafka import KafkaAdminClient, KafkaProducer, TopicPartition
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata
from tenacity import retry, retry_if_exception, stop_after_delay, wait_exponential

from keyshift.names import SINK_COMMITS_TOPIC

log = logging.getLogger(__name__)


def sink_transactional_id(run_id: str) -> str:
    """The Kafka `transactional.id` of run `run_id`'s side-output producer (stable across restarts)."""
    return f"keyshift-sink-{run_id}"


def sink_group_id(run_id: str) -> str:
    """The consumer group whose committed offset on `SINK_COMMITS_TOPIC` counts run `run_id`'s
    committed batches (offset = last committed batch id + 1)."""
    return f"keyshift-sink-{run_id}"


def _retriable(exc: BaseException) -> bool:
    return isinstance(exc, KafkaError) and exc.retriable


@retry(retry=retry_if_exception(_retriable), stop=stop_after_delay(60), wait=wait_exponential(0.2, max=5), reraise=True)
def last_committed_batch(bootstrap_servers: str, run_id: str, client_options: dict | None = None) -> int:
    """The id of the last micro-batch whose side outputs were committed for `run_id`, or -1.

    Retriable broker errors are retried for up to 60 s: on a new broker the group coordinator
    (`__consumer_offsets`) is created by the first lookup, which answers
    `CoordinatorNotAvailableError` until it is ready.

    Args:
        bootstrap_servers: `host:port` of the broker.
        run_id: the run.
        client_options: extra kafka-python client options (security settings).

    Raises:
        kafka.errors.KafkaError: the broker does not answer, or a retriable error lasted 60 s.
    """
    admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers, client_id=f"keyshift-sink-check-{run_id}", **(client_options or {}))
    try:
        partition = TopicPartition(SINK_COMMITS_TOPIC, 0)
        offsets = admin.list_group_offsets({sink_group_id(run_id): [partition]}).get(sink_group_id(run_id), {})
    finally:
        admin.close()
    committed = offsets.get(partition)
    return committed.offset - 1 if committed is not None and committed.offset >= 0 else -1


class TransactionalSideOutputs:
    """Sends each micro-batch's side-output records in one Kafka transaction, exactly once.

    Args:
        bootstrap_servers: `host:port` of the broker.
        run_id: the run; names the transactional id and the commit group.
        client_options: extra kafka-python client options (security settings).
        transaction_timeout_ms: how long the broker keeps an open transaction of a crashed
            driver before aborting it on its own (a restarted driver aborts it at once).

    Raises:
        kafka.errors.KafkaError: the broker does not answer, or another live producer of the
            same run fenced this one (`ProducerFencedError`: two drivers of one run).
    """

    def __init__(
        self, bootstrap_servers: str, run_id: str, client_options: dict | None = None, transaction_timeout_ms: int = 60_000,
    ) -> None:
        self.run_id = run_id
        self._bootstrap_servers = bootstrap_servers
        self._client_options = dict(client_options or {})
        self._producer = KafkaProducer(
            bootstrap_servers=bootstrap_servers,
            transactional_id=sink_transactional_id(run_id),
            transaction_timeout_ms=transaction_timeout_ms,
            enable_idempotence=True,
            acks="all",
            linger_ms=20,
            client_id=f"keyshift-sink-{run_id}",
            **self._client_options,
        )
        self._producer.init_transactions()  # fences a crashed driver's producer, aborts its transaction
        self.last_committed_batch = last_committed_batch(bootstrap_servers, run_id, self._client_options)
        if self.last_committed_batch >= 0:
            log.info("run %s: side outputs committed up to batch %d; a replayed batch is not sent again", run_id, self.last_committed_batch)

    def send_batch(self, batch_id: int, records: Iterable[tuple[str, bytes | None, bytes]]) -> bool:
        """Send one micro-batch's records `(topic, key, value)` in one transaction.

        Returns:
            True if sent and committed; False if batch `batch_id` was committed before (a replay
            of a batch whose outputs are already in Kafka): nothing is sent.

        Raises:
            kafka.errors.KafkaError: the transaction failed; it is aborted and Spark fails the
                batch, which a restart replays.
        """
        if batch_id <= self.last_committed_batch:
            log.info("run %s: batch %d's side outputs were committed before; not sending them again", self.run_id, batch_id)
            return False
        self._producer.begin_transaction()
        try:
            for topic, key, value in records:
                self._producer.send(topic, key=key, value=value)
            self._producer.send_offsets_to_transaction(
                {TopicPartition(SINK_COMMITS_TOPIC, 0): OffsetAndMetadata(batch_id + 1, self.run_id, -1)},
                sink_group_id(self.run_id),
            )
            self._producer.commit_transaction()
        except BaseException:
            try:
                self._producer.abort_transaction()
            except Exception as exc:  # the original error is the one to report
                log.warning("run %s: aborting batch %d's transaction failed too: %s", self.run_id, batch_id, exc)
            raise
        self.last_committed_batch = batch_id
        return True

    def close(self, timeout_s: float = 10.0) -> None:
        """Close the producer (no transaction is open between batches)."""
        self._producer.close(timeout=timeout_s)
