"""Slot tokens: integers that steer a group to a chosen Spark stateful partition.

Spark places the rows of a stateful operator grouped by column `token` on shuffle partition
`pmod(Murmur3_x86_32(token, seed=42), S)` (HashPartitioning over S = `spark.sql.shuffle.partitions`;
the same value SQL's `hash(token)` returns for an INT column). The job groups slot s's keys by
`tokens[s]`, an int Spark places on the stateful partition chosen for s (DESIGN.md, "How a
strategy reaches Spark's stateful stage"). The token column must be INT (32-bit) both here and in
the job: a LONG hashes differently.

P slots (the Kafka partitions) and S stateful partitions need not be equal. With S < P, the
slots are spread over the stateful partitions by range, as Flink spreads key groups over
operator instances (`KeyGroupRangeAssignment.computeOperatorIndexForKeyGroup`): slot s goes to
partition `s * S // P`, so each stateful partition holds P/S adjacent slots, every slot keeps a
token (a grouping key) of its own, and a stateful task per batch serves several slots. Each
task costs a fixed share of a batch (its Python worker round trip, the state store's load and
commit: about 0.3 task-seconds per stateful task measured at P = 32), so on a small engine
S = P spends the batch on overhead; `default_max_stateful_partitions` caps S at
`STATEFUL_PARTITIONS_PER_CORE` per core, and the job's ingest stage is coalesced to the same S
tasks (`keyshift.processing.job_query.JobConfig.source_tasks`). With S = P every
slot is its own partition, and the tokens are those of every release before the cap.
"""

from __future__ import annotations

from functools import lru_cache

from keyshift.errors import PlacementError

SPARK_HASH_SEED = 42
"""Seed of Spark's `Murmur3Hash` expression and of `HashPartitioning`."""

_C1 = 0xCC9E2D51
_C2 = 0x1B873593
_MASK32 = 0xFFFFFFFF


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK32


def _to_int32(x: int) -> int:
    x &= _MASK32
    return x - (1 << 32) if x & 0x80000000 else x


def spark_hash_int(value: int, seed: int = SPARK_HASH_SEED) -> int:
    """Spark's `Murmur3_x86_32.hashInt(value, seed)`: the hash of a 32-bit INT column.

    Args:
        value: a Java int, -2**31 <= value < 2**31.
        seed: 32-bit seed; Spark uses 42 for `hash()` and for hash partitioning.

    Returns:
        The signed 32-bit hash, as Spark SQL's `hash(CAST(value AS INT))` returns it.

    Raises:
        ValueError: if `value` is outside the Java int range.
    """
    if not -(2**31) <= value < 2**31:
        raise ValueError(f"value {value} is not a 32-bit int")
    k1 = (value & _MASK32) * _C1 & _MASK32
    k1 = _rotl32(k1, 15)
    k1 = k1 * _C2 & _MASK32
    h1 = (seed & _MASK32) ^ k1
    h1 = _rotl32(h1, 13)
    h1 = (h1 * 5 + 0xE6546B64) & _MASK32
    # fmix with length 4 bytes
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _MASK32
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _MASK32
    h1 ^= h1 >> 16
    return _to_int32(h1)


def spark_partition_of_token(token: int, partitions: int) -> int:
    """Shuffle partition Spark gives a row grouped by INT `token`: `pmod(hash(token), P)`.

    Raises:
        PlacementError: if `partitions` < 1.
    """
    if partitions < 1:
        raise PlacementError(f"partitions must be >= 1, got {partitions}")
    return spark_hash_int(token) % partitions  # Python's % is pmod for a positive divisor


STATEFUL_PARTITIONS_PER_CORE = 1
"""Stateful partitions (and ingest tasks) per core of the engine when the run does not say how
many. Fewer tasks were faster at every S measured on 2 cores (issue 11, all 3,000,000 flights,
ingest coalesced to S, one run each in alternation): at P = 32 hot_split 38,771 events/s with
S = 2, 34,702 with S = 4, 30,422 with S = 8; at P = 8 hash 59,510 and 45,014 with S = 2 against
47,791 and 43,062 with S = 4 (runs before `keyshift.processing.operators.ingest.kafka_partition_chunks`,
with 0.6 % of the events wrongly dead-lettered; the bench of 2026-11-27 in the README has
44,174 events/s at P = 8 and 34,167 at P = 32 with S = 2). The cost is per task, not per
event: every task of a batch pays its Python worker round trip and, in the stateful stage, a
state store load and commit."""


