"""The cost_aware trigger's defaults in the scheduled monitor (issue 33): the horizon follows the
monitor's schedule, the cost follows measured pauses, and the reason names both with their sources.

Pure rules only (no services); the Redis side is tests/integration/test_cost_aware_monitor.py.
"""

from __future__ import annotations

import pytest

from keyshift.errors import ConfigurationError
from keyshift.monitoring.balance import balance_degree, extra_compute_time, max_over_mean
from keyshift.monitoring.evaluate import Evaluation, StrategyEvaluation
from keyshift.monitoring.switch_policies import (
    DEFAULT_COST_S,
    RECENT_SWITCHES,
    CostAwarePolicy,
    MeasuredSwitch,
    horizon_default,
    migration_cost,
    schedule_text,
    policy_by_name,
)
from keyshift.orchestration.monitor import EVALUATION_INTERVAL, EVALUATION_INTERVAL_S, monitor_params


def _evaluation(in_force: str, loads: dict[str, tuple[int, ...]]) -> Evaluation:
    results = tuple(
        StrategyEvaluation(name, name == in_force, len(load), load, balance_degree(load), extra_compute_time(load), max_over_mean(load))
        for name, load in loads.items()
    )
    return Evaluation(len(next(iter(loads.values()))), in_force, sum(results[0].loads), 0, results)


# hash max/mean 1.05, least_count 1.0: over 60 s the gain is 2.86 s, over 600 s 28.6 s
MILD = _evaluation("hash", {"hash": (21, 19), "least_count": (20, 20)})


# ---------------------------------------------------------------- horizon


def test_the_evaluation_interval_is_the_dags_ten_minutes() -> None:
    assert EVALUATION_INTERVAL.total_seconds() == EVALUATION_INTERVAL_S == 600.0


@pytest.mark.parametrize(("seconds", "text"), [(600.0, "10-min"), (3600.0, "1-h"), (7200.0, "2-h"), (90.0, "90-s"), (30.0, "30-s")])
def test_schedule_text(seconds: float, text: str) -> None:
    assert schedule_text(seconds) == text


def test_horizon_default_is_the_schedule_unless_set() -> None:
    chosen = horizon_default(None, 600.0)
    assert (chosen.seconds, chosen.source) == (600.0, "the monitor's 10-min schedule")
    given = horizon_default(60.0, 600.0)
    assert (given.seconds, given.source) == (60.0, "horizon_s as set")
    with pytest.raises(ConfigurationError):
        horizon_default(0.0, 600.0)


def test_monitor_params_count_the_gain_over_the_schedule() -> None:
    params = monitor_params({"topic": "flights"})  # the DAG's form with horizon_s and cost_s empty
    assert params.horizon_s is None and params.cost_s is None
    assert params.horizon().seconds == EVALUATION_INTERVAL_S
    options = params.trigger_options()
    assert options["horizon_s"] == EVALUATION_INTERVAL_S and options["default_cost_s"] == DEFAULT_COST_S
    assert options["horizon_source"] == "the monitor's 10-min schedule"
    assert monitor_params({"trigger": "threshold", "theta": 0.4}).trigger_options() == {"horizon_s": 600.0, "theta": 0.4}
    assert monitor_params({"horizon_s": 60.0, "cost_s": 5.0}).trigger_options()["horizon_s"] == 60.0  # set: kept


def test_a_mild_skew_pays_over_the_ten_minutes_the_decision_stands() -> None:
    # the old defaults (60 s, 5 s) stayed: 2.86 s < 6 s; over the schedule's 600 s, 28.6 s > 12 s
    trigger = policy_by_name("cost_aware", **monitor_params({"topic": "flights"}).trigger_options())
    decision = trigger.observe(MILD, 0.0, 40)
    assert decision.switch and decision.strategy == "least_count"
    assert decision.expected_gain_s == pytest.approx(600.0 * (1 - 1 / 1.05))
    assert "horizon 600 s = the monitor's 10-min schedule" in decision.reason
    assert "cost 10.00 s = the default, no switch measured" in decision.reason


