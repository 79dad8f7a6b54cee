"""The shared assignment and its epoch, in Redis: one answer per key for every producer.

DESIGN.md makes Redis the coordinator (paper 000's history assignment map and dynamic
configuration centre). One **assignment** (e.g. one per input topic, named after it) is four
Redis hashes under the prefix `keyshift:assignment:<name>` (`assignment_keys`):

| key | fields | meaning |
| --- | --- | --- |
| `...:map` | unit -> slot | the history assignment map; a unit is the key itself, or its bucket `bucket_of(key, B)` written in decimal when the assignment is per bucket; a split unit's FIRST slot |
| `...:split` | unit -> slots | hot_split only: each unit spread over more than one slot, its slots as comma-separated decimal text in piece order (`"3,5"`: piece 0 on slot 3, piece 1 on slot 5); the first equals the unit's `...:map` slot; absent (empty) for every other strategy |
| `...:loads` | slot -> load | S of paper 000 Algorithm 1, one int per slot `0..P-1` (keys for least_key, events for least_count and hot_split) |
| `...:meta` | strategy, partitions, epoch, buckets, published_at | the strategy name that built it, P, the epoch in force, B (`0` = per key), Unix seconds of the last publish |

and one pub/sub channel `keyshift:assignment:<name>:epoch`, on which every publish sends the new
epoch (decimal text).

Two writers, both atomic on the Redis server:

* `AssignmentStore.publish` replaces the whole assignment (map, split, loads, meta) in one MULTI/EXEC
  transaction, under WATCH of the meta hash, with a strictly larger epoch, and PUBLISHes that
  epoch in the same transaction. A reader never sees half of two assignments.
* `AssignmentStore.assign` places one new key with a Lua script (`ASSIGN_SCRIPT`), Algorithm 1
  run on the server: a unit already in the map keeps its slot; else the least-loaded slot (ties
  to the lowest index) is recorded and its load raised. Redis runs a script alone, so several
  producers assigning the same new key at once all receive the same slot. Placing a new key never
  moves a known one, so `assign` never changes the epoch. The script reads and writes `...:map`
  only, so a new key is placed whole (on one slot) even under hot_split; a key is split only by
  a publish (a new epoch).

Records of a split unit are placed per event, not per key: the event with id `event_id` goes
to `slots[event_id % k]` (k = number of slots): `HotSplitStrategy.slot_for_event` with the event
id as the sequence number. The replayer and the job apply the same rule, so every record of a
split key lands in the Kafka partition equal to its Spark slot.

Producers read through `CachedAssignment`, a `Strategy` that memoizes slots per unit and learns
of a new epoch by **polling** the epoch (one HGET every `poll_seconds`, checked on the calling
thread when the strategy is used), then clears its memo. Polling was chosen over subscribing:
it needs no background thread or connection per producer, loses nothing when a connection drops
(a pub/sub message sent while disconnected is gone, a polled epoch is not), and survives a fork.
Its cost: a new epoch is seen up to `poll_seconds` late, and a key placed in the meantime is
traced to the epoch that actually placed it (the epoch the script returns), never a stale one.
The channel is still published for consumers that want a push (the Airflow monitor, a UI).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from keyshift.errors import PlacementError, StackError
from keyshift.names import REDIS_PREFIX
from keyshift.placement.strategies import (
    STRATEGY_NAMES,
    Strategy,
    bucket_of,
    check_buckets,
    check_epoch,
    check_partitions,
)

log = logging.getLogger(__name__)
from keyshift.runs import redis_client
from keyshift.settings import Settings

RULES: tuple[str, ...] = ("least_key", "least_count")
"""The Algorithm 1 rules the server-side assign applies (paper 000 §4.2.1 (2) and (3))."""

SPLIT_STRATEGY = "hot_split"
"""The one strategy whose published assignment may spread a unit over several slots."""

_NAME = re.compile(r"[A-Za-z0-9._-]+")


@dataclass(frozen=True)
class AssignmentKeys:
    """The Redis names of one assignment (see the module docstring for their contents).

    Attributes:
        map: hash unit -> slot (a split unit's first slot). loads: hash slot -> load.
        meta: hash of the assignment's facts. channel: pub/sub channel carrying each newly
        published epoch. split: hash unit -> comma-separated slots of the units spread over
        more than one slot (hot_split).
    """

    map: str
    loads: str
    meta: str
    channel: str
    split: str


def assignment_keys(name: str) -> AssignmentKeys:
    """The Redis key names of assignment `name`: `keyshift:assignment:<name>:{map,split,loads,meta,epoch}`.

    Args:
        name: the assignment's name (e.g. the topic), letters, digits, `.`, `_`, `-` only (the
            characters of a Kafka topic name), so it can never collide with another key's suffix.

    Raises:
        PlacementError: for an empty name or one with other characters.
    """
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise PlacementError(
            f"assignment name must be letters, digits, '.', '_' or '-' (like a topic name), got {name!r}"
        )
    base = f"{REDIS_PREFIX}:assignment:{name}"
    return AssignmentKeys(
        map=f"{base}:map", loads=f"{base}:loads", meta=f"{base}:meta", channel=f"{base}:epoch", split=f"{base}:split"
    )


def resolve_rule(rule: str | None, strategy: str) -> str:
    """The Algorithm 1 rule for a new key: `rule` if given, else the assignment's own strategy
    when it is least_key or least_count, else least_count (the rule that balances events).

    Raises:
        PlacementError: for a rule other than None, "least_key", "least_count".
    """
    if rule is None:
        return strategy if strategy in RULES else "least_count"
    if rule not in RULES:
        raise PlacementError(f"assign rule must be one of {', '.join(RULES)}, got {rule!r}")
    return rule


def _check_weight(weight: int) -> int:
    if isinstance(weight, bool) or not isinstance(weight, int) or weight < 0:
        raise PlacementError(f"weight must be an int >= 0 (events), got {weight!r}")
    return weight


def _unit_field(unit: Any, buckets: int | None) -> str:
    """The hash field of one unit: the key itself (per key) or the bucket's decimal text."""
    if buckets is None:
        if not isinstance(unit, str):
            raise PlacementError(f"a per-key assignment takes str keys, got {unit!r}")
        return unit
    try:
        bucket = int(unit)
    except (TypeError, ValueError):
        raise PlacementError(f"a per-bucket assignment takes bucket numbers, got {unit!r}") from None
    if isinstance(unit, bool) or not 0 <= bucket < buckets:
        raise PlacementError(f"bucket {unit!r} outside 0..{buckets - 1}")
    return str(bucket)


