"""Event-time disorder by whole sources (`keyshift.data.disorder`) and the replay's arrival order.

Paper 000 Table 10 measures watermarks at 25 %, 50 % and 75 % of events out of order; the
planner must hit those fractions on the real flights and on synthetic sensors, keep every
source's own order, and be a pure function of its inputs and seed. The replayer's worker path is
driven here through a fake producer (no broker): it must send each partition's records in the
plan's arrival order with the written (skewed) times, and send the file order unchanged at 0.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import keyshift.data.replay as replay_module
from keyshift.cli.replay import command as replay_command
from keyshift.cli.replay import describe_disorder
from keyshift.data.disorder import (
    DEFAULT_SOURCE_DELAY_S,
    PAPER_FRACTIONS,
    DisorderPlan,
    arrival_order,
    encode_sources,
    out_of_order_fraction,
    out_of_order_mask,
    plan_disorder,
    source_draws,
    stamped_times,
    validate_disorder,
)
from keyshift.data.flights import flights_path
from keyshift.data.replay import (
    _Job,
    _produce,
    disorder_record,
    encode_values,
    event_slots,
    event_time_ms,
    iter_flight_batches,
    read_replay_record,
    replay_flights,
)
from keyshift.errors import ConfigurationError, DataError
from keyshift.placement.strategies import HashStrategy
from keyshift.settings import Settings

MINUTE_MS = 60_000


# ---------------------------------------------------------------------------------------------
# the out-of-order measure


@pytest.mark.parametrize(
    ("times", "expected"),
    [
        ([], []),  # empty: nothing is out of order
        ([5], [False]),  # the first arrival never is
        ([1, 1, 2, 2, 3], [False] * 5),  # in order, ties included: ties are in order
        ([3, 1, 2], [False, True, True]),  # both follow the 3
        ([1, 3, 2, 3], [False, False, True, False]),  # 3 after 3 is a tie, not out of order
        ([5, 5, 4, 5, 6, 4], [False, False, True, False, False, True]),  # against the running max
        ([2, 1, 0], [False, True, True]),  # reversed: all but the first
    ],
)
def test_out_of_order_mask(times: list[int], expected: list[bool]) -> None:
    mask = out_of_order_mask(np.array(times, dtype=np.int64))
    assert mask.dtype == bool and mask.tolist() == expected
    assert out_of_order_fraction(np.array(times, dtype=np.int64)) == (sum(expected) / len(times) if times else 0.0)


@pytest.mark.parametrize(
    "times",
    [
        np.array([[1, 2], [3, 4]]),  # 2-D
        np.array([1.0, 2.0]),  # floats are not ms
    ],
)
def test_out_of_order_refuses_non_integer_or_nd(times: np.ndarray) -> None:
    with pytest.raises(DataError):
        out_of_order_mask(times)


# ---------------------------------------------------------------------------------------------
# the pieces: draws, arrival order, written times


def test_draws_lie_in_their_ranges_and_depend_on_seed_and_name_only() -> None:
    names = [f"S{i:03d}" for i in range(300)]
    priority, delay, offset = source_draws(names, 600, 120, seed=5)
    assert priority.dtype == np.float64 and delay.dtype == offset.dtype == np.int64
    assert ((priority >= 0) & (priority < 1)).all()
    assert delay.min() >= 300_000 and delay.max() <= 600_000  # [D/2, D] ms
    assert offset.min() >= -120_000 and offset.max() <= 120_000  # [-K, K] ms
    assert len(set(delay.tolist())) > 250  # a spread, not one value
    # the same name keeps its draws in another order and beside other names
    subset = names[::-1][:50] + ["NEW"]
    again = source_draws(subset, 600, 120, seed=5)
    position = {n: i for i, n in enumerate(names)}
    for i, name in enumerate(subset[:-1]):
        j = position[name]
        assert (again[0][i], again[1][i], again[2][i]) == (priority[j], delay[j], offset[j])
    other = source_draws(names, 600, 120, seed=6)
    assert not np.array_equal(other[1], delay)


@pytest.mark.parametrize(
    ("delay_s", "skew_s", "low_ms", "high_ms", "skew_ms"),
    [
        (0.001, 0.0, 1, 1, 0),  # the smallest delay: 1 ms, whole
        (0.003, 0.001, 2, 3, 1),  # odd ms: [ceil(3/2), 3]
        (600, 300, 300_000, 600_000, 300_000),  # skew at its bound D/2
    ],
)
def test_draws_at_the_edges(delay_s: float, skew_s: float, low_ms: int, high_ms: int, skew_ms: int) -> None:
    _, delay, offset = source_draws([f"S{i}" for i in range(200)], delay_s, skew_s, seed=1)
    assert low_ms <= delay.min() and delay.max() <= high_ms
    assert -skew_ms <= offset.min() and offset.max() <= skew_ms
    assert (delay - offset >= 0).all()  # a late source never runs ahead of the on-time stream


def test_arrival_order_by_true_time_plus_delay_ties_in_input_order() -> None:
    # positions:       0   1   2   3   4   5
    times = np.array([0, 0, 10, 20, 30, 40], dtype=np.int64)
    codes = np.array([0, 1, 0, 1, 0, 1])
    # source 1 is 15 ms late: arrivals 0:0 1:15 2:10 3:35 4:30 5:55
    order = arrival_order(times, codes, np.array([0, 15], dtype=np.int64))
    assert order.dtype == np.int64 and order.tolist() == [0, 2, 1, 4, 3, 5]
    # a late arrival (position 0: 0 + 10) ties an on-time one (position 2: 10): input order first
    tie = arrival_order(np.array([0, 0, 10, 20]), np.array([1, 0, 0, 0]), np.array([0, 10], dtype=np.int64))
    assert tie.tolist() == [1, 0, 2, 3]
    assert arrival_order(times, codes, np.zeros(2, dtype=np.int64)).tolist() == list(range(6))


def test_written_times_carry_the_clock_offset() -> None:
    times = np.array([100, 200, 300], dtype=np.int64)
    written = stamped_times(times, np.array([0, 1, 0]), np.array([0, -50], dtype=np.int64))
    assert written.tolist() == [100, 150, 300]
    assert times.tolist() == [100, 200, 300]  # the input is not touched


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: arrival_order(np.array([2, 1]), np.array([0, 0]), np.array([0])), "non-decreasing"),
        (lambda: arrival_order(np.array([1, 2]), np.array([0, 0]), np.array([-1])), "delays must be >= 0"),
        (lambda: arrival_order(np.array([1, 2]), np.array([0, 1]), np.array([5])), r"in 0\.\.0"),
        (lambda: arrival_order(np.array([1, 2]), np.array([0]), np.array([5])), "1-D array of 2 codes"),
        (lambda: arrival_order(np.array([1, 2]), np.array([0.0, 0.0]), np.array([5])), "integer indices"),
        (lambda: stamped_times(np.array([1.5]), np.array([0]), np.array([5])), "integer milliseconds"),
    ],
)
def test_pieces_refuse_bad_arrays(call, message: str) -> None:
    with pytest.raises(DataError, match=message):
        call()


def test_sources_are_factorized_from_arrow_or_python() -> None:
    codes, names = encode_sources(pa.chunked_array([["ORD", "ATL"], ["ORD"]], pa.large_string()))
    assert (codes.tolist(), names) == ([0, 1, 0], ["ORD", "ATL"])
    assert encode_sources(["b", "a", "b"])[0].tolist() == [0, 1, 0]
    assert encode_sources(pa.chunked_array([], pa.string()))[0].size == 0
    with pytest.raises(DataError, match="1 events have no source id"):
        encode_sources(pa.array(["a", None]))


# ---------------------------------------------------------------------------------------------
# the planner on synthetic sensors


def sensors(count: int = 200, seconds: int = 6 * 3600, seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """`count` sensors with skewed rates, each reading at whole seconds, merged in time order."""
    rng = np.random.default_rng(seed)
    rates = rng.pareto(1.5, count) + 0.05  # readings per second, a few sensors far busier
    rates = rates / rates.sum() * 20  # about 20 readings per second in all
    times, codes = [], []
    for sensor, rate in enumerate(rates):
        n = rng.poisson(rate * seconds)
        times.append(np.sort(rng.integers(0, seconds, n)) * 1000)
        codes.append(np.full(n, sensor))
    times, codes = np.concatenate(times), np.concatenate(codes)
    order = np.argsort(times, kind="stable")
    return times[order].astype(np.int64), codes[order], [f"sensor-{i}" for i in range(count)]


@pytest.fixture(scope="module")
def synthetic() -> tuple[np.ndarray, np.ndarray, list[str]]:
    return sensors()


def assert_each_source_keeps_its_order(order: np.ndarray, written: np.ndarray, codes: np.ndarray) -> None:
    """Along the arrival order, each source's input positions and written times never go back."""
    arrived_codes = codes[order]
    by_source = np.argsort(arrived_codes, kind="stable")  # arrivals grouped by source, in arrival order
    same = arrived_codes[by_source][1:] == arrived_codes[by_source][:-1]
    positions, stamps = order[by_source], written[order][by_source]
    assert (positions[1:][same] > positions[:-1][same]).all()
    assert (stamps[1:][same] >= stamps[:-1][same]).all()


