"""`keyshift bench throughput`: keyshift's job against the plain Spark job a user would write.

For each configuration (P = 8 with `hash`, P = 32 with `hot_split` by default), the flights are
replayed once into a fresh topic placed by the strategy; then the plain job
(`keyshift.bench.plain_job`) and keyshift's job (`keyshift job run flight_delays`, every feature
on: validation and dead letters, late output, per-slot metrics, placement, key-level watermarks
with a one-minute bound as the demo runs it) read the same records, alternating, `runs` times
each. Every run is a child process of the bench, timed from its start to its exit (JVM start
included), one at a time, so they never share the 2 cores. keyshift's runs map the driver JVM's
class archive (`keyshift.runtime.class_archive`; when it is missing, one unmeasured keyshift
run writes it first); the plain job's JVM starts as a user's would, without one.

Per run (`rows`): `events_per_second` = events / whole-process seconds; `steady_events_per_second`
= events / trigger-execution seconds of the batches after the first that read rows (what the
query sustains once started); `first_batch_seconds` = batch 0's duration; `driver_peak_rss_bytes`
(the driver JVM) and `python_peak_rss_bytes` (its Python workers, 0 for the plain job, which
runs none). keyshift's runs also report `windows_equal_reference` (its windows table against
pandas on the same flights, `keyshift.quality.reference`) and `reconciled` (events in = Σ window
counts + late + dead letters). `cpu_seconds` (user + system seconds of the
run's driver JVM, Python workers and driver Python process, from the query's start to its end;
`keyshift.runtime.resources`) and `events_per_cpu_second` = events / total CPU seconds, the
figure that stays comparable when other processes share the machine. `ratio_whole` and
`ratio_steady`: keyshift's median over the plain job's median at the first configuration (the
issue's P = 8 comparison); `ratio_cpu` the same for events per CPU second; `ratio_by_config` for
every configuration; `p32_over_p8`: keyshift's whole-run rate at P = 32 over P = 8.

`cold_start` measures what every query pays before its first output whatever the batch size:
both jobs, alternating, `runs` times each, on a small topic of the first `COLD_START_RECORDS`
flights (placed as the first configuration places them) read in batches of
`COLD_START_PER_TRIGGER` records. Its `first_batch_seconds` is batch 0 when batch 0 has almost no
records to process, the floor under the main runs' batch 0; `steady_batch_seconds` the median
of the later batches. Measured on two 2-core machines of this kind (2026-11-27, three runs
each): batch 0 of 10,000 records took 9.97 to 10.92 s for the plain job and 10.41 to 11.60 s for
keyshift's on one, 6.31 to 6.54 s and 6.62 to 6.89 s on the other; later batches 1.1 to 3.2 s.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from keyshift.bench import masters, spark_events
from keyshift.errors import ConfigurationError, JobError
from keyshift.eventtime.watermarks import BACKFILL_IDLE_LAG_MS
from keyshift.settings import Settings

log = logging.getLogger(__name__)

ROW_FIELDS = ("job", "partitions", "strategy", "run", "events_per_second", "steady_events_per_second", "first_batch_seconds",
              "driver_peak_rss_bytes", "python_peak_rss_bytes")
"""The fields every row of the report has (the issue's file format); rows may carry more."""

TARGETS = {"ratio_whole": 1.0, "ratio_whole_floor": 0.9, "ratio_steady": 1.0, "first_batch_seconds": 10.0,
           "p32_over_p8": 0.8, "driver_peak_rss_bytes": 2.2e9}
"""The issue's goals: keyshift / plain whole-run and steady ratios, keyshift's first batch (s),
P = 32 throughput over P = 8, keyshift's driver peak memory (bytes)."""


COLD_START_RECORDS = 30_000
"""Flights on the cold-start topic (module docstring): three batches of `COLD_START_PER_TRIGGER`."""

COLD_START_PER_TRIGGER = 10_000
"""Records per micro-batch in the cold-start runs (module docstring)."""


@dataclass(frozen=True)
class Config:
    """One benchmarked configuration: P partitions (= slots) and keyshift's placement strategy."""

    partitions: int
    strategy: str


def parse_configs(texts: Sequence[str]) -> tuple[Config, ...]:
    """`["8:hash", "32:hot_split"]` -> Configs.

    Raises:
        ConfigurationError: a text is not `P:strategy`, or the job cannot place with the strategy.
    """
    from keyshift.processing.job_config import check_job_strategy

    configs = []
    for text in texts:
        partitions, _, strategy = text.partition(":")
        if not partitions.isdigit() or int(partitions) < 1 or not strategy:
            raise ConfigurationError(f"configuration {text!r} must be P:strategy, as in 8:hash or 32:hot_split")
        configs.append(Config(int(partitions), check_job_strategy(strategy)))
    return tuple(configs)


def _run_child(command: list[str], log_path: Path, timeout_s: float, env: Mapping[str, str]) -> tuple[float, str]:
    """Run `command` with `env`, stderr to `log_path`; return (wall seconds, stdout).

    Raises:
        JobError: a non-zero exit or a timeout (the log's tail is in the message).
    """
    started = time.monotonic()
    with log_path.open("w") as err:
        try:
            done = subprocess.run(command, stdout=subprocess.PIPE, stderr=err, text=True, timeout=timeout_s, env=dict(env))
        except subprocess.TimeoutExpired as error:
            raise JobError(f"{command[2:4]} timed out after {timeout_s:.0f} s; log {log_path}") from error
    wall = time.monotonic() - started
    if done.returncode != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-15:]
        raise JobError(f"{' '.join(command[:4])} exited {done.returncode}; log {log_path}:\n" + "\n".join(tail))
    return wall, done.stdout


