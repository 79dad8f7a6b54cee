"""kill -9 of the driver mid-run, then `keyshift job run … --resume RUN_ID`: exactly once.

200,000 real flights (plus 40 malformed records) are replayed into a fresh 8-partition topic and
run once without a fault (the oracle), in micro-batches of 20,000 records with a one-hour bound,
so the run has late events, dead letters and alerts in every side output. Then the same records,
each time in a fresh topic of its own with the same records at the same offsets (so that Spark
cuts the same micro-batches: a bounded run appends its end-of-input markers to its topic, which
would change how a later run's rate limit splits batches, hence its watermarks and late events),
are run four more times, each killed with SIGKILL of the driver's whole process group (Python
driver, JVM, Python workers) at a different point and resumed with `--resume`:

| fault | how it is hit |
| --- | --- |
| during a batch | from outside: batch 3 is in the offset log and not committed |
| between batches | failpoint `sink.before_batch@5`: batch 4 committed, batch 5 planned, nothing of it written |
| after a batch's outputs, before its commit | failpoint `sink.after_outputs@6`: windows file, Kafka transaction and ledger of batch 6 written; Spark replays batch 6 |
| during the final flush | from outside: the batch that reads the end-of-input markers and closes the last windows |

Each resumed run must end with the oracle's windows table, row by row, the oracle's counts, and
the oracle's alerts, late events and dead letters in Kafka, each exactly once for a
`read_committed` consumer. The seconds from the kill to the resumed run's first new batch are
written to the test's output folder.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from kafka import KafkaProducer

from keyshift.names import ALERTS_TOPIC, DEAD_LETTER_TOPIC, LATE_TOPIC
from keyshift.topics import read_committed

pytestmark = pytest.mark.integration

FLIGHTS = 200_000
PARTITIONS = 8
PER_TRIGGER = 20_000
KEYSHIFT = str(Path(sys.executable).parent / "keyshift")
COUNTS = ("events_read", "windows_emitted", "sum_window_counts", "alerts", "late_events",
          "dead_letters", "pending_events", "per_slot_events", "dead_letters_by_reason")


def _job_args(topic: str, run_id: str) -> list[str]:
    return [KEYSHIFT, "job", "run", "flight_delays", "--topic", topic, "--run-id", run_id, "--limit", str(FLIGHTS + 40),
            "--partitions", str(PARTITIONS), "--max-offsets-per-trigger", str(PER_TRIGGER), "--starting", "earliest",
            "--idle-timeout", "240"]


def _start(args: list[str], log: Path, failpoint: str | None = None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "KEYSHIFT_FAILPOINT"}
    if failpoint:
        env["KEYSHIFT_FAILPOINT"] = failpoint
    with log.open("ab") as out:  # own session: the kill takes the driver's group, not pytest
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _batch_ids(folder: Path) -> set[int]:
    return {int(p.name) for p in folder.iterdir() if p.name.isdigit()} if folder.exists() else set()


def _running_batch(checkpoint: Path) -> int | None:
    """A batch in the offset log that is not committed yet (the one running), or None."""
    running = _batch_ids(checkpoint / "offsets") - _batch_ids(checkpoint / "commits")
    return max(running) if running else None


def _wait(predicate, process: subprocess.Popen, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if process.poll() is not None:
            pytest.fail(f"the driver exited ({process.returncode}) before {what}")
        time.sleep(0.02)
    pytest.fail(f"timed out after {timeout_s} s waiting for {what}")


def _kill(process: subprocess.Popen) -> float:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    return time.monotonic()


def _side_outputs(settings, run_id: str) -> dict[str, Counter]:
    """Every record of the run in each side-output topic, as read_committed, run_id removed."""
    found = {}
    for topic in (ALERTS_TOPIC, LATE_TOPIC, DEAD_LETTER_TOPIC):
        records = Counter()
        for message in read_committed(settings, topic):
            value = json.loads(message.value)
            if value.pop("run_id", None) == run_id:
                records[json.dumps(value, sort_keys=True)] += 1
        found[topic] = records
    return found


def _windows(settings, run_id: str) -> pd.DataFrame:
    table = pd.read_parquet(settings.runs_dir / run_id / "windows")
    return table.sort_values(["origin", "window_start"]).reset_index(drop=True)


def _fresh_topic(stack_settings, label: str) -> str:
    """A new 8-partition topic holding the same records at the same offsets as every other."""
    from keyshift.data.replay import replay_flights
    from keyshift.topics import create_topics

    name = f"it-crash-{uuid.uuid4().hex[:8]}-{label}"
    create_topics(stack_settings, [name], PARTITIONS)
    producer = KafkaProducer(bootstrap_servers=stack_settings.bootstrap_servers, acks="all")
    for i in range(20):  # dead letters early and late in the stream
        producer.send(name, key=b"ORD", value=b"not json at all", partition=i % PARTITIONS)
    producer.flush()
    replay_flights(stack_settings, name, limit=FLIGHTS, strategy="hash", partitions=PARTITIONS, progress=False)
    for i in range(20):
        producer.send(name, key=b"ORD", value=b'{"event_id": 1, "origin": "ORD"}', partition=i % PARTITIONS)
    producer.flush()
    producer.close()
    return name


@pytest.fixture(scope="module")
def oracle(stack_settings, tmp_path_factory):
    """The run without a fault: summary, windows table and side outputs."""
    topic = _fresh_topic(stack_settings, "oracle")
    run_id = topic
    process = _start(_job_args(topic, run_id), tmp_path_factory.mktemp("oracle") / "driver.log")
    assert process.wait(timeout=900) == 0, f"the oracle run failed; see {stack_settings.runs_dir / run_id}"
    summary = json.loads((stack_settings.runs_dir / run_id / "summary.json").read_text())
    assert summary["reconciled"] and summary["events_read"] == FLIGHTS + 40
    assert summary["late_events"] > 0 and summary["alerts"] > 0 and summary["dead_letters"] == 40
    return {"summary": summary, "windows": _windows(stack_settings, run_id), "outputs": _side_outputs(stack_settings, run_id)}


def _assert_equals_the_oracle(settings, run_id: str, oracle) -> dict:
    """The run's counts, windows table (row by row) and side outputs (read_committed, each record
    exactly once) are the oracle's; returns its summary."""
    summary = json.loads((settings.runs_dir / run_id / "summary.json").read_text())
    assert summary["reconciled"]
    for count in COUNTS:
        assert summary[count] == oracle["summary"][count], count
    pd.testing.assert_frame_equal(_windows(settings, run_id), oracle["windows"])
    outputs = _side_outputs(settings, run_id)
    for topic_name, records in oracle["outputs"].items():
        assert outputs[topic_name] == records, f"{topic_name}: not the clean run's records exactly once"
    return summary


