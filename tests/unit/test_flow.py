"""When to rescale (paper 001): max flow and min cut on graphs with known answers, the bottleneck
rule of eq. 10, the capacity feedback of eq. 13-17 on a stage of fixed true capacity, and the
recommendation on a synthetic job whose lag grows, holds or whose load falls away.

Paper 001 gives no numeric flow network (its figures are drawings), so the known answer is the
textbook network of Cormen et al. (Introduction to Algorithms, Figure 26.1): maximum flow 23.
"""

from __future__ import annotations

import math

import pytest

from keyshift.errors import ConfigurationError
from keyshift.monitoring.flow import (
    JOB_EDGES, bottlenecks, cut_capacity, cut_flow, feedback_step, lag_trend, max_flow, measure, min_cut, recommend_parallelism,
)

# ---------------------------------------------------------------- max flow, min cut (eq. 1-6)

CLRS = {  # with the antiparallel pair v1 <-> v2 of the first editions (residuals of eq. 2 add up)
    ("s", "v1"): 16, ("s", "v2"): 13, ("v1", "v2"): 10, ("v2", "v1"): 4, ("v1", "v3"): 12, ("v3", "v2"): 9,
    ("v2", "v4"): 14, ("v4", "v3"): 7, ("v3", "t"): 20, ("v4", "t"): 4,
}


def test_max_flow_and_min_cut_of_the_textbook_network() -> None:
    value, flow = max_flow(CLRS, "s", "t")
    assert value == pytest.approx(23)
    x, y = min_cut(CLRS, flow, "s")
    assert x == {"s", "v1", "v2", "v4"} and y == {"v3", "t"}
    assert cut_capacity(CLRS, x) == pytest.approx(23) == cut_flow(flow, x)  # max flow = min cut (§3.2)
    assert all(0 <= flow[e] <= c + 1e-9 for e, c in CLRS.items())


@pytest.mark.parametrize(
    "capacity, sinks, expected",
    [
        ({("s", "a"): 5, ("a", "t"): 3}, "t", 3),  # a chain: its smallest edge
        ({("s", "a"): 10, ("a", "t1"): 4, ("a", "t2"): 5}, ["t1", "t2"], 9),  # several sinks t_i (Definition 1)
        ({("s", "a"): 5, ("b", "t"): 3}, "t", 0),  # no path
        ({("s", "a"): 0, ("a", "t"): 3}, "t", 0),  # a zero capacity
    ],
)
def test_max_flow_small_graphs(capacity, sinks, expected) -> None:
    assert max_flow(capacity, "s", sinks)[0] == pytest.approx(expected)


def test_max_flow_from_a_measured_flow_reaches_the_same_value() -> None:
    chain = {("source", "parse"): 400.0, ("parse", "stateful"): 100.0, ("stateful", "sink"): 300.0}
    value, flow = max_flow(chain, "source", "sink", initial=dict.fromkeys(chain, 60.0))  # Algorithm 2 starts from f
    assert value == pytest.approx(100.0) and list(flow.values()) == pytest.approx([100.0] * 3)


@pytest.mark.parametrize(
    "capacity, initial",
    [
        ({("s", "t"): -1.0}, None),  # negative capacity
        ({("s", "t"): math.inf}, None),  # unbounded
        ({("s", "a"): 5.0, ("a", "t"): 5.0}, {("s", "a"): 6.0, ("a", "t"): 6.0}),  # f > c
        ({("s", "a"): 5.0, ("a", "t"): 5.0}, {("s", "a"): 4.0, ("a", "t"): 2.0}),  # not conserved at a
    ],
)
def test_max_flow_refuses_bad_input(capacity, initial) -> None:
    with pytest.raises(ConfigurationError):
        max_flow(capacity, "s", "t", initial)


def test_max_flow_refuses_the_source_as_sink() -> None:
    with pytest.raises(ConfigurationError, match="exclude the source"):
        max_flow({("s", "t"): 1.0}, "s", ["s"])


# ---------------------------------------------------------------- bottleneck rule (eq. 10, Algorithm 2)


def _chain(parse: float, stateful: float, sink: float) -> dict:
    return dict(zip(JOB_EDGES, (parse, stateful, sink)))


