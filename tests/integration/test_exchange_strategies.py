"""The exchange strategies on a real stack: `plain`, Local Merge's `window` emit mode and
`global_merge` give exactly the default run's windows, late events and dead letters, once each,
on a round_robin topic (a key's events in every partition) with bad and late records mixed in;
Global Merge writes no shuffle bytes and never merges a task twice, and a Global Merge run killed
with SIGKILL between a batch's outputs and its commit, then resumed, still gives them once each."""

from __future__ import annotations

import json
import signal
import uuid

import pandas as pd
import pytest
from kafka import KafkaProducer

from tests.integration.flight_runs import KEYSHIFT, assert_equals_the_oracle, side_outputs, start, windows
from keyshift.topics import read_committed

FLIGHTS = 20_000
PARTITIONS = 4
LATE = 25
BAD = 10


def job_args(topic: str, run_id: str, *options: str) -> list[str]:
    return [KEYSHIFT, "job", "run", "flight_delays", "--topic", topic, "--run-id", run_id, "--limit", str(FLIGHTS + LATE + BAD),
            "--partitions", str(PARTITIONS), "--max-offsets-per-trigger", "4000", "--starting", "earliest",
            "--bound-ms", "3600000", "--idle-timeout", "240", *options]


@pytest.fixture(scope="module")
def round_robin_topic(stack_settings):
    """20,000 flights placed round_robin, then 10 malformed records and 25 valid flights two
    days older than the last ones (late against a one-hour bound)."""
    from keyshift.data.replay import replay_flights
    from keyshift.topics import create_topics, delete_topics

    settings = stack_settings
    topic = f"it-exchange-{uuid.uuid4().hex[:8]}"
    create_topics(settings, [topic], PARTITIONS)
    result = replay_flights(settings, topic, limit=FLIGHTS, strategy="round_robin", partitions=PARTITIONS, progress=False)
    assert result.events_produced == FLIGHTS
    producer = KafkaProducer(bootstrap_servers=settings.bootstrap_servers, acks="all")
    for i in range(BAD):
        producer.send(topic, key=b"ORD", value=b'{"event_id": 5, "origin": "ORD", "delay_min": "late"}', partition=i % PARTITIONS)
    end_ms = _last_event_time(settings, topic)
    for i in range(LATE):
        record = {"event_id": 90_000_000 + i, "origin": "ORD", "destination": "LGA", "delay_min": 40, "distance_mi": 733,
                  "event_time": end_ms - 2 * 86_400_000 - i * 60_000}
        producer.send(topic, key=b"ORD", value=json.dumps(record).encode(), partition=i % PARTITIONS)
    producer.flush()
    producer.close()
    yield topic
    delete_topics(settings, [topic])


def _last_event_time(settings, topic: str) -> int:
    """The largest event time in `topic` now (ms), read back from Kafka."""

    largest = 0
    for message in read_committed(settings, topic):
        try:
            largest = max(largest, int(json.loads(message.value)["event_time"]))
        except (ValueError, KeyError, TypeError):
            continue
    return largest


@pytest.fixture(scope="module")
def oracle(stack_settings, round_robin_topic, tmp_path_factory):
    """The default run (local_merge, emit batch) on the topic."""
    run_id = f"it-exchange-oracle-{uuid.uuid4().hex[:6]}"
    process = start(job_args(round_robin_topic, run_id), tmp_path_factory.mktemp("oracle") / "driver.log")
    assert process.wait(timeout=900) == 0, f"the default run failed; see {stack_settings.runs_dir / run_id}"
    summary = json.loads((stack_settings.runs_dir / run_id / "summary.json").read_text())
    assert summary["reconciled"] and summary["events_read"] == FLIGHTS + LATE + BAD
    assert summary["late_events"] >= LATE and summary["dead_letters"] == BAD
    return {"summary": summary, "windows": windows(stack_settings, run_id), "outputs": side_outputs(stack_settings, run_id)}


@pytest.mark.parametrize("options", [("--exchange", "global_merge"), pytest.param(("--exchange", "plain"), marks=pytest.mark.slow),
                                     pytest.param(("--emit", "window"), marks=pytest.mark.slow)],
                         ids=["global_merge", "plain", "emit-window"])
