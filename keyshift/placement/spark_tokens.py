"""Slot tokens on Spark's executors: a strategy's assignment turned into the grouping value.

`token_lookup` maps a key through a placement strategy to its slot and the slot to its token
(`keyshift.placement.tokens.slot_tokens`), so `groupBy(token)` puts every key's rows on the
stateful partition its strategy chose (DESIGN.md, "How a strategy reaches Spark's stateful
stage"). It caches per process: the hot path is one dict lookup per distinct key and batch.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from keyshift.placement.tokens import slot_tokens


@lru_cache(maxsize=16)
def token_lookup(strategy_name: str, partitions: int, stateful_partitions: int | None = None):
    """(token_of, tokens): key -> slot token with a per-process cache, and the slot -> token array.

    Args:
        strategy_name: a rule strategy (`hash`, `modulo`).
        partitions: P slots.
        stateful_partitions: S, the query's stateful partitions (`slot_tokens`); None: S = P.

    Raises:
        PlacementError: for an unknown strategy, P < 1 or S outside [1, P].
    """
    from keyshift.placement.strategies import strategy_by_name

    strategy = strategy_by_name(strategy_name, partitions)
    tokens = np.asarray(slot_tokens(partitions, stateful_partitions), dtype=np.int32)
    cache: dict[str, int] = {}

    def token_of(key: str) -> int:
        token = cache.get(key)
        if token is None:
            token = cache[key] = int(tokens[strategy.slot_of(key)])
        return token

    return token_of, tokens


def assignment_token_lookup(mapping: dict[str, int], partitions: int, redis_url: str, store_name: str,
                            stateful_partitions: int | None = None):
    """(token_of, tokens) for a learned assignment read from the shared store at job start.

    Keys in `mapping` (key -> slot) resolve locally; a key the store did not hold then is placed by
    the store's atomic assign (paper 000 Algorithm 1 on the Redis server), so every executor and
    every producer agree on its slot. `stateful_partitions` as in `token_lookup`.

    Raises:
        StackError: Redis unreachable for `REDIS_OUTAGE_S` seconds when an unknown key must be
            assigned (a shorter outage, a restart, is waited out).
    """
    tokens = np.asarray(slot_tokens(partitions, stateful_partitions), dtype=np.int32)
    cache = {key: int(tokens[slot]) for key, slot in mapping.items()}
    store = assign = None

    def token_of(key: str) -> int:
        nonlocal store, assign
        token = cache.get(key)
        if token is None:
            if store is None:
                import redis

                from keyshift.placement.assignment_store import AssignmentStore, while_redis_restarts

                store = AssignmentStore(redis.Redis.from_url(redis_url), store_name)
                assign = while_redis_restarts(store.assign)
            token = cache[key] = int(tokens[assign(key, observe_known=False)])
        return token

    return token_of, tokens
