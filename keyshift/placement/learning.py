"""Learn a history-based assignment from the head of the flights and publish it in Redis.

The learned strategies (paper 000 §4.2.1 (2)-(3), Algorithm 1, and our hot_split) need history:
event counts per key. A live system has seen only the start of the stream when it places keys,
so keyshift learns from the origin counts of the first `LEARN_FRACTION` (10 %) of the flights
it will replay, builds the strategy with `from_counts`, and publishes the assignment under the
input topic's name (`AssignmentStore.publish`: a new epoch, one MULTI/EXEC). Producers
(`keyshift replay`, `CachedAssignment`) and the job read that one published map; keys first
seen later are placed by the store's atomic assign (whole, on the least-loaded slot).

| strategy | learned from the counts | published |
| --- | --- | --- |
| `least_key` | Algorithm 1 by keys, keys in arrival order | map + loads (keys per slot) |
| `least_count` | Algorithm 1 by events, heaviest key first (LPT) | map + loads (events per slot) |
| `hot_split` | least_count over pieces; a key above 1/P of the events cut into d >= 2 pieces | map (first slots) + split (`"3,5"`) + loads |
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from keyshift.errors import ConfigurationError, PlacementError
from keyshift.placement.assignment_store import AssignmentStore, CachedAssignment
from keyshift.placement.strategies import HotSplitStrategy, LeastCountStrategy, LeastKeyStrategy
from keyshift.settings import Settings

log = logging.getLogger(__name__)

LEARN_FRACTION = 0.1
"""A learned strategy learns from the first 10 % of the flights (of `limit` when given), as a
live system would that has seen only the start of the stream."""

LEARNED_STRATEGIES: tuple[str, ...] = ("least_key", "least_count", "hot_split")
"""Strategies built from history and shared through the Redis assignment store."""

_LEARNERS = {
    "least_key": LeastKeyStrategy,
    "least_count": LeastCountStrategy,
    "hot_split": HotSplitStrategy,
}

KEY_COLUMN = "origin"
"""The flights' key column (the replay keys records by origin)."""


@dataclass(frozen=True)
class LearnedAssignment:
    """What `learn_and_publish` or `publish_learned` published.

    Attributes:
        name: the assignment's name in Redis (the input topic).
        strategy: least_key, least_count or hot_split. partitions: P.
        epoch: the epoch the publish put in force (>= 1).
        events: events learned from (flights, or a generator's events). keys: distinct keys among them (units placed).
        split: key -> its slots (piece i on element i), the keys spread over two slots or more
            (hot_split only; empty otherwise).
        loads: the published per-slot loads (keys for least_key, else events).
    """

    name: str
    strategy: str
    partitions: int
    epoch: int
    events: int
    keys: int
    split: dict[str, tuple[int, ...]]
    loads: list[int]


def check_learned_strategy(strategy: str) -> str:
    """Return `strategy` if it is one `learn_and_publish` builds.

    Raises:
        PlacementError: for any other name (the message lists the learned ones).
    """
    if strategy not in _LEARNERS:
        raise PlacementError(
            f"strategy {strategy!r} is not learned from history; learned strategies: {', '.join(LEARNED_STRATEGIES)}"
        )
    return strategy


