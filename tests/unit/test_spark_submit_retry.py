"""`JobSparkSubmitOperator`'s pure parts: which arguments a try submits, and what a failure says."""

from __future__ import annotations

from keyshift.names import RunDir
from keyshift.orchestration.spark_submit import attempt_args, failure_message

NEW_RUN = ["--run-id", "r1", "--strategy", "hash", "--partitions", "8", "--limit", "20000"]


def test_the_first_try_submits_a_new_run(tmp_path):
    run_dir = tmp_path / "r1"
    (RunDir(run_dir).checkpoint() / "offsets").mkdir(parents=True)  # even with a checkpoint: try 1 is what was asked
    assert attempt_args(NEW_RUN, "r1", 1, run_dir) == NEW_RUN


def test_a_retry_resumes_a_run_that_has_a_checkpoint(tmp_path):
    run_dir = tmp_path / "r1"
    (RunDir(run_dir).checkpoint() / "offsets").mkdir(parents=True)
    assert attempt_args(NEW_RUN, "r1", 2, run_dir) == ["--resume", "r1"]


def test_a_retry_starts_again_a_run_that_failed_before_its_query_started(tmp_path):
    run_dir = tmp_path / "r1"
    run_dir.mkdir()  # the driver made its folder, then failed before Spark wrote an offset log
    assert attempt_args(NEW_RUN, "r1", 2, run_dir) == NEW_RUN


def test_a_failure_names_the_jobs_error_and_driver_log_first():
    message = failure_message("r1", {"error": "JobError: the query failed", "log_path": "/runs/r1/driver.log"},
                              "Cannot execute: spark-submit ... Error code is: 1.")
    assert message.startswith("run r1 failed: JobError: the query failed (driver log: /runs/r1/driver.log); Cannot execute")


def test_a_failure_without_a_recorded_error_says_what_the_record_shows():
    killed = failure_message("r1", {"state": "running", "pid": "42"}, "Error code is: 137.")
    assert killed == "run r1 failed (its record says 'running': the driver died without recording an error); Error code is: 137."
    never_started = failure_message("r1", {}, "Error code is: 1.")
    assert never_started == "run r1 failed (it has no run record); Error code is: 1."
