"""`keyshift job run --resume RUN_ID` takes the job from the run's `job.json`: naming another job
is refused before anything starts (no services needed)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from keyshift.cli.job import command as job_command


def _started_run(runs_dir, run_id: str, job: str) -> None:
    (runs_dir / run_id).mkdir(parents=True)
    (runs_dir / run_id / "job.json").write_text(json.dumps({"config": {"run_id": run_id, "job": job}, "start_offsets": {}}))


def test_resume_refuses_another_jobs_name(tmp_path, monkeypatch):
    monkeypatch.setenv("KEYSHIFT_RUNS_DIR", str(tmp_path))
    _started_run(tmp_path, "r-ysb", "ysb")
    outcome = CliRunner().invoke(job_command, ["run", "flight_delays", "--resume", "r-ysb"])
    assert outcome.exit_code == 2
    assert "runs job ysb, not flight_delays" in outcome.output and "keyshift job run --resume r-ysb" in outcome.output