def _slot_tuple(unit: Any, slots: Any, partitions: int) -> tuple[int, ...]:
    """A unit's slots as a tuple: an int is one slot; a tuple or list is piece i on element i.

    Raises:
        PlacementError: no slot, a slot that is not an int in [0, P - 1], or one slot twice.
    """
    chosen = tuple(slots) if isinstance(slots, (tuple, list)) else (slots,)
    if not chosen:
        raise PlacementError(f"assignment gives {unit!r} no slot")
    for slot in chosen:
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < partitions:
            raise PlacementError(f"assignment puts {unit!r} on slot {slot!r}, outside 0..{partitions - 1}")
    if len(set(chosen)) != len(chosen):
        raise PlacementError(f"assignment puts {unit!r} on slots {list(chosen)}: a slot may hold one piece of a unit")
    return chosen


def encode_assignment(
    partitions: int,
    mapping: Mapping[Any, int | Sequence[int]],
    loads: Sequence[int] | Mapping[int, int] | None,
    buckets: int | None,
) -> tuple[dict[str, int], dict[str, int]]:
    """Validate an assignment and turn it into the `...:map` and `...:loads` fields (pure).

    Args:
        partitions: P >= 1.
        mapping: unit -> slot in [0, P - 1], or unit -> slots (a tuple or list of distinct
            slots, piece i on element i, as `HotSplitStrategy.assignment`): the map field gets
            the first slot (`encode_split` gives the rest). Units are keys (str) when `buckets`
            is None, else bucket numbers in [0, B - 1] (int, or their decimal text).
        loads: one int >= 0 per slot (a sequence of P, or slot -> load with missing slots 0);
            None for all zeros.
        buckets: None (per key) or B >= 1.

    Returns:
        (map fields unit -> first slot, loads fields slot -> load), field names as text.

    Raises:
        PlacementError: naming the first bad unit, slot or load.
    """
    check_partitions(partitions)
    check_buckets(buckets)
    fields: dict[str, int] = {}
    for unit, slots in mapping.items():
        chosen = _slot_tuple(unit, slots, partitions)
        fields[_unit_field(unit, buckets)] = chosen[0]
    if loads is None:
        per_slot = [0] * partitions
    elif isinstance(loads, Mapping):
        per_slot = [0] * partitions
        for slot, load in loads.items():
            if not isinstance(slot, int) or not 0 <= slot < partitions:
                raise PlacementError(f"loads names slot {slot!r}, outside 0..{partitions - 1}")
            per_slot[slot] = load
    else:
        per_slot = list(loads)
        if len(per_slot) != partitions:
            raise PlacementError(f"loads has {len(per_slot)} entries for {partitions} slots")
    for slot, load in enumerate(per_slot):
        if isinstance(load, bool) or not isinstance(load, int) or load < 0:
            raise PlacementError(f"load of slot {slot} must be an int >= 0, got {load!r}")
    return fields, {str(slot): load for slot, load in enumerate(per_slot)}


