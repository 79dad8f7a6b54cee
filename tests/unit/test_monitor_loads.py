"""Pure parts of the balance monitor: loads from offset deltas, bounded reads, job count deltas,
monitor figures on a known sample, trigger state across evaluations, params and switch requests,
and the Parquet history read back."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from keyshift.errors import ConfigurationError
from keyshift.monitoring.evaluate import evaluate_sample, save_evaluation
from keyshift.monitoring.loads import JobCounts, arrival_ranges, arrivals, bounded_ranges, measured_loads, since_previous
from keyshift.monitoring.results import history_records
from keyshift.monitoring.switch_policies import CountPolicy, PeriodicPolicy, ThresholdPolicy, Decision
from keyshift.orchestration.monitor import DEFAULT_CANDIDATES, SwitchRequest, monitor_params

# ---------------------------------------------------------------- arrivals from end offsets


@pytest.mark.parametrize(
    "previous, current, beginning, expected",
    [
        (None, {0: 5, 1: 0}, None, {0: (0, 5), 1: (0, 0)}),  # first evaluation: everything so far
        ({0: 5, 1: 0}, {0: 9, 1: 3}, None, {0: (5, 9), 1: (0, 3)}),  # the deltas since then
        ({0: 5}, {0: 5, 1: 7}, {0: 0, 1: 2}, {0: (5, 5), 1: (2, 7)}),  # a new partition: from its oldest record
        ({0: 50}, {0: 4}, {0: 0}, {0: (0, 4)}),  # offsets went back (topic recreated): from the start
        ({0: 1}, {0: 10}, {0: 6}, {0: (1, 10)}),  # retention dropped 1..5: they still arrived
    ],
)
def test_arrival_ranges(previous, current, beginning, expected) -> None:
    assert arrival_ranges(previous, current, beginning) == expected


def test_arrivals_are_the_deltas_and_need_every_partition() -> None:
    assert arrivals({0: (5, 9), 1: (0, 3), 2: (7, 7)}) == [4, 3, 0]
    with pytest.raises(ConfigurationError):
        arrivals({0: (0, 1), 2: (0, 1)})  # partition 1 is missing


@pytest.mark.parametrize(
    "ranges, max_events, expected",
    [
        ({0: (0, 10), 1: (0, 5)}, 100, {0: (0, 10), 1: (0, 5)}),  # under the bound: all of it
        ({0: (0, 60), 1: (0, 30), 2: (0, 10)}, 10, {0: (54, 60), 1: (27, 30), 2: (9, 10)}),  # 6/3/1: shares exact
        ({0: (0, 5), 1: (0, 5), 2: (0, 5)}, 4, {0: (3, 5), 1: (4, 5), 2: (4, 5)}),  # 4/3 each: remainder to partition 0
        ({0: (100, 200), 1: (7, 7)}, 1, {0: (199, 200), 1: (7, 7)}),  # the most recent record
    ],
)
def test_bounded_ranges_keep_the_most_recent_in_proportion(ranges, max_events, expected) -> None:
    bounded = bounded_ranges(ranges, max_events)
    assert bounded == expected
    assert sum(end - start for start, end in bounded.values()) == min(max_events, sum(e - s for s, e in ranges.values()))


def test_bounded_ranges_refuse_a_zero_bound() -> None:
    with pytest.raises(ConfigurationError):
        bounded_ranges({0: (0, 1)}, 0)


# ---------------------------------------------------------------- measured figures


def test_measured_loads_on_known_numbers() -> None:
    figures = measured_loads("arrivals", [300, 100, 200, 200])
    assert figures.events == 800 and figures.max_load == 300 and figures.mean_load == 200.0
    assert figures.balance_degree == pytest.approx(1 / 3)  # eq. 1: 100 / 300
    assert figures.extra_compute_time == pytest.approx(0.5)  # eq. 2: (300 - 200) / 200
    assert figures.max_over_mean == pytest.approx(1.5)
    assert measured_loads("arrivals", [0, 0]).balance_degree == 1.0  # nothing arrived: nothing to balance


def _counts(run_id: str, slots: tuple[int, ...]) -> JobCounts:
    return JobCounts(run_id, "running", slots, "progress", "/runs/x/progress.jsonl")


@pytest.mark.parametrize(
    "previous_run, previous, current, expected",
    [
        ("r1", [10, 20], _counts("r1", (15, 26)), [5, 6]),  # same run: the difference
        ("r0", [10, 20], _counts("r1", (15, 26)), [15, 26]),  # another run: its counts so far
        (None, None, _counts("r1", (3, 4)), [3, 4]),  # the first read
        ("r1", [10, 20, 0], _counts("r1", (15, 26)), [15, 26]),  # another P
        ("r1", [10, 30], _counts("r1", (15, 26)), [15, 26]),  # a count went down (rerun): start over
    ],
)
def test_processed_since_previous(previous_run, previous, current, expected) -> None:
    assert since_previous(previous_run, previous, current) == expected


def test_monitor_figures_on_a_known_sample() -> None:
    # least_count puts A (6) alone and B, C, D (3 + 2 + 1) together: 6 vs 6; hash is what murmur2 makes of it
    evaluation = evaluate_sample({"A": 6, "B": 3, "C": 2, "D": 1}, 2, "hash", labels=["hash", "least_count"])
    assert [r.strategy for r in evaluation.results] == ["hash", "least_count"]
    assert evaluation.of("least_count").loads in ((6, 6),) and evaluation.of("least_count").balance_degree == 1.0
    assert sum(evaluation.current.loads) == evaluation.events == 12
    decision = ThresholdPolicy(1.0).observe(evaluation, 0.0, 12)
    assert decision.switch is (evaluation.current.balance_degree < 1.0)


# ---------------------------------------------------------------- trigger state across evaluations


def test_periodic_and_count_resume_from_state() -> None:
    evaluation = evaluate_sample({"A": 6, "B": 3, "C": 2, "D": 1}, 2, "hash", labels=["hash", "least_count"])
    first = PeriodicPolicy(60.0)
    assert first.observe(evaluation, 1000.0, 0).reason.startswith("periodic: 0.0 s")  # starts the clock
    resumed = PeriodicPolicy(60.0)
    resumed.restore(first.state())
    assert "elapsed" in resumed.observe(evaluation, 1030.0, 0).reason  # 30 s of 60 s
    assert "70.0 s >=" in resumed.observe(evaluation, 1070.0, 0).reason  # fired: the clock carried over
    counted = CountPolicy(100)
    counted.observe(evaluation, 0.0, 60)
    again = CountPolicy(100)
    again.restore(counted.state())
    assert "count: 110 events >= 100" in again.observe(evaluation, 1.0, 50).reason


# ---------------------------------------------------------------- params and switch requests


def test_monitor_params_defaults_and_errors() -> None:
    params = monitor_params({"topic": "flights", "partitions": None, "candidates": []})
    assert params.candidates == DEFAULT_CANDIDATES and params.partitions is None
    # the horizon follows the monitor's schedule, the cost a measured switch (none here: the default)
    assert params.trigger_options() == {"horizon_s": 600.0, "default_cost_s": 10.0, "margin": 0.2, "cooldown_s": 300.0,
                                        "horizon_source": "the monitor's 10-min schedule",
                                        "cost_source": "the default, no switch measured"}
    assert monitor_params({"trigger": "threshold", "theta": 0.4}).trigger_options() == {"horizon_s": 600.0, "theta": 0.4}
    with pytest.raises(ConfigurationError, match="theta"):
        monitor_params({"theta": 1.5})
    with pytest.raises(ConfigurationError, match="unknown strategy"):
        monitor_params({"strategy": "nope"})
    with pytest.raises(ConfigurationError, match="topic"):
        monitor_params({"topic": "no spaces"})
    with pytest.raises(ConfigurationError, match="typo"):
        monitor_params({"typo": 1})


def test_default_candidates_are_the_job_strategies() -> None:
    from keyshift.processing.job_config import JOB_STRATEGIES

    assert set(DEFAULT_CANDIDATES) == set(JOB_STRATEGIES)


GOOD_REQUEST = {"topic": "flights", "run_id": "r1", "strategy": "least_count", "strategy_from": "hash", "reason": "threshold: 0.29 < 0.6",
                "expected_gain_s": 24.5, "trigger": "threshold", "partitions": 8, "partitions_from": 8,
                "decided_at": "2026-01-01T00:00:00+00:00", "monitor_run_id": "scheduled__2026-01-01"}


@pytest.mark.parametrize(
    "change",
    [
        {"strategy": "hash"},  # the same strategy and P: nothing to switch
        {"strategy": "hash", "partitions_from": None},  # the same strategy, and the P in force unknown
        {"strategy": "hash", "partitions": None},  # the same strategy, P kept
        {"strategy": "nope"},  # unknown strategy
        {"strategy_from": "nope"},
        {"reason": ""},  # no reason
        {"partitions": 0},
        {"trigger": "sometimes"},
        {"extra_field": 1},  # a typo in the conf
    ],
)
def test_switch_request_refuses(change) -> None:
    from pydantic import ValidationError

    with pytest.raises((ValidationError, ConfigurationError)):
        SwitchRequest(**{**GOOD_REQUEST, **change})


@pytest.mark.parametrize(
    "change",
    [
        {},  # the monitor's conf: another strategy at the same P
        {"partitions": 12},  # another strategy and another P
        {"strategy": "hash", "partitions": 12},  # a change of P alone (the monitor's rescale)
        {"strategy": "hash", "partitions": 4},  # fewer slots
        {"run_id": None},  # the latest run on the topic
    ],
)
def test_switch_request_accepts(change) -> None:
    request = SwitchRequest(**{**GOOD_REQUEST, **change})
    assert (request.strategy, request.partitions) == (change.get("strategy", "least_count"), change.get("partitions", 8))


def test_switch_request_by_hand_needs_only_the_strategy_and_a_reason() -> None:
    request = SwitchRequest(strategy="least_count", reason="by hand")
    assert (request.topic, request.run_id, request.strategy_from, request.partitions, request.trigger) == ("flights", None, None, None, "manual")
    assert SwitchRequest(strategy="hash", partitions=12, reason="more slots").partitions == 12  # what is in force is read later


# ---------------------------------------------------------------- what is in force


@pytest.mark.parametrize(
    "record, expected",
    [
        ({}, ("hash", None, "monitor params")),  # no run recorded: the params stand
        ({"run_id": "r1", "state": "starting"}, ("hash", None, "monitor params")),  # a record without placement yet
        ({"run_id": "r1", "strategy": "hash", "partitions": "8"}, ("hash", 8, "run record r1 (epoch ?, segment 0)")),
        # after a switch the driver rewrote the record: the new strategy and P are in force
        ({"run_id": "r1", "strategy": "least_count", "partitions": "12", "epoch": "3", "segment": "1"},
         ("least_count", 12, "run record r1 (epoch 3, segment 1)")),
    ],
)
def test_placement_in_force_comes_from_the_run_record(record, expected) -> None:
    from keyshift.orchestration.monitor import placement_in_force

    from keyshift.runs import RunRecord

    run_record = RunRecord.from_redis(record) if record else None
    params, source = placement_in_force(run_record, monitor_params({"strategy": "hash", "trigger": "threshold"}))
    assert (params.strategy, params.partitions, source) == expected
    assert params.trigger == "threshold"  # the other params are kept


def test_switch_conf_names_the_run_and_what_is_in_force() -> None:
    from keyshift.orchestration.monitor import switch_conf

    record = {"at": "2026-01-01T00:00:00+00:00", "job_run_id": "r1", "evaluation": {"partitions": 12},
              "decision": {"switch": True, "strategy": "hot_split", "reason": "threshold: 0.5 < 0.6", "expected_gain_s": 3, "trigger": "threshold"}}
    conf = switch_conf(record, monitor_params({"strategy": "least_count", "partitions": 12}), "m1")
    assert (conf["run_id"], conf["strategy_from"], conf["strategy"], conf["partitions_from"], conf["partitions"]) == ("r1", "least_count", "hot_split", 12, 12)
    assert SwitchRequest(**conf).monitor_run_id == "m1"
    with pytest.raises(ConfigurationError, match="stay"):
        switch_conf({**record, "decision": {"switch": False, "strategy": "hash"}}, monitor_params({}))


# ---------------------------------------------------------------- Parquet history read back


def test_history_records_rebuild_what_was_saved(tmp_path) -> None:
    evaluation = evaluate_sample({"A": 6, "B": 3, "C": 2, "D": 1}, 2, "hash", labels=["hash", "least_count"])
    decision = Decision(True, "least_count", "because", 12.5, "threshold")
    measured = [measured_loads("arrivals", [9, 3], "offsets"), measured_loads("processed", [7, 5], "run r")]
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    save_evaluation(tmp_path, evaluation, None, at=datetime(2026, 1, 1, tzinfo=timezone.utc))
    save_evaluation(tmp_path, evaluation, decision, at=at, context={"series": "t", "events_arrived": 12, "ranges": {"0": [0, 9]}}, measured=measured)
    older, newest = history_records(tmp_path, last=5)
    assert older["decision"] is None and older["measured"] == {}
    assert newest["at"] == at.isoformat() and newest["series"] == "t" and newest["events_arrived"] == 12
    assert "ranges" not in newest  # not a scalar: only in latest.json and Redis
    assert newest["decision"] == {"switch": True, "strategy": "least_count", "reason": "because", "expected_gain_s": 12.5, "trigger": "threshold"}
    assert newest["evaluation"]["results"][1]["loads"] == list(evaluation.of("least_count").loads)
    assert newest["measured"]["arrivals"]["loads"] == [9, 3] and newest["measured"]["processed"]["balance_degree"] == pytest.approx(5 / 7)
    with pytest.raises(ConfigurationError, match="keyshift balance evaluate"):
        history_records(tmp_path / "none")
