"""A switch asked of a run whose query has not started yet is refused cleanly (issue 33, point 3).

A bounded run started with `--wait-for-input` waits, alive, until its topic holds `--limit`
records; only then does it write `runs/<run_id>/job.json` and start its query. A switch asked
meanwhile (the balance monitor's, through the `keyshift_switch` DAG) used to fail with
`ConfigurationError: run '…' has no job record in runs/…; is it a started run of a keyshift
job?`, which is untrue and failed the DAG task. Now `request_switch` raises `SwitchNotReady`
saying the run has not started its query yet and that nothing was switched, writes nothing to
Redis (no switch record, no lock), `keyshift switch` exits 75 (EX_TEMPFAIL) with that message
and no traceback, and the DAG task's `carry_out` raises AirflowSkipException (the task is
skipped, not failed). Once the driver is stopped before its query started, the run has ended and
a switch gets a ConfigurationError saying so; an unknown run gets one saying it is unknown.

The driver here is a real `keyshift job run` process on a fresh topic that holds 20 of the 1,000
records its `--limit` asks for.
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid

import pytest
from kafka import KafkaProducer

from flight_runs import KEYSHIFT, PARTITIONS, start, wait_for

pytestmark = pytest.mark.integration

LIMIT = 1_000
WRITTEN = 20
NOT_READY = "has not started its query yet"


def _redis_holds_nothing_for(settings, run_id: str) -> None:
    """No switch record, lock or history of `run_id` in Redis: the refused request left nothing."""
    from keyshift import names
    from keyshift.migration.switch import SwitchControl

    control = SwitchControl.from_settings(settings, run_id)
    assert control.pending() is None and control.current() is None
    assert control.client.get(names.redis_switch_lock_key(run_id)) is None
    assert control.history() == []


def test_a_switch_before_the_query_starts_is_refused_cleanly(stack_settings, tmp_path):
    from airflow.sdk.exceptions import AirflowSkipException

    from keyshift import names
    from keyshift.errors import ConfigurationError, SwitchNotReady
    from keyshift.kafka_clients import client_options
    from keyshift.migration.switch import request_switch
    from keyshift.runs import read_run_record
    from keyshift.orchestration.switching import carry_out, record_request
    from keyshift.runs import redis_client as control_client
    from keyshift.topics import create_topics

    topic = run_id = f"it-switch-{uuid.uuid4().hex[:8]}-early"
    run_dir = stack_settings.runs_dir / run_id
    create_topics(stack_settings, [topic], PARTITIONS)
    producer = KafkaProducer(bootstrap_servers=stack_settings.bootstrap_servers, acks="all", **client_options(stack_settings))
    for i in range(WRITTEN):  # fewer than the limit: the run waits for the rest
        producer.send(topic, key=b"ORD", value=b"not json at all", partition=i % PARTITIONS)
    producer.flush()
    producer.close()

    driver_log = tmp_path / "driver.log"
    process = start([KEYSHIFT, "job", "run", "flight_delays", "--topic", topic, "--run-id", run_id, "--limit", str(LIMIT),
                     "--partitions", str(PARTITIONS), "--starting", "earliest", "--wait-for-input", "--no-progress"], driver_log)
    try:
        def waiting() -> bool:
            record = read_run_record(stack_settings, run_id)
            return record.get("state") == "running" and record.get("pid") == str(process.pid)

        wait_for(waiting, process, 300, "the run record of the waiting driver")
        assert not (run_dir / "job.json").exists(), "the driver wrote its job record: its query is starting, nothing to test"

        # the function behind `keyshift switch` and the DAG
        with pytest.raises(SwitchNotReady) as refused:
            request_switch(stack_settings, run_id, "least_count", reason="test: switch before the query", wait_timeout_s=30)
        message = str(refused.value)
        assert message.startswith(f"run {run_id} {NOT_READY}"), message
        assert "waiting for records" in message and repr(topic) in message and "nothing was switched" in message, message
        assert "has no job record" not in message, message
        _redis_holds_nothing_for(stack_settings, run_id)

        # the command: the message, exit status 75, no traceback
        done = subprocess.run([KEYSHIFT, "switch", "--run", run_id, "--strategy", "least_count"], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 75, (done.returncode, done.stderr[-3000:])
        assert f"error: run {run_id} {NOT_READY}" in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]
        _redis_holds_nothing_for(stack_settings, run_id)

        # the DAG's switch task: skipped, not failed
        request = {"run_id": run_id, "strategy": "least_count", "partitions": PARTITIONS, "partitions_from": PARTITIONS,
                   "strategy_from": "hash", "reason": "test: switch before the query"}
        with pytest.raises(AirflowSkipException, match=NOT_READY) as skipped:
            carry_out(stack_settings, request, wait_timeout_s=30)
        assert isinstance(skipped.value.__cause__, SwitchNotReady)
        _redis_holds_nothing_for(stack_settings, run_id)
        # the DAG's first task (what the monitor triggers): skipped too, and no request recorded
        requests_key = names.redis_switch_requests_key(topic)
        before = control_client(stack_settings).llen(requests_key)
        with pytest.raises(AirflowSkipException, match=NOT_READY):
            record_request(stack_settings, {"run_id": run_id, "topic": topic, "strategy": "least_count",
                                            "reason": "test: switch before the query", "trigger": "cost_aware"})
        assert control_client(stack_settings).llen(requests_key) == before

        assert process.poll() is None, "the refusals must leave the waiting driver alone"
        assert not (run_dir / "job.json").exists()

        # stopped before its query started, the run has ended: nothing will ever be there to switch
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=120)
        assert read_run_record(stack_settings, run_id).get("state") != "running"
        with pytest.raises(ConfigurationError, match=rf"run {run_id} ended \(state '\w+'.*before it started its query"):
            request_switch(stack_settings, run_id, "least_count", wait_timeout_s=30)
        with pytest.raises(ConfigurationError, match="is unknown: no job record"):
            request_switch(stack_settings, f"it-no-such-run-{uuid.uuid4().hex[:8]}", "least_count", wait_timeout_s=30)
        _redis_holds_nothing_for(stack_settings, run_id)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)  # its own session: the driver and anything it started
                process.wait(timeout=30)