def check_stateful_partitions(partitions: int, stateful_partitions: int) -> None:
    """Raise PlacementError unless 1 <= stateful_partitions <= partitions."""
    if partitions < 1:
        raise PlacementError(f"partitions must be >= 1, got {partitions}")
    if not 1 <= stateful_partitions <= partitions:
        raise PlacementError(f"stateful partitions must be between 1 and P = {partitions}, got {stateful_partitions}")


def capped_stateful_partitions(partitions: int, cap: int | None) -> int:
    """S for P slots under a run's cap: min(P, cap); P when `cap` is None.

    Raises:
        PlacementError: P < 1 or cap < 1.
    """
    if partitions < 1:
        raise PlacementError(f"partitions must be >= 1, got {partitions}")
    if cap is not None and cap < 1:
        raise PlacementError(f"max_stateful_partitions must be >= 1, got {cap}")
    return partitions if cap is None else min(partitions, cap)


def stateful_partition_of_slot(slot: int, partitions: int, stateful_partitions: int) -> int:
    """The Spark stateful partition that holds slot `slot`: `slot * S // P`.

    Flink's `KeyGroupRangeAssignment.computeOperatorIndexForKeyGroup(maxParallelism=P,
    parallelism=S, keyGroupId=slot)`: partition i holds the adjacent slots
    [ceil(i * P / S), ceil((i + 1) * P / S)), P // S or P // S + 1 of them.

    Args:
        slot: 0 <= slot < P.
        partitions: P, the number of slots.
        stateful_partitions: S, Spark's stateful partitions, 1 <= S <= P.

    Returns:
        An int in [0, S - 1]; equal to `slot` when S = P.

    Raises:
        PlacementError: S outside [1, P] or slot outside [0, P - 1].
    """
    check_stateful_partitions(partitions, stateful_partitions)
    if not 0 <= slot < partitions:
        raise PlacementError(f"slot {slot} is not one of the {partitions} slots")
    return slot * stateful_partitions // partitions


def default_max_stateful_partitions(cores: int) -> int:
    """How many stateful partitions a run takes at most when it does not say:
    `STATEFUL_PARTITIONS_PER_CORE` (1) per core.

    Args:
        cores: the engine's task slots (Spark's default parallelism; for `local[*]`, the
            machine's cores), >= 1.
    """
    return STATEFUL_PARTITIONS_PER_CORE * max(1, int(cores))


@lru_cache(maxsize=64)
def slot_tokens(partitions: int, stateful_partitions: int | None = None, search_limit: int = 1 << 20) -> tuple[int, ...]:
    """The token of every slot: the smallest ints Spark places on the slot's stateful partition.

    With S = P (the default) `tokens[s]` is the smallest int t >= 0 with `pmod(hash(t), P) = s`.
    With S < P, the slots of stateful partition i (`stateful_partition_of_slot`), in slot order,
    take the smallest ints Spark places on i, in order; the tokens stay distinct, so each slot
    remains a grouping key (its own state, timers and loads) on a shared partition.

    Args:
        partitions: P, the number of slots, 1 <= P.
        stateful_partitions: S = `spark.sql.shuffle.partitions` of the query, 1 <= S <= P;
            None: S = P.
        search_limit: how many candidate ints to try before giving up.

    Returns:
        A tuple of P distinct non-negative ints, index = slot.

    Raises:
        PlacementError: if P < 1, S is outside [1, P], or some slot has no token below
            `search_limit`.
    """
    stateful = partitions if stateful_partitions is None else stateful_partitions
    check_stateful_partitions(partitions, stateful)
    waiting: list[list[int]] = [[] for _ in range(stateful)]  # per stateful partition: its slots, in order
    for slot in range(partitions):
        waiting[slot * stateful // partitions].append(slot)
    tokens: list[int | None] = [None] * partitions
    missing = partitions
    for candidate in range(search_limit):
        slots = waiting[spark_partition_of_token(candidate, stateful)]
        if slots:
            tokens[slots.pop(0)] = candidate
            missing -= 1
            if missing == 0:
                return tuple(tokens)  # type: ignore[arg-type]
    raise PlacementError(
        f"no token below {search_limit} for {missing} of {partitions} slots; raise search_limit"
    )
