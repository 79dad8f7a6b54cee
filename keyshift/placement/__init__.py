"""Placement: which slot (Kafka partition = Spark stateful partition) each key goes to.

`murmur2` holds Kafka's key hash exactly as the Java client computes it; `strategies` holds the
one interface every strategy implements (`Strategy.slot_of(key) -> slot`), the registry
`strategy_by_name` and the per-key `SlotCache`; `kafka_partitioner.KafkaPartitioner` is the
adapter that plugs a strategy into kafka-python's producer (imported on first use, so the
placement math loads no Kafka client). `assignment_store` shares a learned assignment and its
epoch through Redis (hot_split's split keys included); `learning` learns one from the head of the
flights and publishes it; `tokens` and `spark_tokens` turn slots into Spark grouping tokens.
"""

from keyshift.placement.murmur2 import murmur2, partition_for_key, to_positive
from keyshift.placement.strategies import (
    STRATEGY_NAMES,
    HashStrategy,
    SlotCache,
    Strategy,
    bucket_of,
    strategy_by_name,
)

__all__ = [
    "STRATEGY_NAMES",
    "HashStrategy",
    "KafkaPartitioner",
    "SlotCache",
    "Strategy",
    "bucket_of",
    "murmur2",
    "partition_for_key",
    "strategy_by_name",
    "to_positive",
]


def __getattr__(name: str):
    """`keyshift.placement.KafkaPartitioner`, imported on first use (PEP 562)."""
    if name == "KafkaPartitioner":
        from keyshift.placement.kafka_partitioner import KafkaPartitioner

        return KafkaPartitioner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
