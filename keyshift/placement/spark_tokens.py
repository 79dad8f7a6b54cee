"""The slot-token column: a strategy's assignment turned into Spark's grouping column.

`slot_token_column` maps each row's key through a placement strategy to its slot and the slot to
its token (`keyshift.placement.tokens.slot_tokens`), so `groupBy(token)` puts every key's rows on
the stateful partition its strategy chose (DESIGN.md, "How a strategy reaches Spark's stateful
stage"). Rows without a usable key (dead letters) go to the slot of their Kafka partition.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pandas as pd
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from keyshift.placement.tokens import slot_tokens


@lru_cache(maxsize=16)
def _token_lookup(strategy_name: str, partitions: int):
    from keyshift.placement.strategies import strategy_by_name

    strategy = strategy_by_name(strategy_name, partitions)
    tokens = np.asarray(slot_tokens(partitions), dtype=np.int32)
    cache: dict[str, int] = {}

    def token_of(key: str) -> int:
        token = cache.get(key)
        if token is None:
            token = cache[key] = int(tokens[strategy.slot_of(key)])
        return token

    return token_of, tokens


def slot_token_column(
    key: Column, kafka_partition: Column, strategy_name: str, partitions: int
) -> Column:
    """An INT column: the slot token of each row's key under `strategy_name` with P slots.

    Args:
        key: string column of the grouping key (NULL or empty for rows that have none).
        kafka_partition: int column; the fallback slot is `kafka_partition mod P`.
        strategy_name: a name `keyshift.placement.strategies.strategy_by_name` knows.
        partitions: P, the number of slots (= spark.sql.shuffle.partitions).

    Returns:
        An IntegerType column (a vectorized pandas UDF with a per-worker key cache).

    Raises:
        PlacementError: on the executors, for an unknown strategy or P < 1.
    """

    @F.pandas_udf(T.IntegerType())
    def _slot_token(keys: pd.Series, kafka_partitions: pd.Series) -> pd.Series:
        token_of, tokens = _token_lookup(strategy_name, partitions)
        fallback = tokens[kafka_partitions.to_numpy(dtype=np.int64) % partitions]
        has_key = keys.notna() & (keys != "")
        out = pd.Series(fallback, index=keys.index, dtype="int32")
        if has_key.any():
            out[has_key] = keys[has_key].map(token_of).astype("int32")
        return out

    return _slot_token(key, kafka_partition)