def run_plain(settings: Settings, topic: str, config: Config, out: Path, per_trigger: int, timeout_s: float,
              event_log_dir: Path | None = None) -> dict[str, Any]:
    """One run of the plain job in a child process on `settings.spark_master`; its figures plus
    whole-process seconds, and with `event_log_dir` the run's `spark_events.breakdown` as `spark`."""
    wall, stdout = _run_child(
        [sys.executable, "-m", "keyshift.bench.plain_job", "--topic", topic, "--partitions", str(config.partitions),
         "--out", str(out), "--max-offsets-per-trigger", str(per_trigger)],
        out.with_suffix(".log"), timeout_s, masters.child_env(settings, event_log_dir),
    )
    result = json.loads(stdout.strip().splitlines()[-1])
    result["process_seconds"] = round(wall, 3)
    if event_log_dir is not None:
        result["spark"] = spark_events.breakdown(event_log_dir)
    return result


def run_keyshift(settings: Settings, topic: str, config: Config, run_id: str, flights: int, per_trigger: int,
                 timeout_s: float, event_log_dir: Path | None = None) -> dict[str, Any]:
    """One run of `keyshift job run flight_delays` (key watermarks, bound one minute) in a child
    process on `settings.spark_master`; its summary, progress and whole-process seconds, and with
    `event_log_dir` the run's `spark_events.breakdown` as `spark`."""
    from keyshift.bench.switch import read_progress

    log_path = settings.runs_dir / f"{run_id}.log"
    wall, _ = _run_child(
        [sys.executable, "-m", "keyshift.cli", "job", "run", "flight_delays", "--run-id", run_id, "--topic", topic,
         "--strategy", config.strategy, "--partitions", str(config.partitions), "--watermark", "key", "--bound-ms", "60000",
         "--idle-lag-ms", str(BACKFILL_IDLE_LAG_MS),
         "--limit", str(flights), "--max-offsets-per-trigger", str(per_trigger)],
        log_path, timeout_s, masters.child_env(settings, event_log_dir),
    )
    run_dir = settings.runs_dir / run_id
    summary = json.loads((run_dir / "summary.json").read_text())
    progress = read_progress(run_dir)
    reading = [r for r in progress if int(r.get("input_rows") or 0) > 0 and r.get("batch_duration_ms") is not None]
    steady = reading[1:]
    steady_ms = sum(int(r["batch_duration_ms"]) for r in steady)
    result = {
        "events": summary["events_read"],
        "batches": len(progress),
        "query_seconds": summary["wall_seconds"],
        "process_seconds": round(wall, 3),
        "first_batch_seconds": round(int(reading[0]["batch_duration_ms"]) / 1000, 3) if reading else None,
        "steady_events_per_second": round(sum(int(r["input_rows"]) for r in steady) / steady_ms * 1000, 1) if steady_ms else None,
        "driver_peak_rss_bytes": summary.get("driver_peak_rss_bytes"),
        "python_peak_rss_bytes": summary.get("python_workers_peak_rss_bytes"),
        "cpu_seconds": summary.get("cpu_seconds"),
        "events_per_cpu_second": summary.get("events_per_cpu_second"),
        "late_events": summary["late_events"],
        "dead_letters": summary["dead_letters"],
        "reconciled": bool(summary["reconciled"]),
        "driver_class_archive": summary.get("driver_class_archive"),
        "run_dir": str(run_dir),
        "progress": [{k: r.get(k) for k in ("batch_id", "input_rows", "batch_duration_ms")} for r in progress],
    }
    if event_log_dir is not None:
        result["spark"] = spark_events.breakdown(event_log_dir)
    return result