@pytest.mark.parametrize(
    "capacities, expected",
    [
        ((400.0, 100.0, 400.0), {"stateful"}),  # one stage far below the others
        ((110.0, 100.0, 400.0), {"parse", "stateful"}),  # parse within 1/0.85 of the max flow too
        ((400.0, 400.0, 100.0), {"sink"}),
    ],
)
def test_bottlenecks_are_the_heads_of_partitions_at_lambda(capacities, expected) -> None:
    capacity = _chain(*capacities)
    _, flow = max_flow(capacity, "source", "sink")
    assert bottlenecks(capacity, flow, "source", ["sink"]) == expected


def test_bottlenecks_on_a_light_flow_find_none_and_lambda_is_bounded() -> None:
    capacity = _chain(400.0, 100.0, 400.0)
    light = dict.fromkeys(capacity, 50.0)  # 50 % of the stateful stage: below λ = 0.85
    assert bottlenecks(capacity, light, "source", ["sink"]) == set()
    assert bottlenecks(capacity, light, "source", ["sink"], lam=1.0) == set()
    for lam in (0.5, 1.2):
        with pytest.raises(ConfigurationError, match="0.85, 1"):
            bottlenecks(capacity, light, "source", ["sink"], lam=lam)


# ---------------------------------------------------------------- capacity feedback (eq. 13-17, Algorithm 1)


def test_feedback_starts_from_eq_14_and_refuses_a_zero_latency() -> None:
    assert feedback_step(None, 0.01, 0.0, False) == {"capacity": pytest.approx(100_000.0), "latency_ms": 0.01, "eta": None}
    with pytest.raises(ConfigurationError):
        feedback_step(None, 0.0, 0.0, False)


def test_feedback_converges_on_a_fast_stage_from_ten_times_its_capacity() -> None:
    true_c = 50_000.0  # events/s; the start is 10x, like the paper's bandwidth estimate (eq. 8-9)
    edge: dict = {"capacity": 10 * true_c}
    noise = [0.04, -0.03, 0.02, -0.05, 0.01, 0.03, -0.02, 0.0, 0.04, -0.01]
    for step in noise:
        edge = feedback_step(edge, 1000 / true_c * (1 + step), 40_000.0, saturated=True)
    assert edge["capacity"] == pytest.approx(true_c, rel=0.06)


def test_feedback_on_a_slow_stage_is_damped_by_the_derivative() -> None:
    # c = 600 events/s in force, true 200: reg = 400 (eq. 16), |c'| = 1000 / (1000/600)^2 = 360 (eq. 15) -> eta = 360
    first = feedback_step({"capacity": 600.0}, 5.0, 150.0, saturated=True)
    assert first["eta"] == pytest.approx(360.0) and first["capacity"] == pytest.approx(240.0)
    second = feedback_step(first, 5.0, 150.0, saturated=True)  # reg 40 < |c'| 57.6
    assert second["eta"] == pytest.approx(40.0) and second["capacity"] == pytest.approx(200.0)
    assert feedback_step(second, 5.0, 150.0, saturated=True)["eta"] == pytest.approx(0.0)  # eta falls to 0 at the truth


def test_feedback_raises_a_low_capacity_only_when_the_job_is_saturated() -> None:
    low = {"capacity": 25_000.0}  # true 50,000
    assert feedback_step(low, 0.02, 20_000.0, saturated=False)["capacity"] == 25_000.0  # "f ≈ c" does not hold
    assert feedback_step(low, 0.02, 24_000.0, saturated=True)["capacity"] == pytest.approx(50_000.0)


# ---------------------------------------------------------------- lag trend


@pytest.mark.parametrize(
    "history, slope, growing",
    [
        ([(0, 0), (600, 10_000), (1200, 30_000)], 25.0, True),
        ([(0, 30_000), (600, 20_000), (1200, 0)], -25.0, False),
        ([(0, 10_000), (600, 9_000), (1200, 10_600)], 0.5, False),  # saw-tooth: not every step rises
        ([(0, 10), (600, 20)], None, False),  # fewer than k = 3
    ],
)
def test_lag_trend(history, slope, growing) -> None:
    got, grows = lag_trend(history)
    assert (got is None if slope is None else got == pytest.approx(slope)) and grows is growing
    with pytest.raises(ConfigurationError, match=">= 3"):
        lag_trend(history, k=2)


# ---------------------------------------------------------------- measuring and recommending on a synthetic job

P, CORES = 4, 4
PARSE_S, STATEFUL_S, REST_S = 1e-5, 4e-5, 2.5e-6  # task seconds per event; the rest of a batch, seconds per event