def learning_counts(
    path: Path, fraction: float = LEARN_FRACTION, limit: int | None = None
) -> tuple[dict[str, int], int]:
    """Event counts per origin of the first `fraction` of the flights, keys in arrival order.

    The head is `max(1, int(N * fraction))` rows of the file (file order = event-time order),
    N = `limit` when given, else every row. Keys keep the order they first appear in, which is
    the order least_key meets them (Algorithm 1 takes keys as they arrive).

    Args:
        path: the flights file (`flights_path`).
        fraction: share of the flights to learn from, 0 < fraction <= 1.
        limit: flights the replay will produce (events, >= 1), None = all rows of the file.

    Returns:
        (origin -> events in the head, in arrival order; events in the head).

    Raises:
        ConfigurationError: a fraction outside (0, 1], or a limit < 1.
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise ConfigurationError(f"learn fraction must be in (0, 1], got {fraction!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ConfigurationError(f"limit must be an int >= 1 events (or None for all flights), got {limit!r}")
    parquet = pq.ParquetFile(path)
    rows = parquet.metadata.num_rows if limit is None else min(limit, parquet.metadata.num_rows)
    head_rows = max(1, int(rows * fraction))
    origins = pq.read_table(path, columns=[KEY_COLUMN]).column(KEY_COLUMN).slice(0, head_rows).to_pandas()
    counts = origins.value_counts(sort=False).reindex(pd.unique(origins))  # arrival order
    return {str(key): int(count) for key, count in counts.items()}, len(origins)


def learn_strategy(
    strategy: str, counts: Mapping[str, int], partitions: int, *, d: int = 2
) -> LeastKeyStrategy | LeastCountStrategy | HotSplitStrategy:
    """Build a learned strategy's assignment from per-key event counts (`from_counts`).

    least_key and least_count run paper 000 Algorithm 1 over the keys (least_key in the
    mapping's order, least_count heaviest first); hot_split splits keys above 1/P of the events
    over d or more slots (`HotSplitStrategy.from_counts`).

    Args:
        strategy: one of `LEARNED_STRATEGIES`.
        counts: key -> events (>= 0), in arrival order.
        partitions: P >= 1.
        d: hot_split only: least slots per hot key, >= 2.

    Raises:
        PlacementError: an unknown strategy, bad P or d, a negative count.
    """
    cls = _LEARNERS[check_learned_strategy(strategy)]
    if cls is HotSplitStrategy:
        return HotSplitStrategy.from_counts(counts, partitions, d=d)
    return cls.from_counts(counts, partitions)


def learn_and_publish(
    settings: Settings,
    topic: str,
    strategy: str,
    partitions: int,
    limit: int | None = None,
    fraction: float = LEARN_FRACTION,
    *,
    flights: Path,
    d: int = 2,
) -> LearnedAssignment:
    """Learn `strategy` from the head of the flights and publish it under `topic` with a new epoch.

    Counts come from `learning_counts` (the first `fraction` of `limit` flights, or of all),
    the assignment from `learn_strategy`, and the publish replaces the whole assignment named
    `topic` in Redis atomically (map, split units for hot_split, loads, meta; epoch + 1).

    Args:
        settings: where Redis and the flights cache are.
        topic: the input topic; the assignment's name in Redis.
        strategy: least_key, least_count or hot_split.
        partitions: P >= 1, the topic's partition count.
        limit: flights the replay will produce (events), None = all 3,000,000.
        fraction: share of those flights to learn from, 0 < fraction <= 1 (default 10 %).
        flights: the flights file (`keyshift.data.flights.flights_path`, which raises DataError
            when they are not fetched).
        d: hot_split only: least slots per hot key, >= 2.

    Returns:
        A `LearnedAssignment` (epoch, keys, split keys, loads).

    Raises:
        PlacementError: a strategy that is not learned, bad P or d.
        ConfigurationError: a bad fraction or limit.
        StackError: Redis unreachable (run `keyshift stack up`).
    """
    check_learned_strategy(strategy)
    counts, events = learning_counts(flights, fraction, limit)
    return publish_learned(settings, topic, strategy, partitions, counts, events, d=d, source="flights")


def publish_learned(
    settings: Settings,
    topic: str,
    strategy: str,
    partitions: int,
    counts: Mapping[str, int],
    events: int,
    *,
    d: int = 2,
    source: str = "events",
) -> LearnedAssignment:
    """Build `strategy` from per-key counts (`learn_strategy`) and publish it under `topic` with a new epoch.

    Args:
        settings: where Redis is. topic: the assignment's name (the input topic).
        strategy: least_key, least_count or hot_split. partitions: P >= 1.
        counts: key -> events (>= 0) seen in the head of the stream, in arrival order.
        events: how many events the counts were taken from (for the record and the log).
        d: hot_split only: least slots per hot key, >= 2.
        source: what the events were, for the log line ("flights", "YSB events").

    Returns:
        A `LearnedAssignment`.

    Raises:
        PlacementError: a strategy that is not learned, bad P or d, a negative count.
        StackError: Redis unreachable.
    """
    learned = learn_strategy(strategy, counts, partitions, d=d)
    store = AssignmentStore.from_settings(settings, topic)
    epoch = store.publish(strategy, partitions, learned.assignment, learned.loads)
    split = {str(unit): tuple(slots) for unit, slots in learned.assignment.items() if isinstance(slots, tuple) and len(slots) > 1}
    log.info(
        "%s learned from the first %s %s (%d keys, %d split), published for %s as epoch %d over %d slots",
        strategy, f"{events:,}", source, len(counts), len(split), topic, epoch, partitions,
    )
    return LearnedAssignment(
        name=topic,
        strategy=strategy,
        partitions=partitions,
        epoch=epoch,
        events=events,
        keys=len(learned.assignment),
        split=split,
        loads=list(learned.loads),
    )


def published_assignment(
    settings: Settings, topic: str, strategy: str, partitions: int, poll_seconds: float = 1.0
) -> CachedAssignment:
    """The producers' view of the `strategy` assignment published under `topic`, checked.

    Args:
        settings: where Redis is. topic: the assignment's name (the input topic).
        strategy: the learned strategy the caller wants (least_key, least_count, hot_split).
        partitions: P the caller places over (the topic's partition count).
        poll_seconds: the view's epoch polling interval (s).

    Returns:
        A `CachedAssignment` (not key-affine for hot_split).

    Raises:
        ConfigurationError: nothing is published under `topic`, or the published assignment is
            another strategy's or for another P; the message names the command that publishes
            the right one (`keyshift topics create --strategy NAME`).
        PlacementError: a strategy that is not learned.
        StackError: Redis unreachable.
    """
    check_learned_strategy(strategy)
    fix = f"run `keyshift topics create --strategy {strategy} --partitions {partitions} {topic}` to learn and publish it"
    try:
        view = CachedAssignment(AssignmentStore.from_settings(settings, topic), poll_seconds=poll_seconds)
    except PlacementError as exc:
        if "no assignment published" not in str(exc):
            raise
        raise ConfigurationError(f"no {strategy} assignment is published for topic {topic!r}; {fix}") from None
    if view.name != strategy or view.partitions != partitions:
        raise ConfigurationError(
            f"the assignment published for topic {topic!r} is {view.name} over {view.partitions} slots "
            f"(epoch {view.epoch}), not {strategy} over {partitions}; {fix}"
        )
    return view