def encode_split(
    partitions: int,
    mapping: Mapping[Any, int | Sequence[int]],
    split: Mapping[Any, Sequence[int]] | None,
    buckets: int | None,
) -> dict[str, str]:
    """The `...:split` fields of an assignment: unit -> its slots as `"3,5"`, split units only (pure).

    A unit is split when it has two slots or more, given either as a tuple value in `mapping`
    (`HotSplitStrategy.assignment` as it is) or in `split`, beside a `mapping` that holds its
    first slot. A one-slot entry of `split` is allowed and means "not split".

    Args:
        partitions: P >= 1.
        mapping: as for `encode_assignment`.
        split: None, or unit -> slots (distinct, piece i on element i); every unit must be in
            `mapping`, whose slot must equal the first of these.
        buckets: None (per key) or B >= 1.

    Returns:
        field (unit text) -> comma-separated slots, e.g. {"ORD": "3,5"}; empty when no unit is
        split.

    Raises:
        PlacementError: a slot out of range or given twice for one unit, a split unit missing
            from `mapping` or whose first slot differs from the mapping's, or a unit given two
            different slot lists.
    """
    check_partitions(partitions)
    check_buckets(buckets)
    first: dict[str, int] = {}
    chosen_by_field: dict[str, tuple[int, ...]] = {}
    for unit, slots in mapping.items():
        chosen = _slot_tuple(unit, slots, partitions)
        field = _unit_field(unit, buckets)
        first[field] = chosen[0]
        if len(chosen) > 1:
            chosen_by_field[field] = chosen
    for unit, slots in (split or {}).items():
        chosen = _slot_tuple(unit, slots, partitions)
        field = _unit_field(unit, buckets)
        if field not in first:
            raise PlacementError(f"split unit {unit!r} is not in the mapping; the mapping must hold its first slot")
        if chosen[0] != first[field]:
            raise PlacementError(
                f"split unit {unit!r} starts on slot {chosen[0]} but the mapping puts it on slot {first[field]}; "
                "the mapping must hold a split unit's first slot"
            )
        if field in chosen_by_field and chosen_by_field[field] != chosen:
            raise PlacementError(
                f"unit {unit!r} is given slots {list(chosen_by_field[field])} in the mapping and {list(chosen)} in split"
            )
        if len(chosen) > 1:
            chosen_by_field[field] = chosen
    return {field: ",".join(str(slot) for slot in chosen) for field, chosen in chosen_by_field.items()}


def decode_split(text: str | bytes) -> tuple[int, ...]:
    """A `...:split` field value back to slots: `"3,5"` -> (3, 5).

    Raises:
        PlacementError: for text that is not comma-separated decimal slots.
    """
    text = _text(text)
    try:
        return tuple(int(part) for part in text.split(","))
    except (AttributeError, ValueError):
        raise PlacementError(f"split slots must be comma-separated integers like '3,5', got {text!r}") from None


