"""The switch's plan: the admissible assignment that moves the least state, and its lower bound."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import numpy as np
import pytest

from keyshift.errors import ConfigurationError
from keyshift.migration.plan import RULE_STRATEGIES, MigrationPlan, max_weight_matching, plan_switch
from keyshift.monitoring.balance import balance_degree
from keyshift.placement.learning import LEARNED_STRATEGIES, learn_strategy
from keyshift.placement.strategies import bucket_of, strategy_by_name

STRATEGIES = RULE_STRATEGIES + LEARNED_STRATEGIES


def flights_like(keys: int = 229, top_share: float = 0.055, events: int = 1_000_000) -> dict[str, int]:
    """Events per key of a truncated Zipf law r^-s fitted so the largest key holds `top_share`.

    The flights by origin have 229 keys, the largest (ATL) about 5.5 % of the events. Keys are
    integer strings so that modulo can place them too.
    """
    ranks = np.arange(1, keys + 1)
    low, high = 0.0, 4.0
    for _ in range(60):
        s = (low + high) / 2
        low, high = (low, s) if 1 / (ranks**-s).sum() > top_share else (s, high)
    weights = ranks**-s / (ranks**-s).sum()
    return {str(1000 + 7 * i): max(1, round(w * events)) for i, w in enumerate(weights)}


LOADS = flights_like()


def in_force(strategy: str, partitions: int, loads: dict[str, int] = LOADS):
    """The `current` callable of `strategy` built from `loads` over `partitions` slots."""
    if strategy in RULE_STRATEGIES:
        rule = strategy_by_name(strategy, partitions)
        return lambda key: (rule.slot_of(key),)
    assignment = learn_strategy(strategy, loads, partitions).assignment
    return lambda key: assignment[key] if isinstance(assignment[key], tuple) else (assignment[key],)


def slots_of(plan: MigrationPlan, key: str) -> tuple[int, ...]:
    return plan.split.get(key, (plan.mapping[key],))


def check_plan(plan: MigrationPlan, loads: dict[str, int], current, tolerance: float = 0.02) -> None:
    """The invariants every plan keeps, recomputed from its mapping."""
    size = plan.partitions
    assert set(plan.mapping) == set(loads) and plan.keys_total == len(loads)
    assert all(0 <= slot < size for key in loads for slot in slots_of(plan, key))
    per_slot = [0.0] * size
    for key in loads:
        for slot in slots_of(plan, key):
            per_slot[slot] += loads[key] / len(slots_of(plan, key))
    assert plan.balance_degree == pytest.approx(balance_degree(per_slot))
    assert plan.balance_degree >= (1 - tolerance) * plan.best_balance_degree - 1e-12
    moved = [k for k in loads if slots_of(plan, k)[0] != current(k)[0] or set(slots_of(plan, k)) != set(current(k))]
    assert plan.keys_moved == len(moved)
    assert plan.buckets_moved == len({bucket_of(key, 4096) for key in moved})
    assert plan.buckets_total == len({bucket_of(key, 4096) for key in loads})
    assert plan.state_bytes_moved == sum(loads[key] for key in moved)  # state_bytes=None: 1 byte per event
    assert plan.moved_share == pytest.approx(plan.state_bytes_moved / sum(loads.values()))
    assert 0.0 <= plan.min_moved_share <= plan.moved_share <= 1.0
    assert min(c["moved_share"] for c in plan.candidates if c["balance_degree"] >= (1 - tolerance) * plan.best_balance_degree - 1e-12) == plan.moved_share
    json.dumps(plan.as_record())


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(
    ("before", "after"),
    [
        (8, 8),  # same P: only the strategy changes
        (8, 12),  # scale out: four empty slots to fill
        (8, 4),  # scale in: every key on slots 4..7 must move
    ],
)
def test_every_strategy_and_parallelism_from_hash(strategy: str, before: int, after: int) -> None:
    current = in_force("hash", before)
    plan = plan_switch(LOADS, current, strategy, after)
    check_plan(plan, LOADS, current)
    if strategy in RULE_STRATEGIES:  # the rule itself, one candidate; its own share is the minimum
        rule = strategy_by_name(strategy, after)
        assert plan.mapping == {key: rule.slot_of(key) for key in LOADS} and len(plan.candidates) == 1
        assert plan.min_moved_share == plan.moved_share
    else:
        assert [c["candidate"] for c in plan.candidates] == [
            "strategy as built", "slots relabelled to match the current", "min-move rebalance",
        ]
    if after < before:
        assert plan.moved_share >= sum(v for k, v in LOADS.items() if current(k)[0] >= after) / sum(LOADS.values())


@pytest.mark.parametrize("strategy", LEARNED_STRATEGIES)
@pytest.mark.parametrize("after", [8, 12, 4])
def test_relabelling_keeps_the_balance_and_moves_no_more(strategy: str, after: int) -> None:
    plan = plan_switch(LOADS, in_force("least_key", 8), strategy, after)
    built, relabelled = plan.candidates[0], plan.candidates[1]
    assert relabelled["balance_degree"] == pytest.approx(built["balance_degree"])
    assert relabelled["moved_share"] <= built["moved_share"]


def test_relabelling_undoes_a_renaming_of_the_slots() -> None:
    """The map in force is the target's own map with its slots renamed: renaming back moves nothing."""
    assignment = learn_strategy("least_count", LOADS, 8).assignment
    rename = [3, 7, 0, 5, 1, 6, 2, 4]
    plan = plan_switch(LOADS, lambda key: (rename[assignment[key]],), "least_count", 8, tolerance=0.0)
    assert plan.candidates[1]["moved_share"] == 0.0 and plan.moved_share == 0.0


