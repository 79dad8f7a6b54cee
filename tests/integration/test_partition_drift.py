"""Event time that holds when Kafka partitions drift apart (issue 32), on the real stack.

The input is not keyshift's replay: real flights written by a plain kafka-python producer (Kafka's
default partitioner by key, `json.dumps` with its default separators), read from `earliest` in
several micro-batches, so that Spark's Kafka source reads the partitions months apart in event
time (`keyshift.data.drift`):

- `popularity`: ten busy and ten quiet origins swap names half-way through the six months, so
  the partitions hold different shares of different months;
- `partition_offsets`: every partition's flights are shifted by 30 days per partition number,
  so whole partitions start months apart.

At P = 8 one flight in 10 of all 3,000,000 (300,000 over the whole six months) keeps a test's
size while keeping the drift of the full data (thinner, a partition's 1,000-event plausibility
block would span more than the 7 days an event may be ahead of it); at P = 32 the first 200,000
flights, whose origins swap half-way through their 12 days. Every per-key mode and the `partition` mode lose nothing (0
late, 0 dead letters, windows equal to pandas row by row); Spark's `global` mode with the same
one-minute bound loses events, which is what the per-partition clocks are for.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from keyshift.processing.job_config import JobConfig
from tests.integration.flight_runs import assert_lossless

pytestmark = pytest.mark.integration

PER_TRIGGER = 25_000
FIXTURES = {("popularity", 8): (None, 10), ("popularity", 32): (200_000, 1), ("partition_offsets", 8): (None, 10)}
"""(variant, P) -> (first flights, one in how many of them)."""
MINUTE_MS = 60_000


def _frame(settings, variant: str, partitions: int):
    from keyshift.data.drift import shifted_flights
    from keyshift.data.flights import flights_path

    limit, every = FIXTURES[(variant, partitions)]
    frame = shifted_flights(flights_path(settings), limit=limit, variant=variant, partitions=partitions)
    return frame.iloc[::every].reset_index(drop=True)


def _topic(settings, frame, variant: str, partitions: int) -> str:
    from keyshift.data.drift import write_plain
    from keyshift.topics import create_topics

    topic = f"it-drift-{variant.replace('_', '-')}-{partitions}-{uuid.uuid4().hex[:6]}"
    create_topics(settings, [topic], partitions)
    write_plain(settings.bootstrap_servers, topic, frame, partitions)
    return topic


@pytest.fixture(scope="module")
def drifted(settings):
    """variant -> P -> (topic, pandas reference, flights), written once for the module."""
    from keyshift.quality.reference import reference_of

    found: dict = {}
    for variant, partitions in FIXTURES:
        frame = _frame(settings, variant, partitions)
        found.setdefault(variant, {})[partitions] = (_topic(settings, frame, variant, partitions), reference_of(frame), len(frame))
    return found


def _run(settings, spark, topic: str, flights: int, strategy: str, partitions: int, mode: str) -> dict:
    from keyshift.data.flights import flights_path
    from keyshift.placement.learning import LEARNED_STRATEGIES, learn_and_publish
    from keyshift.runtime.driver import run_job

    if strategy in LEARNED_STRATEGIES:
        learn_and_publish(settings, topic, strategy, partitions, None, flights=flights_path(settings))
    config = JobConfig.from_options(
        run_id=f"it-drift-{strategy}-{mode}-{uuid.uuid4().hex[:6]}", strategy=strategy, partitions=partitions, topic=topic,
        bound_ms=MINUTE_MS, max_offsets_per_trigger=PER_TRIGGER, limit=flights, watermark=mode,
    )
    return run_job(settings, config, starting="earliest", spark=spark)


@pytest.mark.parametrize(("variant", "strategy", "partitions", "modes"), [
    ("popularity", "hash", 8, ("key", "dynamic", "partition", "global")),
    # the same clocks under the other placements: make test-all
    pytest.param("popularity", "least_count", 8, ("key", "partition"), marks=pytest.mark.slow),
    pytest.param("popularity", "hot_split", 32, ("key", "partition"), marks=pytest.mark.slow),
    pytest.param("partition_offsets", "hash", 8, ("key", "nkey", "partition", "global"), marks=pytest.mark.slow),
])
def test_a_drifted_backfill_loses_nothing_to_the_drift(settings, spark, drifted, variant, strategy, partitions, modes):
    topic, reference, flights = drifted[variant][partitions]
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    for mode in modes:
        summary = _run(settings, spark, topic, flights, strategy, partitions, mode)
        if mode == "global":  # Spark's one clock for the query, the same bound: the drift costs events
            assert summary["reconciled"] and summary["late_events"] + summary["dead_letters"] > 0
            print(f"{variant} {strategy} P={partitions}: global mode lost {summary['late_events']} late, "
                  f"{summary['dead_letters']} dead letters of {flights}")
            continue
        assert_lossless(summary, reference, flights)


def _cli(settings, topic: str, run_id: str, flights: int, mode: str = "key", extra: tuple[str, ...] = ()) -> list[str]:
    from tests.integration.flight_runs import KEYSHIFT

    return [KEYSHIFT, "job", "run", "flight_delays", "--topic", topic, "--run-id", run_id, "--limit", str(flights),
            "--partitions", "8", "--max-offsets-per-trigger", str(PER_TRIGGER), "--starting", "earliest",
            "--watermark", mode, "--bound-ms", str(MINUTE_MS), "--idle-timeout", "240", *extra]


def test_a_drifted_backfill_killed_mid_way_resumes_to_the_same_windows(settings, drifted, tmp_path):
    from keyshift.data.flights import flights_path
    from keyshift.placement.learning import learn_and_publish
    from tests.integration.flight_runs import KEYSHIFT, batches_done, start, wait_for

    topic, reference, flights = drifted["popularity"][8]
    learn_and_publish(settings, topic, "least_count", 8, None, flights=flights_path(settings))
    run_id = f"it-drift-crash-{uuid.uuid4().hex[:6]}"
    run_dir = settings.runs_dir / run_id
    process = start(_cli(settings, topic, run_id, flights, extra=("--strategy", "least_count")), tmp_path / "driver.log")
    wait_for(lambda: batches_done(run_dir) >= 3, process, 600, "batch 3")
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=60)
    resumed = start([KEYSHIFT, "job", "run", "flight_delays", "--resume", run_id], tmp_path / "driver.log")
    assert resumed.wait(timeout=900) == 0, f"the resumed run failed; see {tmp_path / 'driver.log'}"
    assert_lossless(json.loads((run_dir / "summary.json").read_text()), reference, flights)


def test_a_switch_in_a_drifted_backfill_keeps_the_windows(settings, drifted, tmp_path):
    from keyshift.migration.switch import request_switch
    from tests.integration.flight_runs import batches_done, start, wait_for

    topic, reference, flights = drifted["popularity"][8]
    run_id = f"it-drift-switch-{uuid.uuid4().hex[:6]}"
    run_dir = settings.runs_dir / run_id
    process = start(_cli(settings, topic, run_id, flights), tmp_path / "driver.log")
    wait_for(lambda: batches_done(run_dir) >= 2, process, 600, "batch 2")
    record = request_switch(settings, run_id, "least_count", None, reason="drift test", wait_timeout_s=600)
    assert record.state == "done", record.error
    assert process.wait(timeout=900) == 0, f"the run failed; see {tmp_path / 'driver.log'}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["switches"] == [record.switch_id]
    assert_lossless(summary, reference, flights)


def test_an_idle_partition_neither_stalls_the_others_nor_makes_its_records_late(settings, tmp_path):
    """A live feed on 4 partitions, event time = the producer's clock, 2-second windows, one
    partition silent for 30 s in the middle. In `partition` mode (one watermark: the slowest
    active partition - 1 s) the other partitions' windows keep closing while it is silent (it is
    idle after 3 s), and its records after the pause are on time."""
    from kafka import KafkaProducer

    from keyshift.data.drift import default_partition
    from keyshift.topics import create_topics
    from tests.integration.flight_runs import KEYSHIFT, start, wait_for

    partitions, silent = 4, 3
    topic = run_id = f"it-drift-idle-{uuid.uuid4().hex[:6]}"
    create_topics(settings, [topic], partitions)
    keys: dict[int, list[str]] = {p: [] for p in range(partitions)}
    for i in range(400):
        name = f"K{i:03d}"
        if len(keys[default_partition(name, partitions)]) < 3:
            keys[default_partition(name, partitions)].append(name)
    run_dir = settings.runs_dir / run_id
    process = start([KEYSHIFT, "job", "run", "flight_delays", "--topic", topic, "--run-id", run_id, "--partitions", str(partitions),
                     "--starting", "earliest", "--watermark", "partition", "--bound-ms", "1000", "--window-ms", "2000",
                     "--partition-idle-timeout", "3"], tmp_path / "driver.log")
    producer = KafkaProducer(bootstrap_servers=settings.bootstrap_servers, acks="all", linger_ms=5)
    sent, event_id = 0, 0

    def produce(seconds: float, active: list[int]) -> None:
        nonlocal sent, event_id
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            now_ms = int(time.time() * 1000)
            for p in active:
                for name in keys[p]:
                    value = {"event_id": event_id, "origin": name, "destination": "DST", "delay_min": 1, "distance_mi": 10,
                             "event_time": now_ms}
                    producer.send(topic, key=name.encode(), value=json.dumps(value).encode())
                    event_id += 1
                    sent += 1
            producer.flush()
            time.sleep(0.1)

    try:
        wait_for(lambda: (run_dir / "job.json").exists(), process, 300, "the run's start")
        produce(15, list(range(partitions)))
        silence_from = time.time() * 1000
        produce(30, [p for p in range(partitions) if p != silent])
        # windows of the other partitions closed well after the silent partition's last event:
        # its clock held them back for the idle timeout (3 s) and then no longer
        assert _latest_window_end_ms(run_dir) > silence_from + 15_000, "the silent partition stalled the others' windows"
        produce(10, list(range(partitions)))
    finally:
        producer.close()
        time.sleep(5)
        process.send_signal(signal.SIGTERM)  # the driver, not its JVM: it stops at a batch boundary and writes its summary
        process.wait(timeout=300)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reconciled"] and summary["events_read"] == sent
    assert summary["late_events"] == 0 and summary["dead_letters"] == 0, (summary["late_events"], summary["dead_letters"])


def _latest_window_end_ms(run_dir: Path) -> int:
    """The latest window end (ms) in the windows files written so far (a file being written is skipped)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    latest = 0
    for path in (run_dir / "windows").glob("part-*.parquet"):
        try:
            column = pq.read_table(path, columns=["window_end"]).column("window_end")
            ends = pc.cast(column, pa.timestamp("ms", tz="UTC")).cast(pa.int64()).to_pylist()
        except Exception:  # noqa: BLE001 (a file the sink is writing right now)
            continue
        latest = max([latest, *ends])
    return latest
