"""Dynamic watermark bound from local event-time disorder (paper 004)."""

import math

import numpy as np
import pytest

from keyshift.eventtime.disorder import (
    DynamicBound,
    disorder_degree,
    dynamic_bound_ms,
    max_lateness_ms,
    performance_ratio,
)

T0 = 978_307_200_000  # 2001-01-01T00:00:00Z
SECOND = 1_000
M = 60 * SECOND


def ordered(n, start=T0, step=SECOND):
    return start + step * np.arange(n, dtype=np.int64)


def reference_bound(times, max_bound, min_bound=0):
    """The docstring's formula, one pair and one event at a time."""
    times = [int(t) for t in times]
    n = len(times)
    inversions = sum(times[i] > times[j] for i in range(n) for j in range(i + 1, n))
    pairs = n * (n - 1) // 2
    if inversions == 0:
        return min_bound, 0.0
    lateness, running_max = 0, times[0]
    for t in times:
        running_max = max(running_max, t)
        lateness = max(lateness, running_max - t)
    follows_p = min_bound + math.ceil((max_bound - min_bound) * inversions / pairs)
    return min(max_bound, max(follows_p, lateness)), inversions / pairs


def test_in_order_is_degree_zero_and_min_bound():
    times = ordered(32)
    assert disorder_degree(times) == 0.0
    assert max_lateness_ms(times) == 0
    assert dynamic_bound_ms(times, M, 500) == 500
    assert dynamic_bound_ms(times, M) == 0
    ties = np.array([T0, T0, T0 + 1, T0 + 1], dtype=np.int64)  # equal times are in order
    assert disorder_degree(ties) == 0.0
    assert dynamic_bound_ms(ties, M, 7) == 7


@pytest.mark.parametrize("times", [[], [T0]])
def test_fewer_than_two_times_is_in_order(times):
    assert disorder_degree(np.array(times, dtype=np.int64)) == 0.0
    assert dynamic_bound_ms(np.array(times, dtype=np.int64), M, 3) == 3


def test_hand_computed_examples():
    assert disorder_degree(np.array([0, 2, 1, 3])) == pytest.approx(1 / 6)
    assert disorder_degree(np.array([3, 2, 1, 0])) == 1.0
    # [10, 30, 20, 5]: inversions (10,5) (30,20) (30,5) (20,5) = 4 of 6; lags 0, 0, 10, 25
    times = np.array([10, 30, 20, 5])
    assert disorder_degree(times) == pytest.approx(4 / 6)
    assert max_lateness_ms(times) == 25
    assert dynamic_bound_ms(times, 100) == 67  # ceil(100 * 4/6) = 67 > D = 25
    assert dynamic_bound_ms(times, 30) == 25  # ceil(30 * 4/6) = 20 < D = 25
    assert dynamic_bound_ms(times, 20) == 20  # D = 25 capped at M = 20
    assert dynamic_bound_ms(times, 100, 40) == 80  # 40 + ceil(60 * 4/6)


def test_reversed_cluster_waits_the_maximum():
    assert dynamic_bound_ms(ordered(32)[::-1], M, 1_000) == M


def test_bound_grows_with_the_magnitude_of_a_late_event():
    bounds, degrees = [], []
    for delay in [0, 1, 500, SECOND, 3 * SECOND, 10 * SECOND, 25 * SECOND, 10 * M]:
        times = ordered(32)
        times[20] -= delay  # one event `delay` ms behind its place
        bounds.append(dynamic_bound_ms(times, M, 200))
        degrees.append(disorder_degree(times))
    assert bounds[0] == 200
    assert bounds == sorted(bounds) and degrees == sorted(degrees)
    assert bounds[4] < bounds[5] < bounds[6] < bounds[7] == M
    # lateness is behind the running max (the event before it, 1 s earlier): 10 s late -> 9 s
    assert bounds[4:7] == [2 * SECOND, 9 * SECOND, 24 * SECOND]


