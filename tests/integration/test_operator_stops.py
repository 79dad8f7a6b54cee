"""What an operator meets in the first hour (issue 33): Ctrl-C, a bounded run on a live feed, and
the figures of a resumed run.

Each driver runs as `keyshift job run` in a session of its own, and the test sends SIGINT to that
session's whole process group, as a terminal's Ctrl-C does (it reaches every process of the
foreground group: the driver, and, unless keyshift keeps them apart, its JVM and Python workers).

- Ctrl-C during a batch (failpoint `sink.hold_after_outputs@2` holds batch 2 in the sink, so the
  signal lands inside it every time) and between batches (a continuous run idle at the topic's
  end): the batch in flight finishes and is committed, the run stops at that boundary with a
  reconciled summary and exit status 0, no cancelled Spark job; a resume of the first continues
  exactly (windows equal to pandas) and reports each attempt's own events and seconds.
- A second Ctrl-C stops at once, saying so (exit status 130, no summary).
- A bounded run on a topic being written starts its query at once and reads while the feed
  runs, ending at `--limit` records with windows equal to pandas.
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

import pytest

from tests.integration.flight_runs import start, wait_for

pytestmark = pytest.mark.integration

FLIGHTS = 40_000
PARTITIONS = 4
PER_TRIGGER = 5_000
HELD_BATCH = 2
KEYSHIFT = str(Path(sys.executable).parent / "keyshift")
KEY_MODE = ["--watermark", "key", "--bound-ms", "60000"]


@pytest.fixture(scope="module")
def topic(stack_settings):
    from keyshift.data.replay import replay_flights
    from keyshift.topics import create_topics, delete_topics

    name = f"it-ops-{uuid.uuid4().hex[:8]}"
    create_topics(stack_settings, [name], PARTITIONS)
    replay_flights(stack_settings, name, limit=FLIGHTS, strategy="hash", partitions=PARTITIONS, progress=False)
    yield name
    delete_topics(stack_settings, [name])


@pytest.fixture(scope="module")
def reference(stack_settings):
    from keyshift.data.flights import flights_path
    from keyshift.quality.reference import reference_windows

    return reference_windows(flights_path(stack_settings), limit=FLIGHTS)


def _job(topic: str, run_id: str, *extra: str) -> list[str]:
    return [KEYSHIFT, "job", "run", "flight_delays", "--topic", topic, "--run-id", run_id, "--partitions", str(PARTITIONS),
            "--max-offsets-per-trigger", str(PER_TRIGGER), "--starting", "earliest", "--no-progress", *KEY_MODE, *extra]


def _ctrl_c(process: subprocess.Popen) -> None:
    """SIGINT to the driver's whole process group, as a terminal's Ctrl-C."""
    os.killpg(process.pid, signal.SIGINT)


def _ctrl_c_stops_cleanly(process: subprocess.Popen, out: Path, run_dir: Path) -> dict:
    """Ctrl-C, then: exit status 0, the stop said so with no cancelled job, and the summary written."""
    _ctrl_c(process)
    assert _ended(process, out) == 0, out.read_text()[-3000:]
    _assert_clean_stop(out)
    return json.loads((run_dir / "summary.json").read_text())


def _ended(process: subprocess.Popen, out: Path, timeout_s: float = 180) -> int:
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail(f"the driver did not end within {timeout_s} s: {out.read_text()[-3000:]}")


def _kill(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def _commits(checkpoint: Path) -> list[int]:
    folder = checkpoint / "commits"
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.exists() else []


def _progress(run_dir: Path) -> list[dict]:
    from keyshift.runs import read_jsonl

    return read_jsonl(run_dir / "progress.jsonl")


def _run_state(settings, run_id: str) -> str | None:
    from keyshift.names import redis_run_key
    from keyshift.runs import redis_client

    return redis_client(settings).hget(redis_run_key(run_id), "state")


def _assert_clean_stop(out: Path) -> None:
    text = out.read_text()
    assert "stopping at the next batch boundary" in text, text[-3000:]
    for symptom in ("SPARK_JOB_CANCELLED", "cancellation of all jobs", "Traceback", "KeyboardInterrupt"):
        assert symptom not in text, f"{symptom!r} in the driver's output: {text[-3000:]}"


def _reconciled(summary: dict) -> bool:
    return summary["reconciled"] and summary["events_read"] == (summary["sum_window_counts"] + summary["late_events"]
                                                                + summary["dead_letters"] + summary["filtered_events"]
                                                                + summary["pending_events"])


def test_ctrl_c_during_a_batch_stops_at_its_boundary_and_a_resume_continues_exactly(stack_settings, topic, reference, tmp_path):
    from keyshift.quality.reference import compare_to_reference

    run_id = f"{topic}-mid"
    run_dir = stack_settings.runs_dir / run_id
    out = tmp_path / "first.out"
    process = start(_job(topic, run_id, "--limit", str(FLIGHTS)), out, failpoint=f"sink.hold_after_outputs@{HELD_BATCH}")
    try:
        wait_for((run_dir / "batches" / f"{HELD_BATCH:08d}.json").exists, process, 300, f"batch {HELD_BATCH} in the sink")
        assert HELD_BATCH not in _commits(run_dir / "checkpoint"), "batch 2 committed before the Ctrl-C: not during a batch"
        summary = _ctrl_c_stops_cleanly(process, out, run_dir)
    finally:
        _kill(process)
    assert _commits(run_dir / "checkpoint")[-1] == HELD_BATCH, "the batch in flight was not let finish, or one more ran"
    assert _reconciled(summary) and 0 < summary["events_read"] < FLIGHTS, summary
    assert _run_state(stack_settings, run_id) == "stopped"
    stopped_at = summary["events_read"]

    out = tmp_path / "resume.out"
    process = start([KEYSHIFT, "job", "run", "--resume", run_id, "--no-progress"], out)
    try:
        assert _ended(process, out, 600) == 0, out.read_text()[-3000:]
    finally:
        _kill(process)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert _reconciled(summary) and summary["events_read"] == FLIGHTS and summary["pending_events"] == 0, summary
    assert summary["late_events"] == 0 and summary["dead_letters"] == 0
    comparison = compare_to_reference(run_dir / "windows", reference)
    assert comparison["equal"], comparison
    assert _run_state(stack_settings, run_id) == "succeeded"
    # each attempt's own events and seconds; the run's rate is all its events over all its seconds
    attempts = summary["attempts"]
    assert [a["attempt"] for a in attempts] == [0, 1], attempts
    assert attempts[0]["events"] == stopped_at and attempts[1]["events"] == FLIGHTS - stopped_at, attempts
    assert all(a["seconds"] > 0 for a in attempts), attempts
    total = sum(a["seconds"] for a in attempts)
    assert summary["wall_seconds"] == pytest.approx(total, abs=0.01)
    assert summary["events_per_second"] == pytest.approx(FLIGHTS / total, rel=1e-3)
    assert summary["attempt_events_per_second"] == pytest.approx((FLIGHTS - stopped_at) / attempts[1]["seconds"], rel=1e-3)
    assert "in 2 attempts" in out.read_text()  # the printed table says so


def test_ctrl_c_between_batches_stops_with_a_summary(stack_settings, topic, tmp_path):
    run_id = f"{topic}-idle"
    run_dir = stack_settings.runs_dir / run_id
    out = tmp_path / "idle.out"
    process = start(_job(topic, run_id), out)  # continuous: it reads the topic, then waits for more
    try:
        wait_for(lambda: (p := _progress(run_dir)) and p[-1]["events_read"] == FLIGHTS, process, 300, "every record read")
        seen = []  # no new records: once no batch (not even Spark's no-data batch) came for 3 s, the query is between batches
        wait_for(lambda: seen.append(len(_progress(run_dir))) or (len(seen) > 15 and seen[-1] == seen[-16]), process, 120,
                 "the query to go quiet")
        summary = _ctrl_c_stops_cleanly(process, out, run_dir)
    finally:
        _kill(process)
    assert _reconciled(summary) and summary["events_read"] == FLIGHTS, summary
    assert _run_state(stack_settings, run_id) == "stopped"


def test_a_second_ctrl_c_stops_at_once(stack_settings, topic, tmp_path):
    run_id = f"{topic}-twice"
    run_dir = stack_settings.runs_dir / run_id
    out = tmp_path / "twice.out"
    process = start(_job(topic, run_id), out, failpoint=f"sink.hold_after_outputs@{HELD_BATCH}")
    try:
        wait_for((run_dir / "batches" / f"{HELD_BATCH:08d}.json").exists, process, 300, f"batch {HELD_BATCH} in the sink")
        _ctrl_c(process)
        time.sleep(1)
        _ctrl_c(process)
        assert _ended(process, out, 60) == 130, out.read_text()[-3000:]
    finally:
        _kill(process)
    text = out.read_text()
    assert "Ctrl-C again: stopping at once" in text and f"--resume {run_id}" in text, text[-3000:]
    assert not (run_dir / "summary.json").exists()


def test_a_bounded_run_on_a_live_feed_reads_while_the_feed_runs(stack_settings, tmp_path):
    from keyshift.quality.reference import compare_to_reference, reference_windows
    from keyshift.data.flights import flights_path
    from keyshift.topics import create_topics, delete_topics

    flights, rate = 60_000, 2_500  # a feed of 24 s
    topic = run_id = f"it-live-{uuid.uuid4().hex[:8]}"
    run_dir = stack_settings.runs_dir / run_id
    create_topics(stack_settings, [topic], PARTITIONS)
    out = tmp_path / "live.out"
    job = start(_job(topic, run_id, "--limit", str(flights)), out)
    feed = None
    try:
        wait_for(lambda: "holds 0 of the run's" in out.read_text(), job, 120, "the driver to look at the empty topic")
        feed_out = tmp_path / "feed.out"
        with feed_out.open("w") as feed_log:
            feed = subprocess.Popen([KEYSHIFT, "replay", "flights", "--topic", topic, "--limit", str(flights), "--rate", str(rate),
                                     "--strategy", "hash", "--partitions", str(PARTITIONS), "--no-progress"],
                                    stdout=feed_log, stderr=subprocess.STDOUT, start_new_session=True)
        assert feed.wait(timeout=300) == 0, feed_out.read_text()[-3000:]
        feed_done = time.time()
        assert _ended(job, out, 600) == 0, out.read_text()[-3000:]
    finally:
        _kill(job)
        if feed is not None and feed.poll() is None:
            os.killpg(feed.pid, signal.SIGKILL)
        delete_topics(stack_settings, [topic])
    progress = _progress(run_dir)
    during = [p for p in progress if p["written_at"] < feed_done and p["input_rows"] > 0]
    assert len(during) >= 2, f"{len(during)} batches with records completed while the feed ran: the run waited for it"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert _reconciled(summary) and summary["events_read"] == flights and summary["late_events"] == 0, summary
    assert sum(int(o) for o in summary["end_offsets"].values()) == flights
    job_record = json.loads((run_dir / "job.json").read_text())
    assert job_record["config"]["input"]["end_offsets"] == {str(p): o for p, o in summary["end_offsets"].items()}
    comparison = compare_to_reference(run_dir / "windows", reference_windows(flights_path(stack_settings), limit=flights))
    assert comparison["equal"], comparison
