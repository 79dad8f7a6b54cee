"""Where a benchmarked run's time goes, from Spark's event log.

A bench child (`keyshift bench throughput`, `keyshift bench switch`) started with
`keyshift.bench.masters.child_env(settings, event_log_dir)` writes Spark's event log (`spark.eventLog.enabled`, the same
JSON-lines file the Spark history server reads) into a folder of its own; `breakdown` then sums
its task metrics. That is how the benches compare a `local[*]` run with the same run on a
standalone cluster (`--master spark://...`) and say where the difference goes:

* **executor start-up**: `executors_ready_seconds`, from the application's start to the last
  executor's registration (`SparkListenerExecutorAdded`); 0 on `local[*]`, whose one executor is
  the driver itself.
* **scheduling and task start**: `scheduler_delay_seconds`, each task's duration minus its
  deserialization, run, result serialization and result fetching (the Spark UI's "Scheduler
  Delay": launching the task, shipping it, sending its result back).
* **serialization**: `deserialize_seconds` (the task and its closure, on the executor) and
  `result_serialization_seconds`.
* **shuffle**: `shuffle_fetch_wait_seconds` (a task blocked on remote or local shuffle blocks),
  `shuffle_write_seconds`, and the bytes read from other executors (`shuffle_remote_bytes`)
  against those read locally (`shuffle_local_bytes`). On `local[*]` every block is local.
* **work**: `run_seconds` (executor run time, Python workers' time inside it), `cpu_seconds`
  (its CPU part) and `gc_seconds`.

Every figure sums over all successful and failed tasks of the run, in seconds of task time
(two tasks running at once for 1 s count 2 s). The metric names and units are Spark's
(`org.apache.spark.util.JsonProtocol`: times in ms, except the CPU and shuffle write times in ns).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from keyshift.errors import JobError

FIGURES = ("executors_ready_seconds", "task_seconds", "scheduler_delay_seconds", "deserialize_seconds", "run_seconds",
           "cpu_seconds", "gc_seconds", "result_serialization_seconds", "shuffle_fetch_wait_seconds",
           "shuffle_write_seconds", "shuffle_remote_bytes", "shuffle_local_bytes", "shuffle_written_bytes", "tasks", "jobs")
"""The keys of `breakdown`'s result, in the order a report lists them."""


def event_log_conf(event_log_dir: Path) -> dict[str, str]:
    """The Spark settings that write an uncompressed event log into `event_log_dir` (created),
    one folder per application (Spark 4's rolling layout; `breakdown` reads both layouts)."""
    event_log_dir.mkdir(parents=True, exist_ok=True)
    return {"spark.eventLog.enabled": "true", "spark.eventLog.dir": event_log_dir.resolve().as_uri(),
            "spark.eventLog.compress": "false"}


def _log_files(event_log_dir: Path) -> list[Path]:
    """The event-log files under `event_log_dir` in order: single-file logs (`<app id>`, or
    `<app id>.inprogress` of a driver that did not stop) and the parts of rolling ones
    (`eventlog_v2_<app id>/events_<n>_<app id>`, by n; Spark 4's default layout)."""
    if not event_log_dir.is_dir():
        return []
    files: list[Path] = []
    for entry in sorted(event_log_dir.iterdir()):
        if entry.is_dir():
            parts = [p for p in entry.iterdir() if p.is_file() and p.name.startswith("events_")]
            files += sorted(parts, key=lambda p: int(p.name.split("_")[1]) if p.name.split("_")[1].isdigit() else 0)
        elif entry.is_file() and not entry.name.startswith("."):
            files.append(entry)
    return files


def _events(paths: Iterable[Path]) -> Iterable[dict[str, Any]]:
    for path in paths:
        with path.open() as lines:
            for line in lines:
                if line.strip():
                    yield json.loads(line)


def breakdown(event_log_dir: Path) -> dict[str, Any]:
    """Sum the task metrics of every event log in `event_log_dir` (a driver that restarted
    writes one per application; in-progress logs of a killed driver count too).

    Returns:
        `FIGURES` -> value: seconds of task time (floats, 3 decimals), bytes and counts (ints),
        `executors_ready_seconds` the largest over the applications; plus `applications` (their
        ids) and `master` (the first application's `spark.master`).

    Raises:
        JobError: no event log in `event_log_dir`.
    """
    paths = _log_files(event_log_dir)
    if not paths:
        raise JobError(f"no Spark event log in {event_log_dir}")
    ms = {key: 0 for key in ("task", "scheduler_delay", "deserialize", "run", "gc", "result_serialization", "shuffle_fetch_wait")}
    ns = {"cpu": 0, "shuffle_write": 0}
    counts = {"shuffle_remote_bytes": 0, "shuffle_local_bytes": 0, "shuffle_written_bytes": 0, "tasks": 0, "jobs": 0}
    applications: list[str] = []
    master = None
    ready_ms = 0
    started_ms: int | None = None
    for event in _events(paths):
        kind = event.get("Event")
        if kind == "SparkListenerApplicationStart":
            applications.append(event.get("App ID"))
            started_ms = int(event["Timestamp"])
        elif kind == "SparkListenerEnvironmentUpdate" and master is None:
            master = (event.get("Spark Properties") or {}).get("spark.master")
        elif kind == "SparkListenerExecutorAdded" and event.get("Executor ID") != "driver" and started_ms is not None:
            ready_ms = max(ready_ms, int(event["Timestamp"]) - started_ms)
        elif kind == "SparkListenerJobStart":
            counts["jobs"] += 1
        elif kind == "SparkListenerTaskEnd":
            info, metrics = event.get("Task Info") or {}, event.get("Task Metrics") or {}
            duration = int(info.get("Finish Time", 0)) - int(info.get("Launch Time", 0))
            fetching = int(info.get("Finish Time", 0)) - int(info["Getting Result Time"]) if info.get("Getting Result Time") else 0
            deserialize, run = int(metrics.get("Executor Deserialize Time", 0)), int(metrics.get("Executor Run Time", 0))
            result = int(metrics.get("Result Serialization Time", 0))
            read, write = metrics.get("Shuffle Read Metrics") or {}, metrics.get("Shuffle Write Metrics") or {}
            counts["tasks"] += 1
            ms["task"] += duration
            ms["scheduler_delay"] += max(0, duration - deserialize - run - result - fetching)
            ms["deserialize"] += deserialize
            ms["run"] += run
            ms["gc"] += int(metrics.get("JVM GC Time", 0))
            ms["result_serialization"] += result
            ms["shuffle_fetch_wait"] += int(read.get("Fetch Wait Time", 0))
            ns["cpu"] += int(metrics.get("Executor CPU Time", 0))
            ns["shuffle_write"] += int(write.get("Shuffle Write Time", 0))
            counts["shuffle_remote_bytes"] += int(read.get("Remote Bytes Read", 0))
            counts["shuffle_local_bytes"] += int(read.get("Local Bytes Read", 0))
            counts["shuffle_written_bytes"] += int(write.get("Shuffle Bytes Written", 0))
    figures: dict[str, Any] = {"executors_ready_seconds": round(ready_ms / 1000, 3)}
    figures.update({f"{key}_seconds": round(value / 1000, 3) for key, value in ms.items()})
    figures.update({f"{key}_seconds": round(value / 1e9, 3) for key, value in ns.items()})
    figures.update(counts)
    return {**{key: figures[key] for key in FIGURES}, "applications": applications, "master": master}
