"""Learning an assignment from the head of the flights (pure parts: counts, strategy choice)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from keyshift.errors import ConfigurationError, PlacementError
from keyshift.placement.learning import (
    LEARNED_STRATEGIES,
    check_learned_strategy,
    learn_strategy,
    learning_counts,
)
from keyshift.placement.strategies import HotSplitStrategy, LeastCountStrategy, LeastKeyStrategy

# 20 flights: SEA arrives first but ORD is the heaviest key of the head
ORIGINS = ["SEA", "ORD", "ORD", "ATL", "ORD", "SEA", "DFW", "ORD", "ATL", "ORD"] + ["LAX"] * 10


@pytest.fixture
def origins_file(tmp_path: Path) -> Path:
    path = tmp_path / "origins.parquet"
    pq.write_table(pa.table({"origin": ORIGINS}), path, row_group_size=4)
    return path


@pytest.mark.parametrize(
    ("fraction", "limit", "expected"),
    [
        (0.5, None, {"SEA": 2, "ORD": 5, "ATL": 2, "DFW": 1}),  # head of 10, arrival order kept
        (1.0, None, {"SEA": 2, "ORD": 5, "ATL": 2, "DFW": 1, "LAX": 10}),  # every flight
        (0.5, 4, {"SEA": 1, "ORD": 1}),  # 50 % of a 4-flight replay
        (0.01, None, {"SEA": 1}),  # never fewer than one flight
        (0.5, 1000, {"SEA": 2, "ORD": 5, "ATL": 2, "DFW": 1}),  # a limit above the file is the file
    ],
)
def test_learning_counts(origins_file: Path, fraction: float, limit: int | None, expected: dict) -> None:
    counts, events = learning_counts(origins_file, fraction, limit)
    assert counts == expected and list(counts) == list(expected)  # order = first arrival
    assert events == sum(expected.values())


@pytest.mark.parametrize(
    ("fraction", "limit", "message"),
    [
        (0, None, "learn fraction must be in"),  # nothing to learn from
        (1.5, None, "learn fraction must be in"),
        (True, None, "learn fraction must be in"),
        (0.1, 0, "limit must be an int >= 1"),
        (0.1, -5, "limit must be an int >= 1"),
    ],
)
def test_learning_counts_refuses(origins_file: Path, fraction, limit, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        learning_counts(origins_file, fraction, limit)


def test_learn_strategy_builds_each_learned_strategy() -> None:
    counts = {"SEA": 2, "ORD": 9, "ATL": 2, "DFW": 1}
    least_key = learn_strategy("least_key", counts, 2)
    assert isinstance(least_key, LeastKeyStrategy)
    assert least_key.assignment == {"SEA": 0, "ORD": 1, "ATL": 0, "DFW": 1}  # arrival order, by keys
    least_count = learn_strategy("least_count", counts, 2)
    assert isinstance(least_count, LeastCountStrategy)
    assert least_count.assignment == LeastCountStrategy.from_counts(counts, 2).assignment
    hot = learn_strategy("hot_split", counts, 2)
    assert isinstance(hot, HotSplitStrategy)
    assert hot.assignment["ORD"] == (0, 1)  # 9 of 14 events > 1/2: split over both slots
    assert learn_strategy("hot_split", counts, 4, d=3).assignment["ORD"] == (0, 1, 2)
    assert LEARNED_STRATEGIES == ("least_key", "least_count", "hot_split")


@pytest.mark.parametrize("name", ["hash", "modulo", "weight", "nope"])
def test_only_learned_strategies_are_learned(name: str) -> None:
    with pytest.raises(PlacementError, match="learned strategies: least_key, least_count, hot_split"):
        check_learned_strategy(name)
    with pytest.raises(PlacementError, match="not learned from history"):
        learn_strategy(name, {"a": 1}, 2)