ASSIGN_SCRIPT = """
-- KEYS: map, loads, meta. ARGV: unit, weight, rule ('' = from meta), buckets the caller assumed,
-- observe_known ('1': a known unit's weight is added to its slot's load under least_count).
-- Returns {slot, epoch, status}: status 1 = newly placed, 0 = known, -1 = caller's buckets stale.
local meta = redis.call('HMGET', KEYS[3], 'partitions', 'epoch', 'buckets', 'strategy')
local p = tonumber(meta[1])
if not p then return redis.error_reply('KEYSHIFT_NO_ASSIGNMENT') end
local epoch = tonumber(meta[2]) or 0
if (meta[3] or '0') ~= ARGV[4] then return {-1, epoch, -1} end
local weight = tonumber(ARGV[2])
local rule = ARGV[3]
if rule == '' then
  if meta[4] == 'least_key' then rule = 'least_key' else rule = 'least_count' end
end
local known = redis.call('HGET', KEYS[1], ARGV[1])
if known then
  local slot = tonumber(known)
  if rule == 'least_count' and ARGV[5] == '1' and weight > 0 then
    redis.call('HINCRBY', KEYS[2], slot, weight)
  end
  return {slot, epoch, 0}
end
local flat = redis.call('HGETALL', KEYS[2])
local loads = {}
for i = 1, #flat, 2 do loads[tonumber(flat[i])] = tonumber(flat[i + 1]) end
local best = 0
local best_load = loads[0] or 0
for s = 1, p - 1 do
  local load = loads[s] or 0
  if load < best_load then best = s; best_load = load end
end
redis.call('HSET', KEYS[1], ARGV[1], best)
local add = weight
if rule == 'least_key' then add = 1 end
redis.call('HINCRBY', KEYS[2], best, add)
return {best, epoch, 1}
"""
"""Algorithm 1 (paper 000 §4.2.1, "Least") as a Redis Lua script; see `AssignmentStore.assign`."""


@dataclass(frozen=True)
class AssignmentMeta:
    """The facts of the assignment in force.

    Attributes:
        strategy: name of the strategy that built it (one of `STRATEGY_NAMES`).
        partitions: P >= 1. epoch: >= 1 once published. buckets: None (per key) or B >= 1.
        published_at: Unix seconds of the publish.
    """

    strategy: str
    partitions: int
    epoch: int
    buckets: int | None
    published_at: float

    def unit_of(self, key: str) -> str:
        """The map field of `key`: the key itself, or its bucket's decimal text (per bucket)."""
        return key if self.buckets is None else str(bucket_of(key, self.buckets))


def _text(value: Any) -> Any:
    return value.decode("utf-8") if isinstance(value, bytes) else value


