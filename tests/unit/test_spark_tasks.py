"""Makespan ratio of a keyed stage's per-slot task times, with and without the warm-up batch."""

import pytest

from keyshift.monitoring.spark_tasks import after_warmup, makespan_ratio


@pytest.mark.parametrize(
    ("per_batch", "ratio"),
    [
        ({0: [1.0, 1.0, 1.0, 1.0]}, 1.0),  # even slots: the batch takes the mean
        ({0: [2.0, 0.0]}, 2.0),  # one idle slot of two doubles the time
        ({0: [3.0, 1.0], 1: [1.0, 1.0]}, (3.0 + 1.0) / (2.0 + 1.0)),  # sums over batches, not a mean of ratios
        ({}, None),  # nothing timed
        ({0: [0.0, 0.0]}, None),  # tasks that took no time
    ],
)
def test_makespan_ratio(per_batch, ratio):
    assert makespan_ratio(per_batch) == (pytest.approx(ratio, abs=1e-4) if ratio is not None else None)


def test_after_warmup_drops_only_the_first_batch_timed():
    per_batch = {3: [4.0, 4.0, 1.0, 1.0], 4: [1.0, 1.0, 1.0, 1.0], 5: [1.0, 2.0, 1.0, 1.0]}
    assert after_warmup(per_batch) == {4: [1.0, 1.0, 1.0, 1.0], 5: [1.0, 2.0, 1.0, 1.0]}
    assert makespan_ratio(after_warmup(per_batch)) == pytest.approx(3.0 / 2.25, abs=1e-4)
    assert after_warmup({}) == {}