def _write_class_archive(settings: Settings, topic: str, config: Config, work: Path, flights: int, per_trigger: int,
                         timeout_s: float) -> None:
    """Run keyshift's job once, unmeasured, on the topic when its driver JVM's class archive does
    not exist yet (`keyshift.runtime.class_archive`), so that no measured run pays the one-off
    writing of it (about 20 s at the run's exit) and every measured run maps it."""
    from keyshift.runtime.class_archive import archive_path
    from keyshift.stack.spark import connector_jars

    path = archive_path(settings.cache, connector_jars(settings)) if settings.spark_class_archive else None
    if path is None or path.exists():
        return
    log.info("no driver class archive yet: one unmeasured keyshift run on %s writes %s", topic, path)
    run_keyshift(settings, topic, config, f"{work.name}-class-archive", flights, per_trigger, timeout_s)


def _row(job: str, config: Config, run: int, result: Mapping[str, Any]) -> dict[str, Any]:
    events, seconds = result["events"], result["process_seconds"]
    row = {"job": job, "partitions": config.partitions, "strategy": config.strategy if job == "keyshift" else "kafka_default",
           "run": run, "events": events, "process_seconds": seconds, "query_seconds": result["query_seconds"],
           "events_per_second": round(events / seconds, 1) if seconds else None,
           "steady_events_per_second": result["steady_events_per_second"], "first_batch_seconds": result["first_batch_seconds"],
           "driver_peak_rss_bytes": result["driver_peak_rss_bytes"], "python_peak_rss_bytes": result["python_peak_rss_bytes"] or 0,
           "cpu_seconds": result.get("cpu_seconds"), "events_per_cpu_second": result.get("events_per_cpu_second"),
           "progress": result["progress"]}
    for key in ("late_events", "dead_letters", "reconciled", "windows_equal_reference", "driver_class_archive", "run_dir", "spark"):
        if key in result:
            row[key] = result[key]
    return row


def cold_start_row(job: str, run: int, result: Mapping[str, Any]) -> dict[str, Any]:
    """A cold-start run's row: `job`, `run`, `events`, `first_batch_seconds` (batch 0, s) and
    `steady_batch_seconds` (median of the later batches that read records, s; None with fewer
    than two such batches), plus keyshift's `reconciled` and `windows_equal_reference`."""
    durations = [b["batch_duration_ms"] / 1000 for b in result["progress"] if b.get("input_rows") and b.get("batch_duration_ms") is not None]
    row = {"job": job, "run": run, "events": result["events"], "first_batch_seconds": result["first_batch_seconds"],
           "steady_batch_seconds": round(statistics.median(durations[1:]), 3) if len(durations) > 1 else None}
    for key in ("reconciled", "windows_equal_reference", "spark"):
        if key in result:
            row[key] = result[key]
    return row