def test_more_late_events_give_a_longer_wait():
    bounds = []
    for late in range(0, 17):
        times = ordered(32)
        times[range(1, 2 * late, 2)] -= 2 * SECOND  # `late` events, each 1 s behind the one before
        bounds.append(dynamic_bound_ms(times, M))
    assert bounds[0] == 0
    assert bounds == sorted(bounds)
    # the lateness seen (1 s) holds the wait until the disorder degree asks for more:
    # late / 496 inversions of 60 s > 1 s from 9 late events on
    assert bounds[1:9] == [SECOND] * 8
    assert bounds[9:] == [math.ceil(M * late / 496) for late in range(9, 17)]


def test_burst_raises_the_bound_and_k_ordered_events_relax_it():
    state = DynamicBound(k=32, max_bound_ms=M, min_bound_ms=250)
    recent, bound = state.update(np.empty(0, dtype=np.int64), ordered(100))
    assert bound == 250
    burst = ordered(10, start=int(recent[-1]) + SECOND)
    burst = burst[np.array([0, 5, 1, 6, 2, 7, 3, 8, 4, 9])]  # 10 inversions, up to 4 s late
    recent, bound = state.update(recent, burst)
    assert bound == 4 * SECOND  # the lateness seen; the degree asks 250 + ceil(59,750 * 10/496)
    worse = burst[np.array([9, 8, 7, 6, 5, 4, 3, 2, 1, 0])]  # 45 inversions, up to 9 s late
    assert state.update(recent[:-10], worse)[1] == 9 * SECOND
    after = []
    for t in ordered(32, start=int(burst.max()) + SECOND):
        recent, bound = state.update(recent, np.array([t]))
        after.append(bound)
    assert after == sorted(after, reverse=True)  # relaxes as the burst leaves the cluster
    # ordered once only burst[-2:] = (4, 9) is left: after 30 ordered events, at the latest after k
    assert after[28] > 250 and after[29:] == [250, 250, 250]


def test_bound_stays_within_min_and_max():
    rng = np.random.default_rng(4)
    for _ in range(300):
        n = int(rng.integers(0, 40))
        times = T0 + rng.integers(-10 * M, 10 * M, size=n)
        low = int(rng.integers(0, M))
        high = low + int(rng.integers(0, M))
        bound = dynamic_bound_ms(times, high, low)
        assert low <= bound <= high
        assert 0.0 <= disorder_degree(times) <= 1.0


def test_vectorized_functions_match_the_definition():
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(0, 33))
        times = ordered(n) - rng.integers(0, 5 * SECOND, size=n) * (rng.random(n) < 0.3)
        expected_bound, expected_degree = reference_bound(times, M, 100)
        assert dynamic_bound_ms(times, M, 100) == expected_bound
        assert disorder_degree(times) == pytest.approx(expected_degree)


def test_update_on_an_array_equals_event_by_event():
    rng = np.random.default_rng(11)
    state = DynamicBound(k=16, max_bound_ms=M, min_bound_ms=10)
    times = ordered(1_000) - rng.integers(0, 8 * SECOND, size=1_000) * (rng.random(1_000) < 0.2)
    start = times[:5]
    whole, whole_bound = state.update(start, times)
    one_by_one, bound = start, None
    for t in times:
        one_by_one, bound = state.update(one_by_one, np.array([t], dtype=np.int64))
    np.testing.assert_array_equal(whole, one_by_one)
    assert whole_bound == bound
    in_chunks = start
    for chunk in np.array_split(times, [3, 4, 50, 51, 700]):  # sizes 3, 1, 46, 1, 649, 300
        in_chunks, bound = state.update(in_chunks, chunk)
    np.testing.assert_array_equal(whole, in_chunks)
    assert whole_bound == bound
    np.testing.assert_array_equal(whole, times[-16:])
    assert whole.dtype == np.int64
    assert whole_bound == reference_bound(times[-16:], M, 10)[0]


