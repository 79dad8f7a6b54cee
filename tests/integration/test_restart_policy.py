"""The restart policy of a detached continuous run (Flink's fixed-delay restart strategy), for real.

Every run goes through `launch.launch_job`: a real supervisor process (`python -m
keyshift.orchestration.supervisor`) runs a real `spark-submit` driver in its own process group,
the run record lives in the real Redis, and `JobProgressTrigger` watches it as the triggerer would.

| test | driver | what must happen |
| --- | --- | --- |
| `test_killed_driver_restarts_from_checkpoint_and_reconciles` | the flight delay job on a fresh topic | `kill -9` of the driver's process group after a few batches: restarted with `--resume`, the record and the watch show the restart, progress goes on, and after `stop_job` the summary reconciles with every event of the topic read once |
| `test_driver_dying_every_time_fails_the_run_naming_the_log` | the flight delay job with `KEYSHIFT_FAILPOINT=sink.before_batch@0` | `max_restarts=1`: two deaths, the run ends `failed`, the trigger event and the sensor name the driver log |
| `test_stand_in_past_the_limit_counts_every_attempt` | a Python stand-in that exits 3 | `max_restarts=2`: exactly 3 attempts, 2 restarts recorded with their exit codes |
| `test_stop_during_the_delay_restarts_nothing` | a Python stand-in, killed | a stop during the restart delay ends the run `stopped` with no new driver |

The Spark tests write the seconds from the kill to the resumed driver's first new batch, and the
reconciliation figures, to `restart.json` in the test's tmp folder (and print them).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest

from keyshift import names
from keyshift.orchestration import launch, pipeline
from keyshift.orchestration.supervisor import RestartPolicy
from keyshift.orchestration.triggers import JobProgressTrigger
from keyshift.settings import Settings

pytestmark = pytest.mark.integration

PARTITIONS = 2
EVENTS = 24_000
PER_TRIGGER = 3_000  # eight batches of real flights: room to kill after a few and see more after

STAND_IN = """\
import os, sys, time
from pathlib import Path
args = sys.argv[1:]
run_id = args[args.index("--resume") + 1] if "--resume" in args else args[args.index("--run-id") + 1]
(Path(os.environ["KEYSHIFT_RUNS_DIR"]) / run_id / "checkpoint" / "offsets").mkdir(parents=True, exist_ok=True)
print("stand-in driver", os.getpid(), args, flush=True)
if os.environ.get("STAND_IN_EXIT"):  # fail as the job does: an error in the run record, a non-zero exit
    time.sleep(2)
    from keyshift.names import redis_run_key
    from keyshift.runs import redis_client
    from keyshift.settings import Settings
    redis_client(Settings()).hset(redis_run_key(run_id), mapping={"state": "failed", "error": f"stand-in {os.getpid()} failed"})
    sys.exit(int(os.environ["STAND_IN_EXIT"]))
time.sleep(600)
"""


# ---------------------------------------------------------------- helpers


@pytest.fixture
def run_settings(stack_settings, tmp_path) -> Settings:
    """The stack's settings with a private runs folder (handed to the supervisor and driver)."""
    return stack_settings.model_copy(update={"runs_dir": tmp_path / "runs"})


@pytest.fixture
def run_id(run_settings):
    settings = run_settings
    run_id = f"it-restart-{uuid.uuid4().hex[:8]}"
    yield run_id
    launch.stop_job(settings, run_id, timeout_s=30)
    from keyshift.runs import redis_client

    client = redis_client(settings)
    client.delete(names.redis_run_key(run_id), names.redis_progress_key(run_id))
    client.close()


@pytest.fixture
def topic(run_settings):
    """A fresh input topic of PARTITIONS partitions, deleted afterwards."""
    from keyshift.topics import create_topics, delete_topics

    name = f"it-restart-{uuid.uuid4().hex[:8]}"
    create_topics(run_settings, [name], PARTITIONS)
    yield name
    delete_topics(run_settings, [name])


class Watch:
    """`JobProgressTrigger.run()` in a thread of its own until its first event (the triggerer's part)."""

    def __init__(self, settings: Settings, run_id: str, topic: str = names.FLIGHTS_TOPIC) -> None:
        self.trigger = JobProgressTrigger(run_id=run_id, settings=settings.model_dump(mode="json"), topic=topic,
                                          poll_interval=0.5, start_grace_s=30.0)
        self.event = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        async def first():
            async for event in self.trigger.run():
                return event

        self.event = asyncio.run(first())

    def result(self, timeout_s: float) -> dict:
        self.thread.join(timeout_s)
        assert self.event is not None, f"the trigger fired no event within {timeout_s} s"
        return self.event.payload


