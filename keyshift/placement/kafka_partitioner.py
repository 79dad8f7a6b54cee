"""`KafkaPartitioner`: a keyshift placement strategy as kafka-python's producer `partitioner=`.

Kept apart from `keyshift.placement.strategies` so that the placement math imports no Kafka
client: every Python process that runs the job's placement (Spark's workers, the stateful
operator's driver-side initialisation at each query start) would otherwise import kafka-python,
about 0.23 s each (`python -X importtime`).
"""

from __future__ import annotations

from kafka.partitioner import Partitioner

from keyshift.errors import PlacementError
from keyshift.placement.strategies import SlotCache, Strategy


class KafkaPartitioner(Partitioner):
    """Adapter: a keyshift strategy as kafka-python's producer `partitioner=`.

    kafka-python 3.0.12 calls `partition(topic, key, serialized_key, value, serialized_value,
    cluster)` for each record sent without an explicit partition (`kafka.partitioner.Partitioner`;
    the older `partitioner(key_bytes, all_partitions, available)` callable form is deprecated).
    The key is decoded from its serialized UTF-8 bytes, so placement follows the bytes on the wire
    exactly as Kafka's own partitioner does; results are memoized per serialized key.

    The memo is valid for one epoch. Every call reads the strategy's `epoch` (an attribute for
    the rule strategies; for a `CachedAssignment` a property that polls Redis once every
    `poll_seconds`, a clock comparison otherwise), and when it differs from the epoch the memo
    was filled under, the byte memo and the `SlotCache` are cleared first. A long-lived producer
    thus follows a newly published assignment within the view's poll interval, without restart.

    Args:
        strategy: a key-affine `Strategy`; its P must equal the topic's partition count.

    Raises (from `partition`, surfaced by `KafkaProducer.send`):
        PlacementError: a record without a key, a key that is not UTF-8, a topic whose
            partition count differs from the strategy's P, or a new epoch whose assignment is
            no longer key-affine (hot_split: its records are placed per event by the replayer).
        ValueError: a topic missing from the producer's metadata (as kafka-python's default).
    """

    def __init__(self, strategy: Strategy) -> None:
        self.cache = SlotCache(strategy)
        self._strategy = strategy
        self._epoch = strategy.epoch
        self._by_bytes: dict[bytes, int] = {}

    @property
    def epoch(self) -> int:
        """The epoch the memo was filled under (the strategy's, as of the last call)."""
        return self._epoch

    def _new_epoch(self, epoch: int) -> None:
        """Drop every memoized slot: the strategy moved from `self._epoch` to `epoch`."""
        if not self._strategy.key_affine:
            raise PlacementError(
                f"the assignment moved to epoch {epoch} of strategy {self._strategy.name!r}, which is not key-affine; "
                "a per-key partitioner cannot place it (replay with `keyshift replay flights --strategy "
                f"{self._strategy.name}`, which places split keys per event)"
            )
        self._by_bytes.clear()
        self.cache.refresh()
        self._epoch = epoch

    def partition(self, topic, key, serialized_key, value, serialized_value, cluster) -> int:
        """The partition of a record, as kafka-python's producer asks its partitioner: the
        strategy's slot of `serialized_key` (UTF-8). Follows the strategy's epoch: a new epoch
        clears the key cache.

        Raises:
            ValueError: the topic is not in the producer's metadata (kafka-python's own error).
            PlacementError: the topic's partition count differs from the strategy's P, or the
                record has no key, or a key that is not UTF-8.
        """
        epoch = self._strategy.epoch
        if epoch != self._epoch:
            self._new_epoch(epoch)
        all_partitions = cluster.partitions_for_topic(topic)
        if all_partitions is None:
            raise ValueError(f"Topic {topic} not found in ClusterMetadata")
        if len(all_partitions) != self.cache.partitions:
            raise PlacementError(
                f"topic {topic!r} has {len(all_partitions)} partitions but strategy "
                f"{self.cache.strategy.name!r} places over {self.cache.partitions} slots; "
                "recreate the topic or build the strategy with the topic's partition count"
            )
        if type(serialized_key) is bytes:
            slot = self._by_bytes.get(serialized_key)
            if slot is not None:
                return slot
        elif serialized_key is None:
            raise PlacementError(f"record for topic {topic!r} has no key; keyshift places keyed records only")
        key_bytes = bytes(serialized_key)
        try:
            text = key_bytes.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PlacementError(f"key {key_bytes!r} is not UTF-8: {exc}") from exc
        slot = self._by_bytes[key_bytes] = self.cache.slot_of(text)
        return slot