@pytest.mark.parametrize("fraction", PAPER_FRACTIONS)
@pytest.mark.parametrize("skew_s", [0.0, 30.0])
def test_plan_hits_the_fraction_on_synthetic_sensors(synthetic, fraction: float, skew_s: float) -> None:
    times, codes, names = synthetic
    plan = plan_disorder(times, codes, names, fraction, source_delay_s=60, clock_skew_s=skew_s, seed=11)
    assert abs(plan.out_of_order - fraction) < 0.01, plan.out_of_order
    order, written = plan.apply(times, codes, names)
    assert np.array_equal(np.sort(order), np.arange(times.size))  # a permutation: every event once
    assert_each_source_keeps_its_order(order, written, codes)
    # the reported fraction is the measure of what would be written, in arrival order
    assert plan.out_of_order_events == int(out_of_order_mask(written[order]).sum())
    assert plan.out_of_order == plan.out_of_order_events / times.size and plan.events == times.size
    # on-time sources are untouched; late ones are late by [D/2, D] with offsets in [-K, K]
    offsets = plan.offsets_for(names)[codes]
    assert np.array_equal(written - times, offsets)
    assert set(plan.delay_ms) == set(plan.offset_ms) and plan.late_sources == sorted(plan.delay_ms)
    assert all(30_000 <= d <= 60_000 for d in plan.delay_ms.values())
    assert all(abs(o) <= skew_s * 1000 for o in plan.offset_ms.values())
    if skew_s == 0:
        assert not any(plan.offset_ms.values()) and np.array_equal(written, times)