def _batches(first: int, count: int, rows: int, gap_ms: int = 0, start_ms: int = 1_000_000, partitions: int = P,
             parse_s: float = PARSE_S, stateful_s: float = STATEFUL_S) -> list[dict]:
    """Progress records of a job with P even slots on CORES cores: c_parse = 400,000, c_stateful = 100,000, c_sink = 400,000 events/s."""
    records, at = [], start_ms
    for batch in range(first, first + count):
        per_slot = rows // partitions
        walls = rows * (parse_s + stateful_s) / min(partitions, CORES)
        duration = round(1000 * (walls + rows * REST_S))
        records.append({
            "run_id": "r1", "batch_id": batch, "input_rows": rows, "processed_rows_per_slot": [per_slot] * partitions, "timestamp_ms": at,
            "batch_duration_ms": duration, "stage_seconds": {"source": [per_slot * parse_s] * partitions, "stateful": [per_slot * stateful_s] * partitions},
        })
        at += duration + gap_ms
    return records


def test_measure_maps_progress_to_flow_and_eq_13_latency() -> None:
    window = measure(_batches(0, 5, 100_000), None, CORES)
    assert window.batches == 5 and window.timed == 4  # batch 0 starts Python workers: not timed
    assert window.flow == pytest.approx(100_000 / 1.5) and window.busy_share == pytest.approx(1.0)
    assert window.latency_ms == {"parse": pytest.approx(0.0025), "stateful": pytest.approx(0.01), "sink": pytest.approx(0.0025)}
    from_file = measure([{k: v for k, v in r.items() if k != "stage_seconds"} for r in _batches(0, 3, 100_000)],
                        {"source": {"1": [0.25] * 4, "2": [0.25] * 4}, "stateful": {"1": [1.0] * 4, "2": [1.0] * 4}}, CORES)
    assert from_file.timed == 2 and from_file.latency_ms["stateful"] == pytest.approx(0.01)  # task_seconds.json
    assert measure(_batches(0, 3, 100_000), None, CORES, after=2) is None


def test_a_growing_lag_with_the_stateful_bottleneck_asks_for_more_slots() -> None:
    rec = recommend_parallelism(_batches(0, 10, 100_000), [(0, 0), (600, 10_000), (1200, 30_000)], None, cores=CORES, slots_per_core=4)
    assert rec.capacities == {"parse": pytest.approx(400_000), "stateful": pytest.approx(100_000), "sink": pytest.approx(400_000)}
    assert rec.bottleneck == "stateful" and rec.max_flow == pytest.approx(100_000) and rec.lag_trend == pytest.approx(25.0)
    # a = 66,667 + 25 events/s; busy share at P' = a (4/P' x 1.25e-5 + 2.5e-6) <= 0.85 -> P' = ceil(4 x 0.8337 / 0.6833) = 5
    assert (rec.current, rec.recommended) == (4, 5) and "stateful" in rec.why
    assert rec.state["last_batch_id"] == 9 and set(rec.state["edges"]) == {"parse", "stateful", "sink"}
    record = rec.as_record()
    assert "state" not in record and record["utilisation"]["stateful"] == pytest.approx(0.667, abs=1e-3)


def test_growth_is_capped_at_cores_times_the_factor() -> None:
    rec = recommend_parallelism(_batches(0, 10, 100_000), [(0, 0), (600, 10_000), (1200, 30_000)], None, cores=CORES, slots_per_core=1)
    assert rec.recommended == 4 and "4 cores × 1" in rec.why
    fast = recommend_parallelism(_batches(0, 10, 100_000), [(0, 0), (600, 14_000_000), (1200, 28_000_000)], None, cores=CORES, slots_per_core=1.5)
    assert fast.recommended == 6 and "capped" in fast.why  # a = 90,000 events/s wants 8; 6 = floor(4 x 1.5) is the most


def test_a_growing_lag_with_another_bottleneck_keeps_p() -> None:
    rec = recommend_parallelism(_batches(0, 10, 100_000, parse_s=4e-5, stateful_s=1e-5), [(0, 0), (600, 10_000), (1200, 30_000)], None,
                                cores=CORES, slots_per_core=4)
    assert rec.bottleneck == "parse" and rec.recommended == rec.current == 4 and "not the stateful stage" in rec.why


def test_a_stable_lag_keeps_p() -> None:
    rec = recommend_parallelism(_batches(0, 10, 100_000), [(0, 10_000), (600, 9_000), (1200, 10_600)], None, cores=CORES, slots_per_core=4)
    assert rec.recommended == rec.current == 4 and rec.why.startswith("stay")
    assert rec.state["low_streak"] == 0  # 67 % busy is not low


