"""The pure parts of the assignment store: key names, validation, rule choice, epoch polling."""

from __future__ import annotations

import pytest

from keyshift.errors import PlacementError
from keyshift.placement.assignment_store import (
    AssignmentMeta,
    CachedAssignment,
    assignment_keys,
    decode_split,
    encode_assignment,
    encode_split,
    resolve_rule,
)
from keyshift.placement.strategies import Strategy, bucket_of


def test_assignment_keys():
    keys = assignment_keys("flights")
    assert keys.map == "keyshift:assignment:flights:map"
    assert keys.loads == "keyshift:assignment:flights:loads"
    assert keys.meta == "keyshift:assignment:flights:meta"
    assert keys.channel == "keyshift:assignment:flights:epoch"
    assert keys.split == "keyshift:assignment:flights:split"
    for bad in ("", "a b", "a:b", "x*", None):
        with pytest.raises(PlacementError, match="assignment name"):
            assignment_keys(bad)


def test_resolve_rule():
    assert resolve_rule(None, "least_key") == "least_key"
    assert resolve_rule(None, "least_count") == "least_count"
    assert resolve_rule(None, "hash") == "least_count"
    assert resolve_rule("least_key", "least_count") == "least_key"
    with pytest.raises(PlacementError, match="least_key, least_count"):
        resolve_rule("weight", "least_count")


def test_encode_assignment():
    assert encode_assignment(3, {"a": 0, "b": 2}, [1, 0, 4], None) == ({"a": 0, "b": 2}, {"0": 1, "1": 0, "2": 4})
    assert encode_assignment(2, {}, None, None) == ({}, {"0": 0, "1": 0})
    assert encode_assignment(2, {5: 1, "6": 0}, {1: 9}, 8) == ({"5": 1, "6": 0}, {"0": 0, "1": 9})
    bad = [
        ((2, {"a": 2}, None, None), "outside"),
        ((2, {"a": -1}, None, None), "outside"),
        ((2, {"a": True}, None, None), "outside"),
        ((2, {1: 0}, None, None), "str keys"),
        ((2, {9: 0}, None, 8), "bucket 9"),
        ((2, {"x": 0}, None, 8), "bucket numbers"),
        ((2, {}, [1], None), "1 entries for 2 slots"),
        ((2, {}, [1, -1], None), "load of slot 1"),
        ((2, {}, {3: 1}, None), "loads names slot 3"),
        ((0, {}, None, None), "partitions"),
        ((2, {}, None, 0), "buckets"),
    ]
    for args, message in bad:
        with pytest.raises(PlacementError, match=message):
            encode_assignment(*args)


def test_encode_assignment_takes_split_units_first_slot():
    # HotSplitStrategy.assignment as it is: unit -> tuple of slots, piece i on element i
    assert encode_assignment(4, {"ORD": (3, 1), "ATL": (2,), "DFW": 0}, None, None)[0] == {"ORD": 3, "ATL": 2, "DFW": 0}
    assert encode_assignment(4, {7: [2, 0]}, None, 16)[0] == {"7": 2}
    for mapping, message in [
        ({"ORD": ()}, "no slot"),  # a unit must live somewhere
        ({"ORD": (1, 4)}, "slot 4, outside 0..3"),  # second piece out of range
        ({"ORD": (1, 1)}, "one piece of a unit"),  # two pieces on one slot
        ({"ORD": (1, True)}, "outside"),  # bool is not a slot
    ]:
        with pytest.raises(PlacementError, match=message):
            encode_assignment(4, mapping, None, None)


