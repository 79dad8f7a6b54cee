"""Key-level watermarks in the real job (Kafka, Redis, Spark) on real flights, against pandas.

The demo's claim at a test's size: with `key` watermarks and a one-minute bound the job loses no
event (for hash and least_count at P = 8 and hot_split at P = 32), and its windows equal the same
windows computed by pandas from the data file, while `global` mode with the same bound on the
same records makes events late (checked once, with hash: the other placements only add run time).
Micro-batches of 8,000 records make Spark read the partitions at different speeds in event
time, as a backfill does.
"""

from __future__ import annotations

import uuid

import pytest

from keyshift.processing.job_config import JobConfig

pytestmark = pytest.mark.integration

FLIGHTS = 40_000
PER_TRIGGER = 8_000
MINUTE_MS = 60_000


def _run(settings, spark, strategy: str, partitions: int, modes: tuple[str, ...]) -> dict:
    from keyshift.data.replay import replay_flights
    from keyshift.data.flights import flights_path
    from keyshift.placement.learning import LEARNED_STRATEGIES, learn_and_publish
    from keyshift.runtime.driver import run_job
    from keyshift.topics import create_topics

    topic = f"it-keywm-{strategy}-{uuid.uuid4().hex[:6]}"
    create_topics(settings, [topic], partitions)
    if strategy in LEARNED_STRATEGIES:
        learn_and_publish(settings, topic, strategy, partitions, FLIGHTS, flights=flights_path(settings))
    replay_flights(settings, topic, limit=FLIGHTS, strategy=strategy, partitions=partitions, progress=False)
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    runs = {}
    for mode in modes:
        config = JobConfig.from_options(
            run_id=f"it-keywm-{strategy}-{mode}-{uuid.uuid4().hex[:6]}", strategy=strategy, partitions=partitions, topic=topic,
            bound_ms=MINUTE_MS, max_offsets_per_trigger=PER_TRIGGER, limit=FLIGHTS, watermark=mode,
        )
        runs[mode] = run_job(settings, config, starting="replay", spark=spark)
    return runs


@pytest.fixture(scope="module")
def reference(settings):
    from keyshift.data.flights import flights_path
    from keyshift.quality.reference import reference_windows

    return reference_windows(flights_path(settings), limit=FLIGHTS)


@pytest.mark.parametrize(("strategy", "partitions"), [("hash", 8), pytest.param("least_count", 8, marks=pytest.mark.slow), ("hot_split", 32)])
def test_key_watermarks_with_a_one_minute_bound_lose_no_flight(settings, spark, reference, strategy, partitions):
    from pathlib import Path

    from keyshift.quality.reference import compare_to_reference

    runs = _run(settings, spark, strategy, partitions, ("key", "global") if strategy == "hash" else ("key",))
    key = runs["key"]
    assert key["events_read"] == FLIGHTS and key["reconciled"] and key["pending_events"] == 0
    assert key["late_events"] == 0, f"key mode made {key['late_events']} events late"
    comparison = compare_to_reference(Path(key["windows_path"]), reference)
    assert comparison["equal"], comparison
    if strategy == "hot_split":
        assert key["split_keys"] and key["merged_window_pieces"] > 0  # pieces closed apart and were merged
    if "global" in runs:  # the same records, the same bound, one watermark for the query: events are late
        assert runs["global"]["reconciled"] and runs["global"]["late_events"] > 0
        print(f"{strategy} P={partitions}: late events key {key['late_events']}, global {runs['global']['late_events']}")