class AssignmentStore:
    """One shared assignment (key or bucket -> slot, per-slot loads, epoch) in Redis.

    Args:
        client: a `redis.Redis` (from `keyshift.runs.redis_client`, or `from_settings`); str or
            bytes responses both work.
        name: the assignment's name, e.g. the topic (`assignment_keys` says which are valid).

    Every method raises StackError, with the fix, when Redis cannot be reached, and PlacementError
    for bad arguments or when no assignment was published under `name` yet.
    """

    def __init__(self, client: redis.Redis, name: str) -> None:
        self.client = client
        self.name = name
        self.keys = assignment_keys(name)
        self._script = client.register_script(ASSIGN_SCRIPT)

    @classmethod
    def from_settings(cls, settings: Settings, name: str) -> AssignmentStore:
        """A store on the coordinator at `settings.redis_url`.

        Raises:
            StackError: if Redis does not answer PING (run `keyshift stack up`).
        """
        return cls(redis_client(settings), name)

    def _unreachable(self, exc: redis.RedisError) -> StackError:
        return StackError(f"Redis did not answer for assignment {self.name!r} ({exc}); run `keyshift stack up`")

    def publish(
        self,
        strategy_name: str,
        partitions: int,
        mapping: Mapping[Any, int],
        loads: Sequence[int] | Mapping[int, int] | None = None,
        epoch: int | None = None,
        *,
        buckets: int | None = None,
        split: Mapping[Any, Sequence[int]] | None = None,
    ) -> int:
        """Replace the whole assignment atomically and announce its new epoch.

        One MULTI/EXEC transaction, under WATCH of the meta hash (retried if another publish
        slipped in): deletes the old map, split and loads, writes the new ones and the meta, and
        PUBLISHes the new epoch on `keys.channel`. Readers and `assign` see the old assignment or
        the new one, never a mix (a republish without split units leaves no old split behind).

        Args:
            strategy_name: the strategy that built it, one of `STRATEGY_NAMES`.
            partitions: P >= 1.
            mapping: unit -> slot (see `encode_assignment`), e.g. a least_* strategy's
                `assignment`; for hot_split also unit -> tuple of slots (piece i on slot i), so
                `HotSplitStrategy.assignment` can be passed as it is.
            loads: per-slot loads S (keys or events), e.g. that strategy's `loads`; None = zeros.
            epoch: the new epoch; None = the current epoch + 1 (1 for the first publish). An
                explicit epoch must exceed the current one, so epochs only grow.
            buckets: None (per key) or B >= 1 (mapping's units are buckets).
            split: hot_split only: unit -> its slots, for units spread over two slots or more,
                beside a `mapping` holding each one's first slot (see `encode_split`).

        Returns:
            The epoch now in force.

        Raises:
            PlacementError: unknown strategy, bad assignment (a slot out of range or repeated
                for one unit, a split unit whose first slot is not the mapping's), split units
                under a strategy other than hot_split, or an epoch not above the current.
            StackError: Redis unreachable.
        """
        if strategy_name not in STRATEGY_NAMES:
            raise PlacementError(f"unknown placement strategy {strategy_name!r}; known: {', '.join(STRATEGY_NAMES)}")
        if epoch is not None:
            check_epoch(epoch)
        map_fields, load_fields = encode_assignment(partitions, mapping, loads, buckets)
        split_fields = encode_split(partitions, mapping, split, buckets)
        if split_fields and strategy_name != SPLIT_STRATEGY:
            raise PlacementError(
                f"strategy {strategy_name!r} places each unit on one slot, but {len(split_fields)} unit(s) have "
                f"several (e.g. {next(iter(split_fields))!r}); publish them as {SPLIT_STRATEGY!r}"
            )
        try:
            with self.client.pipeline(transaction=True) as pipe:
                while True:
                    try:
                        pipe.watch(self.keys.meta)
                        current = int(_text(pipe.hget(self.keys.meta, "epoch")) or 0)
                        new = current + 1 if epoch is None else epoch
                        if new <= current:
                            pipe.unwatch()
                            raise PlacementError(
                                f"epoch {new} of assignment {self.name!r} is not above the current epoch {current}"
                            )
                        pipe.multi()
                        pipe.delete(self.keys.map, self.keys.split, self.keys.loads)
                        if map_fields:
                            pipe.hset(self.keys.map, mapping=map_fields)
                        if split_fields:
                            pipe.hset(self.keys.split, mapping=split_fields)
                        pipe.hset(self.keys.loads, mapping=load_fields)
                        pipe.hset(
                            self.keys.meta,
                            mapping={
                                "strategy": strategy_name,
                                "partitions": partitions,
                                "epoch": new,
                                "buckets": buckets or 0,
                                "published_at": repr(time.time()),
                            },
                        )
                        pipe.publish(self.keys.channel, str(new))
                        pipe.execute()
                        return new
                    except redis.WatchError:
                        continue
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise self._unreachable(exc) from exc

    def meta(self) -> AssignmentMeta:
        """The assignment's facts (strategy, P, epoch, buckets).

        Raises:
            PlacementError: nothing was published under this name yet.
            StackError: Redis unreachable.
        """
        try:
            raw = self.client.hgetall(self.keys.meta)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise self._unreachable(exc) from exc
        return self._parse_meta(raw)

    def _parse_meta(self, raw: Mapping[Any, Any]) -> AssignmentMeta:
        fields = {_text(k): _text(v) for k, v in raw.items()}
        if "partitions" not in fields:
            raise PlacementError(
                f"no assignment published under {self.name!r} (Redis {self.keys.meta} is empty); publish one first"
            )
        buckets = int(fields.get("buckets") or 0)
        return AssignmentMeta(
            strategy=fields.get("strategy", ""),
            partitions=int(fields["partitions"]),
            epoch=int(fields.get("epoch") or 0),
            buckets=buckets or None,
            published_at=float(fields.get("published_at") or 0.0),
        )

    def epoch(self) -> int:
        """The epoch in force (0 when nothing was published). Raises StackError if Redis is unreachable."""
        try:
            return int(_text(self.client.hget(self.keys.meta, "epoch")) or 0)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise self._unreachable(exc) from exc

    def slot_of(self, key: str) -> int | None:
        """The recorded slot of `key` (of its bucket, per bucket), or None if it has none yet.

        Reads only; never places. Raises PlacementError (nothing published) or StackError.
        """
        unit = self.meta().unit_of(key)
        try:
            slot = self.client.hget(self.keys.map, unit)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise self._unreachable(exc) from exc
        return None if slot is None else int(_text(slot))

    def place(
        self, key: str, weight: int = 1, rule: str | None = None, *, observe_known: bool = True
    ) -> tuple[int, int, bool]:
        """`assign`, returning (slot, epoch that placed it, True if the key was new).

        Raises:
            PlacementError: bad weight or rule; nothing published under this name.
            StackError: Redis unreachable.
        """
        _check_weight(weight)
        if rule is not None:
            resolve_rule(rule, "")
        meta = self.meta()
        for _ in range(10):
            args = [meta.unit_of(key), weight, rule or "", str(meta.buckets or 0), "1" if observe_known else "0"]
            try:
                slot, epoch, status = self._script(keys=[self.keys.map, self.keys.loads, self.keys.meta], args=args)
            except redis.ResponseError as exc:
                if "KEYSHIFT_NO_ASSIGNMENT" in str(exc):
                    raise PlacementError(
                        f"no assignment published under {self.name!r} (it was deleted); publish one first"
                    ) from None
                raise
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                raise self._unreachable(exc) from exc
            if status >= 0:
                return int(slot), int(epoch), status == 1
            meta = self.meta()  # a publish changed the bucket count since we read it
        raise PlacementError(f"assignment {self.name!r} kept changing its bucket count; try again")

    def assign(self, key: str, weight: int = 1, rule: str | None = None, *, observe_known: bool = True) -> int:
        """Atomic Algorithm 1 (paper 000 §4.2.1, "Least") on the server; returns the key's slot.

        In one Lua script (`ASSIGN_SCRIPT`), so concurrent callers are serialized by Redis: if
        the key's unit (key, or bucket per bucket) has a slot, return it; else pick the slot
        with the least load (ties to the lowest index), record it in the map, raise its load,
        return it. Every caller assigning the same new key gets the same slot.

        Loads follow `LeastKeyStrategy` / `LeastCountStrategy` exactly: least_key adds 1 when a
        unit is placed; least_count adds `weight` when a unit is placed and also when a known
        unit is observed again (unless `observe_known=False`, for callers that only look a slot
        up, e.g. `CachedAssignment`). The same (key, weight) sequence thus gives the same slots
        and loads as the in-process strategy. The epoch does not change.

        Args:
            key: the record's key (str).
            weight: events this observation carries, int >= 0.
            rule: "least_key" or "least_count"; None = the published strategy's rule when it is
                one of those, else least_count.
            observe_known: whether a known unit's weight counts into its slot's load.

        Returns:
            The slot, 0 <= slot <= P - 1.

        Raises:
            PlacementError: bad weight or rule; nothing published under this name.
            StackError: Redis unreachable.
        """
        return self.place(key, weight, rule, observe_known=observe_known)[0]

    def snapshot(self) -> dict[str, Any]:
        """The whole assignment, read in one MULTI (a consistent view).

        Returns:
            {"name", "strategy", "partitions", "epoch", "buckets" (None per key),
            "mapping": unit -> slot (units are str keys, or int buckets; a split unit's first
            slot), "split": unit -> tuple of its slots (piece i on element i), only the units
            spread over two slots or more (an empty dict unless the strategy is hot_split),
            "loads": [int] * P}.

        Raises:
            PlacementError: nothing published. StackError: Redis unreachable.
        """
        try:
            with self.client.pipeline(transaction=True) as pipe:
                pipe.hgetall(self.keys.meta)
                pipe.hgetall(self.keys.map)
                pipe.hgetall(self.keys.loads)
                pipe.hgetall(self.keys.split)
                raw_meta, raw_map, raw_loads, raw_split = pipe.execute()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise self._unreachable(exc) from exc
        meta = self._parse_meta(raw_meta)
        loads = [0] * meta.partitions
        for slot, load in raw_loads.items():
            loads[int(_text(slot))] = int(_text(load))
        mapping: dict[str | int, int] = {}
        for unit, slot in raw_map.items():
            text = _text(unit)
            mapping[int(text) if meta.buckets else text] = int(_text(slot))
        split: dict[str | int, tuple[int, ...]] = {}
        for unit, slots in raw_split.items():
            text = _text(unit)
            split[int(text) if meta.buckets else text] = decode_split(slots)
        return {
            "name": self.name,
            "strategy": meta.strategy,
            "partitions": meta.partitions,
            "epoch": meta.epoch,
            "buckets": meta.buckets,
            "mapping": mapping,
            "split": split,
            "loads": loads,
        }

    def meta_and_split(self) -> tuple[AssignmentMeta, dict[str, tuple[int, ...]]]:
        """The facts and the split units of the assignment in force, read in one MULTI.

        Returns:
            (meta, split) with split: unit field (key, or bucket as decimal text) -> its slots,
            only units on two slots or more.

        Raises:
            PlacementError: nothing published. StackError: Redis unreachable.
        """
        try:
            with self.client.pipeline(transaction=True) as pipe:
                pipe.hgetall(self.keys.meta)
                pipe.hgetall(self.keys.split)
                raw_meta, raw_split = pipe.execute()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise self._unreachable(exc) from exc
        return self._parse_meta(raw_meta), {_text(unit): decode_split(slots) for unit, slots in raw_split.items()}

    def delete(self) -> None:
        """Remove the assignment's four hashes (the epoch restarts at 1 on the next publish)."""
        try:
            self.client.delete(self.keys.map, self.keys.split, self.keys.loads, self.keys.meta)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise self._unreachable(exc) from exc


