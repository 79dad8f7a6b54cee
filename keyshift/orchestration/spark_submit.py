"""`JobSparkSubmitOperator`: Airflow's SparkSubmitOperator for keyshift's jobs, on `local[*]` or a cluster.

Three things differ from the provider's operator:

* **A retry resumes the run.** Airflow retries a failed task (`retries` of the task, the pipeline
  DAG gives `spark_submit` one). A bounded run that failed after its query started has a
  checkpoint, and `spark-submit ... --run-id R` would refuse it ("already has a checkpoint"); a
  retry therefore submits `--resume R` instead (`attempt_args`), which continues the run exactly
  from its checkpoint, as the supervisor of a detached run does after its driver died
  (`keyshift.orchestration.supervisor`). A run that failed before any checkpoint starts again.
* **A failure names the job's own error.** When spark-submit exits non-zero the task fails with
  the run record's `error` (what the driver recorded, e.g. `JobError: ...`) and its driver log
  (`failure_message`), not only the last lines of spark-submit's output, which are often Spark's
  shutdown noise.
* **On a cluster master it runs in a driver folder.** The job ships its executors a packed
  environment and sets `spark.pyspark.python = ./environment/bin/python`
  (`keyshift.stack.executor_env`), a path relative to the working directory that the driver's own
  Python processes use too. This operator runs `spark-submit` in a folder where that path names
  the task's venv (`executor_env.driver_folder`), exactly as the supervisor of a continuous run
  does (`keyshift.orchestration.launch`). On a local master it keeps the task's folder.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator


def attempt_args(application_args: Sequence[str], run_id: str, try_number: int, run_dir: Path) -> list[str]:
    """The job's arguments for one try of the `spark_submit` task.

    Args:
        application_args: the rendered arguments of a new run (`pipeline.spark_submit_args`).
        run_id: the keyshift run id those arguments name (`--run-id`).
        try_number: Airflow's try number of the task instance (1 = the first try).
        run_dir: `runs/<run_id>/`.

    Returns:
        `application_args` on the first try, or on a retry of a run with no checkpoint (it failed
        before its query started: it starts again); `pipeline.resume_args(run_id)` on a retry of a
        run that has one (the driver's rule, `keyshift.processing.job_record.has_checkpoint`), so
        the retry continues the run exactly instead of being refused.
    """
    from keyshift.orchestration.pipeline import resume_args
    from keyshift.processing.job_record import has_checkpoint

    if try_number > 1 and has_checkpoint(run_dir):
        return resume_args(run_id)
    return [str(arg) for arg in application_args]


def failure_message(run_id: str, record: Mapping[str, str], spark_submit_error: str) -> str:
    """The task's error when spark-submit failed: the run record's error and driver log first.

    Args:
        run_id: the keyshift run id.
        record: the run's Redis record as stored (`keyshift.runs.read_run_record`; empty if none).
        spark_submit_error: the provider's own message (the spark-submit command and exit code).

    Returns:
        One text: `run R failed: <record error> (driver log: <path>); <provider message>`; when
        the driver recorded no error, `run R failed (its record says 'running': the driver died
        without recording an error); ...` (a kill -9, a lost JVM) or `run R failed (it has no run
        record); ...` (spark-submit failed before the job started).
    """
    error = record.get("error")
    if not error:
        state = record.get("state")
        seen = f"its record says {state!r}: the driver died without recording an error" if state else "it has no run record"
        return f"run {run_id} failed ({seen}); {spark_submit_error}"
    log_path = record.get("log_path") or "not recorded"
    return f"run {run_id} failed: {error} (driver log: {log_path}); {spark_submit_error}"


class JobSparkSubmitOperator(SparkSubmitOperator):
    """SparkSubmitOperator for a keyshift run: resumes on a retry, fails with the job's error, and
    runs `spark-submit` in a driver folder on a cluster master (module docstring).

    Args:
        run_id: the keyshift run id (templated; the pipeline DAG passes `"{{ job_run_id(run_id) }}"`),
            the `--run-id` of `application_args`.
        **kwargs: SparkSubmitOperator's arguments unchanged (`conn_id`, `application`, `jars`,
            `conf`, `application_args`, `retries`, ...). The master is the one keyshift's settings
            name (`KEYSHIFT_SPARK_MASTER`, which the stack also puts in the `spark_default`
            connection, `keyshift.stack.airflow`).

    Raises:
        AirflowException: spark-submit failed (`failure_message`); whatever else
            SparkSubmitOperator raises.
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "run_id")

    def __init__(self, *, run_id: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_id = run_id

    def execute(self, context: Any) -> Any:
        """Run spark-submit (the provider's `execute`) for this try; a failure names the job's error."""
        from airflow.sdk.exceptions import AirflowException

        from keyshift.errors import StackError
        from keyshift.runs import read_run_record
        from keyshift.settings import Settings

        settings = Settings()
        try_number = int(getattr(context.get("ti"), "try_number", 1) or 1)
        args = attempt_args(self.application_args or [], self.run_id, try_number, settings.runs_dir / self.run_id)
        if args != list(self.application_args or []):
            self.log.info("try %d: run %s has a checkpoint; resuming it (%s)", try_number, self.run_id, " ".join(args))
        self.application_args = args
        try:
            return self._submit(context, settings)
        except AirflowException as exc:
            try:
                record = read_run_record(settings, self.run_id)
            except StackError as unread:
                record = {"error": f"(run record not read: {unread})"}
            raise AirflowException(failure_message(self.run_id, record, str(exc))) from exc

    def _submit(self, context: Any, settings: Any) -> Any:
        """The provider's `execute`, in a driver folder on a cluster master."""
        from keyshift.stack.executor_env import driver_folder
        from keyshift.stack.spark import is_local_master

        if is_local_master(settings.spark_master):
            return super().execute(context)
        folder = driver_folder()
        self.log.info("spark-submit runs in %s: its environment/ is this venv, as the executors' is the shipped one", folder)
        previous = os.getcwd()
        os.chdir(folder)  # the task runs in a process of its own; the provider's Popen takes its cwd
        try:
            return super().execute(context)
        finally:
            os.chdir(previous)
