"""Sampled balance monitoring: sampler, per-strategy figures on a hand-made sample, switch triggers, CLI."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from keyshift.errors import ConfigurationError
from keyshift.monitoring.balance import balance_degree, extra_compute_time, max_over_mean
from keyshift.monitoring.evaluate import Evaluation, StrategyEvaluation, evaluate_sample, load_latest, save_evaluation
from keyshift.monitoring.sampling import Sampler
from keyshift.monitoring.switch_policies import (
    CostAwarePolicy,
    CountPolicy,
    Decision,
    PeriodicPolicy,
    ThresholdPolicy,
    SwitchPolicy,
    expected_gain_s,
    policy_by_name,
)
from keyshift.placement.strategies import bucket_of

# ---------------------------------------------------------------- sampler


def test_every_nth_keeps_positions_n_2n_3n() -> None:
    sampler = Sampler(every=3)
    kept = [sampler.offer(key) for key in "abcabcabca"]
    assert kept == [False, False, True] * 3 + [False]  # 1-based positions 3, 6, 9
    assert sampler.counts == {"c": 3}
    assert (sampler.seen, sampler.sampled, sampler.rate) == (10, 3, 1 / 3)


def test_every_nth_in_batches_matches_one_at_a_time() -> None:
    keys = [f"k{i % 7}" for i in range(100)]
    single, batched = Sampler(every=4), Sampler(every=4)
    for key in keys:
        single.offer(key)
    for start in range(0, 100, 13):  # uneven batches straddle the n-th positions
        batched.offer_batch(keys[start : start + 13])
    assert single.counts == batched.counts and sum(batched.counts.values()) == 25


def test_fraction_is_seeded_and_batch_invariant() -> None:
    keys = [f"k{i % 11}" for i in range(5000)]
    single, batched, again = Sampler(fraction=0.1, seed=7), Sampler(fraction=0.1, seed=7), Sampler(fraction=0.1, seed=7)
    for key in keys:
        single.offer(key)
    batched.offer_batch(keys[:1234])
    batched.offer_batch(keys[1234:])
    again.offer_batch(keys)
    assert single.counts == batched.counts == again.counts
    assert list(single.counts) == list(batched.counts)  # order of first sampled event too
    assert 400 < single.sampled < 600  # about 10 % of 5000


@pytest.mark.parametrize(
    "options",
    [
        {},  # neither rule
        {"every": 2, "fraction": 0.5},  # both rules
        {"every": 0},  # n must be >= 1
        {"fraction": 0.0},  # f must be > 0
        {"fraction": 1.5},  # f must be <= 1
    ],
)
def test_sampler_refuses_bad_rules(options: dict) -> None:
    with pytest.raises(ConfigurationError):
        Sampler(**options)


# ---------------------------------------------------------------- evaluation on a hand-made sample

SAMPLE = {"a": 6, "b": 3, "c": 2, "d": 1}  # 12 events, arrival order a, b, c, d


def test_hash_slots_of_the_sample_are_the_murmur2_ones() -> None:
    # the hand computations below take these slots as given (murmur2 is tested in test_murmur2)
    assert [bucket_of(key, 2) for key in "abcd"] == [0, 0, 0, 1]
    assert [bucket_of(key, 3) for key in "abcd"] == [1, 2, 1, 2]


@pytest.mark.parametrize(
    ("partitions", "strategy", "loads", "degree", "extra", "split_keys"),
    [
        # hash P=2: a, b, c -> 0 (6+3+2), d -> 1; eq.1 1/11; eq.2 mean 6: (11-6)/6
        (2, "hash", (11, 1), 1 / 11, 5 / 6, 0),
        # least_key P=2 (fewest keys, ties to lowest): a->0, b->1, c->0, d->1; mean 6: (8-6)/6
        (2, "least_key", (8, 4), 0.5, 1 / 3, 0),
        # least_count P=2 (LPT): a->0 (6), b->1 (3), c->1 (5), d->1 (6)
        (2, "least_count", (6, 6), 1.0, 0.0, 0),
        # hot_split P=2: a is 6 of 12, 6*2 = 12 is not > 12, so nothing is split: as least_count
        (2, "hot_split", (6, 6), 1.0, 0.0, 0),
        # hash P=3: a, c -> 1 (8), b, d -> 2 (4), slot 0 empty; eq.1 0; mean 4: (8-4)/4
        (3, "hash", (0, 8, 4), 0.0, 1.0, 0),
        # least_key P=3: a->0, b->1, c->2, d->0 (tie of one key each); mean 4: (7-4)/4
        (3, "least_key", (7, 3, 2), 2 / 7, 0.75, 0),
        # least_count P=3: a->0, b->1, c->2, d->2 (2 < 3); mean 4: (6-4)/4
        (3, "least_count", (6, 3, 3), 0.5, 0.5, 0),
        # hot_split P=3: a hot (6*3 > 12), k = max(2, ceil(18/12)) = 2 pieces of 3 -> slots 0, 1;
        # b (3) -> 2; c (2) -> 0 (tie, lowest); d (1) -> 1; mean 4: (5-4)/4
        (3, "hot_split", (5, 4, 3), 0.6, 0.25, 1),
    ],
)
def test_figures_on_the_hand_made_sample(
    partitions: int, strategy: str, loads: tuple, degree: float, extra: float, split_keys: int
) -> None:
    result = evaluate_sample(SAMPLE, partitions, "hash").of(strategy)
    assert result.loads == loads
    assert result.balance_degree == pytest.approx(degree)
    assert result.extra_compute_time == pytest.approx(extra)
    assert result.max_over_mean == pytest.approx(1 + extra)
    assert result.split_keys == split_keys
    assert result.in_force == (strategy == "hash") and result.partitions == partitions


def test_every_strategy_is_evaluated_on_the_same_sample() -> None:
    evaluation = evaluate_sample(SAMPLE, 2, "least_key")
    labels = [result.strategy for result in evaluation.results]
    assert labels == ["hash", "least_key", "least_count", "weight", "weight/random", "hot_split"]  # no modulo: letters
    assert (evaluation.events, evaluation.keys, evaluation.in_force) == (12, 4, "least_key")
    for result in evaluation.results:
        assert sum(result.loads) == 12
        assert result.balance_degree == balance_degree(result.loads)  # the shared metrics, not a copy
        assert result.extra_compute_time == extra_compute_time(result.loads)
        assert result.max_over_mean == max_over_mean(result.loads)
    assert evaluation.current.strategy == "least_key"
    assert evaluation.best.strategy == "least_count"  # balance 1.0, first in order among the best
    with pytest.raises(Exception):
        StrategyEvaluation.__setattr__(evaluation.current, "balance_degree", 0.0)  # frozen


def test_modulo_is_evaluated_for_integer_keys() -> None:
    evaluation = evaluate_sample({"0": 5, "1": 1, "2": 5, "3": 1}, 2, "modulo")
    assert evaluation.of("modulo").loads == (10, 2)  # even keys -> 0, odd keys -> 1


def test_the_live_assignment_in_force_is_scored_as_is() -> None:
    from keyshift.placement.strategies import LeastCountStrategy

    live = LeastCountStrategy.from_counts({"d": 10}, 2)  # learned on an old sample: d on slot 0
    result = evaluate_sample(SAMPLE, 2, "least_count", assignment=live).current
    # d stays on 0 (S = 10); new keys, placed as met (one event each, `slot_of`): a, b, c -> 1 (S 0, 1, 2 < 10)
    # sampled loads: slot 0 = d's 1 event, slot 1 = 6 + 3 + 2
    assert result.loads == (1, 11)


@pytest.mark.parametrize(
    ("sample", "in_force"),
    [
        ({}, "hash"),  # no events
        ({"a": 0}, "hash"),  # only empty keys
        ({"a": -1}, "hash"),  # negative count
        (SAMPLE, "nope"),  # unknown strategy in force
    ],
)
def test_evaluate_refuses_bad_input(sample: dict, in_force: str) -> None:
    with pytest.raises(ConfigurationError):
        evaluate_sample(sample, 2, in_force)


def test_save_and_load_latest(tmp_path) -> None:
    evaluation = evaluate_sample(SAMPLE, 2, "hash")
    decision = Decision(True, "least_count", "because", 1.5, "threshold")
    written = save_evaluation(tmp_path, evaluation, decision, context={"key": "origin"})
    save_evaluation(tmp_path, evaluation)  # a second entry: history grows, latest is replaced
    assert len(list((tmp_path / "history").glob("*.parquet"))) == 2
    frame = pd.read_parquet(written)
    assert list(frame["strategy"]) == [result.strategy for result in evaluation.results]
    assert set(frame["decision_strategy"]) == {"least_count"}
    latest = load_latest(tmp_path)
    assert latest["decision"] is None and latest["evaluation"]["events"] == 12
    with pytest.raises(ConfigurationError, match="keyshift balance evaluate"):
        load_latest(tmp_path / "empty")


# ---------------------------------------------------------------- triggers


def _evaluation(in_force: str, loads: dict[str, tuple[int, ...]]) -> Evaluation:
    """An evaluation with given loads per strategy (figures from the shared metrics)."""
    results = tuple(
        StrategyEvaluation(name, name == in_force, len(load), load, balance_degree(load), extra_compute_time(load), max_over_mean(load))
        for name, load in loads.items()
    )
    return Evaluation(len(next(iter(loads.values()))), in_force, sum(results[0].loads), 0, results)


SKEWED = _evaluation("hash", {"hash": (9, 3), "least_count": (6, 6)})  # hash: balance 1/3, max/mean 1.5
EVEN = _evaluation("hash", {"hash": (6, 6), "least_count": (7, 5)})  # hash is already the best


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        # T = 10 s: the first call starts the clock; fires at 10 and again 10 s after that
        ([0, 5, 9.9, 10, 15, 19.9, 20], [False, False, False, True, False, False, True]),
        # calls sparser than T: every call at least 10 s after the last firing fires
        ([0, 25, 30, 36], [False, True, False, True]),
    ],
)
def test_periodic_fires_every_t_seconds(steps: list[float], expected: list[bool]) -> None:
    trigger = PeriodicPolicy(period_s=10)
    decisions = [trigger.observe(SKEWED, now, 0) for now in steps]
    assert [decision.switch for decision in decisions] == expected
    assert {d.strategy for d in decisions if d.switch} == {"least_count"}
    assert all(d.trigger == "periodic" for d in decisions)


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        # N = 100: 40 + 50 = 90 < 100, + 10 = 100 fires; 99 waits, + 1 fires
        ([40, 50, 10, 99, 1], [False, False, True, False, True]),
        # one big batch fires at once, and the count restarts at 0 (not at the excess)
        ([250, 50, 50], [True, False, True]),
        # no events, no firing
        ([0, 0, 0], [False, False, False]),
    ],
)
def test_count_fires_every_n_events(events: list[int], expected: list[bool]) -> None:
    trigger = CountPolicy(every_events=100)
    assert [trigger.observe(SKEWED, float(i), n).switch for i, n in enumerate(events)] == expected


@pytest.mark.parametrize(
    ("loads_in_force", "switch"),
    [
        ((6, 4), False),  # balance 0.667 >= 0.5
        ((6, 3), False),  # balance 0.5 = θ: not below
        ((9, 3), True),  # balance 0.333 < 0.5: move to least_count (balance 1.0)
        ((12, 0), True),  # balance 0.0
    ],
)
def test_threshold_fires_below_theta(loads_in_force: tuple[int, int], switch: bool) -> None:
    evaluation = _evaluation("hash", {"hash": loads_in_force, "least_count": (6, 6)})
    decision = ThresholdPolicy(theta=0.5).observe(evaluation, 0.0, 0)
    assert decision.switch is switch
    assert decision.strategy == ("least_count" if switch else "hash")


def test_paper_triggers_do_not_switch_when_the_strategy_in_force_is_best() -> None:
    # every paper trigger fires here, but the best balance degree is already in force
    for trigger in (PeriodicPolicy(1), CountPolicy(1), ThresholdPolicy(1.0)):
        trigger.observe(EVEN, 0.0, 1)
        decision = trigger.observe(EVEN, 5.0, 1)
        assert decision == Decision(False, "hash", decision.reason, 0.0, trigger.name)
        assert isinstance(trigger, SwitchPolicy)


def test_expected_gain_is_the_makespan_saved_over_the_horizon() -> None:
    # hash max/mean 1.5, least_count 1.0: the same events take 60 * 1.0 / 1.5 = 40 s, 20 s saved
    assert expected_gain_s(SKEWED.of("hash"), SKEWED.of("least_count"), 60.0) == pytest.approx(20.0)
    assert expected_gain_s(SKEWED.of("least_count"), SKEWED.of("hash"), 60.0) == pytest.approx(-30.0)


@pytest.mark.parametrize(
    ("horizon_s", "cost_s", "margin", "switch"),
    [
        (60.0, 5.0, 0.2, True),  # gain 20 s > 5 * 1.2 = 6 s
        (60.0, 20.5, 0.0, False),  # gain 20 s < cost 20.5 s even without a margin: stay
        (60.0, 17.0, 0.2, False),  # gain 20 s < 17 * 1.2 = 20.4 s: the margin holds it back
        (6.0, 1.0, 0.2, True),  # short horizon: gain 2 s > 1.2 s
        (6.0, 5.0, 0.2, False),  # short horizon: gain 2 s < 6 s
    ],
)
def test_cost_aware_switches_only_when_the_gain_exceeds_the_cost(horizon_s: float, cost_s: float, margin: float, switch: bool) -> None:
    trigger = CostAwarePolicy(horizon_s=horizon_s, default_cost_s=cost_s, margin=margin)
    decision = trigger.observe(SKEWED, 0.0, 1000)
    assert decision.switch is switch
    assert decision.strategy == ("least_count" if switch else "hash")
    assert decision.expected_gain_s == pytest.approx(horizon_s / 3)


def test_cost_aware_uses_the_measured_cost_of_the_last_migration() -> None:
    trigger = CostAwarePolicy(horizon_s=60.0, default_cost_s=1.0, margin=0.2, cooldown_s=0.0)
    assert trigger.observe(SKEWED, 0.0, 0).switch  # 20 s > 1.2 s
    trigger.record_switch("least_count", "hash", 1.0, migration_s=30.0)  # a migration measured at 30 s
    assert trigger.cost_s == 30.0
    assert not trigger.observe(SKEWED, 2.0, 0).switch  # 20 s < 36 s
    with pytest.raises(ConfigurationError):
        trigger.record_switch("hash", "least_count", 3.0, migration_s=-1.0)


def test_cost_aware_never_flaps_back_within_the_cool_down() -> None:
    trigger = CostAwarePolicy(horizon_s=60.0, default_cost_s=1.0, margin=0.2, cooldown_s=300.0)
    first = trigger.observe(SKEWED, 0.0, 0)
    assert (first.switch, first.strategy) == (True, "least_count")
    trigger.record_switch("hash", "least_count", 0.0)
    # the distribution turns: now hash would be better than least_count (in force)
    turned = _evaluation("least_count", {"hash": (6, 6), "least_count": (9, 3)})
    script = [
        (100.0, False),  # hash was left 100 s ago: cool-down, stay
        (299.0, False),  # still inside the 300 s cool-down
        (300.0, True),  # cool-down over: switching back pays and is allowed
    ]
    for now, switch in script:
        decision = trigger.observe(turned, now, 0)
        assert decision.switch is switch, (now, decision.reason)
    assert "cool-down" in trigger.observe(turned, 100.0, 0).reason
    # a third strategy is not a flap back: allowed inside the cool-down
    third = _evaluation("least_count", {"hash": (9, 3), "least_count": (9, 3), "hot_split": (6, 6)})
    assert trigger.observe(third, 100.0, 0).strategy == "hot_split"


def test_cost_aware_stays_when_the_strategy_in_force_is_best() -> None:
    decision = CostAwarePolicy(default_cost_s=0.0).observe(EVEN, 0.0, 0)
    assert decision == Decision(False, "hash", decision.reason, 0.0, "cost_aware")


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("nope", {}),  # unknown trigger
        ("periodic", {"theta": 0.5}),  # an option of another trigger
        ("periodic", {"period_s": 0}),  # T must be > 0
        ("count", {"every_events": 0}),  # N must be >= 1
        ("threshold", {"theta": 1.5}),  # θ in [0, 1]
        ("cost_aware", {"margin": -0.1}),  # margin >= 0
    ],
)
def test_trigger_by_name_refuses_bad_options(name: str, options: dict) -> None:
    with pytest.raises(ConfigurationError):
        policy_by_name(name, **options)


def test_triggers_refuse_negative_events() -> None:
    with pytest.raises(ConfigurationError):
        CountPolicy(10).observe(SKEWED, 0.0, -1)


# ---------------------------------------------------------------- CLI


def test_cli_balance_evaluate_and_show_on_a_tiny_sample(tmp_path, monkeypatch) -> None:
    from click.testing import CliRunner

    from keyshift.cli import _register, cli

    _register()
    monkeypatch.setenv("KEYSHIFT_RUNS_DIR", str(tmp_path / "runs"))
    source = tmp_path / "tiny.parquet"
    origins = ["A"] * 6 + ["B"] * 3 + ["C"] * 2 + ["D"]
    pd.DataFrame({"origin": origins, "destination": ["X", "Y"] * 6}).to_parquet(source)
    args = ["balance", "evaluate", "--input", str(source), "-p", "2", "--strategy", "hash", "--sample-fraction", "1", "--trigger", "threshold", "--theta", "0.9"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "12 events, sampled 12" in result.output and "least_count" in result.output
    assert "decision (threshold)" in result.output
    latest = json.loads((tmp_path / "runs" / "balance" / "latest.json").read_text())
    assert latest["evaluation"]["events"] == 12 and latest["key"] == "origin"
    assert len(list((tmp_path / "runs" / "balance" / "history").glob("*.parquet"))) == 1
    shown = CliRunner().invoke(cli, ["balance", "show"])
    assert shown.exit_code == 0, shown.output
    assert "decision (threshold)" in shown.output and "least_count" in shown.output
    routes = CliRunner().invoke(cli, [*args[:2], "--input", str(source), "--key", "route", "-p", "2", "--sample-fraction", "1", "--no-save"])
    assert routes.exit_code == 0, routes.output
    assert "7 keys" in routes.output  # A-X, A-Y, B-X, B-Y, C-Y, C-X, D-Y


def test_cli_balance_evaluate_restricted_to_candidates(tmp_path, monkeypatch) -> None:
    from click.testing import CliRunner

    from keyshift.cli import _register, cli

    _register()
    monkeypatch.setenv("KEYSHIFT_RUNS_DIR", str(tmp_path / "runs"))
    source = tmp_path / "tiny.parquet"
    pd.DataFrame({"origin": ["A"] * 6 + ["B"] * 3 + ["C"] * 2 + ["D"], "destination": ["X"] * 12}).to_parquet(source)
    base = ["balance", "evaluate", "--input", str(source), "-p", "2", "--sample-fraction", "1", "--no-save"]
    result = CliRunner().invoke(cli, [*base, "--candidate", "hash", "--candidate", "least_count"])
    assert result.exit_code == 0, result.output
    assert "least_count" in result.output and "least_key" not in result.output and "hot_split" not in result.output
    assert "switch to least_count" in result.output  # hash (11, 1) -> least_count (6, 6): 60 s x (1 - 1/1.833) = 27.3 s > 6 s
    unknown = CliRunner().invoke(cli, [*base, "--candidate", "nope"])
    assert unknown.exit_code != 0