def strategy_from_snapshot(snapshot: Mapping[str, Any]) -> Strategy:
    """A local, in-memory copy of a published learned assignment, as its `Strategy` class.

    What an evaluation scores the strategy in force with: its real history map (and split units),
    not one rebuilt from the sample. Keys the copy lacks are placed by the strategy's own rule on
    the copy only (as the store's atomic assign would place them), so nothing is written to Redis.

    Args:
        snapshot: `AssignmentStore.snapshot()` of a least_key, least_count or hot_split assignment.

    Returns:
        A `LeastKeyStrategy`, `LeastCountStrategy` or `HotSplitStrategy` with the snapshot's
        partitions, epoch, buckets, map and loads (hot_split: split units keep all their slots).

    Raises:
        PlacementError: the snapshot's strategy is not a learned one.
    """
    from keyshift.placement.strategies import HotSplitStrategy, LeastCountStrategy, LeastKeyStrategy

    common = {"partitions": snapshot["partitions"], "epoch": snapshot["epoch"], "buckets": snapshot["buckets"], "loads": list(snapshot["loads"])}
    if snapshot["strategy"] == HotSplitStrategy.name:
        split = snapshot.get("split") or {}
        units = {unit: tuple(split.get(unit, (slot,))) for unit, slot in snapshot["mapping"].items()}
        return HotSplitStrategy(assignment=units, **common)
    for cls in (LeastKeyStrategy, LeastCountStrategy):
        if snapshot["strategy"] == cls.name:
            return cls(assignment=dict(snapshot["mapping"]), **common)
    raise PlacementError(f"assignment {snapshot.get('name')!r} holds {snapshot['strategy']!r}, not a learned strategy")


