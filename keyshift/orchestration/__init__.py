"""Orchestration: what the Airflow DAGs (and the CLI) call to run a streaming job.

- `pipeline`: plain functions the `keyshift_pipeline` tasks call (provision topics, replay,
  spark-submit arguments, read and verify a run's summary).
- `launch`: the detached launch of a continuous job (a supervised driver process in its own
  session via `keyshift.stack.process`, its log under `runs/<run_id>/logs/driver.log`, its record
  in Redis) and its stop.
- `triggers`: `JobProgressTrigger`, the asynchronous watcher the triggerer runs.
- `sensors`: `JobProgressSensor`, the deferrable operator that hands the watch to the trigger.

Nothing here connects to anything at import time; the DAG file imports these modules while
Airflow parses it.
"""