def test_every_exchange_gives_the_default_runs_outputs_exactly_once(stack_settings, round_robin_topic, oracle, options, tmp_path):
    run_id = f"it-exchange-{options[-1].replace('_', '-')}-{uuid.uuid4().hex[:6]}"
    process = start(job_args(round_robin_topic, run_id, *options), tmp_path / "driver.log")
    assert process.wait(timeout=900) == 0, f"the {options} run failed; see {stack_settings.runs_dir / run_id}"
    summary = assert_equals_the_oracle(stack_settings, run_id, oracle)
    assert summary["exchange"] == (options[1] if options[0] == "--exchange" else "local_merge")
    if options[1] == "global_merge":
        assert summary["shuffle_write_bytes"] == 0  # no keyed exchange at all
        assert summary["pending_events"] == 0
    else:
        assert summary["shuffle_write_bytes"] > 0


def test_global_merge_killed_after_a_batchs_outputs_resumes_to_the_default_runs_outputs(stack_settings, round_robin_topic, oracle,
                                                                                       tmp_path):
    """kill -9 of the driver's process group at failpoint `sink.after_outputs@2`: batch 2's merges
    are in Redis and its windows, side outputs and ledger written, its commit and its
    `closed_through` mark are not. Spark replays batch 2 on `--resume`: its tasks merge nothing
    twice, the windows it closes are routed again (the same rows), and the run ends with the
    default run's outputs exactly once."""
    run_id = f"it-exchange-gm-kill-{uuid.uuid4().hex[:6]}"
    log = tmp_path / "driver.log"
    killed = start(job_args(round_robin_topic, run_id, "--exchange", "global_merge"), log, "sink.after_outputs@2")
    assert killed.wait(timeout=900) == -signal.SIGKILL, f"the failpoint did not fire; see {log}"
    run_dir = stack_settings.runs_dir / run_id
    assert not (run_dir / "summary.json").exists() and (run_dir / "batches" / f"{2:08d}.json").exists()
    assert not (run_dir / "checkpoint" / "commits" / "2").exists()
    resumed = start([KEYSHIFT, "job", "run", "flight_delays", "--resume", run_id], log)
    assert resumed.wait(timeout=900) == 0, f"the resumed run failed; see {log}"
    summary = assert_equals_the_oracle(stack_settings, run_id, oracle)
    assert summary["exchange"] == "global_merge" and summary["resumes"] == 1 and summary["pending_events"] == 0


def test_global_merge_state_merges_a_task_once_and_forgets_closed_windows(stack_settings):
    import numpy as np
    import redis

    from keyshift.jobs.flight_delays import FLIGHT_DELAYS
    from keyshift.processing.operators.global_merge import GlobalMergeState

    client = redis.Redis.from_url(stack_settings.redis_url, decode_responses=True)
    state = GlobalMergeState(client, f"it-gm-{uuid.uuid4().hex[:6]}", FLIGHT_DELAYS)
    partials = pd.DataFrame({"origin": ["ORD", "ORD", "LGA"], "window_start_ms": [0, 3_600_000, 0],
                             "window_end_ms": [3_600_000, 7_200_000, 3_600_000], "count": [3, 1, 2],
                             "sum_delay_min": [30, -5, 7], "max_delay_min": [20, -5, 9]})
    more = partials.assign(count=[1, 1, 1], sum_delay_min=[10, 10, 10], max_delay_min=[50, -9, 1])
    try:
        assert state.merge(0, "0", partials, np.array([1, 1, 2])) == 3
        assert state.merge(0, "0", partials, np.array([1, 1, 2])) == 0  # a retried task: nothing twice
        assert state.merge(0, "1", more, np.array([1, 1, 2])) == 3
        assert state.pending_events() == 9
        closed = state.closed(3_600_000).sort_values("origin").reset_index(drop=True)
        assert closed[["origin", "window_start_ms", "count", "sum_delay_min", "max_delay_min", "slot"]].values.tolist() == [
            ["LGA", 0, 3, 17, 9, 2], ["ORD", 0, 4, 40, 50, 1]]
        state.set_closed_through(0, 3_600_000)
        assert state.closed_through(0) == 3_600_000 and state.closed_through() == 3_600_000 and state.closed_through(7) is None
        assert state.pending_events() == 2  # routed windows no longer count, though still in Redis
        assert sorted(state.members_through(3_600_000)) == sorted(closed["member"])
        state.forget(state.members_through(3_600_000), batch_id=0)
        assert state.pending_events() == 2 and state.closed(3_600_000).empty
        left = state.closed(7_200_000)
        assert left[["count", "sum_delay_min", "max_delay_min"]].values.tolist() == [[2, 5, -5]]
    finally:
        state.clear()