REDIS_OUTAGE_S = 60.0
"""Seconds placement waits for Redis to come back (a restart: the assignment and its epoch are
in Redis' append-only file) before a new key's placement gives up with StackError."""


def while_redis_restarts(function):
    """Retry `function` on StackError (Redis unreachable) for up to `REDIS_OUTAGE_S` seconds.

    Raises:
        StackError: Redis stayed unreachable that long.
    """
    from tenacity import before_sleep_log, retry, retry_if_exception_type, stop_after_delay, wait_exponential

    return retry(
        retry=retry_if_exception_type(StackError), stop=stop_after_delay(REDIS_OUTAGE_S),
        wait=wait_exponential(0.2, max=2.0), before_sleep=before_sleep_log(log, logging.WARNING), reraise=True,
    )(function)


class CachedAssignment:
    """A producer's view of a shared `AssignmentStore`, as a `Strategy`.

    `slot_of(key)` answers from a local memo (unit -> slot); on a miss it asks the store's
    atomic assign (`observe_known=False`: looking a key up does not count events), so a new key
    is placed once for all producers. A new epoch is learnt by polling: when `poll_seconds` have
    passed since the last check, the next `slot_of`, `slots_of` or `epoch` read does one HGET of
    the epoch; if it changed, the memo is cleared and strategy, P, buckets (and, for hot_split,
    the split units) are re-read (`refresh`). A slot returned by the server carries the epoch
    that placed it; if that is newer than the cached epoch the view refreshes first, so a slot
    is never attributed to an older epoch.

    A hot_split assignment spreads some units over several slots: `slots_of(key)` gives all of
    them (piece i on element i), `slot_of(key)` the first. Such a view is not key-affine
    (`key_affine` False, as `HotSplitStrategy`): a record of a split key is placed by its event
    id (`slots[event_id % k]`), never by its key alone, so `SlotCache` refuses it.

    Args:
        store: the shared assignment (must be published already).
        poll_seconds: seconds between epoch checks, >= 0 (0 = check on every call).
        clock: monotonic seconds (tests pass a fake).

    Raises:
        PlacementError: nothing published under the store's name; poll_seconds < 0.
        StackError: Redis unreachable (on construction, a poll, or a miss).

    Thread-safe: the hit path is one dict lookup; misses and refreshes take a lock.
    """

    def __init__(
        self, store: AssignmentStore, poll_seconds: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if poll_seconds < 0:
            raise PlacementError(f"poll_seconds must be >= 0, got {poll_seconds!r}")
        self.store = store
        self.poll_seconds = poll_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._slots: dict[str, int] = {}
        self._split: dict[str, tuple[int, ...]] = {}
        self._reload()
        self._checked = clock()

    def _reload(self) -> None:
        """Re-read meta (and split units for hot_split) and clear the memo; caller holds the lock or is __init__."""
        meta = self.store.meta()
        split: dict[str, tuple[int, ...]] = {}
        if meta.strategy == SPLIT_STRATEGY:
            meta, split = self.store.meta_and_split()
        self._meta, self._split = meta, split
        self._slots.clear()

    @property
    def name(self) -> str:
        """The published strategy's name (e.g. "least_count")."""
        return self._meta.strategy

    @property
    def partitions(self) -> int:
        """P of the assignment in force (as of the last poll)."""
        return self._meta.partitions

    @property
    def key_affine(self) -> bool:
        """False for a hot_split assignment (records of a split key are placed per event), else True."""
        return self._meta.strategy != SPLIT_STRATEGY

    @property
    def epoch(self) -> int:
        """The epoch in force as of the last poll (reading it may poll)."""
        self._maybe_poll()
        return self._meta.epoch

    @property
    def split(self) -> dict[str, tuple[int, ...]]:
        """The split units of the epoch in force: unit field (key, or bucket as text) -> slots (a copy)."""
        self._maybe_poll()
        return dict(self._split)

    def _maybe_poll(self) -> None:
        if self._clock() - self._checked >= self.poll_seconds:
            self.refresh()

    def refresh(self) -> bool:
        """Check the epoch now; on a change, clear the memo and re-read the meta (and split units).

        While Redis is unreachable (a restart), the epoch in force stays and the check is tried
        again at the next poll; a new key's placement waits up to `REDIS_OUTAGE_S` for Redis.

        Returns:
            True when the epoch changed (the memo was cleared).
        """
        with self._lock:
            self._checked = self._clock()
            try:
                if self.store.epoch() == self._meta.epoch:
                    return False
                self._reload()
            except StackError as exc:  # a Redis restart: place by the epoch in force until it is back
                log.warning("assignment %r: epoch check failed, keeping epoch %d (%s)", self.store.name, self._meta.epoch, exc)
                return False
            return True

    def slot_of(self, key: str) -> int:
        """The slot of `key` under the epoch in force, 0 <= slot <= P - 1 (a split key's first slot).

        Raises:
            PlacementError: the assignment was deleted. StackError: Redis unreachable.
        """
        self._maybe_poll()
        meta = self._meta
        unit = meta.unit_of(key)
        slot = self._slots.get(unit)
        if slot is not None:
            return slot
        place = while_redis_restarts(self.store.place)
        with self._lock:
            while True:
                slot, epoch, _ = place(key, 1, observe_known=False)
                if epoch == self._meta.epoch:
                    self._slots[self._meta.unit_of(key)] = slot
                    return slot
                self._reload()
                self._checked = self._clock()

    def slots_of(self, key: str) -> tuple[int, ...]:
        """All slots of `key` under the epoch in force, piece i on element i; one slot unless split.

        A record of a split key with event id n goes to `slots[n % len(slots)]`.

        Raises:
            PlacementError: the assignment was deleted. StackError: Redis unreachable.
        """
        slot = self.slot_of(key)  # polls first, and places a new key (whole) if needed
        slots = self._split.get(self._meta.unit_of(key))
        return slots if slots is not None and slots[0] == slot else (slot,)

    def __len__(self) -> int:
        """Number of units memoized."""
        return len(self._slots)