@pytest.mark.parametrize("size", range(0, 7))
def test_max_weight_matching_is_optimal(size: int) -> None:
    rng = np.random.default_rng(size)
    for _ in range(20):
        weight = rng.integers(0, 10, (size, size)).astype(float)  # small integers: many ties
        perm = max_weight_matching(weight)
        assert sorted(perm) == list(range(size))
        best = max((sum(weight[r, p[r]] for r in range(size)) for p in itertools.permutations(range(size))), default=0)
        assert sum(weight[r, perm[r]] for r in range(size)) == best


@pytest.mark.parametrize(
    ("before", "target", "p1", "p2"),
    [
        ("hash", "least_count", 8, 8),
        ("hash", "least_count", 8, 12),
        ("least_count", "hot_split", 8, 8),
        ("least_count", "hot_split", 8, 12),
    ],
)
def test_flights_like_moves_at_most_1_2_times_the_minimum(before: str, target: str, p1: int, p2: int) -> None:
    plan = plan_switch(LOADS, in_force(before, p1), target, p2)
    assert plan.moved_share <= 1.2 * plan.min_moved_share
    if p1 == p2 and before == "least_count":  # no key of this sample is hot: hot_split is least_count
        assert plan.moved_share == 0.0


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("partitions", [1, 8, 12])
def test_the_target_already_in_force_moves_nothing(strategy: str, partitions: int) -> None:
    plan = plan_switch(LOADS, in_force(strategy, partitions), strategy, partitions)
    assert (plan.keys_moved, plan.buckets_moved, plan.state_bytes_moved, plan.min_moved_share) == (0, 0, 0, 0.0)


def test_a_map_already_balanced_enough_is_kept() -> None:
    """least_count learned on another sample is within 2 % of the best on this one: nothing moves."""
    rng = random.Random(3)
    other = {key: max(1, round(value * rng.uniform(0.99, 1.01))) for key, value in LOADS.items()}
    current = in_force("least_count", 8, other)
    per_slot = [0] * 8
    for key, value in LOADS.items():
        per_slot[current(key)[0]] += value
    plan = plan_switch(LOADS, current, "least_count", 8)
    assert balance_degree(per_slot) >= 0.98 * plan.best_balance_degree
    assert plan.keys_moved == 0 and plan.candidate == "min-move rebalance"


@pytest.mark.parametrize("tolerance", [0.0, 0.01, 0.05, 0.2])
def test_the_tolerance_is_respected(tolerance: float) -> None:
    current = in_force("hash", 8)
    plan = plan_switch(LOADS, current, "least_count", 8, tolerance=tolerance)
    check_plan(plan, LOADS, current, tolerance)


def test_a_looser_tolerance_moves_less() -> None:
    shares = [plan_switch(LOADS, in_force("hash", 8), "least_count", 8, tolerance=t).moved_share for t in (0.0, 0.02, 0.1)]
    assert shares[0] > shares[1] > shares[2]


def brute_force_least_bytes(loads, sizes, current, partitions, beta, options) -> int:
    """The fewest bytes moved by any map giving each key one of `options` with balance >= beta."""
    keys, least = list(loads), None
    for choice in itertools.product(options, repeat=len(keys)):
        per_slot = [0.0] * partitions
        for key, slots in zip(keys, choice):
            for slot in slots:
                per_slot[slot] += loads[key] / len(slots)
        if balance_degree(per_slot) >= beta - 1e-12:
            moved = sum(sizes[k] for k, s in zip(keys, choice) if s[0] != current[k][0] or set(s) != set(current[k]))
            least = moved if least is None else min(least, moved)
    return least


