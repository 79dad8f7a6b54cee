"""The run record's typed form (`keyshift.runs.RunRecord`): what the launcher, the supervisor and
the job write, read back with types; a name no writer declared is refused."""

from __future__ import annotations

import pytest

from keyshift.runs import RunRecord


def test_the_launchers_record_reads_back_typed():
    # what `launch_job` writes when a continuous run starts, then the job's and the supervisor's fields
    stored = RunRecord.encode(
        run_id="r1", state="starting", log_path="/x/driver.log", job="flight_delays", strategy="hash", partitions=8,
        bound_ms=60_000, watermark="key", limit="", topic="flights", started_at="2026-11-28T10:00:00+00:00",
        host="h", max_restarts=3, restart_delay_s=5.0, restarts=0, restart_history=[], attempt=0,
    )
    assert stored["partitions"] == "8" and stored["limit"] == "" and stored["restart_history"] == "[]"
    stored.update(RunRecord.encode(state="running", pid=4242, started_at=1_795_860_000.5, epoch=2, segment=1,
                                   restart_history=[{"restart": 1, "exit_code": -9}], summary_path=None))
    record = RunRecord.from_redis({**stored, "someone_elses": "x"})
    assert record.state == "running" and record.active and record.pid == 4242
    assert (record.partitions, record.epoch, record.segment, record.bound_ms, record.limit) == (8, 2, 1, 60_000, None)
    assert record.restart_history == ({"restart": 1, "exit_code": -9},) and record.restarts == 0
    assert record.summary_path is None and record.restart_delay_s == 5.0
    assert record.started_at == "1795860000.5"
    assert RunRecord.from_redis({"limit": "3000000", "bound_ms": "60000.0", "pid": "x"}).limit == 3_000_000
    assert RunRecord.from_redis({"bound_ms": "60000.0", "pid": "x"}).bound_ms == 60_000


def test_an_empty_or_partial_record_has_no_values():
    record = RunRecord.from_redis({"run_id": "r1", "state": "succeeded", "pid": "", "restarts": "x"})
    assert record.pid is None and record.restarts == 0 and not record.active and record.partitions is None


def test_a_field_no_writer_declared_is_refused():
    with pytest.raises(ValueError, match="not fields of a run record: \\['stat'\\]"):
        RunRecord.encode(stat="running")