def test_update_keeps_the_last_k_in_arrival_order():
    state = DynamicBound(k=4, max_bound_ms=M)
    recent, _ = state.update(np.array([], dtype=np.int64), np.array([5, 3]))
    np.testing.assert_array_equal(recent, [5, 3])
    recent, _ = state.update(recent, np.array([9, 1]))
    np.testing.assert_array_equal(recent, [5, 3, 9, 1])
    recent, bound = state.update(recent, np.array([10]))
    np.testing.assert_array_equal(recent, [3, 9, 1, 10])
    assert bound == dynamic_bound_ms(np.array([3, 9, 1, 10]), M)


def test_update_with_no_events_is_a_no_op():
    state = DynamicBound(k=8, max_bound_ms=M, min_bound_ms=5)
    recent = np.array([T0 + 3, T0 + 1, T0 + 2], dtype=np.int64)
    same, bound = state.update(recent, np.empty(0, dtype=np.int64))
    np.testing.assert_array_equal(same, recent)
    assert bound == dynamic_bound_ms(recent, M, 5)
    empty, bound = state.update(np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))
    assert empty.size == 0 and bound == 5


def test_pack_unpack_round_trip():
    state = DynamicBound(max_bound_ms=M)
    recent = np.array([T0, T0 - 7, -1, 2**62], dtype=np.int64)
    blob = state.pack(recent)
    assert isinstance(blob, bytes) and len(blob) == 8 * recent.size
    back = state.unpack(blob)
    assert back.dtype == np.int64 and back.flags.writeable
    np.testing.assert_array_equal(back, recent)
    assert state.pack(np.empty(0, dtype=np.int64)) == b""
    assert state.unpack(b"").size == 0 and state.unpack(None).size == 0
    assert state.pack(np.array([1], dtype=np.int32)) == (1).to_bytes(8, "little")


def test_pack_and_unpack_reject_bad_input():
    state = DynamicBound(k=2, max_bound_ms=M)
    with pytest.raises(ValueError, match="at most k=2"):
        state.pack(np.array([1, 2, 3]))
    with pytest.raises(ValueError, match="multiple of 8"):
        state.unpack(b"\x00" * 9)


def test_invalid_arguments():
    with pytest.raises(ValueError, match="k must be >= 2"):
        DynamicBound(k=1, max_bound_ms=M)
    with pytest.raises(ValueError, match="max_bound_ms"):
        DynamicBound(max_bound_ms=5, min_bound_ms=6)
    with pytest.raises(ValueError, match="min_bound_ms"):
        dynamic_bound_ms(np.array([1, 0]), M, -1)
    with pytest.raises(TypeError, match="integer"):
        disorder_degree(np.array([1.5, 0.5]))
    with pytest.raises(ValueError, match="1-D"):
        dynamic_bound_ms(np.zeros((2, 2), dtype=np.int64), M)


def test_performance_ratio_hand_computed():
    # mean events 75, mean latency 2.5 s -> 30 events/s (the mean of the ratios would be 56.25)
    assert performance_ratio(np.array([100, 50]), np.array([1.0, 4.0])) == pytest.approx(30.0)
    assert performance_ratio(np.array([100, 200, 300]), np.array([2.0, 4.0, 6.0])) == 50.0
    assert performance_ratio(np.array([0]), np.array([3.0])) == 0.0


@pytest.mark.parametrize(
    ("counts", "latencies", "message"),
    [
        ([], [], "empty input"),
        ([1, 2], [1.0], "one length"),
        ([1], [0.0], "every window latency is 0"),
        ([-1], [1.0], ">= 0"),
        ([1], [float("nan")], "finite"),
    ],
)
def test_performance_ratio_errors(counts, latencies, message):
    with pytest.raises(ValueError, match=message):
        performance_ratio(np.array(counts), np.array(latencies))
