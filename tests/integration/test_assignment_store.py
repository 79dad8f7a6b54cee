"""The shared assignment in the real Redis of the local stack (needs `keyshift stack up`).

Each test uses its own assignment name and deletes its keys afterwards.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter

import pytest
import redis

from keyshift.errors import PlacementError, StackError
from keyshift.placement.assignment_store import AssignmentStore, CachedAssignment, assignment_keys
from keyshift.placement.strategies import HotSplitStrategy, LeastCountStrategy, LeastKeyStrategy, SlotCache, bucket_of
from keyshift.runs import redis_client
from keyshift.settings import Settings

pytestmark = pytest.mark.integration

PRODUCERS = 8
KEYS = 500
PARTITIONS = 8


@pytest.fixture(scope="module")
def client() -> redis.Redis:
    return redis_client(Settings())


@pytest.fixture
def store(client):
    store = AssignmentStore(client, f"it-{uuid.uuid4().hex[:10]}")
    yield store
    store.delete()
    assert client.exists(store.keys.map, store.keys.split, store.keys.loads, store.keys.meta) == 0


def _weight(key: str) -> int:
    return 1 + bucket_of(key, 7)


def _race(store: AssignmentStore, rule: str) -> tuple[list[dict[str, int]], list[str]]:
    """PRODUCERS threads, each with its own client, assign the same new keys at once.

    Even-numbered producers take the keys in the same order (so they hit each new key at the same
    moment), odd-numbered ones in their own shuffled order.
    """
    keys = [f"key-{i}" for i in range(KEYS)]
    barrier = threading.Barrier(PRODUCERS)
    answers: list[dict[str, int]] = [{} for _ in range(PRODUCERS)]
    errors: list[BaseException] = []

    def producer(index: int) -> None:
        try:
            own = AssignmentStore(redis_client(Settings()), store.name)
            order = keys[:]
            if index % 2:  # half race in lockstep on the same key, half in their own order
                random.Random(index).shuffle(order)
            barrier.wait()
            for key in order:
                answers[index][key] = own.assign(key, weight=_weight(key), rule=rule)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=producer, args=(i,)) for i in range(PRODUCERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return answers, keys


def test_concurrent_least_count_assign_gives_one_slot_per_key(store):
    store.publish("least_count", PARTITIONS, {})
    answers, keys = _race(store, "least_count")
    snap = store.snapshot()
    assert set(snap["mapping"]) == set(keys)
    for key in keys:
        assert {answer[key] for answer in answers} == {snap["mapping"][key]}, key
    # least_count adds the weight of every observation (new or known), as LeastCountStrategy does
    expected = [0] * PARTITIONS
    for key, slot in snap["mapping"].items():
        expected[slot] += PRODUCERS * _weight(key)
    assert snap["loads"] == expected
    assert sum(snap["loads"]) == PRODUCERS * sum(_weight(key) for key in keys)
    assert snap["epoch"] == 1  # placing new keys never changes the epoch


def test_concurrent_least_key_assign_balances_keys(store):
    store.publish("least_key", PARTITIONS, {})
    answers, keys = _race(store, "least_key")
    snap = store.snapshot()
    for key in keys:
        assert {answer[key] for answer in answers} == {snap["mapping"][key]}
    per_slot = Counter(snap["mapping"].values())
    assert snap["loads"] == [per_slot[slot] for slot in range(PARTITIONS)]
    assert sum(snap["loads"]) == KEYS
    assert max(snap["loads"]) - min(snap["loads"]) <= 1  # least_key deals keys round-robin


def test_concurrent_cached_producers_agree(store):
    store.publish("least_count", PARTITIONS, {})
    keys = [f"k{i}" for i in range(200)]
    results: list[dict[str, int]] = []
    barrier = threading.Barrier(4)

    def producer(seed: int) -> None:
        view = CachedAssignment(AssignmentStore(redis_client(Settings()), store.name), poll_seconds=5)
        order = keys[:]
        random.Random(seed).shuffle(order)
        barrier.wait()
        results.append({key: view.slot_of(key) for key in order})

    threads = [threading.Thread(target=producer, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 4
    assert all(result == results[0] for result in results)
    assert store.snapshot()["mapping"] == results[0]
    assert sum(store.snapshot()["loads"]) == len(keys)  # a lookup counts one event per new key only


def test_ties_go_to_lowest_slot(store):
    store.publish("least_count", 4, {"a": 0, "b": 3}, [3, 1, 1, 2])
    assert store.assign("x") == 1  # slots 1 and 2 tie at 1
    assert store.snapshot()["loads"] == [3, 2, 1, 2]
    assert store.assign("y") == 2
    assert store.assign("z") == 1  # 1, 2, 3 tie at 2
    assert store.assign("a", weight=5) == 0  # known key keeps its slot, load grows
    assert store.snapshot()["loads"] == [8, 3, 2, 2]
    assert store.slot_of("b") == 3 and store.slot_of("never") is None


def test_same_answers_as_the_in_process_strategies(store):
    rng = random.Random(7)
    observations = [(f"k{rng.randrange(60)}", rng.randrange(0, 9)) for _ in range(400)]
    for rule, local in (("least_count", LeastCountStrategy(partitions=5)), ("least_key", LeastKeyStrategy(partitions=5))):
        store.publish(rule, 5, {})
        for key, weight in observations:
            assert store.assign(key, weight, rule) == local.assign(key, weight), (rule, key)
        snap = store.snapshot()
        assert snap["loads"] == local.loads and snap["mapping"] == local.assignment


def test_publish_bumps_epoch_atomically_and_announces_it(store, client):
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(store.keys.channel)
    try:
        assert store.epoch() == 0
        strategy = LeastCountStrategy.from_counts({"ORD": 50, "ATL": 40, "DFW": 30, "SFO": 5}, 2)
        assert store.publish("least_count", 2, strategy.assignment, strategy.loads) == 1
        assert store.publish("least_count", 2, {"ORD": 1}, [0, 50]) == 2
        assert store.publish("least_count", 2, {"ORD": 0}, [50, 0], epoch=10) == 10
        with pytest.raises(PlacementError, match="not above"):
            store.publish("least_count", 2, {}, epoch=10)
        seen = []
        deadline = time.monotonic() + 5
        while len(seen) < 3 and time.monotonic() < deadline:
            message = pubsub.get_message(timeout=0.5)
            if message:
                seen.append(int(message["data"]))
        assert seen == [1, 2, 10]
    finally:
        pubsub.close()
    snap = store.snapshot()
    assert snap["mapping"] == {"ORD": 0} and snap["loads"] == [50, 0] and snap["epoch"] == 10
    assert snap["strategy"] == "least_count" and snap["partitions"] == 2 and snap["buckets"] is None
    assert snap["split"] == {}


# flights-like counts at P = 4: ORD and ATL each exceed a slot's fair share (1/4 of 220 events)
HOT_COUNTS = {"ORD": 90, "ATL": 60, "DFW": 30, "LAX": 20, "SFO": 12, "SEA": 8}


def test_hot_split_round_trip(store, client):
    learned = HotSplitStrategy.from_counts(HOT_COUNTS, 4)
    split = {unit: slots for unit, slots in learned.assignment.items() if len(slots) > 1}
    assert set(split) == {"ORD", "ATL"}  # the fixture is what the test means it to be
    epoch = store.publish("hot_split", 4, learned.assignment, learned.loads)
    snap = store.snapshot()
    assert (snap["strategy"], snap["partitions"], snap["epoch"]) == ("hot_split", 4, epoch)
    assert snap["mapping"] == {unit: slots[0] for unit, slots in learned.assignment.items()}
    assert snap["split"] == split and all(type(v) is tuple and len(v) >= 2 for v in snap["split"].values())
    assert snap["loads"] == learned.loads
    # the raw hashes: the map keeps each unit's first slot, the split hash "a,b"
    assert client.hget(store.keys.map, "ORD") in (str(split["ORD"][0]), str(split["ORD"][0]).encode())
    raw = client.hget(store.keys.split, "ORD")
    assert (raw.decode() if isinstance(raw, bytes) else raw) == ",".join(map(str, split["ORD"]))
    # the same through split= beside a first-slot mapping
    epoch2 = store.publish("hot_split", 4, snap["mapping"], snap["loads"], split=split)
    assert epoch2 == epoch + 1 and store.snapshot()["split"] == split


def test_republish_replaces_the_split_hash(store, client):
    store.publish("hot_split", 4, {"ORD": (1, 2), "ATL": (3, 0), "DFW": 2})
    assert set(store.snapshot()["split"]) == {"ORD", "ATL"}
    store.publish("hot_split", 4, {"ORD": (1, 3), "ATL": 3, "DFW": 2})  # ATL no longer split
    assert store.snapshot()["split"] == {"ORD": (1, 3)}
    store.publish("least_count", 4, {"ORD": 1, "ATL": 3})  # a key-affine strategy: no split left
    snap = store.snapshot()
    assert snap["split"] == {} and client.exists(store.keys.split) == 0
    assert snap["mapping"] == {"ORD": 1, "ATL": 3} and snap["epoch"] == 3


def test_hot_split_per_bucket_round_trip(store):
    store.publish("hot_split", 4, {7: (2, 0), 3: 1}, buckets=16)
    snap = store.snapshot()
    assert snap["buckets"] == 16 and snap["mapping"] == {7: 2, 3: 1} and snap["split"] == {7: (2, 0)}


def test_split_publish_is_validated_and_leaves_nothing_behind(store):
    store.publish("hot_split", 4, {"ORD": (1, 2)})
    for kwargs, message in [
        ({"strategy_name": "least_count", "mapping": {"ORD": (1, 2)}}, "publish them as 'hot_split'"),
        ({"strategy_name": "hot_split", "mapping": {"ORD": 1}, "split": {"ORD": (2, 1)}}, "starts on slot 2"),
        ({"strategy_name": "hot_split", "mapping": {"ORD": 1}, "split": {"ATL": (2, 1)}}, "not in the mapping"),
        ({"strategy_name": "hot_split", "mapping": {"ORD": (1, 4)}}, "outside 0..3"),
        ({"strategy_name": "hot_split", "mapping": {"ORD": (1, 1)}}, "one piece"),
    ]:
        with pytest.raises(PlacementError, match=message):
            store.publish(partitions=4, **kwargs)
    snap = store.snapshot()
    assert snap["epoch"] == 1 and snap["split"] == {"ORD": (1, 2)}  # refused publishes changed nothing


def test_new_key_under_hot_split_is_placed_whole(store):
    store.publish("hot_split", 4, {"ORD": (0, 1)}, [10, 10, 0, 3])
    assert store.assign("NEW", weight=5) == 2  # Algorithm 1 by events: least-loaded slot, whole
    snap = store.snapshot()
    assert snap["mapping"]["NEW"] == 2 and "NEW" not in snap["split"] and snap["loads"] == [10, 10, 5, 3]


def test_cached_assignment_of_hot_split(store):
    store.publish("hot_split", 4, {"ORD": (1, 2), "ATL": 3}, [0, 0, 0, 5])
    view = CachedAssignment(store, poll_seconds=0)
    assert not view.key_affine and view.name == "hot_split"
    assert view.slots_of("ORD") == (1, 2) and view.slot_of("ORD") == 1
    assert view.slots_of("ATL") == (3,) and view.slots_of("NEW") == (0,)
    assert view.split == {"ORD": (1, 2)}
    with pytest.raises(PlacementError, match="not key-affine"):
        SlotCache(view)
    store.publish("hot_split", 4, {"ORD": (2, 0, 1), "ATL": 3})
    assert view.slots_of("ORD") == (2, 0, 1) and view.epoch == 2
    store.publish("least_count", 4, {"ORD": 2})
    assert view.slots_of("ORD") == (2,) and view.key_affine and view.split == {}


def test_cached_assignment_sees_new_epoch_within_poll_interval(store):
    store.publish("least_count", 4, {"ORD": 2}, [0, 0, 5, 0])
    now = [0.0]  # the view's clock, seconds: the test decides when the poll interval has passed
    view = CachedAssignment(store, poll_seconds=0.3, clock=lambda: now[0])
    cache = SlotCache(view)  # it is a key-affine Strategy
    assert (view.name, view.partitions, view.epoch) == ("least_count", 4, 1)
    assert cache.slot_of("ORD") == 2 and view.slot_of("ORD") == 2
    store.publish("least_count", 4, {"ORD": 3}, [0, 0, 0, 5])
    now[0] = 0.29
    assert view.slot_of("ORD") == 2  # still inside the poll interval: the cached answer
    now[0] = 0.3
    assert view.slot_of("ORD") == 3 and view.epoch == 2 and len(view) == 1
    assert cache.refresh() and cache.slot_of("ORD") == 3


def test_cached_assignment_never_labels_a_slot_with_a_stale_epoch(store):
    store.publish("least_key", 3, {})
    view = CachedAssignment(store, poll_seconds=3600)
    store.publish("least_key", 3, {"a": 2}, [0, 0, 1])
    assert view.slot_of("new") == 0  # placed by the server under epoch 2 ...
    assert view.epoch == 2 and view.slot_of("a") == 2  # ... so the view moved to epoch 2 at once


def test_per_bucket_assignment(store):
    store.publish("least_key", 4, {7: 3}, [0, 0, 0, 1], buckets=16)
    key = next(f"k{i}" for i in range(1000) if bucket_of(f"k{i}", 16) == 7)
    assert store.assign(key) == 3 and store.slot_of(key) == 3
    other = next(f"k{i}" for i in range(1000) if bucket_of(f"k{i}", 16) == 5)
    assert store.assign(other) == 0
    view = CachedAssignment(store, poll_seconds=0)
    assert view.slot_of(key) == 3 and view.slot_of(other) == 0
    snap = store.snapshot()
    assert snap["buckets"] == 16 and snap["mapping"] == {7: 3, 5: 0}


def test_errors(store):
    with pytest.raises(PlacementError, match="no assignment published"):
        store.assign("x")
    with pytest.raises(PlacementError, match="no assignment published"):
        CachedAssignment(store)
    with pytest.raises(PlacementError, match="unknown placement strategy"):
        store.publish("nope", 2, {})
    with pytest.raises(PlacementError, match="outside"):
        store.publish("least_count", 2, {"a": 2})
    store.publish("least_count", 2, {})
    with pytest.raises(PlacementError, match="rule"):
        store.assign("x", rule="hash")
    with pytest.raises(PlacementError, match="weight"):
        store.assign("x", weight=-1)
    assert store.epoch() == 1 and store.snapshot()["mapping"] == {}
    assert assignment_keys(store.name).map == f"keyshift:assignment:{store.name}:map"


def test_unreachable_redis_is_a_stack_error():
    with pytest.raises(StackError, match="keyshift stack up"):
        AssignmentStore.from_settings(Settings(redis_port=1), "x")
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=1, decode_responses=True)
    with pytest.raises(StackError, match="keyshift stack up"):
        AssignmentStore(dead, "x").epoch()


def test_a_switch_verifies_a_key_the_new_query_placed_by_the_store_slot(store):
    """Stop 29's CI: a key absent from the switch's plan and from the migrated state (PSG, seen
    again only after the cut) is placed in the new query's first batch by the store's atomic
    assign; the switch's placement check must expect that slot, not the hash rule's."""
    from keyshift.migration.in_driver import slot_function
    from keyshift.migration.switch_record import SwitchRecord
    from keyshift.placement.spark_tokens import assignment_token_lookup
    from keyshift.placement.strategies import strategy_by_name

    hashed = strategy_by_name("hash", 4).slot_of("PSG")
    emptiest = (hashed + 1) % 4
    loads = [9, 9, 9, 9]
    loads[emptiest] = 0
    mapping = {"ORD": 0, "ATL": 1, "DEN": 2, "SFO": 3}
    store.publish("least_count", 4, mapping, loads)
    record = SwitchRecord(switch_id="sw", run_id="r", topic=store.name, strategy_from="hash", strategy_to="least_count",
                          partitions_from=4, partitions_to=4, epoch_from=0, epoch_to=1, mapping=mapping)

    token_of, tokens = assignment_token_lookup(mapping, 4, Settings().redis_url, store.name)
    job_slot = list(tokens).index(token_of("PSG"))  # the slot the new query's ingest gave it
    assert job_slot == emptiest != hashed
    assert slot_function(record, store.slot_of)("PSG") == job_slot
    assert slot_function(record, store.slot_of)("ORD") == 0 and slot_function(record, store.slot_of)("never") == \
        strategy_by_name("hash", 4).slot_of("never")  # planned keys and unplaced keys as before
    assert slot_function(record)("PSG") == hashed  # without the store, the rule's slot: the CI failure