# ---------------------------------------------------------------- cost


def test_default_cost_is_in_the_measured_range() -> None:
    assert 8.0 <= DEFAULT_COST_S <= 20.0  # issue 33's measured pauses; README's switch bench figures


def test_cost_rule_order_topic_then_set_then_median_then_default() -> None:
    ours = MeasuredSwitch(9.8, "sw-20261128T090611-8d99", "flights", 50.0)
    others = [MeasuredSwitch(8.0, "sw-a", "t1", 10.0), MeasuredSwitch(20.0, "sw-b", "t2", 20.0), MeasuredSwitch(12.4, "sw-c", "t3", 30.0)]
    topic_first = migration_cost(3.0, ours, others)
    assert (topic_first.seconds, topic_first.source) == (9.8, "the topic's last measured switch sw-20261128T090611-8d99 (its pause)")
    assert migration_cost(None, MeasuredSwitch(9.8), others).source == "the topic's last measured switch (its pause)"
    set_second = migration_cost(3.0, None, others)
    assert (set_second.seconds, set_second.source) == (3.0, "cost_s as set, no switch measured on the topic")
    assert migration_cost(0.0, None, others).seconds == 0.0  # 0 is a value, not "unset"
    median = migration_cost(None, None, others)
    assert median.seconds == 12.4 and median.source.startswith("median pause of 3 measured switches")
    assert migration_cost(None, None, others[:2]).seconds == 14.0  # even count: the mean of the middle two
    one = migration_cost(None, None, others[:1])
    assert one.seconds == 8.0 and "the one measured switch sw-a on t1" in one.source
    fallback = migration_cost(None, None, [])
    assert (fallback.seconds, fallback.source) == (DEFAULT_COST_S, "the default, no switch measured")
    with pytest.raises(ConfigurationError):
        migration_cost(-1.0, None, [])


def test_cost_median_takes_only_the_newest_switches() -> None:
    old = [MeasuredSwitch(100.0, f"old-{i}", "t", float(i)) for i in range(RECENT_SWITCHES)]
    new = [MeasuredSwitch(7.0, f"new-{i}", "t", 1000.0 + i) for i in range(RECENT_SWITCHES)]
    undated = [MeasuredSwitch(500.0, "undated")]  # no finished_at: counts as the oldest
    cost = migration_cost(None, None, old + undated + new)
    assert cost.seconds == 7.0 and f"of {RECENT_SWITCHES} measured switches" in cost.source


# ---------------------------------------------------------------- the trigger's reason


def test_every_cost_aware_reason_names_the_horizon_and_the_cost_with_their_sources() -> None:
    trigger = CostAwarePolicy(horizon_s=600.0, default_cost_s=12.4, horizon_source="the monitor's 10-min schedule",
                               cost_source="median pause of 5 measured switches")
    basis = "horizon 600 s = the monitor's 10-min schedule; cost 12.40 s = median pause of 5 measured switches"
    assert trigger.basis == basis
    pays = trigger.observe(MILD, 0.0, 40)
    assert pays.switch and basis in pays.reason and "needs > cost x (1 + 0.20) = 14.88 s" in pays.reason
    even = _evaluation("hash", {"hash": (20, 20), "least_count": (21, 19)})
    assert basis in trigger.observe(even, 1.0, 40).reason  # stays: the strategy in force is best
    trigger.record_switch("least_count", "hash", 2.0, migration_s=30.0)  # measured by the trigger's user
    assert trigger.cost_s == 30.0 and "cost 30.00 s = the last measured migration (least_count -> hash)" in trigger.basis


def test_a_trigger_built_without_a_cost_uses_the_documented_default() -> None:
    trigger = CostAwarePolicy()
    assert trigger.cost_s == DEFAULT_COST_S and trigger.cost_source == "the default, no switch measured"
    assert CostAwarePolicy(default_cost_s=5.0).cost_source == "default_cost_s as given"
