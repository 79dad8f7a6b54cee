"""Benchmarks on another Spark master: `keyshift bench throughput --master` and `keyshift bench
switch --master` run their jobs on a standalone cluster (`spark://...`, `keyshift stack up --only
spark`: a master and two one-core workers whose Python is a bare interpreter) as they do on
`local[*]`, and `keyshift bench compare-masters` puts two such reports side by side.

Each bench child gets the bench's settings as `KEYSHIFT_*` variables (`child_env`), so its
driver, and a driver it relaunches for a switch, submits to the same master; the child's event
log (`keyshift.bench.spark_events`) says where its task time went.
"""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Mapping
from pathlib import Path

from keyshift.bench.spark_events import event_log_conf
from keyshift.errors import JobError
from keyshift.settings import Settings

log = logging.getLogger(__name__)


def child_env(settings: Settings, event_log_dir: Path | None = None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a bench child process: `base` (default: this process's environment)
    with `settings` as `KEYSHIFT_*` variables, so the child's `Settings()` has this bench's Spark
    master, broker and runs folder; with `event_log_dir`, `PYSPARK_SUBMIT_ARGS` also carries
    `event_log_conf` (pyspark's gateway passes these arguments to spark-submit when it starts
    the driver JVM, so the child's own session settings are untouched).

    Raises:
        JobError: `base` already has `PYSPARK_SUBMIT_ARGS` (its arguments would be dropped).
    """
    from keyshift.orchestration.launch import settings_env

    env = dict(os.environ if base is None else base)
    env.pop("KEYSHIFT_FAILPOINT", None)
    env.update(settings_env(settings))
    if event_log_dir is not None:
        if env.get("PYSPARK_SUBMIT_ARGS"):
            raise JobError("PYSPARK_SUBMIT_ARGS is set; unset it to run the bench (it writes its own event-log settings there)")
        confs = " ".join(f"--conf {shlex.quote(f'{key}={value}')}" for key, value in event_log_conf(event_log_dir).items())
        env["PYSPARK_SUBMIT_ARGS"] = f"{confs} pyspark-shell"
    return env


def prepare_master(settings: Settings) -> None:
    """On a cluster master (`settings.spark_master` not `local[...]`): check that the stack's own
    master answers with its workers, when it is that one, and build the executors' packed
    environment now (`keyshift.stack.executor_env`), so that no measured run pays for packing it
    (once per environment and code, about a minute).

    Raises:
        StackError: the stack's master does not answer (`keyshift stack up --only spark`).
    """
    from keyshift import stack
    from keyshift.stack import executor_env, spark_cluster
    from keyshift.stack.spark import is_local_master

    if is_local_master(settings.spark_master):
        return
    if settings.spark_master == spark_cluster.master_url(settings):
        stack.require(settings, "spark")
    package = executor_env.build(settings, settings.spark_executor_python)
    log.info("Spark master %s: executors get %s", settings.spark_master, package.spark_conf().get("spark.archives"))


# --- comparing two reports ------------------------------------------------------------------

THROUGHPUT_FIGURES = ("events_per_second", "steady_events_per_second", "first_batch_seconds", "process_seconds", "query_seconds")
"""A throughput row's figures `compare_reports` puts side by side (medians over the runs). Not
`events_per_cpu_second`: its CPU seconds are the driver's processes', which on `local[*]` run every
task and on a cluster none (the executors' CPU is the event log's `cpu_seconds`)."""


def _median(values: list[float]) -> float | None:
    import statistics

    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def _side_by_side(first: Mapping[str, float | None], second: Mapping[str, float | None]) -> dict[str, dict[str, float | None]]:
    """{figure: {"first", "second", "difference" (second - first)}} over `first`'s keys."""
    table = {}
    for key, a in first.items():
        b = second.get(key)
        table[key] = {"first": a, "second": b, "difference": round(b - a, 3) if a is not None and b is not None else None}
    return table


def _throughput_medians(report: Mapping[str, object], job: str) -> dict[str, float | None]:
    from keyshift.bench.spark_events import FIGURES

    config = report["ratio_by_config"][0]  # type: ignore[index]
    rows = [r for r in report["rows"] if r["job"] == job and r["partitions"] == config["partitions"]  # type: ignore[index,union-attr]
            and (job == "plain" or r["strategy"] == config["strategy"])]
    medians = {field: _median([r.get(field) for r in rows]) for field in THROUGHPUT_FIGURES}
    medians.update({f"spark_{key}": _median([(r.get("spark") or {}).get(key) for r in rows]) for key in FIGURES})
    return medians


def _switch_medians(report: Mapping[str, object]) -> dict[str, float | None]:
    from keyshift.bench.spark_events import FIGURES

    medians: dict[str, float | None] = {"median_pause_seconds": report.get("median_pause_seconds")}  # type: ignore[dict-item]
    medians.update({f"step_{step}": seconds for step, seconds in (report.get("median_step_seconds") or {}).items()})  # type: ignore[union-attr]
    spark = (report.get("spark") or {}).get("switching") or {}  # type: ignore[union-attr]
    medians.update({f"spark_{key}": spark.get(key) for key in FIGURES})
    return medians


def compare_reports(first: Mapping[str, object], second: Mapping[str, object]) -> dict[str, object]:
    """Two reports of the same bench on two Spark masters, side by side.

    Args:
        first, second: `keyshift bench throughput` reports (with `rows`) or `keyshift bench
            switch` reports (with `switches`), usually `local[*]` first and the cluster second.

    Returns:
        {"bench": "throughput" | "switch", "masters": [first's, second's], "jobs": {job: {figure:
        {"first", "second", "difference"}}}}: for throughput the jobs `plain` and `keyshift` at the
        reports' first configuration (medians over the runs of `THROUGHPUT_FIGURES` and of each
        run's `spark_events.FIGURES`, prefixed `spark_`); for switch the job `keyshift` (median
        pause, median seconds per step, and the switching run's event-log figures).

    Raises:
        JobError: the reports are of different benches, or of neither.
    """
    kinds = ["throughput" if "rows" in r and "ratio_by_config" in r else "switch" if "switches" in r else None for r in (first, second)]
    if kinds[0] is None or kinds[0] != kinds[1]:
        raise JobError(f"compare-masters needs two reports of the same bench (throughput or switch); got {kinds}")
    masters = [((r.get("settings") or {}).get("spark_master") or "local[*]") for r in (first, second)]  # type: ignore[union-attr]
    if kinds[0] == "throughput":
        jobs = {job: _side_by_side(_throughput_medians(first, job), _throughput_medians(second, job)) for job in ("plain", "keyshift")}
    else:
        jobs = {"keyshift": _side_by_side(_switch_medians(first), _switch_medians(second))}
    return {"bench": kinds[0], "masters": masters, "jobs": jobs}


def plot_comparison(comparison: Mapping[str, object], path: Path) -> Path:
    """Bars of where task time goes (`spark_events`: scheduler delay, deserialization, run,
    result serialization, shuffle fetch wait and write; seconds summed over tasks) per job and
    master, and beside them the whole-process (throughput) or pause (switch) wall seconds with
    the executors' start-up hatched; written to `path` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = ("scheduler_delay_seconds", "deserialize_seconds", "run_seconds", "result_serialization_seconds",
             "shuffle_fetch_wait_seconds", "shuffle_write_seconds")
    jobs: Mapping[str, Mapping[str, Mapping[str, float | None]]] = comparison["jobs"]  # type: ignore[assignment]
    masters: list[str] = comparison["masters"]  # type: ignore[assignment]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    labels = [f"{job}\n{master}" for job in jobs for master in masters]
    for i, part in enumerate(parts):
        values = [jobs[job].get(f"spark_{part}", {}).get(side) or 0 for job in jobs for side in ("first", "second")]
        bottoms = [sum(jobs[job].get(f"spark_{p}", {}).get(side) or 0 for p in parts[:i]) for job in jobs for side in ("first", "second")]
        left.bar(range(len(labels)), values, bottom=bottoms, label=part.removesuffix("_seconds").replace("_", " "), color=f"C{i}")
    left.set_xticks(range(len(labels)), labels, fontsize=8)
    left.set_ylabel("seconds of task time (sum over tasks)")
    left.set_title("where task time goes (event log)")
    left.legend(fontsize=7)
    whole = "process_seconds" if comparison["bench"] == "throughput" else "median_pause_seconds"
    values = [jobs[job].get(whole, {}).get(side) or 0 for job in jobs for side in ("first", "second")]
    right.bar(range(len(labels)), values, color=["#999999", "#1f77b4"] * len(jobs))
    ready = [jobs[job].get("spark_executors_ready_seconds", {}).get(side) or 0 for job in jobs for side in ("first", "second")]
    right.bar(range(len(labels)), ready, color="none", edgecolor="black", hatch="//", label="of which executors starting (wall)")
    right.legend(fontsize=7)
    right.set_xticks(range(len(labels)), labels, fontsize=8)
    right.set_ylabel("seconds")
    right.set_title("whole process (median run)" if whole == "process_seconds" else "median switch pause")
    fig.suptitle(f"keyshift bench {comparison['bench']}: {masters[0]} vs {masters[1]}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
