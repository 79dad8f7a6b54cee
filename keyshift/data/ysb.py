"""The Yahoo Streaming Benchmark (YSB) generator: ad events into Kafka, the ad -> campaign map into Redis.

Follows the published benchmark (yahoo/streaming-benchmarks, `data/src/setup/core.clj`): C
campaigns with A ads each (100 x 10 by default), every id a UUID; each event is a JSON object

    {"event_id": 0, "user_id": "<uuid>", "page_id": "<uuid>", "ad_id": "<uuid>", "ad_type": "banner",
     "event_type": "view", "event_time": 1764000000000, "ip_address": "1.2.3.4"}

with `ad_type` one of `AD_TYPES` and `event_type` one of `EVENT_TYPES`, each drawn uniformly, the
user and page drawn uniformly from pools of 100 ids (as the published `run` mode does), the ad
uniformly from all C x A ads (or, with `zipf` = s > 0, with Zipf popularity: the ad of rank r,
r = 1 .. C x A, is drawn with probability proportional to r^-s, ranks dealt to ads by a seeded
permutation), and `ip_address` always "1.2.3.4". Event n (n = 0, 1, ...) has
`event_time` = start_ms + floor(n * 1000 / rate): the time the published generator schedules it
at (its emit time when the producer keeps up). Two departures from the published format, both
for keyshift's engine: `event_time` is a JSON integer (epoch milliseconds) rather than a string,
and `event_id` = n is added (the engine's duplicate check and the per-event placement of a split
key, `slots[event_id % k]`, use it).

Everything is a pure function of the seed: campaign and ad ids, the user and page pools, the
popularity ranks and every event (event batch b of `GENERATE_BATCH` events draws from its own
generator, seeded by (seed, b), so a shorter run is a prefix of a longer one at the same rate).
UUIDs are version-4 UUIDs made from the seeded generator's bytes.

Kafka: the record key is the event's campaign_id (UTF-8), the key the YSB job groups by (the
generator knows the map), and the partition is the slot a keyshift strategy gives that key
(`keyshift.data.replay.place_keys`; round_robin and hot_split's split keys per event,
`slots[event_id % k]`), sent through the flights replay's producer and pacing.

Redis (per topic, so two generators' maps never mix): the hash
`keyshift.names.redis_ysb_ad_campaign_key(topic)` (ad_id -> campaign_id; the published benchmark
keeps one `SET ad campaign` per ad) and the set `redis_ysb_campaigns_key(topic)` (the published
`campaigns`), replaced together in one MULTI/EXEC; and the replay record
`redis_replay_key(topic)` as the flights replay writes it, plus the generator's parameters.

What was written, for checking results (`runs/ysb-<run_id>/`):

* `expected_views.parquet`: one row per (campaign, 10-second window) holding at least one view:
  `campaign_id` (string), `window_start_ms` (int64, epoch ms, a multiple of `WINDOW_MS`: the
  window is [window_start_ms, window_start_ms + 10,000)), `views` (int64, view events of the
  campaign's ads with event_time in the window); sorted by campaign_id, window_start_ms.
* `ysb.json`: the parameters, the topic, strategy, epoch (`learned_from_events`: the head a learned
  strategy was learned from) and per-partition counts, the totals per
  event type, views, windows, the first and last event_time, and `behind_schedule_ms` (how far the
  sends fell behind the events' times at worst; wall-clock runs only).
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
from kafka.errors import KafkaError
from tqdm import tqdm

from keyshift.data.replay import (
    ReplayResult,
    check_growth,
    event_slots,
    json_objects,
    json_strings,
    open_producer,
    pacing,
    place_keys,
    replay_record_fields,
    resolve_placer,
    send_placed,
)
from keyshift.errors import ConfigurationError, StackError
from keyshift.eventtime.windows import YSB_WINDOW_MS
from keyshift.names import redis_replay_key, redis_ysb_ad_campaign_key, redis_ysb_ad_campaign_version_key, redis_ysb_campaigns_key
from keyshift.placement.learning import LEARN_FRACTION, LEARNED_STRATEGIES, publish_learned
from keyshift.placement.strategies import Strategy
from keyshift.settings import Settings
from keyshift.topics import end_offsets, kafka_config

log = logging.getLogger(__name__)

AD_TYPES: tuple[str, ...] = ("banner", "modal", "sponsored-search", "mail", "mobile")
"""The published benchmark's ad types, drawn uniformly."""