@pytest.mark.parametrize("seed", range(12))
def test_min_moved_share_is_a_lower_bound(seed: int) -> None:
    """Against every whole-key map (least_count) and every map with splits (hot_split), by brute force."""
    rng = random.Random(seed)
    splitting, p1, p2 = seed % 2 == 1, rng.choice([2, 3]), rng.choice([2, 3])
    keys = [str(k) for k in range(4 if splitting else 7)]
    loads = {key: rng.choice([0, 1, 5, 20, 60]) for key in keys}
    sizes = {key: rng.randint(0, 50) for key in keys}
    slot_sets = [s for k in range(1, p1 + 1) for s in itertools.permutations(range(p1), k)] if splitting else [(s,) for s in range(p1)]
    current = {key: rng.choice(slot_sets) for key in keys}
    target = "hot_split" if splitting else "least_count"
    plan = plan_switch(loads, current.__getitem__, target, p2, state_bytes=sizes, tolerance=0.05)
    options = [s for k in range(1, p2 + 1) for s in itertools.permutations(range(p2), k)] if splitting else [(s,) for s in range(p2)]
    least = brute_force_least_bytes(loads, sizes, current, p2, 0.95 * plan.best_balance_degree, options)
    assert plan.min_moved_share * plan.state_bytes_total <= least + 1e-9
    assert plan.state_bytes_moved >= least


def test_keys_only_in_state_bytes_are_planned_with_no_events() -> None:
    loads = {"1": 10, "2": 10}
    plan = plan_switch(loads, lambda key: (int(key) % 2,), "least_count", 2, state_bytes={"1": 100, "2": 100, "3": 7})
    assert set(plan.mapping) == {"1", "2", "3"} and plan.state_bytes_total == 207 and plan.moved_share == 0.0


def test_a_hot_key_is_split_over_the_slots_it_needs() -> None:
    loads = {**flights_like(), "1": 400_000}  # one key with 29 % of the events: more than two slots' share
    current = in_force("hash", 8, loads)
    plan = plan_switch(loads, current, "hot_split", 8)
    check_plan(plan, loads, current)
    slots = plan.split["1"]
    assert len(slots) >= 3 and len(set(slots)) == len(slots) and plan.mapping["1"] == slots[0]
    assert plan.balance_degree > 0.95 and plan.moved_share <= 1.2 * plan.min_moved_share
    back = plan_switch(loads, lambda key: slots_of(plan, key), "least_count", 8)  # least_count keeps keys whole
    assert back.split == {} and back.keys_moved >= 1 and back.min_moved_share >= 400_000 / sum(loads.values())


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"strategy": "weight"}, "cannot plan a switch to strategy 'weight'"),  # weights are set by hand
        ({"strategy": "nope"}, "cannot plan a switch to strategy 'nope'"),
        ({"partitions": 0}, "partitions must be >= 1"),
        ({"tolerance": 1.0}, "tolerance must be in"),
        ({"buckets": 0}, "buckets must be an int >= 1"),
        ({"loads": {"1": -1}}, "sampled events of key '1'"),
        ({"state_bytes": {"1": 1.5}}, "state bytes of key '1'"),
        ({"current": lambda key: ()}, "slots in force of key '1'"),
        ({"current": lambda key: (1, 1)}, "slots in force of key '1'"),
    ],
)
def test_bad_arguments_are_configuration_errors(arguments: dict, message: str) -> None:
    call = {"loads": {"1": 3}, "current": lambda key: (0,), "strategy": "least_count", "partitions": 2, **arguments}
    with pytest.raises(ConfigurationError, match=message):
        plan_switch(call.pop("loads"), call.pop("current"), call.pop("strategy"), call.pop("partitions"), **call)


def test_nothing_to_plan() -> None:
    plan = plan_switch({}, lambda key: (0,), "least_count", 4)
    assert (plan.keys_total, plan.moved_share, plan.min_moved_share, plan.balance_degree) == (0, 0.0, 0.0, 1.0)


def test_the_rebalance_does_not_stick_when_every_key_of_the_heaviest_slot_exceeds_the_gap() -> None:
    """Real flights (the first 96,000, 223 origins) from hash to least_count at P = 8.

    The min-move rebalance used to stop at a balance of 0.964 (goal 0.980): the heaviest slot's
    lightest key (825 events) was above its gap to the lightest slot (441), so no single move
    helped, and the plan fell back to the relabelled map, moving 0.685 of the state where 0.177
    suffices. A swap with a lighter slot now reaches the goal.
    """
    sample = json.loads((Path(__file__).parent / "data" / "flights_sample_96000.json").read_text())
    loads = sample["events_per_key"]
    plan = plan_switch(loads, in_force("hash", 8, loads), "least_count", 8)
    check_plan(plan, loads, in_force("hash", 8, loads))
    assert plan.candidate == "min-move rebalance"
    assert plan.moved_share <= 1.2 * plan.min_moved_share