def _wait(predicate, timeout_s: float, what: str, interval_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _latest(settings: Settings, run_id: str) -> dict | None:
    from keyshift.runs import redis_client

    client = redis_client(settings)
    try:
        latest = client.hget(names.redis_progress_key(run_id), "latest")
    finally:
        client.close()
    return json.loads(latest) if latest else None


def _progress_lines(settings: Settings, run_id: str) -> int:
    path = pipeline.run_dir(settings, run_id) / "progress.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _logged(capfd, caplog) -> str:
    return capfd.readouterr().out + caplog.text  # Airflow's structlog writes to stdout


# ---------------------------------------------------------------- the flight delay job


def test_killed_driver_restarts_from_checkpoint_and_reconciles(run_settings, run_id, topic, tmp_path, capfd, caplog):
    settings = run_settings
    from keyshift.stack import process

    replayed = pipeline.replay(settings, EVENTS, None, "hash", PARTITIONS, topic=topic)
    assert replayed["events_produced"] == EVENTS
    job = launch.launch_job(settings, run_id, strategy="hash", partitions=PARTITIONS, bound_ms=3_600_000, topic=topic,
                            max_offsets_per_trigger=PER_TRIGGER, policy=RestartPolicy(max_restarts=3, restart_delay_s=2))
    log_path = job.log_path
    with caplog.at_level("INFO"):
        watch = Watch(settings, run_id, topic)
        _wait(lambda: (_latest(settings, run_id) or {}).get("batch_id", -1) >= 2, 400, f"batch 2; see {log_path}")

        driver = launch.driver_record(settings, run_id)
        batch_at_kill, lines_at_kill = _latest(settings, run_id)["batch_id"], _progress_lines(settings, run_id)
        os.killpg(driver.pid, signal.SIGKILL)  # the driver's whole group: spark-submit JVM, Python driver, workers
        killed_at = time.monotonic()

        _wait(lambda: _progress_lines(settings, run_id) > lines_at_kill, 400, f"a batch of the restarted driver; see {log_path}")
        first_new_batch_s = time.monotonic() - killed_at
        record = launch.read_run_record(settings, run_id)
        restarted = launch.driver_record(settings, run_id)
        assert restarted is not None and restarted.pid != driver.pid
        assert restarted.argv[-2:] == ("--resume", run_id), restarted.argv
        assert launch.supervisor_record(settings, run_id).pid == job.supervisor_pid  # the supervisor survived
        assert record["restarts"] == "1" and record["attempt"] == "2" and record["resumes"] == "1", record
        (entry,) = json.loads(record["restart_history"])
        assert entry["restart"] == 1 and entry["signal"] == signal.SIGKILL and entry["exit_code"] is None
        assert entry["from"] == "checkpoint" and entry["log_path"] == str(log_path)

        # progress goes on until the whole topic is read, then the run is stopped on request
        _wait(lambda: sum((_latest(settings, run_id) or {}).get("offsets", {}).values()) >= EVENTS, 600,
              f"the restarted driver to read all {EVENTS} events; see {log_path}")
        assert _latest(settings, run_id)["batch_id"] > batch_at_kill
        assert launch.stop_job(settings, run_id, timeout_s=120)
        event = watch.result(120)
    logged = _logged(capfd, caplog)

    assert event["status"] == "succeeded", event
    assert event["restarts"] == 1 and event["restart_history"][0]["signal"] == signal.SIGKILL
    assert "driver died (signal 9), restart 1 of 3 in 2 s from its checkpoint" in logged
    assert launch.supervisor_record(settings, run_id) is None and launch.driver_record(settings, run_id) is None
    record = launch.read_run_record(settings, run_id)
    assert record["state"] == "stopped" and record["restarts"] == "1", record

    summary = pipeline.read_summary(settings, run_id)
    assert pipeline.summary_problems(summary, run_id=run_id, complete=False) == [], summary
    assert summary["events_read"] == EVENTS  # each event of the topic read once across both drivers
    assert summary["resumes"] == 1
    text = Path(log_path).read_text(errors="replace")
    assert text.count("==== keyshift starting driver") == 2 and f"--resume {run_id}" in text
    assert "==== keyshift supervisor" in text and "restart 1 of 3" in text
    assert process.log_file(pipeline.run_dir(settings, run_id), "supervisor").is_file()
    figures = {
        "kill_to_first_new_batch_s": round(first_new_batch_s, 1), "batch_at_kill": batch_at_kill,
        "events_read": summary["events_read"], "sum_window_counts": summary["sum_window_counts"],
        "late_events": summary["late_events"], "dead_letters": summary["dead_letters"],
        "pending_events": summary["pending_events"], "batches": summary["batches"],
    }
    (tmp_path / "restart.json").write_text(json.dumps(figures, indent=1))
    print("restart figures", json.dumps(figures))


def test_driver_dying_every_time_fails_the_run_naming_the_log(run_settings, run_id, topic, monkeypatch, capfd, caplog):
    settings = run_settings
    from airflow.sdk.exceptions import AirflowException

    from keyshift.orchestration.sensors import JobProgressSensor

    pipeline.replay(settings, 2 * PER_TRIGGER, None, "hash", PARTITIONS, topic=topic)
    monkeypatch.setenv("KEYSHIFT_FAILPOINT", "sink.before_batch@0")  # the driver kills its group at batch 0, every time
    job = launch.launch_job(settings, run_id, strategy="hash", partitions=PARTITIONS, bound_ms=3_600_000, topic=topic,
                            max_offsets_per_trigger=PER_TRIGGER, policy=RestartPolicy(max_restarts=1, restart_delay_s=1))
    with caplog.at_level("INFO"):
        event = Watch(settings, run_id, topic).result(400)
    logged = _logged(capfd, caplog)

    log_path = str(job.log_path)
    assert event["status"] == "failed", event
    assert log_path in event["message"] and "max_restarts=1" in event["message"], event["message"]
    assert "signal 9" in event["message"]
    assert event["restarts"] == 1
    assert "driver died (signal 9), restart 1 of 1 in 1 s from its checkpoint" in logged
    record = launch.read_run_record(settings, run_id)
    assert record["state"] == "failed" and record["attempt"] == "2" and record["resumes"] == "1", record
    assert launch.supervisor_record(settings, run_id) is None and launch.driver_record(settings, run_id) is None
    with pytest.raises(AirflowException) as failure:  # what the watch task does with that event
        JobProgressSensor(task_id="watch_job", run_id=run_id).execute_complete({}, event)
    assert log_path in str(failure.value) and "restarted 1 time" in str(failure.value)
    text = Path(log_path).read_text(errors="replace")
    assert text.count("==== keyshift starting driver") == 2 and f"--resume {run_id}" in text


# ---------------------------------------------------------------- the supervisor with a stand-in driver


def _stand_in(tmp_path: Path) -> Path:
    app = tmp_path / "stand_in.py"
    app.write_text(STAND_IN)
    return app


def test_stand_in_past_the_limit_counts_every_attempt(run_settings, run_id, tmp_path, monkeypatch):
    settings = run_settings
    monkeypatch.setenv("STAND_IN_EXIT", "3")
    job = launch.launch_job(settings, run_id, strategy="hash", partitions=2, bound_ms=1000, application=_stand_in(tmp_path),
                            policy=RestartPolicy(max_restarts=2, restart_delay_s=0.5), startup_check_s=0.5)
    event = Watch(settings, run_id).result(120)
    # each attempt records `failed` as it dies; the watch ends only on the supervisor's final one
    assert event["status"] == "failed" and str(job.log_path) in event["message"], event
    assert event["restarts"] == 2 and "max_restarts=2" in event["message"], event
    record = launch.read_run_record(settings, run_id)
    history = json.loads(record["restart_history"])
    assert record["state"] == "failed" and record["restarts"] == "2" and record["attempt"] == "3", record
    assert [(e["restart"], e["exit_code"], e["signal"]) for e in history] == [(1, 3, None), (2, 3, None)]
    assert all(e["error"].startswith("stand-in ") for e in history)  # each dead attempt's own error, kept
    assert "exit code 3" in record["error"] and "attempt 3 of 3" in record["error"]  # the run's: the supervisor's
    assert Path(job.log_path).read_text().count("==== keyshift starting driver") == 3


def test_stop_during_the_delay_restarts_nothing(run_settings, run_id, tmp_path):
    settings = run_settings
    job = launch.launch_job(settings, run_id, strategy="hash", partitions=2, bound_ms=1000, application=_stand_in(tmp_path),
                            policy=RestartPolicy(max_restarts=3, restart_delay_s=120), startup_check_s=0.5)
    os.killpg(job.pid, signal.SIGKILL)
    _wait(lambda: launch.read_run_record(settings, run_id).get("state") == "restarting", 30, "the supervisor's restart record")
    assert launch.stop_job(settings, run_id, timeout_s=10)
    supervisor_log = Path(job.log_path).parent / "supervisor.log"
    assert "stopped on request; supervisor done" in supervisor_log.read_text()  # it ended the delay itself
    record = launch.read_run_record(settings, run_id)
    assert record["state"] == "stopped" and record["restarts"] == "1" and record["attempt"] == "1", record
    assert launch.supervisor_record(settings, run_id) is None and launch.driver_record(settings, run_id) is None
    assert Path(job.log_path).read_text().count("==== keyshift starting driver") == 1
