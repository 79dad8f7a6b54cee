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

kafka-python waits without a time limit for the broker's answer to `send_offsets_to_transaction`,
`commit_transaction` and `abort_transaction`; a broker restarted while such a request is in
flight can leave it unanswered forever (seen: the sink hung in `send_offsets_to_transaction` for
15 min after `keyshift stack` restarted Kafka). So each of these calls is bounded
(`TRANSACTION_CALL_TIMEOUT_S`); when one does not finish, the producer is dropped and a new one
with the same `transactional.id` fences it and aborts its open transaction
(`init_transactions`, which also waits for a commit already under way), and the batch's
transaction is sent again, up to `TRANSACTION_ATTEMPTS` times, unless the group offset shows that
the timed-out commit went through after all. Nothing is sent twice and nothing of an abandoned
transaction becomes visible.

A consumer that reads with `isolation_level="read_uncommitted"` (kafka-python's default) also sees
records of aborted transactions: read the side outputs with `read_committed`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from kafka import KafkaAdminClient, KafkaProducer, TopicPartition
from kafka.errors import KafkaError, KafkaTimeoutError
from kafka.structs import OffsetAndMetadata
from tenacity import retry, retry_if_exception, stop_after_delay, wait_exponential

from keyshift.names import SINK_COMMITS_TOPIC
from keyshift.processing.failpoints import hold_here

log = logging.getLogger(__name__)


def sink_transactional_id(run_id: str) -> str:
    """The Kafka `transactional.id` of run `run_id`'s side-output producer (stable across restarts)."""
    return f"keyshift-sink-{run_id}"


def sink_group_id(run_id: str) -> str:
    """The consumer group whose committed offset on `SINK_COMMITS_TOPIC` counts run `run_id`'s
    committed batches (offset = last committed batch id + 1)."""
    return f"keyshift-sink-{run_id}"


TRANSACTION_CALL_TIMEOUT_S = 30.0
"""Seconds one transactional call (offsets, commit, abort) may take before the producer is
replaced. The replacement's `init_transactions` fences the old producer and finishes its open
transaction (aborts it, or waits for a commit under way), so a shorter bound costs no correctness,
only a resend of a batch's few side-output records. It is what the sink stalls when a broker dies:
kafka-python keeps waiting on a transaction coordinator that is gone (the cluster test kills the
coordinator in the middle of a transaction); 90 s stalled the run 90 s per lost broker. A side
output transaction takes well under a second when the brokers are up."""
TRANSACTION_ATTEMPTS = 5
"""How many times a batch's transaction is sent, each with a new producer after the first."""


def bounded_call(call: Callable[[], object], what: str, timeout_s: float) -> None:
    """Run `call()` in a daemon thread and wait at most `timeout_s` seconds for it.

    Raises:
        KafkaTimeoutError: `call` did not return in time (the thread is left to finish or hang).
        BaseException: whatever `call` raised.
    """
    outcome: list[BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            outcome.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name=f"keyshift-{what}", daemon=True).start()
    if not done.wait(timeout_s):
        raise KafkaTimeoutError(f"{what} did not finish in {timeout_s:.0f} s")
    if outcome:
        raise outcome[0]


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
        self._transaction_timeout_ms = transaction_timeout_ms
        self.call_timeout_s = TRANSACTION_CALL_TIMEOUT_S
        self._producer = self._new_producer()
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
        records = list(records)
        for attempt in range(1, TRANSACTION_ATTEMPTS + 1):
            try:
                self._send_once(batch_id, records)
                break
            except KafkaTimeoutError as exc:
                if attempt == TRANSACTION_ATTEMPTS:
                    raise
                log.warning("run %s: batch %d's transaction (attempt %d of %d): %s; a new producer fences this one "
                            "and sends the batch again", self.run_id, batch_id, attempt, TRANSACTION_ATTEMPTS, exc)
                self._replace_producer()
                # a commit that timed out here may still have reached the broker: the new
                # producer's init waited for it, so the group offset now says whether it did
                if last_committed_batch(self._bootstrap_servers, self.run_id, self._client_options) >= batch_id:
                    log.info("run %s: batch %d's transaction had committed after all; not sending it again", self.run_id, batch_id)
                    break
        self.last_committed_batch = batch_id
        return True

    def _send_once(self, batch_id: int, records: list[tuple[str, bytes | None, bytes]]) -> None:
        """One transaction with `records` and the batch's commit offset; aborted on any error.

        Raises:
            KafkaTimeoutError: a transactional call took longer than `call_timeout_s`.
            kafka.errors.KafkaError: the broker refused the transaction.
        """
        producer = self._producer
        producer.begin_transaction()
        try:
            for topic, key, value in records:
                producer.send(topic, key=key, value=value)
            hold_here("side_outputs.hold_in_transaction", batch_id)
            offsets = {TopicPartition(SINK_COMMITS_TOPIC, 0): OffsetAndMetadata(batch_id + 1, self.run_id, -1)}
            bounded_call(lambda: producer.send_offsets_to_transaction(offsets, sink_group_id(self.run_id)),
                         "send_offsets_to_transaction", self.call_timeout_s)
            bounded_call(producer.commit_transaction, "commit_transaction", self.call_timeout_s)
        except KafkaTimeoutError:
            raise  # the producer is replaced: the new one aborts the open transaction
        except BaseException:
            try:
                bounded_call(producer.abort_transaction, "abort_transaction", self.call_timeout_s)
            except Exception as exc:  # the original error is the one to report
                log.warning("run %s: aborting batch %d's transaction failed too: %s", self.run_id, batch_id, exc)
            raise

    def _new_producer(self) -> KafkaProducer:
        """A transactional producer of this run, initialised: it fences any earlier producer of the
        run and aborts that one's open transaction."""
        producer = KafkaProducer(
            bootstrap_servers=self._bootstrap_servers,
            transactional_id=sink_transactional_id(self.run_id),
            transaction_timeout_ms=self._transaction_timeout_ms,
            enable_idempotence=True,
            acks="all",
            linger_ms=20,
            client_id=f"keyshift-sink-{self.run_id}",
            **self._client_options,
        )
        producer.init_transactions()  # bounded by the producer's max_block_ms (60 s)
        return producer

    def _replace_producer(self) -> None:
        """Drop the current producer (closed without waiting) and start a new one that fences it."""
        old = self._producer
        try:
            bounded_call(lambda: old.close(timeout=0), "close", 10.0)
        except Exception as exc:  # noqa: BLE001 - the old producer is abandoned either way
            log.warning("run %s: closing the abandoned producer: %s", self.run_id, exc)
        self._producer = self._new_producer()

    def close(self, timeout_s: float = 10.0) -> None:
        """Close the producer (no transaction is open between batches)."""
        self._producer.close(timeout=timeout_s)