def test_a_load_that_falls_away_for_k_evaluations_asks_for_fewer_slots() -> None:
    """20,000 events every 10 s: the stateful stage is 2 % busy; after k = 3 low evaluations P falls to 1."""
    state, lag, batches = None, [], []
    for evaluation in range(3):
        batches += _batches(10 * evaluation, 10, 20_000, gap_ms=9_700, start_ms=1_000_000 + 100_000 * evaluation)
        lag.append((600.0 * evaluation, 100 - 10 * evaluation))
        rec = recommend_parallelism(batches, lag, state, cores=CORES, slots_per_core=4)
        state = rec.state
        if evaluation < 2:
            assert rec.recommended in (None, 4)  # fewer than k observations, then a streak too short
    assert rec.state["low_streak"] == 3
    assert rec.utilisation["stateful"] < 0.3
    assert (rec.current, rec.recommended) == (4, 1) and "P 4 → 1" in rec.why


def test_not_enough_data_says_why_and_keeps_learning() -> None:
    untimed = [{k: v for k, v in r.items() if k != "stage_seconds"} for r in _batches(0, 5, 100_000)]
    rec = recommend_parallelism(untimed, [(0, 0), (600, 1), (1200, 2)], None, cores=CORES, slots_per_core=4)
    assert rec.recommended is None and "task times" in rec.why
    short = recommend_parallelism(_batches(0, 5, 100_000), [(0, 0)], None, cores=CORES, slots_per_core=4)
    assert short.recommended is None and "1 of the 3 lag observations" in short.why
    assert short.capacities["stateful"] == pytest.approx(100_000) and short.state["last_batch_id"] == 4  # learned anyway
    again = recommend_parallelism(_batches(0, 5, 100_000), [(0, 0), (600, 0), (1200, 0)], short.state, cores=CORES, slots_per_core=4)
    assert again.recommended is None and "no batch completed" in again.why  # nothing after batch 4


def test_a_new_p_starts_the_feedback_state_afresh() -> None:
    first = recommend_parallelism(_batches(0, 5, 100_000), [], None, cores=CORES, slots_per_core=4)
    rescaled = _batches(0, 5, 100_000) + _batches(5, 5, 100_000, partitions=8, start_ms=2_000_000)
    second = recommend_parallelism(rescaled, [], first.state, cores=CORES, slots_per_core=4)
    assert second.current == 8 and second.state["partitions"] == 8 and second.state["last_batch_id"] == 9
    assert second.capacities["stateful"] == pytest.approx(100_000)  # 8 slots on 4 cores: the same 4 at a time


def test_recommend_refuses_bad_arguments() -> None:
    for kwargs in ({"cores": 0, "slots_per_core": 1}, {"cores": 2, "slots_per_core": 0}, {"cores": 2, "slots_per_core": 1, "lam": 0.5},
                   {"cores": 2, "slots_per_core": 1, "low_utilisation": 0.6}):
        with pytest.raises(ConfigurationError):
            recommend_parallelism([], [], None, **kwargs)


# ---------------------------------------------------------------- the line of `keyshift balance show`


def test_balance_show_prints_the_rescale_line() -> None:
    from keyshift.cli.balance import format_record

    base = {"at": "2026-01-01T00:00:00+00:00", "source": "kafka:flights"}
    rec = recommend_parallelism(_batches(0, 10, 100_000), [(0, 0), (600, 10_000), (1200, 30_000)], None, cores=CORES, slots_per_core=4)
    lines = format_record({**base, "rescale": {**rec.as_record(), "switch": "requested: P 4 -> 5"}})
    assert lines[-1].startswith("rescale: P 4 -> 5 (bottleneck stateful, lag +25.0 records/s, 66,667 events/s of max flow 100,000)")
    assert lines[-1].endswith("; requested: P 4 -> 5")
    assert format_record({**base, "rescale": None, "rescale_reason": "2 of the 3 lag observations needed"})[-1] == \
        "rescale: no recommendation: 2 of the 3 lag observations needed"
    assert not [line for line in format_record(base) if line.startswith("rescale")]  # records from before


# ---------------------------------------------------------------- the monitor's evaluation (Kafka and Redis faked)


class _NoRunRecords:
    """A Redis whose run records hold only a state: every run is running (evaluate_topic reads the
    record of its job run for what is in force, which the params then say, and switches live runs only)."""

    def hgetall(self, key: str) -> dict:
        return {"state": "running"}