def _during_batch(checkpoint: Path, process: subprocess.Popen, log: Path) -> None:
    # one read of the checkpoint per poll: reading twice let the batch commit in between (None >= 3, a CI failure)
    _wait(lambda: (_running_batch(checkpoint) or -1) >= 3, process, 600, "batch 3 to run")


def _during_final_flush(checkpoint: Path, process: subprocess.Popen, log: Path) -> None:
    driver_log = checkpoint.parent / "driver.log"  # `keyshift job run` keeps its INFO lines in the run's log, off the terminal
    _wait(lambda: driver_log.exists() and "writing end-of-input markers" in driver_log.read_text(errors="replace"), process, 900,
          "the end-of-input markers")
    planned = max(_batch_ids(checkpoint / "offsets"))
    _wait(lambda: (_running_batch(checkpoint) or -1) > planned, process, 300, "the batch that reads the markers")


FAULTS = {
    "during_batch": (None, _during_batch),
    "between_batches": ("sink.before_batch@5", None),
    "after_outputs_before_commit": ("sink.after_outputs@6", None),
    "during_final_flush": (None, _during_final_flush),
}


SLOW_FAULTS = ("between_batches", "during_final_flush")
"""Kill points skipped by `make test` (the other two cover a crash inside a batch and between a
batch's outputs and its commit); `make test-all` runs all four."""


