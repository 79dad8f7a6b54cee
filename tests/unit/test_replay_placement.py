"""Per-event placement of split keys in the replayer: `event_slots` and `plan_placement`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from keyshift.data.replay import _Job, event_slots, plan_placement, plan_slots
from keyshift.errors import PlacementError
from keyshift.placement.strategies import HashStrategy, HotSplitStrategy, WeightStrategy

# 12 events; event id = row number. ORD holds half of them.
ORIGINS = ["ORD", "ATL", "ORD", "ORD", "SEA", "ORD", "ATL", "ORD", "DFW", "ORD", "ATL", "SEA"]


@pytest.fixture
def origins_file(tmp_path: Path) -> Path:
    path = tmp_path / "origins.parquet"
    pq.write_table(pa.table({"origin": ORIGINS}), path, row_group_size=5)
    return path


@pytest.mark.parametrize(
    ("keys", "codes", "ids", "slot_by_key", "split_by_key", "expected"),
    [
        ([], [], [], {}, {}, []),  # an empty batch
        (["A", "B"], [0, 1, 1, 0], [0, 1, 2, 3], {"A": 2, "B": 0}, {}, [2, 0, 0, 2]),  # per key only
        # A split over (3, 1): event id even -> 3, odd -> 1; B stays whole on 0
        (["A", "B"], [0, 0, 1, 0, 0], [10, 11, 12, 13, 14], {"A": 3, "B": 0}, {"A": (3, 1)}, [3, 1, 0, 1, 3]),
        # three pieces beside two: the table is as wide as the widest split key
        (["A", "B", "C"], [0, 1, 0, 1, 0, 2], [0, 1, 1, 2, 2, 5], {"A": 0, "B": 4, "C": 6},
         {"A": (0, 1, 2), "B": (4, 5)}, [0, 5, 1, 4, 2, 6]),
    ],
)
def test_event_slots(keys, codes, ids, slot_by_key, split_by_key, expected) -> None:
    slots = event_slots(keys, np.asarray(codes, dtype=np.int32), np.asarray(ids, dtype=np.int64), slot_by_key, split_by_key)
    assert slots.tolist() == expected


def test_event_slots_follow_hot_split_slot_for_event() -> None:
    strategy = HotSplitStrategy.from_counts({"ORD": 60, "ATL": 20, "DFW": 20}, 4, d=3)
    keys = ["ORD", "ATL", "DFW"]
    rng = np.random.default_rng(3)
    codes, ids = rng.integers(0, 3, 500), rng.permutation(10_000)[:500]
    slot_by_key = {k: strategy.slot_of(k) for k in keys}
    split = {k: strategy.slots_of(k) for k in keys if strategy.is_split(k)}
    assert split  # ORD is hot
    got = event_slots(keys, codes, ids, slot_by_key, split)
    assert got.tolist() == [strategy.slot_for_event(keys[c], int(i)) for c, i in zip(codes, ids)]


def test_plan_placement_counts_split_keys_per_event(origins_file: Path) -> None:
    strategy = HotSplitStrategy(partitions=4, assignment={"ORD": (2, 0), "ATL": (1,), "SEA": (3,), "DFW": (1,)})
    plan = plan_placement(origins_file, strategy)
    assert plan.slot_by_key == {"ORD": 2, "ATL": 1, "SEA": 3, "DFW": 1}
    assert plan.split_by_key == {"ORD": (2, 0)}
    # ORD's event ids 0, 2, 3, 5, 7, 9: even -> slot 2 (0, 2), odd -> slot 0 (3, 5, 7, 9)
    assert plan.counts.tolist() == [4, 4, 2, 2]
    limited = plan_placement(origins_file, strategy, limit=4)  # ORD ids 0, 2, 3
    assert limited.counts.tolist() == [1, 1, 2, 0]


def test_plan_placement_of_a_key_affine_strategy_is_plan_slots(origins_file: Path) -> None:
    strategy = HashStrategy(partitions=8)
    plan = plan_placement(origins_file, strategy, limit=7)
    slot_by_key, counts = plan_slots(origins_file, strategy, limit=7)
    assert plan.slot_by_key == slot_by_key and plan.split_by_key == {}
    assert plan.counts.tolist() == counts.tolist()


def test_plan_placement_refuses_what_it_cannot_place(origins_file: Path) -> None:
    class Spreads:  # not key-affine, and no slots_of
        name, partitions, epoch, key_affine = "spreads", 4, 0, False

        def slot_of(self, key: str) -> int:
            return 0

    with pytest.raises(PlacementError, match="cannot list a key's slots"):
        plan_placement(origins_file, Spreads())

    class OutOfRange(Spreads):
        def slots_of(self, key: str) -> tuple[int, ...]:
            return (0, 4)

    with pytest.raises(PlacementError, match=r"slots \[0, 4\], outside 0..3"):
        plan_placement(origins_file, OutOfRange())
    assert WeightStrategy(partitions=4).key_affine  # the weight strategy plans per key


def test_job_carries_split_keys_as_json() -> None:
    job = _Job(
        kafka={"bootstrap_servers": "127.0.0.1:9092"},
        path="/tmp/f.parquet",
        topic="flights",
        limit=10,
        slot_by_key={"ORD": 2},
        partitions=4,
        mine=(0, 2),
        rate=None,
        split_by_key={"ORD": [2, 0]},
    )
    assert _Job.from_json(job.to_json()) == job