EVENT_TYPES: tuple[str, ...] = ("view", "click", "purchase")
"""The published benchmark's event types, drawn uniformly; the YSB job counts `view` only."""

IP_ADDRESS = "1.2.3.4"
"""Every event's ip_address, as published."""

RECORD_FIELDS: tuple[str, ...] = (
    "event_id", "user_id", "page_id", "ad_id", "ad_type", "event_type", "event_time", "ip_address",
)
"""Fields of an ad event's JSON value, in the order they are written."""

POOL_SIZE = 100
"""User ids and page ids per pool (the published `run` mode draws from 100 of each)."""

WINDOW_MS = YSB_WINDOW_MS
"""The YSB window: 10 seconds of event time, aligned to the epoch (`keyshift.eventtime.windows.YSB_WINDOW_MS`)."""

GENERATE_BATCH = 8_192
"""Events per generated batch (each from its own seeded generator); fixed, so streams are prefixes."""

_STREAM_MAP, _STREAM_POOLS, _STREAM_RANKS, _STREAM_EVENTS = 0, 1, 2, 3


def _check_count(name: str, value: int, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigurationError(f"{name} must be an int >= {least}, got {value!r}")
    return value


def check_zipf(zipf: float | None) -> float | None:
    """Validate the Zipf exponent: None (uniform ads) or a finite s > 0.

    Raises:
        ConfigurationError: naming the bad value.
    """
    if zipf is None:
        return None
    if isinstance(zipf, bool) or not isinstance(zipf, (int, float)) or not math.isfinite(zipf) or zipf <= 0:
        raise ConfigurationError(f"zipf must be a finite number > 0 (or unset for uniform ads), got {zipf!r}")
    return float(zipf)


def seeded_uuids(rng: np.random.Generator, n: int) -> list[str]:
    """`n` version-4 UUID strings from `rng`'s bytes (16 per UUID): the same generator state
    gives the same ids."""
    raw = rng.bytes(16 * n)
    return [str(uuid.UUID(bytes=raw[16 * i : 16 * i + 16], version=4)) for i in range(n)]


@dataclass(frozen=True)
class CampaignMap:
    """The campaigns and their ads: campaign i owns ads[i * A : (i + 1) * A] (A = ads_per_campaign).

    Attributes:
        campaigns: campaign ids (UUID strings), C of them.
        ads: ad ids (UUID strings), C x A of them, grouped by campaign.
        ads_per_campaign: A >= 1.
    """

    campaigns: tuple[str, ...]
    ads: tuple[str, ...]
    ads_per_campaign: int

    def campaign_index(self, ad_codes: np.ndarray) -> np.ndarray:
        """The campaign index (into `campaigns`) of each ad index (into `ads`), int64."""
        return np.asarray(ad_codes, dtype=np.int64) // self.ads_per_campaign

    def ad_campaign(self) -> dict[str, str]:
        """ad_id -> campaign_id for every ad (what the Redis hash holds)."""
        return {ad: self.campaigns[i // self.ads_per_campaign] for i, ad in enumerate(self.ads)}


def campaign_map(campaigns: int = 100, ads_per_campaign: int = 10, seed: int = 0) -> CampaignMap:
    """The campaign -> ads map of a run: C campaign ids, then C x A ad ids, from the seed.

    Args:
        campaigns: C >= 1. ads_per_campaign: A >= 1. seed: int >= 0.

    Raises:
        ConfigurationError: a count or seed out of range.
    """
    _check_count("campaigns", campaigns, 1)
    _check_count("ads_per_campaign", ads_per_campaign, 1)
    _check_count("seed", seed, 0)
    rng = np.random.default_rng([seed, _STREAM_MAP])
    campaign_ids = seeded_uuids(rng, campaigns)
    ad_ids = seeded_uuids(rng, campaigns * ads_per_campaign)
    return CampaignMap(tuple(campaign_ids), tuple(ad_ids), ads_per_campaign)


def ad_popularity(ads: int, zipf: float | None = None, seed: int = 0) -> np.ndarray:
    """The probability of each ad index being drawn by an event (float64, sums to 1).

    Uniform (1 / ads each) without `zipf`; with s = zipf > 0, the ad of rank r (1-based) has
    probability r^-s / sum_{q=1..ads} q^-s, and rank r goes to ad `permutation[r - 1]` of a
    permutation seeded by `seed` (so the popular ads fall on campaigns at random).

    Raises:
        ConfigurationError: ads < 1, a bad zipf or seed.
    """
    _check_count("ads", ads, 1)
    _check_count("seed", seed, 0)
    if check_zipf(zipf) is None:
        return np.full(ads, 1.0 / ads)
    by_rank = np.arange(1, ads + 1, dtype=np.float64) ** -zipf
    by_rank /= by_rank.sum()
    weights = np.empty(ads)
    weights[np.random.default_rng([seed, _STREAM_RANKS]).permutation(ads)] = by_rank
    return weights


def event_times_ms(start_ms: int, rate: float, event_ids: np.ndarray) -> np.ndarray:
    """Event time of each event id n: start_ms + floor(n * 1000 / rate), epoch ms (int64).

    Args:
        start_ms: the first event's time, epoch ms >= 0. rate: events/s > 0.
        event_ids: int array of n >= 0.
    """
    return start_ms + np.floor(np.asarray(event_ids, dtype=np.float64) * (1000.0 / rate)).astype(np.int64)


def window_start_ms(times_ms: np.ndarray) -> np.ndarray:
    """The start of each time's 10-second window (`WINDOW_MS`, epoch-aligned), epoch ms (int64)."""
    times = np.asarray(times_ms, dtype=np.int64)
    return times - times % WINDOW_MS


@dataclass(frozen=True)
class EventBatch:
    """Consecutive events of a run, as indices into the run's pools (vectorized; no per-row Python).

    Attributes:
        event_ids: int64, n of each event (consecutive).
        users, pages: int64 indices into the user and page pools (`POOL_SIZE` each).
        ads: int64 indices into `CampaignMap.ads`. campaigns: int64 indices into `CampaignMap.campaigns`.
        ad_types: int64 indices into `AD_TYPES`. event_types: int64 indices into `EVENT_TYPES`.
        event_times: int64 event times, epoch ms.
    """

    event_ids: np.ndarray
    users: np.ndarray
    pages: np.ndarray
    ads: np.ndarray
    campaigns: np.ndarray
    ad_types: np.ndarray
    event_types: np.ndarray
    event_times: np.ndarray

    def __len__(self) -> int:
        """Events in the batch."""
        return len(self.event_ids)


class EventStream:
    """The events of one generator run: a pure function of (map, seed, zipf, start_ms, rate).

    Args:
        cmap: the campaign map. seed: int >= 0. start_ms: first event time, epoch ms >= 0.
        rate: events/s > 0 (spacing of event times: 1000 / rate ms). zipf: None (uniform ads) or s > 0.

    Raises:
        ConfigurationError: a bad seed, start_ms, rate or zipf.
    """

    def __init__(self, cmap: CampaignMap, seed: int, start_ms: int, rate: float, zipf: float | None = None) -> None:
        _check_count("seed", seed, 0)
        _check_count("start_ms", start_ms, 0)
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate <= 0:
            raise ConfigurationError(f"rate must be a finite number > 0 events/s, got {rate!r}")
        self.cmap, self.seed, self.start_ms, self.rate, self.zipf = cmap, seed, start_ms, float(rate), check_zipf(zipf)
        pools = np.random.default_rng([seed, _STREAM_POOLS])
        self.users = seeded_uuids(pools, POOL_SIZE)
        self.pages = seeded_uuids(pools, POOL_SIZE)
        self.popularity = ad_popularity(len(cmap.ads), self.zipf, seed)
        self._cdf = np.cumsum(self.popularity)
        self._literals = {
            "user_id": pa.array([json.dumps(u) for u in self.users]),
            "page_id": pa.array([json.dumps(p) for p in self.pages]),
            "ad_id": pa.array([json.dumps(a) for a in cmap.ads]),
            "ad_type": pa.array([json.dumps(t) for t in AD_TYPES]),
            "event_type": pa.array([json.dumps(t) for t in EVENT_TYPES]),
        }

    def batch(self, index: int) -> EventBatch:
        """Batch `index` (>= 0): events index * GENERATE_BATCH ... (index + 1) * GENERATE_BATCH - 1."""
        rng = np.random.default_rng([self.seed, _STREAM_EVENTS, index])
        size = GENERATE_BATCH
        ids = np.arange(index * size, (index + 1) * size, dtype=np.int64)
        if self.zipf is None:
            ads = rng.integers(0, len(self.cmap.ads), size)
        else:
            ads = np.minimum(np.searchsorted(self._cdf, rng.random(size), side="right"), len(self.cmap.ads) - 1)
        ads = ads.astype(np.int64)
        return EventBatch(
            event_ids=ids,
            users=rng.integers(0, POOL_SIZE, size),
            pages=rng.integers(0, POOL_SIZE, size),
            ads=ads,
            campaigns=self.cmap.campaign_index(ads),
            ad_types=rng.integers(0, len(AD_TYPES), size),
            event_types=rng.integers(0, len(EVENT_TYPES), size),
            event_times=event_times_ms(self.start_ms, self.rate, ids),
        )

    def batches(self, events: int) -> Iterator[EventBatch]:
        """The first `events` events (>= 0), in order, in batches of at most `GENERATE_BATCH`."""
        _check_count("events", events, 0)
        for index in range(-(-events // GENERATE_BATCH)):
            batch = self.batch(index)
            keep = min(GENERATE_BATCH, events - index * GENERATE_BATCH)
            if keep < GENERATE_BATCH:
                batch = EventBatch(**{name: column[:keep] for name, column in asdict(batch).items()})
            yield batch

    def values(self, batch: EventBatch) -> list[bytes]:
        """The JSON value of each event of `batch` (fields in `RECORD_FIELDS` order), UTF-8 bytes."""
        literals = self._literals
        return json_objects([
            ("event_id", pa.array(batch.event_ids).cast(pa.string())),
            ("user_id", literals["user_id"].take(batch.users)),
            ("page_id", literals["page_id"].take(batch.pages)),
            ("ad_id", literals["ad_id"].take(batch.ads)),
            ("ad_type", literals["ad_type"].take(batch.ad_types)),
            ("event_type", literals["event_type"].take(batch.event_types)),
            ("event_time", pa.array(batch.event_times).cast(pa.string())),
            ("ip_address", json_strings(pa.array([IP_ADDRESS] * len(batch), pa.string()))),
        ])

    def frame(self, batch: EventBatch) -> pd.DataFrame:
        """The events of `batch` as a DataFrame: the record's fields (`RECORD_FIELDS`) plus `campaign_id`."""
        return pd.DataFrame({
            "event_id": batch.event_ids,
            "user_id": np.asarray(self.users, dtype=object)[batch.users],
            "page_id": np.asarray(self.pages, dtype=object)[batch.pages],
            "ad_id": np.asarray(self.cmap.ads, dtype=object)[batch.ads],
            "ad_type": np.asarray(AD_TYPES, dtype=object)[batch.ad_types],
            "event_type": np.asarray(EVENT_TYPES, dtype=object)[batch.event_types],
            "event_time": batch.event_times,
            "ip_address": IP_ADDRESS,
            "campaign_id": np.asarray(self.cmap.campaigns, dtype=object)[batch.campaigns],
        })


class ViewCounter:
    """Counts what a run wrote: views per (campaign, 10-second window), and events per type.

    Args:
        cmap: the run's campaign map (names the campaign indices in `frame`).
    """

    def __init__(self, cmap: CampaignMap) -> None:
        self.cmap = cmap
        self._views: dict[tuple[int, int], int] = {}
        self.by_type = np.zeros(len(EVENT_TYPES), dtype=np.int64)
        self.first_ms: int | None = None
        self.last_ms: int | None = None

    def add(self, campaigns: np.ndarray, event_types: np.ndarray, event_times: np.ndarray) -> None:
        """Count a batch: campaign indices, event type indices (into `EVENT_TYPES`) and event times (epoch ms)."""
        event_times = np.asarray(event_times, dtype=np.int64)
        if event_times.size == 0:
            return
        self.by_type += np.bincount(np.asarray(event_types, dtype=np.int64), minlength=len(EVENT_TYPES))
        self.first_ms = int(event_times.min()) if self.first_ms is None else min(self.first_ms, int(event_times.min()))
        self.last_ms = int(event_times.max()) if self.last_ms is None else max(self.last_ms, int(event_times.max()))
        views = np.asarray(event_types) == EVENT_TYPES.index("view")
        pairs = np.stack([np.asarray(campaigns, dtype=np.int64)[views], window_start_ms(event_times[views])], axis=1)
        found, counts = np.unique(pairs, axis=0, return_counts=True)
        for (campaign, window), count in zip(found.tolist(), counts.tolist()):
            self._views[(campaign, window)] = self._views.get((campaign, window), 0) + count

    def add_batch(self, batch: EventBatch) -> None:
        """Count an `EventBatch`."""
        self.add(batch.campaigns, batch.event_types, batch.event_times)

    def frame(self) -> pd.DataFrame:
        """Views per window: columns campaign_id (str), window_start_ms (int64), views (int64),
        one row per (campaign, window) with at least one view, sorted by campaign_id, window_start_ms."""
        rows = [(self.cmap.campaigns[c], w, n) for (c, w), n in self._views.items()]
        frame = pd.DataFrame(rows, columns=["campaign_id", "window_start_ms", "views"])
        frame = frame.astype({"campaign_id": object, "window_start_ms": "int64", "views": "int64"})
        return frame.sort_values(["campaign_id", "window_start_ms"], ignore_index=True)

    def totals(self) -> dict[str, int]:
        """Events written per event type (`EVENT_TYPES` order), e.g. {"view": 3340, "click": ..., "purchase": ...}."""
        return {name: int(count) for name, count in zip(EVENT_TYPES, self.by_type)}


def count_views(frame: pd.DataFrame) -> pd.DataFrame:
    """Views per (campaign, 10-second window) recomputed from events read back (pandas, independent
    of `ViewCounter`).

    Args:
        frame: one row per event with columns campaign_id, event_type, event_time (epoch ms).

    Returns:
        The columns and order of `ViewCounter.frame`.

    Raises:
        KeyError: a column missing.
    """
    views = frame.loc[frame["event_type"] == "view", ["campaign_id", "event_time"]]
    counted = (
        views.assign(window_start_ms=views["event_time"].astype("int64") // WINDOW_MS * WINDOW_MS)
        .groupby(["campaign_id", "window_start_ms"], as_index=False)
        .size()
        .rename(columns={"size": "views"})
    )
    counted = counted.astype({"campaign_id": object, "window_start_ms": "int64", "views": "int64"})
    return counted.sort_values(["campaign_id", "window_start_ms"], ignore_index=True)


def campaign_counts(stream: EventStream, events: int) -> dict[str, int]:
    """Events per campaign id among the stream's first `events` events (>= 0), campaigns in the
    order they first appear (the history a learned strategy is built from)."""
    codes = np.concatenate([batch.campaigns for batch in stream.batches(events)] or [np.zeros(0, np.int64)])
    found, first = np.unique(codes, return_index=True)
    counts = np.bincount(codes, minlength=len(stream.cmap.campaigns))
    return {stream.cmap.campaigns[c]: int(counts[c]) for c in found[np.argsort(first)].tolist()}


def write_campaign_map(settings: Settings, topic: str, cmap: CampaignMap) -> None:
    """Replace the topic's YSB map in Redis: the hash ad_id -> campaign_id and the campaigns set,
    both deleted and written again in one MULTI/EXEC (a reader never sees half a map), which also
    increments the map's version counter (`redis_ysb_ad_campaign_version_key`: the YSB job's
    executors reload their cached copy when it changes).

    Raises:
        StackError: Redis unreachable or refusing the login.
    """
    import redis

    from keyshift.runs import redis_client

    client = redis_client(settings)
    hash_key, set_key = redis_ysb_ad_campaign_key(topic), redis_ysb_campaigns_key(topic)
    try:
        pipe = client.pipeline(transaction=True)
        pipe.delete(hash_key, set_key)
        pipe.hset(hash_key, mapping=cmap.ad_campaign())
        pipe.sadd(set_key, *cmap.campaigns)
        pipe.incr(redis_ysb_ad_campaign_version_key(topic))
        pipe.execute()
    except redis.RedisError as exc:
        raise StackError(f"Redis at {settings.redis_address} failed writing the YSB map of {topic!r}: {exc}") from exc


@dataclass(frozen=True)
class YsbResult:
    """What one generator run wrote.

    Attributes:
        replay: the Kafka side (topic, strategy, epoch, partitions, events per partition, end
            offsets, seconds), as the flights replay reports it.
        run_id: the run's id; run_dir: `runs/ysb-<run_id>/` with expected_views.parquet and ysb.json.
        start_ms: the first event's time (epoch ms). wall_clock: True when paced in real time.
        events_by_type: events per event type. views: view events. windows: (campaign, window)
            rows of expected_views.parquet. behind_schedule_ms: worst lag of a send behind its
            event's time (ms; wall-clock runs, else 0).
    """

    replay: ReplayResult
    run_id: str
    run_dir: Path
    start_ms: int
    wall_clock: bool
    events_by_type: dict[str, int]
    views: int
    windows: int
    behind_schedule_ms: int


def generate_ysb(
    settings: Settings,
    topic: str,
    *,
    rate: float,
    duration: float,
    campaigns: int = 100,
    ads_per_campaign: int = 10,
    seed: int = 0,
    zipf: float | None = None,
    strategy: str | Strategy = "hash",
    partitions: int | None = None,
    start_ms: int | None = None,
    run_id: str,
    progress: bool = True,
) -> YsbResult:
    """Generate floor(rate x duration) YSB ad events into `topic`, the map into Redis, and the record.

    Order: check the topic and the strategy, write the map to Redis, produce (acks=all,
    idempotent), check each partition's end offset grew by what was sent, write
    `runs/ysb-<run_id>/expected_views.parquet` and `ysb.json`, then the Redis replay record.

    Args:
        settings: broker, Redis and runs folder.
        topic: an existing topic (`keyshift topics create ysb-ad-events`).
        rate: events/s > 0: the spacing of event times (1000 / rate ms) and, in wall-clock mode,
            the send rate (token bucket).
        duration: seconds of generation (event time) > 0.
        campaigns, ads_per_campaign: C >= 1, A >= 1. seed: int >= 0. zipf: None or s > 0.
        strategy: a strategy name or `Strategy` placing campaign ids (`resolve_placer`). A learned
            name (least_key, least_count, hot_split) is first learned from the campaign counts of
            this run's first `LEARN_FRACTION` (10 %) of events and published under `topic` with a
            new epoch (`publish_learned`), then read back as the flights replay reads one.
        partitions: P expected; None = the topic's.
        start_ms: None = wall clock (the first event's time is now, sends paced at `rate`); an
            epoch ms >= 0 = backfill: event times from there, sent as fast as possible.
        run_id: names `runs/ysb-<run_id>/` (letters, digits, `.`, `_`, `-`).
        progress: show a tqdm bar (stderr).

    Returns:
        A `YsbResult`.

    Raises:
        ConfigurationError: a bad count, rate, duration, zipf, start_ms or run id; fewer than one
            event; a missing topic or P mismatch; an existing run folder.
        PlacementError: an unknown strategy, or one the generator cannot place.
        StackError: Kafka or Redis unreachable or failing, or end offsets that did not grow by
            exactly the records sent.
    """
    if not isinstance(duration, (int, float)) or isinstance(duration, bool) or not math.isfinite(duration) or duration <= 0:
        raise ConfigurationError(f"duration must be a finite number > 0 s, got {duration!r}")
    if start_ms is not None:
        _check_count("start_ms", start_ms, 0)
    if not run_id or not all(ch.isalnum() or ch in "._-" for ch in run_id) or run_id.startswith("."):
        raise ConfigurationError(f"run id must be letters, digits, '.', '_' or '-', not starting with '.', got {run_id!r}")
    cmap = campaign_map(campaigns, ads_per_campaign, seed)
    wall_clock = start_ms is None
    stream = EventStream(cmap, seed, 0 if wall_clock else start_ms, rate, zipf)  # wall clock: restarted below
    events = int(math.floor(rate * duration))
    if events < 1:
        raise ConfigurationError(f"rate x duration = {rate:g} x {duration:g} s makes no event; raise either")
    run_dir = Path(settings.runs_dir) / f"ysb-{run_id}"
    if run_dir.exists():
        raise ConfigurationError(f"{run_dir} exists already; choose another --run-id")

    learned_from = None
    if isinstance(strategy, str) and strategy in LEARNED_STRATEGIES:
        # learn from this run's own head (the flights' counts mean nothing here), publish, then place by it
        info, _ = resolve_placer(settings, topic, "hash", partitions)  # the topic exists and has P partitions
        learned_from = max(1, int(events * LEARN_FRACTION))
        counts = campaign_counts(stream, learned_from)
        publish_learned(settings, topic, strategy, info.partitions, counts, learned_from, source="YSB events")
    info, placer = resolve_placer(settings, topic, strategy, partitions)
    slot_by_key, split_by_key = place_keys(placer, cmap.campaigns)
    write_campaign_map(settings, topic, cmap)
    keys = [c.encode("utf-8") for c in cmap.campaigns]
    counter = ViewCounter(cmap)
    sent = np.zeros(info.partitions, dtype=np.int64)
    behind_ms = 0
    before = end_offsets(settings, topic)
    log.info(
        "generating %s YSB events to %s (%d campaigns x %d ads, zipf %s, seed %d, P=%d, strategy %s epoch %d, %s)",
        f"{events:,}", topic, campaigns, ads_per_campaign, zipf, seed, info.partitions, placer.name, placer.epoch,
        f"wall clock at {rate:,.0f} events/s" if wall_clock else f"backfill from {start_ms} ms",
    )
    bucket, step = pacing(rate if wall_clock else None)
    bar = tqdm(total=events, unit="ev", unit_scale=True, desc=f"ysb {topic}", disable=not progress, mininterval=0.5)
    producer = open_producer(kafka_config(settings, "keyshift-ysb"))
    if wall_clock:  # the first event's time is when sending starts, after the checks and the learning
        stream = EventStream(cmap, seed, int(time.time() * 1000), rate, zipf)
    started_at = datetime.now(UTC)
    started = time.perf_counter()
    try:
        with bar:
            for batch in stream.batches(events):
                slots = event_slots(cmap.campaigns, batch.campaigns, batch.event_ids, slot_by_key, split_by_key)
                send_placed(
                    producer.send, topic, [keys[c] for c in batch.campaigns.tolist()], stream.values(batch),
                    slots.tolist(), bucket, step, bar.update,
                )
                sent += np.bincount(slots, minlength=info.partitions)
                counter.add_batch(batch)
                if wall_clock:
                    behind_ms = max(behind_ms, int(time.time() * 1000) - int(batch.event_times[-1]))
            producer.flush()
    except KafkaError as exc:
        raise StackError(f"Kafka failed while generating YSB events to {topic!r} at {settings.bootstrap_servers}: {exc}") from exc
    finally:
        producer.close()
    seconds = time.perf_counter() - started
    after = end_offsets(settings, topic)
    per_partition = {p: int(sent[p]) for p in range(info.partitions)}
    check_growth(topic, before, after, per_partition, settings)
    result = ReplayResult(
        topic=topic, strategy=placer.name, epoch=placer.epoch, partitions=info.partitions,
        events_produced=int(sent.sum()), per_partition=per_partition, end_offsets=after, seconds=seconds,
        workers=1, split_keys={key: list(slots) for key, slots in sorted(split_by_key.items())},
    )
    expected = counter.frame()
    record = {
        "run_id": run_id, "topic": topic, "seed": seed, "campaigns": campaigns, "ads_per_campaign": ads_per_campaign,
        "zipf": stream.zipf, "rate": rate, "duration_s": duration, "start_ms": stream.start_ms,
        "wall_clock": wall_clock, "events": result.events_produced, "events_by_type": counter.totals(),
        "views": int(expected["views"].sum()), "windows": len(expected), "window_ms": WINDOW_MS,
        "first_event_time_ms": counter.first_ms, "last_event_time_ms": counter.last_ms,
        "behind_schedule_ms": max(0, behind_ms), "strategy": placer.name, "epoch": placer.epoch,
        "learned_from_events": learned_from,
        "partitions": info.partitions, "per_partition": per_partition, "start_offsets": before,
        "end_offsets": after, "seconds": round(seconds, 3),
        "ad_campaign_key": redis_ysb_ad_campaign_key(topic), "campaigns_key": redis_ysb_campaigns_key(topic),
    }
    run_dir.mkdir(parents=True)
    expected.to_parquet(run_dir / "expected_views.parquet", index=False)
    (run_dir / "ysb.json").write_text(json.dumps(record, indent=2) + "\n")
    _store_record(settings, result, before, started_at, rate if wall_clock else None, record, run_dir)
    log.info("generated %s YSB events to %s in %.1f s; record in %s", f"{result.events_produced:,}", topic, seconds, run_dir)
    return YsbResult(
        replay=result, run_id=run_id, run_dir=run_dir, start_ms=stream.start_ms, wall_clock=wall_clock,
        events_by_type=counter.totals(), views=record["views"], windows=record["windows"],
        behind_schedule_ms=record["behind_schedule_ms"],
    )


def _store_record(
    settings: Settings, result: ReplayResult, before: dict[int, int], started_at: datetime, rate: float | None,
    record: dict[str, object], run_dir: Path,
) -> None:
    """The Redis replay record of a YSB run: the common replay fields plus `source` = "ysb", the
    run id, seed, campaigns, ads_per_campaign, zipf ("" = uniform), start_ms and the run folder."""
    from keyshift.runs import redis_client

    redis_client(settings).hset(
        redis_replay_key(result.topic),
        mapping={
            **replay_record_fields(result, before, started_at, rate),
            "source": "ysb",
            "limit": result.events_produced,
            **{name: record[name] for name in ("run_id", "seed", "campaigns", "ads_per_campaign", "start_ms")},
            "zipf": "" if record["zipf"] is None else record["zipf"],
            "record": str(run_dir),
        },
    )