class _Store:
    """ResultStore's surface that evaluate_topic uses, in memory."""

    def __init__(self) -> None:
        self.client, self.cursor_fields, self.records = _NoRunRecords(), {}, []

    def cursor(self) -> dict:
        return dict(self.cursor_fields)

    def last_switch(self):
        return None

    def save(self, record, *, cursor=None, switch=None) -> None:
        self.records.append(record)
        self.cursor_fields.update(cursor or {})


@pytest.fixture
def monitor(monkeypatch, tmp_path):
    """evaluate_topic on run r1 (4 slots) whose lag grows 10,000 records per 10-minute evaluation."""
    import json
    from types import SimpleNamespace

    from keyshift.monitoring import loads, results, stream
    from keyshift.orchestration import monitor as module
    from keyshift.settings import Settings

    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    store, lag = _Store(), {"total": 0}
    monkeypatch.setattr(results.ResultStore, "from_settings", classmethod(lambda cls, *a, **k: store))
    monkeypatch.setattr(loads, "job_counts", lambda *a: None)
    monkeypatch.setattr(loads, "job_offsets", lambda *a: {p: 0 for p in range(4)})

    def offsets(*args):  # each evaluation: 10 more batches back to back, 40,000 more records behind
        done = lag["total"] // 4_000
        with (run_dir / "progress.jsonl").open("a") as out:
            out.writelines(json.dumps(r) + "\n" for r in _batches(done, 10, 100_000, start_ms=1_000_000 + 1_500 * done))
        lag["total"] += 40_000
        return stream.TopicOffsets({p: 0 for p in range(4)}, {p: lag["total"] // 4 for p in range(4)})

    def sample(settings, topic, ranges, sampler):
        sampler.offer_batch([f"k{i % 7}" for i in range(200)])
        return SimpleNamespace(ranges=ranges, read=200, unkeyed=0)

    monkeypatch.setattr(stream, "read_offsets", offsets)
    monkeypatch.setattr(stream, "sample_topic", sample)
    settings = Settings(runs_dir=tmp_path / "runs", spark_master="local[4]")
    return SimpleNamespace(module=module, settings=settings, store=store)


def test_the_monitor_records_the_recommendation_and_asks_the_switch_for_it(monitor) -> None:
    from datetime import datetime, timedelta, timezone

    params = monitor.module.monitor_params({"topic": "flights", "run_id": "r1", "trigger": "threshold", "theta": 0.0, "sample_fraction": 1.0})
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    results = [monitor.module.evaluate_topic(monitor.settings, params, now=start + timedelta(minutes=10 * i)) for i in range(3)]
    first, third = results[0]["record"], results[2]["record"]
    assert first["rescale"] is None and first["rescale_reason"] == "1 of the 3 lag observations needed"
    assert results[0]["switch_conf"] is None and results[1]["record"]["rescale"] is None
    assert monitor.store.cursor_fields["flow_state"]["last_batch_id"] == 29  # three evaluations of 10 batches
    assert [p[1] for p in monitor.store.cursor_fields["lag_history"]["points"]] == [40_000, 80_000, 120_000]
    rescale = third["rescale"]
    assert (rescale["current"], rescale["recommended"], rescale["bottleneck"], rescale["cores"]) == (4, 5, "stateful", 4)
    assert rescale["lag_trend"] == pytest.approx(40_000 / 600)
    # the decision is to stay on hash: the change of P alone is asked of keyshift_switch, for run r1
    conf = results[2]["switch_conf"]
    assert rescale["switch"] == "requested: P 4 -> 5"
    assert (conf["strategy_from"], conf["strategy"], conf["partitions_from"], conf["partitions"], conf["run_id"]) == ("hash", "hash", 4, 5, "r1")
    assert monitor.module.SwitchRequest(**conf).partitions == 5


def test_the_monitor_puts_the_recommended_p_into_a_strategy_switch(monitor) -> None:
    from datetime import datetime, timedelta, timezone

    params = monitor.module.monitor_params({"topic": "flights", "run_id": "r1", "trigger": "threshold", "theta": 1.0, "sample_fraction": 1.0,
                                            "candidates": ["hash", "least_count"]})
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    result = [monitor.module.evaluate_topic(monitor.settings, params, now=start + timedelta(minutes=10 * i)) for i in range(3)][-1]
    assert result["switch_conf"]["strategy"] == "least_count" and result["switch_conf"]["partitions"] == 5
    assert result["record"]["rescale"]["switch"] == "requested: P 4 -> 5 with the switch to least_count"