def test_plan_is_deterministic_and_the_seed_matters(synthetic) -> None:
    times, codes, names = synthetic
    first = plan_disorder(times, codes, names, 0.5, 60, 10, seed=3)
    again = plan_disorder(times.copy(), codes.copy(), list(names), 0.5, 60, 10, seed=3)
    assert first == again
    assert np.array_equal(first.apply(times, codes, names)[0], again.apply(times, codes, names)[0])
    other = plan_disorder(times, codes, names, 0.5, 60, 10, seed=4)
    assert other.delay_ms != first.delay_ms
    assert not np.array_equal(other.apply(times, codes, names)[0], first.apply(times, codes, names)[0])


def test_fraction_zero_is_the_input_order_exactly(synthetic) -> None:
    times, codes, names = synthetic
    plan = plan_disorder(times, codes, names, 0.0, seed=9)
    assert (plan.delay_ms, plan.offset_ms, plan.out_of_order, plan.out_of_order_events) == ({}, {}, 0.0, 0)
    order, written = plan.apply(times, codes, names)
    assert np.array_equal(order, np.arange(times.size)) and np.array_equal(written, times)


@pytest.mark.parametrize(
    ("times", "codes", "names", "late", "out_of_order_events"),
    [
        ([], [], [], 0, 0),  # no events: nothing to disorder
        # one source alone stays in its own order, late or not: the earlier plan (none late) wins
        ([0, 60_000, 120_000], [0, 0, 0], ["A"], 0, 0),
        # two sources a minute apart: the late one arrives after all of the other; its events at
        # 0 and 60,000 follow the 120,000, its last one ties it (in order): 2 of 6
        ([0, 0, 60_000, 60_000, 120_000, 120_000], [0, 1, 0, 1, 0, 1], ["A", "B"], 1, 2),
    ],
)
def test_plan_on_tiny_inputs(times, codes, names, late: int, out_of_order_events: int) -> None:
    plan = plan_disorder(np.array(times, dtype=np.int64), np.array(codes, dtype=np.int64), names, 0.5, 600)
    assert (len(plan.delay_ms), plan.out_of_order_events, plan.events) == (late, out_of_order_events, len(times))
    assert plan.out_of_order == (out_of_order_events / len(times) if times else 0.0)