@pytest.mark.parametrize(
    ("mapping", "split", "buckets", "expected"),
    [
        ({}, None, None, {}),  # nothing published: no split field
        ({"ORD": 3, "ATL": 1}, None, None, {}),  # key-affine mapping: nothing split
        ({"ORD": (3, 5), "ATL": (1,)}, None, None, {"ORD": "3,5"}),  # tuple values; one slot is not split
        ({"ORD": 3, "ATL": 1}, {"ORD": (3, 5, 0)}, None, {"ORD": "3,5,0"}),  # split= beside first slots
        ({"ORD": 3}, {"ORD": [3]}, None, {}),  # a one-slot split entry means "not split"
        ({"ORD": (3, 5)}, {"ORD": (3, 5)}, None, {"ORD": "3,5"}),  # the same list twice is fine
        ({7: 2, "9": 0}, {"7": (2, 1)}, 16, {"7": "2,1"}),  # per bucket: fields are decimal text
    ],
)
def test_encode_split(mapping, split, buckets, expected):
    assert encode_split(8, mapping, split, buckets) == expected


@pytest.mark.parametrize(
    ("mapping", "split", "message"),
    [
        ({"ORD": 3}, {"ATL": (1, 2)}, "'ATL' is not in the mapping"),  # split unit without first slot
        ({"ORD": 3}, {"ORD": (5, 3)}, "starts on slot 5 but the mapping puts it on slot 3"),  # first differs
        ({"ORD": (3, 5)}, {"ORD": (3, 6)}, r"slots \[3, 5\] in the mapping and \[3, 6\] in split"),
        ({"ORD": 3}, {"ORD": (3, 8)}, "slot 8, outside 0..7"),  # out of range
        ({"ORD": 3}, {"ORD": (3, 3)}, "one piece of a unit"),  # repeated slot
        ({"ORD": 3}, {"ORD": ()}, "no slot"),
    ],
)
def test_encode_split_refuses(mapping, split, message):
    with pytest.raises(PlacementError, match=message):
        encode_split(8, mapping, split, None)


def test_decode_split():
    assert decode_split("3,5") == (3, 5)
    assert decode_split(b"0,7,2") == (0, 7, 2)
    assert decode_split("4") == (4,)
    for bad in ("", "3,,5", "a,b"):
        with pytest.raises(PlacementError, match="comma-separated"):
            decode_split(bad)


def test_meta_unit_of():
    assert AssignmentMeta("least_count", 4, 1, None, 0.0).unit_of("ORD") == "ORD"
    assert AssignmentMeta("least_count", 4, 1, 16, 0.0).unit_of("ORD") == str(bucket_of("ORD", 16))


class FakeStore:
    """An in-memory stand-in with the calls CachedAssignment makes."""

    def __init__(self) -> None:
        self.current = AssignmentMeta("least_count", 4, 1, None, 0.0)
        self.mapping = {"a": 1}
        self.epoch_reads = 0
        self.places = 0

    def meta(self) -> AssignmentMeta:
        return self.current

    def epoch(self) -> int:
        self.epoch_reads += 1
        return self.current.epoch

    def place(self, key, weight=1, rule=None, *, observe_known=True):
        self.places += 1
        slot = self.mapping.setdefault(key, 0)
        return slot, self.current.epoch, False

    def publish(self, mapping, epoch) -> None:
        self.mapping = dict(mapping)
        self.current = AssignmentMeta("least_count", 4, epoch, None, 0.0)


def test_cached_assignment_polls_on_its_interval():
    store, now = FakeStore(), [100.0]
    view = CachedAssignment(store, poll_seconds=2.0, clock=lambda: now[0])
    assert isinstance(view, Strategy) and view.key_affine
    assert view.slot_of("a") == 1 and view.slot_of("a") == 1 and store.places == 1
    assert store.epoch_reads == 0
    store.publish({"a": 3}, 2)
    now[0] += 1.9
    assert view.slot_of("a") == 1 and store.epoch_reads == 0  # not yet due
    now[0] += 0.1
    assert view.slot_of("a") == 3 and view.epoch == 2 and store.epoch_reads == 1
    now[0] += 2.0
    assert view.slot_of("a") == 3 and store.epoch_reads == 2 and store.places == 2  # same epoch: memo kept


def test_cached_assignment_rejects_negative_interval():
    with pytest.raises(PlacementError, match="poll_seconds"):
        CachedAssignment(FakeStore(), poll_seconds=-1)