@pytest.mark.parametrize("fault", [pytest.param(f, marks=pytest.mark.slow) if f in SLOW_FAULTS else f for f in FAULTS])
def test_kill_9_then_resume_equals_the_clean_run(stack_settings, oracle, fault, tmp_path):
    failpoint, observe = FAULTS[fault]
    topic = run_id = _fresh_topic(stack_settings, fault.replace("_", "-"))
    run_dir = stack_settings.runs_dir / run_id
    log = tmp_path / "driver.log"
    process = _start(_job_args(topic, run_id), log, failpoint)
    if observe is not None:
        observe(run_dir / "checkpoint", process, log)
        killed_at = _kill(process)
    else:
        process.wait(timeout=900)
        killed_at = time.monotonic()
        assert process.returncode == -signal.SIGKILL, f"the failpoint did not fire; see {log}"
    assert not (run_dir / "summary.json").exists()
    batches_before = len(list((run_dir / "batches").glob("*.json")))

    # a reused run id without --resume is refused, naming the fix
    refused = subprocess.run(_job_args(topic, run_id), capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and f"--resume {run_id}" in refused.stderr

    resumed = _start([KEYSHIFT, "job", "run", "flight_delays", "--resume", run_id], log)
    progress = run_dir / "progress.jsonl"
    lines_before = len(progress.read_text().splitlines()) if progress.exists() else 0
    _wait(lambda: progress.exists() and len(progress.read_text().splitlines()) > lines_before, resumed, 600, "a new batch")
    resume_seconds = time.monotonic() - killed_at
    assert resumed.wait(timeout=900) == 0, f"the resumed run failed; see {log}"

    summary = _assert_equals_the_oracle(stack_settings, run_id, oracle)
    assert summary["resumes"] == 1
    (tmp_path / "resume.json").write_text(json.dumps({
        "fault": fault, "resume_seconds_to_first_new_batch": round(resume_seconds, 2),
        "batches_recorded_before_the_crash": batches_before, "events_read": summary["events_read"],
        "late_events": summary["late_events"], "dead_letters": summary["dead_letters"], "alerts": summary["alerts"],
    }))
    print(f"{fault}: resumed in {resume_seconds:.1f} s from the kill to the first new batch; "
          f"{batches_before} batches recorded before the crash; reconciled {summary['events_read']} events")


@pytest.mark.parametrize("service", ["kafka", pytest.param("redis", marks=pytest.mark.slow)])
def test_a_service_restarted_mid_run_costs_nothing(stack_settings, oracle, service, tmp_path):
    """`keyshift stack` stops the broker (or Redis) while batch 3 runs and starts it again 5 s
    later: the job waits, reconnects and ends with the oracle's table, counts and side outputs.
    With Redis, a learned assignment and its epoch survive (append-only file) and a producer that
    follows it (a replay with least_count, rate-limited to span the outage) finishes its replay."""
    import threading

    from keyshift import stack
    from keyshift.data.replay import replay_flights
    from keyshift.placement.assignment_store import AssignmentStore
    from keyshift.data.flights import flights_path
    from keyshift.placement.learning import learn_and_publish
    from keyshift.topics import create_topics, end_offsets

    topic = run_id = _fresh_topic(stack_settings, f"restart-{service}")
    producer_topic, produced, producer_errors = f"{topic}-producer", 30_000, []
    if service == "redis":
        create_topics(stack_settings, [producer_topic], PARTITIONS)
        learn_and_publish(stack_settings, producer_topic, "least_count", PARTITIONS, limit=produced,
                          flights=flights_path(stack_settings))
        before = AssignmentStore.from_settings(stack_settings, producer_topic).snapshot()
    log = tmp_path / "driver.log"
    process = _start(_job_args(topic, run_id), log)
    _during_batch(stack_settings.runs_dir / run_id / "checkpoint", process, log)
    if service == "redis":
        def replay() -> None:
            try:
                replay_flights(stack_settings, producer_topic, limit=produced, rate=2_000, strategy="least_count",
                               partitions=PARTITIONS, progress=False)
            except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                producer_errors.append(exc)

        producer = threading.Thread(target=replay)
        producer.start()
        time.sleep(3)
    assert stack.down(stack_settings, only=service) == [service]
    time.sleep(5)
    stack.up(stack_settings, only=service, timeout_s=120)
    assert process.wait(timeout=900) == 0, f"the job did not survive the {service} restart; see {log}"
    _assert_equals_the_oracle(stack_settings, run_id, oracle)
    if service == "redis":
        producer.join(timeout=300)
        assert not producer_errors, producer_errors
        assert sum(end_offsets(stack_settings, producer_topic).values()) == produced
        after = AssignmentStore.from_settings(stack_settings, producer_topic).snapshot()
        assert after["epoch"] == before["epoch"]  # keys new to the replay are added by the atomic assign;
        assert {key: after["mapping"][key] for key in before["mapping"]} == before["mapping"]  # none moved