def summarize_cold_start(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per job (`plain`, `keyshift`): the median `first_batch_seconds` and `steady_batch_seconds`
    of the cold-start rows (None for a job without rows)."""
    summary = {}
    for job in ("plain", "keyshift"):
        for field in ("first_batch_seconds", "steady_batch_seconds"):
            values = [r[field] for r in rows if r["job"] == job and r.get(field) is not None]
            summary[f"{job}_{field}"] = round(statistics.median(values), 3) if values else None
    return summary


def _median(rows: Sequence[Mapping[str, Any]], job: str, config: Config, field: str) -> float | None:
    values = [r[field] for r in rows if r["job"] == job and r["partitions"] == config.partitions and r.get(field) is not None
              and (job == "plain" or r["strategy"] == config.strategy)]
    return statistics.median(values) if values else None


def summarize(rows: Sequence[Mapping[str, Any]], configs: Sequence[Config],
              cold_rows: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """Ratios and goals from the rows (module docstring); keyshift's `cold_rows` count in the
    windows-and-accounting goal like its main runs."""
    by_config = []
    for config in configs:
        entry = {"partitions": config.partitions, "strategy": config.strategy}
        for field in ("events_per_second", "steady_events_per_second", "first_batch_seconds", "events_per_cpu_second"):
            entry[f"keyshift_{field}"] = _median(rows, "keyshift", config, field)
            entry[f"plain_{field}"] = _median(rows, "plain", config, field)
        entry["ratio_whole"] = _ratio(entry["keyshift_events_per_second"], entry["plain_events_per_second"])
        entry["ratio_steady"] = _ratio(entry["keyshift_steady_events_per_second"], entry["plain_steady_events_per_second"])
        entry["ratio_cpu"] = _ratio(entry["keyshift_events_per_cpu_second"], entry["plain_events_per_cpu_second"])
        by_config.append(entry)
    first = by_config[0]
    keyshift_rows = [r for r in rows if r["job"] == "keyshift"]
    checked = keyshift_rows + [r for r in cold_rows if r["job"] == "keyshift"]
    report = {
        "ratio_whole": first["ratio_whole"],
        "ratio_steady": first["ratio_steady"],
        "ratio_cpu": first["ratio_cpu"],
        "ratio_by_config": by_config,
        "p32_over_p8": None,
        "all_windows_equal_reference": all(r.get("windows_equal_reference") for r in checked),
        "all_reconciled": all(r.get("reconciled") for r in checked),
    }
    p8 = next((e for e in by_config if e["partitions"] == 8), None)
    p32 = next((e for e in by_config if e["partitions"] == 32), None)
    if p8 and p32:
        report["p32_over_p8"] = _ratio(p32["keyshift_events_per_second"], p8["keyshift_events_per_second"])
    first_batch = max((r["first_batch_seconds"] for r in keyshift_rows if r["first_batch_seconds"] is not None), default=None)
    driver_peak = max((r["driver_peak_rss_bytes"] for r in keyshift_rows if r["driver_peak_rss_bytes"]), default=None)
    report["goals"] = [
        _goal("whole-run ratio >= 1.0 (floor 0.9) at P=8", report["ratio_whole"], TARGETS["ratio_whole"], ">="),
        _goal("steady-state ratio >= 1.0", report["ratio_steady"], TARGETS["ratio_steady"], ">="),
        _goal("keyshift's first batch <= 10 s (slowest run)", first_batch, TARGETS["first_batch_seconds"], "<="),
        _goal("P=32 throughput >= 0.8 x P=8", report["p32_over_p8"], TARGETS["p32_over_p8"], ">="),
        _goal("driver peak memory <= 2.2 GB", driver_peak, TARGETS["driver_peak_rss_bytes"], "<="),
        _goal("windows equal pandas, accounting exact, every keyshift run",
              report["all_windows_equal_reference"] and report["all_reconciled"], True, "=="),
    ]
    return report


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def _goal(name: str, value: Any, target: Any, op: str) -> dict[str, Any]:
    met = None if value is None else {">=": value >= target, "<=": value <= target, "==": value == target}[op]
    return {"goal": name, "target": target, "measured": value, "met": met}


def plot_throughput(report: Mapping[str, Any], path: Path) -> Path:
    """Bars of whole-run and steady events/s per job and configuration (one point per run) and
    keyshift's and the plain job's batch durations; written to `path` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    labels = sorted({(r["partitions"], r["strategy"] if r["job"] == "keyshift" else None) for r in rows if r["job"] == "keyshift"})
    cold = report.get("cold_start") or {}
    fig, axes = plt.subplots(1, 3 if cold.get("rows") else 2, figsize=(17 if cold.get("rows") else 12, 4.5))
    width = 0.35
    for i, field in enumerate(("events_per_second", "steady_events_per_second")):
        ax = axes[i]
        for j, job in enumerate(("plain", "keyshift")):
            for k, (partitions, strategy) in enumerate(labels):
                values = [r[field] for r in rows if r["job"] == job and r["partitions"] == partitions
                          and (job == "plain" or r["strategy"] == strategy) and r[field] is not None]
                if values:
                    ax.bar(k + (j - 0.5) * width, statistics.median(values), width, color=("#999999", "#1f77b4")[j],
                           label=job if k == 0 else None)
                    ax.scatter([k + (j - 0.5) * width] * len(values), values, color="black", s=8, zorder=3)
        ax.set_xticks(range(len(labels)), [f"P={p} {s}" for p, s in labels])
        ax.set_ylabel("events / s")
        ax.set_title("whole process (JVM start included)" if i == 0 else "steady state (after batch 0)")
        ax.legend()
    if cold.get("rows"):
        ax = axes[2]
        first = [(f"P={config['partitions']} {config['strategy']}\n{report['settings']['per_trigger']:,}/batch", job,
                  [r["first_batch_seconds"] for r in rows if r["job"] == job and r["first_batch_seconds"] is not None
                   and r["partitions"] == config["partitions"] and (job == "plain" or r["strategy"] == config["strategy"])])
                 for config in report["ratio_by_config"][:1] for job in ("plain", "keyshift")]
        first += [(f"cold start\n{cold['per_trigger']:,}/batch", job, [r["first_batch_seconds"] for r in cold["rows"] if r["job"] == job])
                  for job in ("plain", "keyshift")]
        groups = list(dict.fromkeys(label for label, _, _ in first))
        for label, job, values in first:
            if values:
                x = groups.index(label) + (("plain", "keyshift").index(job) - 0.5) * width
                ax.bar(x, statistics.median(values), width, color=("#999999", "#1f77b4")[("plain", "keyshift").index(job)],
                       label=job if label == groups[0] else None)
                ax.scatter([x] * len(values), values, color="black", s=8, zorder=3)
        ax.axhline(TARGETS["first_batch_seconds"], color="red", linestyle="--", linewidth=1, label="goal")
        ax.set_xticks(range(len(groups)), groups)
        ax.set_ylabel("seconds")
        ax.set_title("batch 0")
        ax.legend()
    fig.suptitle(f"keyshift vs plain Spark job: ratio whole {report['ratio_whole']}, steady {report['ratio_steady']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_throughput_bench(
    settings: Settings,
    out: Path,
    configs: Sequence[Config] = (Config(8, "hash"), Config(32, "hot_split")),
    runs: int = 3,
    flights: int | None = None,
    per_trigger: int = 250_000,
    timeout_s: float = 1800.0,
    progress: bool = True,
    cold_start_records: int = COLD_START_RECORDS,
    cold_start_per_trigger: int = COLD_START_PER_TRIGGER,
) -> dict[str, Any]:
    """Replay, run both jobs alternately, check, summarize, plot; write `out` (JSON) and the PNG.

    Args:
        settings: the stack (Kafka and Redis must be up) and the runs folder.
        out: the JSON report's path; the plot is `out` with `.png`.
        configs: (P, strategy) pairs; the first is the one `ratio_whole`/`ratio_steady` report.
        runs: runs of each job per configuration (alternating plain, keyshift, plain, ...).
        flights: flights to replay (None: all 3,000,000).
        per_trigger: records per micro-batch at most (both jobs).
        timeout_s: a child run taking longer fails the bench (JobError).
        cold_start_records: flights on the cold-start topic (module docstring); 0: no cold-start runs.
        cold_start_per_trigger: records per micro-batch in the cold-start runs.

    Returns:
        The report: {"rows": [...], "ratio_whole", "ratio_steady", "ratio_by_config",
        "p32_over_p8", "goals", "cold_start", "settings"}; `cold_start` is {"records",
        "per_trigger", "partitions", "strategy", "rows", and `summarize_cold_start`'s medians},
        or None without cold-start runs.

    Raises:
        JobError: a run failed; StackError: Kafka or Redis is down.
    """
    from tqdm import tqdm

    from keyshift import stack
    from keyshift.data.flights import flights_path
    from keyshift.quality.reference import compare_to_reference, reference_windows

    stack.require(settings, "kafka", "redis")
    masters.prepare_master(settings)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    work = settings.runs_dir / f"bench-throughput-{stamp}"
    work.mkdir(parents=True, exist_ok=True)
    reference = None
    rows: list[dict[str, Any]] = []
    bar = tqdm(total=len(configs) * runs * 2 + (runs * 2 if cold_start_records else 0), desc="bench throughput", unit="run",
               disable=not progress)
    for config in configs:
        topic = f"bench-throughput-{config.partitions}-{config.strategy}".replace("_", "-")
        replay = _replayed_topic(settings, topic, config, flights)
        if reference is None:
            reference = reference_windows(flights_path(settings), limit=replay.events_produced)
            _write_class_archive(settings, topic, config, work, replay.events_produced, per_trigger, timeout_s)
        for run in range(runs):
            bar.set_postfix_str(f"P={config.partitions} {config.strategy} run {run + 1}: plain")
            name = f"plain-{config.partitions}-{run}"
            plain = run_plain(settings, topic, config, work / name, per_trigger, timeout_s, work / "eventlogs" / name)
            rows.append(_row("plain", config, run, plain))
            bar.update()
            bar.set_postfix_str(f"P={config.partitions} {config.strategy} run {run + 1}: keyshift")
            run_id = f"{work.name}-ks-{config.partitions}-{config.strategy}-{run}"
            ours = run_keyshift(settings, topic, config, run_id, replay.events_produced, per_trigger, timeout_s,
                                work / "eventlogs" / run_id)
            ours["windows_equal_reference"] = compare_to_reference(Path(ours["run_dir"]) / "windows", reference)["equal"]
            rows.append(_row("keyshift", config, run, ours))
            bar.update()
            log.info("throughput P=%d %s run %d: plain %.0f ev/s, keyshift %.0f ev/s (whole process)", config.partitions,
                     config.strategy, run, rows[-2]["events_per_second"], rows[-1]["events_per_second"])
    cold_start = None
    if cold_start_records:
        cold_start = _cold_start_runs(settings, configs[0], work, runs, cold_start_records, cold_start_per_trigger, timeout_s, bar)
    bar.close()
    report = {"rows": rows, **summarize(rows, configs, cold_start["rows"] if cold_start else ()), "cold_start": cold_start,
              "settings": {"flights": flights or 3_000_000, "per_trigger": per_trigger, "runs": runs,
                           "configs": [f"{c.partitions}:{c.strategy}" for c in configs], "keyshift_watermark": "key",
                           "keyshift_bound_ms": 60_000, "keyshift_idle_lag_ms": BACKFILL_IDLE_LAG_MS,
                           "keyshift_class_archive": settings.spark_class_archive, "plain_bound": "48 hours",
                           "cores": os.cpu_count(), "spark_master": settings.spark_master,
                           "event_logs": str(work / "eventlogs")}}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    plot_throughput(report, out.with_suffix(".png"))
    return report


def _replayed_topic(settings: Settings, topic: str, config: Config, flights: int | None):
    """(Re)create `topic` with `config.partitions` partitions, publish a learned strategy's
    assignment, and replay the first `flights` flights (None: all) placed by `config.strategy`;
    returns the replay's report (`events_produced`, ...)."""
    from keyshift.data.replay import replay_flights
    from keyshift.data.flights import flights_path
    from keyshift.placement.learning import LEARNED_STRATEGIES, learn_and_publish
    from keyshift.topics import create_topics

    create_topics(settings, [topic], config.partitions, recreate=True)
    if config.strategy in LEARNED_STRATEGIES:
        learn_and_publish(settings, topic, config.strategy, config.partitions, flights, flights=flights_path(settings))
    return replay_flights(settings, topic, limit=flights, strategy=config.strategy, partitions=config.partitions, progress=False)


def _cold_start_runs(settings: Settings, config: Config, work: Path, runs: int, records: int, per_trigger: int, timeout_s: float,
                     bar) -> dict[str, Any]:
    """The cold-start runs (module docstring) on a fresh topic of the first `records` flights
    placed by `config`: plain and keyshift alternating, `runs` each; keyshift's checked against
    pandas and for its accounting like the main runs."""
    from keyshift.data.flights import flights_path
    from keyshift.quality.reference import compare_to_reference, reference_windows

    topic = f"bench-throughput-cold-{config.partitions}-{config.strategy}".replace("_", "-")
    replay = _replayed_topic(settings, topic, config, records)
    reference = reference_windows(flights_path(settings), limit=replay.events_produced)
    rows: list[dict[str, Any]] = []
    for run in range(runs):
        bar.set_postfix_str(f"cold start run {run + 1}: plain")
        name = f"cold-plain-{run}"
        rows.append(cold_start_row("plain", run, run_plain(settings, topic, config, work / name, per_trigger, timeout_s,
                                                           work / "eventlogs" / name)))
        bar.update()
        bar.set_postfix_str(f"cold start run {run + 1}: keyshift")
        run_id = f"{work.name}-cold-ks-{run}"
        ours = run_keyshift(settings, topic, config, run_id, replay.events_produced, per_trigger, timeout_s, work / "eventlogs" / run_id)
        ours["windows_equal_reference"] = compare_to_reference(Path(ours["run_dir"]) / "windows", reference)["equal"]
        rows.append(cold_start_row("keyshift", run, ours))
        bar.update()
        log.info("cold start run %d: batch 0 of %d records: plain %.1f s, keyshift %.1f s", run, per_trigger,
                 rows[-2]["first_batch_seconds"], rows[-1]["first_batch_seconds"])
    return {"records": replay.events_produced, "per_trigger": per_trigger, "partitions": config.partitions,
            "strategy": config.strategy, "rows": rows, **summarize_cold_start(rows)}
