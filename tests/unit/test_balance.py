"""Balance metrics (paper 000, eq. 1 and eq. 2)."""

import pytest

from keyshift.monitoring.balance import balance_degree, extra_compute_time, max_over_mean


@pytest.mark.parametrize(
    ("loads", "degree", "extra"),
    [
        ([5, 5, 5, 5], 1.0, 0.0),  # even
        ([0, 10], 0.0, 1.0),  # one idle slot
        ([2, 4, 6], 2 / 6, (6 - 4) / 4),  # textbook
        ([7], 1.0, 0.0),  # one slot
        ([0, 0, 0], 1.0, 0.0),  # nothing processed
    ],
)
def test_balance_metrics(loads, degree, extra):
    assert balance_degree(loads) == pytest.approx(degree)
    assert extra_compute_time(loads) == pytest.approx(extra)
    assert max_over_mean(loads) == pytest.approx(1 + extra)


@pytest.mark.parametrize("loads", [[], [1, -1]])
def test_bad_loads(loads):
    with pytest.raises(ValueError):
        balance_degree(loads)
