"""A job's key looked up from a record field in a map kept in Redis, executor-side (Local Merge).

The Yahoo Streaming Benchmark joins every ad event to its campaign through the ad -> campaign
map its generator writes to Redis (`keyshift.data.ysb`; the published jobs cache it per task and
ask Redis on a miss). A spec with `key_lookup` (`keyshift.jobs.spec.KeyLookup`) does the
same here, inside Local Merge's `mapInArrow` function, before the partials are cut:

- each Python worker keeps one copy of the map per (Redis, hash) (`KeyMapCache`), read whole
  (HGETALL) the first time and again only when the map's version counter (`KeyLookup.version_key`,
  which the generator increments in the same MULTI/EXEC that replaces the map) has changed: one
  GET per Local Merge call, i.e. per ingest task per micro-batch;
- a value the copy lacks is asked for with one HMGET of all such values of the call, so a map
  that grew without a new version is still followed;
- `resolve_keys` then sets each valid record's key to the looked-up one, or makes it a dead
  letter: `unknown <field>` when the value is not in the map, `key does not match <key>` when
  the Kafka key (the key the producer claims, carried in the key column by
  `keyshift.processing.operators.records.validate_records`) differs from it.

Redis is read only; a map that changes mid-run takes effect from the next Local Merge call.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from keyshift.errors import StackError
from keyshift.processing.operators.records import key_mismatch
from keyshift.jobs.spec import JobSpec, KeyLookup


def resolve_keys(events: pa.Table, spec: JobSpec, values: pa.Array, keys: pa.Array) -> pa.Table:
    """Look up the key of every valid record of `events`.

    Args:
        events: a table of `keyshift.processing.operators.local_merge.input_columns(spec)` (one Local
            Merge call's rows); the key column holds the Kafka key as text, `dead_letter_reason`
            is NULL for a valid record.
        spec: a job with `key_lookup`.
        values, keys: the map as two string arrays of equal length (values[i] -> keys[i]),
            values distinct.

    Returns:
        `events` with, for each valid record, the key column set to the looked-up key, or
        `dead_letter_reason` set to `unknown <field>` (not in the map) or `key does not match
        <key>` (the Kafka key differs) and the key column NULL. Rejected records are unchanged.
    """
    lookup = spec.key_lookup
    field = next(f.col for f in spec.fields if f.name == lookup.field)
    reasons = events.column("dead_letter_reason").combine_chunks()
    valid = pc.is_null(reasons)
    index = pc.index_in(events.column(field).combine_chunks(), value_set=values)
    found = pc.take(keys, index)
    claimed = events.column(spec.key).combine_chunks()
    missing = pc.and_(valid, pc.is_null(index))
    differs = pc.and_(pc.and_(valid, pc.invert(missing)), pc.invert(pc.fill_null(pc.equal(claimed, found), False)))
    reason = pc.if_else(missing, pa.scalar(lookup.missing_reason), pc.if_else(differs, pa.scalar(key_mismatch(spec)), reasons))
    good = pc.and_(valid, pc.is_null(reason))
    key = pc.if_else(good, found, pa.scalar(None, pa.string()))
    events = events.set_column(events.schema.get_field_index("dead_letter_reason"), "dead_letter_reason", reason)
    return events.set_column(events.schema.get_field_index(spec.key), spec.key, key)


class KeyMapCache:
    """One worker's copy of a lookup map in Redis (module docstring).

    Args:
        client: a `redis.Redis` client with `decode_responses=True`.
        map_key: the Redis hash value -> key.
        version_key: the counter its writer increments with each new map (absent: version None).
    """

    def __init__(self, client, map_key: str, version_key: str) -> None:
        self._client = client
        self.map_key = map_key
        self.version_key = version_key
        self.version: str | None = None
        self.mapping: dict[str, str] | None = None
        self.reloads = 0
        self._arrays: tuple[pa.Array, pa.Array] | None = None

    def arrays_for(self, wanted: pa.Array) -> tuple[pa.Array, pa.Array]:
        """The map as (values, keys) string arrays, current for the values in `wanted`.

        One GET of the version per call (HGETALL when it changed or on the first call), and one
        HMGET of the wanted values the copy lacks, if any.

        Raises:
            StackError: Redis unreachable.
        """
        import redis

        try:
            version = self._client.get(self.version_key)
            if self.mapping is None or version != self.version:
                self.mapping, self.version, self._arrays = dict(self._client.hgetall(self.map_key)), version, None
                self.reloads += 1
            distinct = [v for v in pc.unique(wanted.drop_null()).to_pylist() if v not in self.mapping]
            if distinct:
                found = {v: k for v, k in zip(distinct, self._client.hmget(self.map_key, distinct)) if k is not None}
                if found:
                    self.mapping.update(found)
                    self._arrays = None
        except redis.RedisError as exc:
            raise StackError(f"Redis failed reading the lookup map {self.map_key!r}: {exc}; is Redis up (keyshift stack up)?") from exc
        if self._arrays is None:
            values = np.array(list(self.mapping), dtype=object)
            self._arrays = (pa.array(values, pa.string()), pa.array([self.mapping[v] for v in values], pa.string()))
        return self._arrays


_CACHES: dict[tuple[str, str], KeyMapCache] = {}
"""Per Python worker: (redis_url, map key) -> its cache (kept across micro-batches)."""


def worker_cache(redis_url: str, lookup: KeyLookup, topic: str) -> KeyMapCache:
    """This worker's `KeyMapCache` of `lookup`'s map for input `topic` on Redis at `redis_url`
    (made on first use, then reused by every later Local Merge call of the worker)."""
    cache = _CACHES.get((redis_url, lookup.map_key(topic)))
    if cache is None:
        import redis

        client = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=30)
        cache = _CACHES[(redis_url, lookup.map_key(topic))] = KeyMapCache(client, lookup.map_key(topic), lookup.version_key(topic))
    return cache


def lookup_keys(events: pa.Table, spec: JobSpec, cache: KeyMapCache) -> pa.Table:
    """`resolve_keys` with the map from `cache`, current for the valid records' lookup values.

    Raises:
        StackError: Redis unreachable.
    """
    field = next(f.col for f in spec.fields if f.name == spec.key_lookup.field)
    wanted = pc.filter(events.column(field).combine_chunks(), pc.is_null(events.column("dead_letter_reason").combine_chunks()))
    values, keys = cache.arrays_for(wanted)
    return resolve_keys(events, spec, values, keys)
