"""Learn from the real flights and publish in the real Redis (needs `keyshift stack up`)."""

from __future__ import annotations

import uuid

import pandas as pd
import pytest

from keyshift.data.flights import fetch_flights, flights_path
from keyshift.placement.assignment_store import AssignmentStore, CachedAssignment
from keyshift.placement.learning import learn_and_publish, published_assignment
from keyshift.placement.strategies import HotSplitStrategy, LeastKeyStrategy
from keyshift.settings import Settings

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def settings() -> Settings:
    settings = Settings()
    fetch_flights(settings)  # reuses the verified cached copy
    return settings


@pytest.fixture
def name(settings: Settings):
    name = f"it-learn-{uuid.uuid4().hex[:8]}"
    yield name
    AssignmentStore.from_settings(settings, name).delete()


def head_counts(settings: Settings, rows: int) -> dict[str, int]:
    """The reference: origin counts of the first `rows` flights with pandas, in arrival order."""
    head = pd.read_parquet(flights_path(settings), columns=["origin"])["origin"].iloc[:rows]
    return {k: int(v) for k, v in head.value_counts().reindex(pd.unique(head)).items()}


def test_hot_split_at_32_slots_publishes_its_split_keys(settings: Settings, name: str) -> None:
    learned = learn_and_publish(settings, name, "hot_split", 32, flights=flights_path(settings))
    assert learned.events == 300_000 and learned.epoch == 1
    reference = HotSplitStrategy.from_counts(head_counts(settings, 300_000), 32)
    expected_split = {k: s for k, s in reference.assignment.items() if len(s) > 1}
    assert "ORD" in expected_split  # ORD holds more than 1/32 of the events
    assert learned.split == expected_split and learned.keys == len(reference.assignment)
    snap = AssignmentStore.from_settings(settings, name).snapshot()
    assert snap["strategy"] == "hot_split" and snap["partitions"] == 32 and snap["epoch"] == 1
    assert snap["split"] == expected_split
    assert snap["mapping"] == {k: s[0] for k, s in reference.assignment.items()}
    assert snap["loads"] == reference.loads == learned.loads


def test_least_key_learns_in_arrival_order_from_ten_percent_of_the_limit(settings: Settings, name: str) -> None:
    learn_and_publish(settings, name, "least_key", 8, limit=50_000, flights=flights_path(settings))
    view = published_assignment(settings, name, "least_key", 8)
    assert isinstance(view, CachedAssignment) and view.key_affine and view.epoch == 1
    reference = LeastKeyStrategy.from_counts(head_counts(settings, 5_000), 8)
    snap = AssignmentStore.from_settings(settings, name).snapshot()
    assert snap["mapping"] == reference.assignment and snap["split"] == {}
    assert snap["loads"] == reference.loads
    again = learn_and_publish(settings, name, "least_count", 8, limit=50_000, flights=flights_path(settings))
    assert again.epoch == 2 and again.split == {}