@pytest.mark.parametrize(
    ("fraction", "delay", "skew", "seed", "message"),
    [
        (-0.1, 600, 0, 0, "disorder must be a fraction in"),  # negative
        (1.0, 600, 0, 0, "disorder must be a fraction in"),  # 1 is out: someone must be first
        (math.nan, 600, 0, 0, "disorder must be a fraction in"),
        (True, 600, 0, 0, "disorder must be a fraction in"),  # a bool is not a fraction
        ("0.5", 600, 0, 0, "disorder must be a fraction in"),
        (0.5, 0, 0, 0, "source delay must be in"),  # zero delay would make nobody late
        (0.5, 0.0004, 0, 0, "source delay must be in"),  # below 1 ms
        (0.5, math.inf, 0, 0, "source delay must be in"),
        (0.5, 600, -1, 0, "clock skew must be in"),
        (0.5, 600, math.nan, 0, "clock skew must be in"),
        (0.5, 600, 300.001, 0, "exceeds half the source delay"),  # a clock could run ahead
        (0.0, 600, 10, 0, "applies to late sources only"),  # skew without any late source
        (0.5, 600, 0, -1, "seed must be an int >= 0"),
        (0.5, 600, 0, 1.5, "seed must be an int >= 0"),
        (0.5, 600, 0, True, "seed must be an int >= 0"),
    ],
)
def test_bad_settings_are_refused(fraction, delay, skew, seed, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        validate_disorder(fraction, delay, skew, seed)
    with pytest.raises(ConfigurationError, match=message):
        plan_disorder(np.arange(3, dtype=np.int64), np.zeros(3, dtype=np.int64), ["A"], fraction, delay, skew, seed)


def test_plan_refuses_times_out_of_order() -> None:
    with pytest.raises(DataError, match="position 2"):
        plan_disorder(np.array([0, 5, 4]), np.array([0, 1, 0]), ["A", "B"], 0.5)


def test_plan_travels_as_json() -> None:
    plan = DisorderPlan(0.5, 600.0, 30.0, 7, {"ORD": 400_000}, {"ORD": -12_000}, 10, 5, 0.5)
    assert DisorderPlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan


# ---------------------------------------------------------------------------------------------
# the planner on the real flights (paper 000 Table 10's fractions)

REAL_EVENTS = 300_000


@pytest.fixture(scope="module")
def real_flights() -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The first 300,000 flights (about 18 days): true event times, origin codes, origins."""
    try:
        path = flights_path(Settings())
    except DataError as exc:
        pytest.skip(str(exc))
    table = pa.Table.from_batches([batch for _, batch in iter_flight_batches(path, limit=REAL_EVENTS)])
    assert table.num_rows == REAL_EVENTS
    codes, names = encode_sources(table.column("origin"))
    return event_time_ms(table.column("date")), codes, names


@pytest.mark.parametrize("fraction", PAPER_FRACTIONS)
@pytest.mark.parametrize(("delay_s", "skew_s"), [(DEFAULT_SOURCE_DELAY_S, 0.0), (1800.0, 600.0)])
def test_plan_hits_the_paper_fractions_on_the_real_flights(real_flights, fraction, delay_s, skew_s) -> None:
    times, codes, names = real_flights
    plan = plan_disorder(times, codes, names, fraction, delay_s, skew_s, seed=0)
    assert abs(plan.out_of_order - fraction) < 0.005, plan.out_of_order
    order, written = plan.apply(times, codes, names)
    assert_each_source_keeps_its_order(order, written, codes)
    assert out_of_order_fraction(written[order]) == plan.out_of_order
    assert plan_disorder(times, codes, names, fraction, delay_s, skew_s, seed=0) == plan  # deterministic
    assert plan_disorder(times, codes, names, fraction, delay_s, skew_s, seed=1).delay_ms != plan.delay_ms


# ---------------------------------------------------------------------------------------------
# the replayer: values, worker path (fake producer), record, CLI


def test_values_can_carry_written_times() -> None:
    table = pa.table(
        {
            "date": pa.array([datetime(2001, 1, 1, 0, 1)] * 2, pa.timestamp("us")),
            "delay": [1, 2],
            "distance": [3, 4],
            "origin": ["ORD", "ATL"],
            "destination": ["ATL", "ORD"],
        }
    )
    values = encode_values(table, np.array([4, 9]), event_times=np.array([978_307_260_000 - 5_000, 7]))
    assert [json.loads(v)["event_time"] for v in values] == [978_307_255_000, 7]
    assert encode_values(table, np.array([4, 9])) == encode_values(table, np.array([4, 9]), None)
    with pytest.raises(DataError, match="1 event times for 2 rows"):
        encode_values(table, np.array([4, 9]), event_times=np.array([1]))


AIRPORTS = [f"A{i:02d}" for i in range(30)]


@pytest.fixture(scope="module")
def flights_file(tmp_path_factory) -> Path:
    """4,000 flights from 30 origins over about 33 hours, sorted by date, a few per minute."""
    rng = np.random.default_rng(8)
    minutes = np.sort(rng.integers(0, 2000, 4000))
    weights = rng.pareto(1.2, len(AIRPORTS)) + 0.1
    origins = rng.choice(AIRPORTS, 4000, p=weights / weights.sum())
    table = pa.table(
        {
            "date": pa.array([datetime(2001, 1, 1) + timedelta(minutes=int(m)) for m in minutes], pa.timestamp("us")),
            "delay": pa.array(rng.integers(-20, 120, 4000), pa.int64()),
            "distance": pa.array(rng.integers(50, 2500, 4000), pa.int64()),
            "origin": pa.array(origins.tolist(), pa.large_string()),
            "destination": pa.array(rng.choice(AIRPORTS, 4000).tolist(), pa.large_string()),
        }
    )
    path = tmp_path_factory.mktemp("flights") / "flights.parquet"
    pq.write_table(table, path, row_group_size=700)
    return path


class FakeProducer:
    """Stands in for kafka-python's KafkaProducer: records every send, in order."""

    sent: list[tuple[str, bytes, bytes, int]] = []

    def __init__(self, **config) -> None:
        FakeProducer.sent = []

    def send(self, topic: str, value: bytes, key: bytes, partition: int) -> None:
        FakeProducer.sent.append((topic, key, value, partition))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def produce(monkeypatch, path: Path, plan: DisorderPlan | None, mine=tuple(range(8)), limit=None, rate=None):
    """Run the worker's `_produce` on `path` through `FakeProducer`; (sends, counts, slot_by_key)."""
    monkeypatch.setattr(replay_module, "KafkaProducer", FakeProducer)
    strategy = HashStrategy(partitions=8)
    job = _Job(
        kafka={}, path=str(path), topic="t", limit=limit, slot_by_key={a: strategy.slot_of(a) for a in AIRPORTS},
        partitions=8, mine=tuple(mine), rate=rate, disorder=None if plan is None else plan.to_json(),
    )
    job = _Job.from_json(job.to_json())  # as a worker process gets it
    counts = _produce(job, lambda n: None)
    return list(FakeProducer.sent), counts, job.slot_by_key


def file_events(path: Path, limit: int | None = None):
    table = pq.read_table(path)
    if limit is not None:
        table = table.slice(0, limit)
    codes, names = encode_sources(table.column("origin"))
    return table, event_time_ms(table.column("date")), codes, names


@pytest.mark.parametrize("limit", [None, 2500])
def test_worker_sends_each_partition_in_arrival_order_with_written_times(monkeypatch, flights_file, limit) -> None:
    table, times, codes, names = file_events(flights_file, limit)
    plan = plan_disorder(times, codes, names, 0.5, 1200, 300, seed=2)
    assert plan.delay_ms and abs(plan.out_of_order - 0.5) < 0.01
    order, written = plan.apply(times, codes, names)
    mine = (0, 2, 3, 5, 6)
    sends, counts, slot_by_key = produce(monkeypatch, flights_file, plan, mine=mine, limit=limit)
    slots = event_slots(names, codes, np.arange(times.size), slot_by_key, {})
    expected = [int(i) for i in order if slots[i] in mine]  # the arrival order, this worker's partitions
    got = [json.loads(value)["event_id"] for _, _, value, _ in sends]
    assert got == expected
    for (_, key, value, partition), event_id in zip(sends, expected):
        record = json.loads(value)
        assert key == names[codes[event_id]].encode() == record["origin"].encode()
        assert partition == slots[event_id]
        assert record["event_time"] == written[event_id] == times[event_id] + plan.offset_ms.get(record["origin"], 0)
    assert counts == {p: int((slots == p).sum()) for p in mine}


def test_worker_rate_paces_the_arrival_order(monkeypatch, flights_file) -> None:
    table, times, codes, names = file_events(flights_file, 600)
    plan = plan_disorder(times, codes, names, 0.5, 1200, seed=2)
    taken: list[int] = []
    monkeypatch.setattr(replay_module.TokenBucket, "take", lambda self, n: taken.append(n))
    sends, counts, _ = produce(monkeypatch, flights_file, plan, limit=600, rate=2000.0)
    assert sum(taken) == len(sends) == 600 and max(taken) == 100  # steps of rate / 20 events
    assert [json.loads(v)["event_id"] for *_, v, _ in sends] == plan.apply(times, codes, names)[0].tolist()


def test_worker_without_late_sources_sends_the_file_order_byte_for_byte(monkeypatch, flights_file) -> None:
    default, default_counts, _ = produce(monkeypatch, flights_file, None)
    table, times, codes, names = file_events(flights_file)
    empty = plan_disorder(times, codes, names, 0.0)
    same, same_counts, _ = produce(monkeypatch, flights_file, empty)
    assert same == default and same_counts == default_counts
    assert [json.loads(v)["event_id"] for *_, v, _ in default] == list(range(4000))


def test_replay_plans_on_the_replayed_flights_and_refuses_a_fraction_out_of_reach(flights_file) -> None:
    table, times, codes, names = file_events(flights_file, 3000)
    plan = replay_module._plan_disorder(flights_file, 3000, 0.25, 900.0, 60.0, 5)
    assert plan == plan_disorder(times, codes, names, 0.25, 900.0, 60.0, 5)
    assert abs(plan.out_of_order - 0.25) <= replay_module.DISORDER_TOLERANCE
    # delays under a minute never pass a whole-minute event time: nothing would be disordered
    unreachable = r"disorder 0.5 cannot be reached on these 4,000 flights: the best plan puts 0.0000 of them"
    with pytest.raises(ConfigurationError, match=unreachable + r" out of order .* raise --source-delay"):
        replay_module._plan_disorder(flights_file, None, 0.5, 50.0, 0.0, 0)


def test_disorder_record_round_trips_through_redis(monkeypatch) -> None:
    plan = DisorderPlan(
        0.25, 600.0, 60.0, 4, {"ORD": 400_000, "ATL": 333_333}, {"ORD": -1, "ATL": 59_000}, 100, 25, 0.25
    )

    class FakeRedis:
        def __init__(self, mapping: dict) -> None:
            self.raw = {k.encode(): str(v).encode() for k, v in mapping.items()}

        def hgetall(self, key):
            return self.raw

    for given, expected in [
        (plan, {"disorder": 0.25, "source_delay_s": 600.0, "clock_skew_s": 60.0, "seed": 4, "out_of_order": 0.25,
                "out_of_order_events": 25,
                "late_sources": {"ATL": {"delay_ms": 333_333, "offset_ms": 59_000},
                                 "ORD": {"delay_ms": 400_000, "offset_ms": -1}}}),
        (None, {"disorder": 0.0, "source_delay_s": None, "clock_skew_s": None, "seed": None, "out_of_order": 0.0,
                "out_of_order_events": 0, "late_sources": {}}),
    ]:
        fields = disorder_record(given)
        assert set(fields) == set(expected)  # every field, also without disorder (overwrites an older one)
        monkeypatch.setattr(replay_module, "_redis", lambda settings, f=fields: FakeRedis(f))
        record = read_replay_record(Settings(), "t")
        assert {k: record[k] for k in expected} == expected


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"disorder": 1.0}, "disorder must be a fraction in"),
        ({"disorder": 0.5, "source_delay": -1.0}, "source delay must be in"),
        ({"disorder": 0.5, "clock_skew": 400.0}, "exceeds half the source delay"),
        ({"clock_skew": 5.0}, "applies to late sources only"),
        ({"disorder": 0.5, "seed": -3}, "seed must be an int >= 0"),
    ],
)
def test_replay_refuses_bad_disorder_before_touching_anything(tmp_path: Path, options: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        replay_flights(Settings(home=tmp_path, kafka_port=1, redis_port=1), "flights", **options)


@pytest.mark.parametrize(
    ("argv", "exit_code", "says"),
    [
        (["--disorder", "1"], 2, "0<=x<1"),
        (["--disorder", "-0.25"], 2, "0<=x<1"),
        (["--disorder", "0.5", "--source-delay", "0"], 2, "0.001<=x"),
        (["--disorder", "0.5", "--clock-skew", "-1"], 2, "0<=x"),
        (["--disorder", "0.5", "--seed", "-1"], 2, "x>=0"),
        (["--disorder", "half"], 2, "is not a valid float"),
    ],
)
def test_cli_refuses_bad_disorder_options(argv: list[str], exit_code: int, says: str) -> None:
    result = CliRunner().invoke(replay_command, ["flights", *argv])
    assert result.exit_code == exit_code and says in result.output


def test_cli_checks_the_skew_against_the_delay_before_any_service(monkeypatch) -> None:
    monkeypatch.setattr("keyshift.cli.replay.stack.require", lambda *a: pytest.fail("asked the stack"))
    result = CliRunner().invoke(replay_command, ["flights", "--disorder", "0.5", "--clock-skew", "301"])
    assert isinstance(result.exception, ConfigurationError) and "exceeds half the source delay" in str(result.exception)


def test_cli_line_names_the_achieved_fraction_and_the_late_origins() -> None:
    plan = DisorderPlan(0.5, 600.0, 60.0, 2, {"ORD": 400_000, "ATL": 300_500}, {"ORD": -59_000, "ATL": 12_000},
                        3_000_000, 1_499_918, 0.49997266)
    assert describe_disorder(plan) == (
        "  disorder 0.5 (seed 2): 50.00% of events out of order (1,499,918 of 3,000,000); 2 late origin(s), "
        "delays 300..400 s, clock offsets -59..+12 s"
    )
    assert describe_disorder(DisorderPlan(0.5, 600.0, 0.0, 0, events=1)).endswith("0 late origin(s)")
