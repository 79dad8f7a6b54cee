"""Watermark alignment (`--max-partition-drift-ms`, issue 32) on the real stack.

The input is the drifted backfill of `test_partition_drift.py` (`keyshift.data.drift`, one flight
in 10 of all 3,000,000, written by a plain kafka-python producer with Kafka's default partitioner)
read from `earliest` by keyshift's aligned Kafka source (`keyshift.processing.sources.aligned_kafka`).
With the bound the run loses nothing (0 late, 0 dead letters, windows equal to pandas), the
spread between the partitions' clocks stays within the bound while every partition has records,
a run killed mid-way resumes from the offsets Spark logged for the aligned source to the same
windows, and a switch's new query goes on from where the old one ended. Spark's Kafka source on the same topic drifts 40 days apart (`test_partition_drift.py`).
"""

from __future__ import annotations

import json
import os
import signal
import uuid

import pytest

from keyshift.processing.job_config import JobConfig
from tests.integration.flight_runs import assert_lossless

pytestmark = pytest.mark.integration

PER_TRIGGER = 25_000
MINUTE_MS = 60_000
DAY_MS = 86_400_000
EVERY = 10
"""One flight in 10 of all 3,000,000: six months of drift in 300,000 events."""


@pytest.fixture(scope="module")
def backfills(settings):
    """variant -> (topic, pandas reference, flights, the largest gap in event time between two
    consecutive records of a partition, ms) at P = 8, written once for the module."""
    import numpy as np

    from keyshift.data.drift import default_partition, shifted_flights, write_plain
    from keyshift.data.flights import flights_path
    from keyshift.quality.reference import reference_of
    from keyshift.topics import create_topics

    found = {}
    for variant in ("popularity", "partition_offsets"):
        frame = shifted_flights(flights_path(settings), variant=variant, partitions=8).iloc[::EVERY].reset_index(drop=True)
        topic = f"it-align-{variant.replace('_', '-')}-{uuid.uuid4().hex[:6]}"
        create_topics(settings, [topic], 8)
        write_plain(settings.bootstrap_servers, topic, frame, 8)
        partition = frame["origin"].map(lambda key: default_partition(key, 8))
        gap = max(int(np.diff(group.to_numpy()).max()) for _, group in frame["event_time"].groupby(partition))
        found[variant] = (topic, reference_of(frame), len(frame), gap)
    return found


@pytest.mark.parametrize(("variant", "mode", "drift_ms"), [
    ("popularity", "partition", DAY_MS),
    ("popularity", "key", 3_600_000),
    pytest.param("partition_offsets", "partition", DAY_MS, marks=pytest.mark.slow),  # the other drift shape: make test-all
])
def test_an_aligned_backfill_loses_nothing_and_keeps_the_partitions_within_the_bound(settings, spark, backfills, variant,
                                                                                   mode, drift_ms):
    from keyshift.bench.drift import drift_per_batch
    from keyshift.runtime.driver import run_job

    topic, reference, flights, gap = backfills[variant]
    spark.conf.set("spark.sql.shuffle.partitions", "8")
    config = JobConfig.from_options(
        run_id=f"it-align-{mode}-{uuid.uuid4().hex[:6]}", partitions=8, topic=topic, bound_ms=MINUTE_MS,
        max_offsets_per_trigger=PER_TRIGGER, limit=flights, watermark=mode, max_partition_drift_ms=drift_ms,
        max_ahead_ms=EVERY * 7 * DAY_MS,  # a thinned block of 1,000 events spans 10 times the event time
    )
    summary = run_job(settings, config, starting="earliest", spark=spark)
    assert_lossless(summary, reference, flights)
    assert summary["partition_drift_bound_ms"] == drift_ms
    drift = [d["drift_ms"] for d in drift_per_batch(settings.runs_dir / config.run_id)]
    if variant == "popularity":
        # every partition has records until the end: no partition reads past the slowest + the
        # bound, so the clocks (the largest event time read per partition) stay within the bound
        # plus the longest silence of a partition (a paused partition's clock is its last record)
        assert max(drift) <= drift_ms + gap, (drift, gap)
    else:  # partition p starts 30 p days late: the first batches read the partitions one after the other
        assert summary["batches"] > flights // PER_TRIGGER


def _cli(topic: str, run_id: str, flights: int, mode: str) -> list[str]:
    from tests.integration.flight_runs import KEYSHIFT

    return [KEYSHIFT, "job", "run", "flight_delays", "--topic", topic, "--run-id", run_id, "--limit", str(flights),
            "--partitions", "8", "--max-offsets-per-trigger", str(PER_TRIGGER), "--starting", "earliest",
            "--watermark", mode, "--bound-ms", str(MINUTE_MS), "--max-ahead-ms", str(EVERY * 7 * DAY_MS),
            "--max-partition-drift-ms", str(DAY_MS), "--idle-timeout", "240"]


@pytest.mark.slow  # 80 s; a kill and resume of a drifted backfill is test_partition_drift's (unaligned)
def test_an_aligned_backfill_killed_mid_way_resumes_to_the_same_windows(settings, backfills, tmp_path):
    from tests.integration.flight_runs import KEYSHIFT, batches_done, start, wait_for

    topic, reference, flights, _ = backfills["popularity"]
    run_id = f"it-align-crash-{uuid.uuid4().hex[:6]}"
    run_dir = settings.runs_dir / run_id
    process = start(_cli(topic, run_id, flights, "partition"), tmp_path / "driver.log")
    wait_for(lambda: batches_done(run_dir) >= 3, process, 600, "batch 3")
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=60)
    resumed = start([KEYSHIFT, "job", "run", "flight_delays", "--resume", run_id], tmp_path / "driver.log")
    assert resumed.wait(timeout=900) == 0, f"the resumed run failed; see {tmp_path / 'driver.log'}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["partition_drift_bound_ms"] == DAY_MS  # the resume read the job record's bound
    assert_lossless(summary, reference, flights)


@pytest.mark.slow  # 90 s; a switch in a drifted backfill is test_partition_drift's (unaligned)
def test_a_switch_in_an_aligned_backfill_keeps_the_windows(settings, backfills, tmp_path):
    """The switch's new query starts the aligned source at the offsets the old one ended at."""
    from keyshift.migration.switch import request_switch
    from tests.integration.flight_runs import batches_done, start, wait_for

    topic, reference, flights, _ = backfills["partition_offsets"]
    run_id = f"it-align-switch-{uuid.uuid4().hex[:6]}"
    run_dir = settings.runs_dir / run_id
    process = start(_cli(topic, run_id, flights, "key"), tmp_path / "driver.log")
    wait_for(lambda: batches_done(run_dir) >= 2, process, 600, "batch 2")
    record = request_switch(settings, run_id, "least_count", None, reason="alignment test", wait_timeout_s=600)
    assert record.state == "done", record.error
    assert process.wait(timeout=900) == 0, f"the run failed; see {tmp_path / 'driver.log'}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["switches"] == [record.switch_id] and summary["partition_drift_bound_ms"] == DAY_MS
    assert_lossless(summary, reference, flights)
