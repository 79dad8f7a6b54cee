"""Overload: a live topic fed at about twice the rate the job sustains, for two minutes.

A continuous run (no `--limit`) reads a fresh topic from its start while real flights are
replayed into it at `RATE` events/s for `SECONDS` s; the job is held to `PER_TRIGGER` records per
micro-batch, and a micro-batch of the flight job takes at least about 2 s on this machine kind
(8 stateful tasks on 2 cores, the side-output transaction, the commit), so the job sustains
about half the replay's rate (measured here: 585 events/s). The consumer lag must grow while the
replay runs, be reported by the balance monitor, and drain to zero afterwards; then the run is
stopped with SIGTERM and must reconcile (events read = Σ window counts + late + dead letters + pending = events produced) with every
window it closed equal, field by field, to the same window of a clean bounded run over the same
records, and the events of the windows it did not close yet all pending in its state.
The bound is one day, so no event is late under either run however the batches are cut.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pandas as pd
import pytest

pytestmark = pytest.mark.integration

PARTITIONS = 8
RATE = 1_200
SECONDS = 120
PER_TRIGGER = 2_000
BOUND_MS = 86_400_000
KEYSHIFT = str(Path(sys.executable).parent / "keyshift")


def _lag(settings, topic: str, run_id: str) -> int | None:
    """The job's consumer lag in records, from the offsets the balance monitor reads (None: no
    batch yet): the topic's end offsets against the job's latest progress record."""
    from keyshift.monitoring.loads import job_offsets
    from keyshift.orchestration.pipeline import consumer_lag
    from keyshift.runs import redis_client
    from keyshift.topics import end_offsets

    read_to = job_offsets(redis_client(settings), settings.runs_dir, run_id)
    return sum(consumer_lag(end_offsets(settings, topic), read_to).values()) if read_to is not None else None


def _monitored_lag(settings, topic: str, run_id: str) -> int | None:
    """The consumer lag the balance monitor records in one evaluation (a small sample)."""
    from keyshift.orchestration.monitor import evaluate_topic, monitor_params

    params = monitor_params({"topic": topic, "run_id": run_id, "partitions": PARTITIONS, "max_events": 2_000})
    lag = evaluate_topic(settings, params, save=False)["record"].get("consumer_lag")
    return lag["total"] if lag else None


@pytest.mark.slow
def test_lag_grows_under_twice_the_sustained_rate_then_drains_and_nothing_is_lost(stack_settings, tmp_path):
    from keyshift.data.replay import replay_flights
    from keyshift.topics import create_topics, end_offsets

    topic = run_id = f"it-overload-{uuid.uuid4().hex[:8]}"
    create_topics(stack_settings, [topic], PARTITIONS)
    log = tmp_path / "driver.log"
    with log.open("ab") as out:
        job = subprocess.Popen(
            [KEYSHIFT, "job", "run", "flight_delays", "--topic", topic, "--run-id", run_id, "--partitions", str(PARTITIONS),
             "--max-offsets-per-trigger", str(PER_TRIGGER), "--bound-ms", str(BOUND_MS), "--starting", "earliest"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        progress = stack_settings.runs_dir / run_id / "progress.jsonl"
        deadline = time.monotonic() + 300
        while not (progress.exists() and progress.read_text().strip()):  # the query is up and polling
            assert job.poll() is None and time.monotonic() < deadline, f"the job did not start; see {log}"
            time.sleep(1)

        events = RATE * SECONDS
        started = time.monotonic()
        replay_flights(stack_settings, topic, limit=events, rate=RATE, strategy="hash", partitions=PARTITIONS, progress=False)
        replay_seconds = time.monotonic() - started
        lag_after_replay = _monitored_lag(stack_settings, topic, run_id)
        assert lag_after_replay is not None and lag_after_replay > RATE * SECONDS // 10, (
            f"lag {lag_after_replay} after {replay_seconds:.0f} s at {RATE} events/s: the job was not overloaded"
        )

        drained_at, deadline = None, time.monotonic() + 900
        while drained_at is None:
            assert job.poll() is None, f"the job died under load; see {log}"
            assert time.monotonic() < deadline, f"the lag did not drain (still {_lag(stack_settings, topic, run_id)})"
            if _lag(stack_settings, topic, run_id) == 0:
                drained_at = time.monotonic()
            time.sleep(2)
        sustained = events / (drained_at - started)
        os.kill(job.pid, signal.SIGTERM)
        assert job.wait(timeout=300) == 0, f"the job did not stop cleanly; see {log}"
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)

    summary = json.loads((stack_settings.runs_dir / run_id / "summary.json").read_text())
    assert sum(end_offsets(stack_settings, topic).values()) == events
    assert summary["events_read"] == events and summary["reconciled"]
    assert summary["late_events"] == 0 and summary["dead_letters"] == 0

    # the clean run: the same records, bounded, in a topic of their own
    clean_topic = f"{topic}-clean"
    create_topics(stack_settings, [clean_topic], PARTITIONS)
    replay_flights(stack_settings, clean_topic, limit=events, strategy="hash", partitions=PARTITIONS, progress=False)
    clean = subprocess.run(
        [KEYSHIFT, "job", "run", "flight_delays", "--topic", clean_topic, "--run-id", clean_topic, "--limit", str(events),
         "--partitions", str(PARTITIONS), "--max-offsets-per-trigger", "40000", "--bound-ms", str(BOUND_MS), "--starting", "earliest"],
        capture_output=True, text=True, timeout=900,
    )
    assert clean.returncode == 0, clean.stderr[-2000:]

    keys = ["origin", "window_start"]
    closed = pd.read_parquet(stack_settings.runs_dir / run_id / "windows").sort_values(keys).reset_index(drop=True)
    oracle = pd.read_parquet(stack_settings.runs_dir / clean_topic / "windows").sort_values(keys).reset_index(drop=True)
    watermark = pd.Timestamp(summary["final_watermark_ms"], unit="ms", tz="UTC")
    assert len(closed) > 0 and (closed["window_end"] <= watermark).all()
    pd.testing.assert_frame_equal(closed, oracle[oracle["window_end"] <= watermark].reset_index(drop=True))
    assert oracle[oracle["window_end"] > watermark]["count"].sum() == summary["pending_events"]
    (tmp_path / "overload.json").write_text(json.dumps({
        "replay_events_per_second": round(events / replay_seconds), "job_sustained_events_per_second": round(sustained),
        "lag_after_replay": lag_after_replay, "drain_seconds_after_replay": round(drained_at - started - replay_seconds, 1),
        "events": events, "windows_closed": len(closed), "pending_events": summary["pending_events"],
    }))
    print(f"overload: replay {events / replay_seconds:.0f} events/s, job sustained {sustained:.0f} events/s; lag {lag_after_replay} "
          f"after the replay, drained {drained_at - started - replay_seconds:.0f} s later; {len(closed)} windows equal the clean run's")
