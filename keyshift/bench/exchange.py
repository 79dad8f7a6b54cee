"""`keyshift bench exchange`: what each keyed exchange strategy (paper 000 §4.3) sends and costs.

For the flights job and for YSB, the same records are written twice: to a topic placed by
`round_robin` (a key's events in every partition: what a producer without keyshift writes) and
to one placed by `hash` (a key's events in one partition: Ahead KeyBy). Then, one child process
at a time (so no two runs share the 2 cores), keyshift's job runs with each strategy:

| row `strategy` | job options | topic |
| --- | --- | --- |
| `plain` | `--exchange plain`: every event crosses the shuffle (Flink's KeyBy, the paper's baseline) | round_robin |
| `local_merge` | `--exchange local_merge` (emit `batch`): partials per (key, window) per task | round_robin |
| `global_merge` | `--exchange global_merge`: no shuffle; each task merges into Redis | round_robin |
| `ahead_keyby` | `--exchange local_merge` on the key-placed topic: a key's events meet in one task | hash |

and, for YSB, one more keyshift run: `global_merge` on the key-placed topic (`YSB_EXTRA_RUNS`,
Global Merge as paper 000 recommends it for campaign counts), and plain Spark Structured
Streaming running the published YSB job (`keyshift.bench.plain_ysb`) on that same topic:
`ysb_vs_plain_throughput_ratio` is the first over the second (`ysb_ratio_by_run` gives every
keyshift YSB run's ratio).

Per row: `shuffle_bytes` (Spark's shuffle write bytes over the run's stages, from its monitoring
REST API); `events_per_second` (events read / the query's seconds: first batch to last, JVM
start excluded, as both jobs report it); `latency_p95_s` (the 95th percentile of the run's
micro-batch durations: a result is written at the end of the batch that completes it, so on a
backfill this is how long an event's batch takes to turn it into output; batch 0, which
also starts the Python workers and state stores, is left out when later batches read input);
`results_identical`
(flights: the windows table equals pandas' windows of the same flights,
`keyshift.quality.reference`; YSB: every window's count equals the generator's recorded views,
and no window is missing or extra).

Every keyshift run uses the global watermark (Global Merge needs it) with the plain jobs' bounds
(flights: 48 h; YSB: one minute), so no event is late and every strategy must produce the same
windows. The plain YSB job writes no end-of-input markers: it is checked on the windows its final
watermark closed.
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from keyshift.errors import JobError
from keyshift.settings import Settings

log = logging.getLogger(__name__)

ROW_FIELDS = ("job", "strategy", "shuffle_bytes", "events_per_second", "latency_p95_s", "results_identical")
"""The fields every row of the report has (the issue's file format); rows carry more."""


@dataclass(frozen=True)
class ExchangeRun:
    """One row's set-up: the row's strategy name, the job's `--exchange`, the topic's placement."""

    strategy: str
    exchange: str
    placement: str


EXCHANGE_RUNS = (
    ExchangeRun("plain", "plain", "round_robin"),
    ExchangeRun("local_merge", "local_merge", "round_robin"),
    ExchangeRun("global_merge", "global_merge", "round_robin"),
    ExchangeRun("ahead_keyby", "local_merge", "hash"),
)
"""The strategies benchmarked, in order (module docstring)."""

YSB_EXTRA_RUNS = (ExchangeRun("global_merge", "global_merge", "hash"),)
"""YSB only: Global Merge on the key-placed topic, the plain Spark YSB job's topic: keyshift's YSB as
paper 000 §4.3 recommends it for campaign counts (results that change rarely), and the run
`ysb_vs_plain_throughput_ratio` compares."""

RATIO_RUN = ("global_merge", "hash")
"""(strategy, topic placement) of the keyshift YSB run the ratio takes."""

FLIGHTS_BOUND_MS = 48 * 3_600_000
"""The flights runs' watermark bound (ms): the plain flights job's, enough to lose no flight."""

YSB_RATE = 1_000
"""Generated YSB events per second of event time (the backfill's spacing: 1 ms)."""

YSB_BOUND_MS = 60_000
"""The YSB runs' watermark bound (ms), the plain YSB job's (`keyshift.bench.plain_ysb.BOUND`): a
generated topic's partitions stay within seconds of event time of each other in a backfill."""


def p95(values: Sequence[float]) -> float | None:
    """The 95th percentile (nearest rank) of `values`, None when empty."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def run_keyshift_job(settings: Settings, job: str, topic: str, run_id: str, exchange: str, events: int, partitions: int,
                     bound_ms: int, per_trigger: int, timeout_s: float) -> dict[str, Any]:
    """`keyshift job run JOB --exchange EXCHANGE` in a child process; its figures.

    Returns:
        events, query_seconds, events_per_second, steady_events_per_second, latency_p95_s,
        shuffle_bytes, reconciled, late_events, dead_letters, run_dir, process_seconds.

    Raises:
        JobError: the run failed or timed out.
    """
    import sys

    from keyshift.bench.switch import read_progress
    from keyshift.bench.throughput import _run_child

    wall, _ = _run_child(
        [sys.executable, "-m", "keyshift.cli", "job", "run", job, "--run-id", run_id, "--topic", topic, "--strategy", "hash",
         "--partitions", str(partitions), "--watermark", "global", "--bound-ms", str(bound_ms), "--exchange", exchange,
         "--limit", str(events), "--starting", "earliest", "--max-offsets-per-trigger", str(per_trigger)],
        settings.runs_dir / f"{run_id}.log", timeout_s,
    )
    run_dir = settings.runs_dir / run_id
    summary = json.loads((run_dir / "summary.json").read_text())
    progress = read_progress(run_dir)
    return _figures(summary["events_read"], summary["wall_seconds"], progress, summary.get("shuffle_write_bytes")) | {
        "reconciled": bool(summary["reconciled"]), "late_events": summary["late_events"], "dead_letters": summary["dead_letters"],
        "run_dir": str(run_dir), "process_seconds": round(wall, 3),
        "cpu_seconds": summary.get("cpu_seconds"), "events_per_cpu_second": summary.get("events_per_cpu_second"),
    }


def _figures(events: int, query_seconds: float, progress: Sequence[Mapping[str, Any]], shuffle_bytes: int | None) -> dict[str, Any]:
    """events/s, steady events/s and batch-latency p95 of one run from its per-batch progress
    (`batch_id`, `input_rows`, `batch_duration_ms`)."""
    timed = [p for p in progress if p.get("batch_duration_ms") is not None]
    reading = [p for p in timed if int(p.get("input_rows") or 0) > 0]
    steady = reading[1:]
    steady_ms = sum(int(p["batch_duration_ms"]) for p in steady)
    latency = p95([int(p["batch_duration_ms"]) / 1000 for p in (steady or reading)])
    return {
        "events": int(events),
        "query_seconds": query_seconds,
        "events_per_second": round(events / query_seconds, 1) if query_seconds else None,
        "steady_events_per_second": round(sum(int(p["input_rows"]) for p in steady) / steady_ms * 1000, 1) if steady_ms else None,
        "latency_p95_s": round(latency, 3) if latency is not None else None,
        "batches": len(timed),
        "shuffle_bytes": shuffle_bytes,
    }


def run_plain_ysb_job(settings: Settings, topic: str, partitions: int, out: Path, per_trigger: int, timeout_s: float) -> dict[str, Any]:
    """The plain Spark YSB job (`keyshift.bench.plain_ysb`) in a child process; its figures."""
    import sys

    from keyshift.bench.throughput import _run_child

    wall, stdout = _run_child(
        [sys.executable, "-m", "keyshift.bench.plain_ysb", "--topic", topic, "--partitions", str(partitions), "--out", str(out),
         "--max-offsets-per-trigger", str(per_trigger)],
        out.with_suffix(".log"), timeout_s,
    )
    result = json.loads(stdout.strip().splitlines()[-1])
    figures = _figures(result["events"], result["query_seconds"], result["progress"], result.get("shuffle_write_bytes"))
    return figures | {"process_seconds": round(wall, 3), "windows_dir": result["windows_path"], "run_dir": str(out),
                      "final_watermark_ms": result["final_watermark_ms"], "dropped_by_watermark": result.get("dropped_by_watermark"),
                      "cpu_seconds": result.get("cpu_seconds"), "events_per_cpu_second": result.get("events_per_cpu_second")}


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The report's figures over `rows` (medians over repeated runs).

    Returns:
        `ysb_vs_plain_throughput_ratio` (keyshift's YSB run `RATIO_RUN` over the plain Spark
        YSB job on the same topic, events/s), `ysb_ratio_by_run` (every keyshift YSB run,
        `strategy@placement`, over the plain Spark job), `shuffle_fraction_of_plain` per job and
        strategy (shuffle bytes over the `plain` strategy's), `all_results_identical`, `goals`.
    """
    def median(job: str, strategy: str, field: str, placement: str | None = None) -> float | None:
        if placement is None:  # the strategy's canonical topic (EXCHANGE_RUNS)
            placement = next((run.placement for run in EXCHANGE_RUNS if run.strategy == strategy), None)
        values = [r[field] for r in rows if r["job"] == job and r["strategy"] == strategy and r.get(field) is not None
                  and (placement is None or r.get("topic_placement", placement) == placement)]
        return statistics.median(values) if values else None

    plain = median("ysb", "plain_spark", "events_per_second", "hash")
    ratio_by_run = {}
    for run in (*EXCHANGE_RUNS, *YSB_EXTRA_RUNS):
        ours = median("ysb", run.strategy, "events_per_second", run.placement)
        if ours is not None and plain:
            ratio_by_run[f"{run.strategy}@{run.placement}"] = round(ours / plain, 3)
    ratio = ratio_by_run.get("@".join(RATIO_RUN))
    fractions: dict[str, dict[str, float | None]] = {}
    for job in sorted({r["job"] for r in rows}):
        keyby = median(job, "plain", "shuffle_bytes")
        fractions[job] = {}
        for run in EXCHANGE_RUNS:
            sent = median(job, run.strategy, "shuffle_bytes")
            fractions[job][run.strategy] = round(sent / keyby, 5) if keyby and sent is not None else None
    identical = all(bool(r.get("results_identical")) for r in rows)
    return {
        "ysb_vs_plain_throughput_ratio": ratio,
        "ysb_ratio_by_run": ratio_by_run,
        "shuffle_fraction_of_plain": fractions,
        "all_results_identical": identical,
        "goals": [
            {"name": "ysb_vs_plain_throughput_ratio", "value": ratio, "target": 1.0, "op": ">=",
             "met": ratio is not None and ratio >= 1.0},
            {"name": "all_results_identical", "value": identical, "target": True, "op": "==", "met": identical},
        ],
    }


def row_label(row: Mapping[str, Any]) -> str:
    """A row's name in the plot and the CLI: its strategy, with `@placement` when the topic is not
    the strategy's canonical one (`EXCHANGE_RUNS`), e.g. `global_merge@hash`."""
    canonical = {run.strategy: run.placement for run in EXCHANGE_RUNS}
    strategy, placement = row["strategy"], row.get("topic_placement")
    return f"{strategy}@{placement}" if strategy in canonical and placement and placement != canonical[strategy] else strategy


def plot_exchange(report: Mapping[str, Any], path: Path) -> Path:
    """Bars per job and strategy: shuffle bytes (MB, log scale), events/s and batch latency p95 (s)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [{**r, "label": row_label(r)} for r in report["rows"]]
    jobs = sorted({r["job"] for r in rows})
    order = [run.strategy for run in EXCHANGE_RUNS] + [f"{run.strategy}@{run.placement}" for run in YSB_EXTRA_RUNS] + ["plain_spark"]
    strategies = [s for s in order if any(r["label"] == s for r in rows)]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    width = 0.8 / max(1, len(strategies))
    for panel, (field, label, scale) in zip(axes, (("shuffle_bytes", "shuffle write (MB)", 1e6),
                                                   ("events_per_second", "events / s", 1.0),
                                                   ("latency_p95_s", "batch latency p95 (s)", 1.0))):
        for i, strategy in enumerate(strategies):
            values = []
            for job in jobs:
                found = [r[field] for r in rows if r["job"] == job and r["label"] == strategy and r.get(field) is not None]
                values.append(statistics.median(found) / scale if found else 0.0)
            panel.bar([j + i * width for j in range(len(jobs))], values, width, label=strategy)
        panel.set_xticks([j + width * (len(strategies) - 1) / 2 for j in range(len(jobs))], jobs)
        panel.set_title(label)
        if field == "shuffle_bytes":
            panel.set_yscale("symlog", linthresh=0.01)
    axes[0].legend(fontsize=8)
    ratio = report.get("ysb_vs_plain_throughput_ratio")
    fig.suptitle(f"keyshift bench exchange: YSB keyshift / plain Spark = {ratio}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _flights_identical(windows_dir: Path, reference) -> bool:
    from keyshift.quality.reference import compare_to_reference

    return bool(compare_to_reference(windows_dir, reference)["equal"])


ALL_CLOSED_MS = 2**62
"""A watermark past every window: a bounded keyshift run closes all its windows (end-of-input markers)."""


def _ysb_identical(windows_dir: Path, expected_views: Path, watermark_ms: int = ALL_CLOSED_MS) -> bool:
    """A YSB windows table (Parquet folder: campaign_id, window_start, count, ...) against the
    generator's record (`keyshift.bench.plain_ysb.compare_to_expected`): every window the
    watermark `watermark_ms` (ms) closed, once, with the recorded views, none missing or extra."""
    import pandas as pd

    from keyshift.bench.plain_ysb import compare_to_expected

    if any(Path(windows_dir).glob("*.parquet")):
        windows = pd.read_parquet(windows_dir)
    else:  # a run whose watermark closed no window wrote no file
        windows = pd.DataFrame({"campaign_id": pd.Series(dtype=str), "window_start_ms": pd.Series(dtype="int64"),
                                "count": pd.Series(dtype="int64")})
    return bool(compare_to_expected(windows, expected_views, watermark_ms=watermark_ms)["identical"])


def run_exchange_bench(
    settings: Settings,
    out: Path,
    jobs: Sequence[str] = ("flights", "ysb"),
    flights: int | None = 1_000_000,
    ysb_events: int = 1_000_000,
    partitions: int = 8,
    runs: int = 1,
    per_trigger: int = 250_000,
    timeout_s: float = 1800.0,
    progress: bool = True,
) -> dict[str, Any]:
    """Write both topics per job, run every strategy (and plain Spark YSB), check, write `out` + PNG.

    Args:
        settings: the stack (Kafka and Redis up) and the runs folder.
        out: the JSON report's path; the plot is `out` with `.png`.
        jobs: `flights` and/or `ysb`.
        flights: flights replayed (None: all 3,000,000). ysb_events: generated YSB ad events
            (all event types; about a third are views), `YSB_RATE` per second of event time.
        partitions: P. runs: runs of each strategy. per_trigger: records per micro-batch at most.
        timeout_s: a child run taking longer fails the bench (JobError).

    Returns:
        The report: {"rows": [...], "ysb_vs_plain_throughput_ratio", "shuffle_fraction_of_plain",
        "all_results_identical", "goals", "settings"}.

    Raises:
        JobError: a run failed; StackError: Kafka or Redis is down.
    """
    from tqdm import tqdm

    from keyshift import stack
    from keyshift.topics import create_topics

    stack.require(settings, "kafka", "redis")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    work = settings.runs_dir / f"bench-exchange-{stamp}"
    work.mkdir(parents=True, exist_ok=True)
    per_job = len(EXCHANGE_RUNS) + len(YSB_EXTRA_RUNS) + 1
    bar = tqdm(total=sum(per_job if j == "ysb" else len(EXCHANGE_RUNS) for j in jobs) * runs, desc="bench exchange", unit="run",
               disable=not progress)
    rows: list[dict[str, Any]] = []

    def settings_of() -> dict[str, Any]:
        return {"jobs": list(jobs), "flights": flights or 3_000_000, "ysb_events": ysb_events, "ysb_rate": YSB_RATE,
                "partitions": partitions, "runs": runs, "per_trigger": per_trigger, "watermark": "global",
                "flights_bound_ms": FLIGHTS_BOUND_MS, "ysb_bound_ms": YSB_BOUND_MS, "cores": os.cpu_count()}

    for job in jobs:
        topics, check, events, bound_ms, job_name = {}, None, 0, FLIGHTS_BOUND_MS, "flight_delays"
        for placement in ("round_robin", "hash"):
            topic = f"bench-exchange-{job}-{placement}".replace("_", "-")
            create_topics(settings, [topic], partitions, recreate=True)
            topics[placement] = topic
            if job == "flights":
                from keyshift.data.flights import flights_path
                from keyshift.data.replay import replay_flights
                from keyshift.quality.reference import reference_windows

                replay = replay_flights(settings, topic, limit=flights, strategy=placement, partitions=partitions, progress=False)
                events = replay.events_produced
                if check is None:
                    reference = reference_windows(flights_path(settings), limit=events)
                    check = lambda windows_dir, reference=reference: _flights_identical(windows_dir, reference)  # noqa: E731
            else:
                from keyshift.data.ysb import generate_ysb
                from keyshift.names import YSB_DEAD_LETTER_TOPIC, YSB_LATE_TOPIC
                from keyshift.topics import describe_topics

                missing = [t for t in (YSB_DEAD_LETTER_TOPIC, YSB_LATE_TOPIC) if t not in describe_topics(settings, [t])]
                if missing:
                    create_topics(settings, missing, partitions)
                result = generate_ysb(settings, topic, rate=YSB_RATE, duration=ysb_events / YSB_RATE, strategy=placement,
                                      partitions=partitions, start_ms=1_700_000_000_000, run_id=f"{work.name}-{placement}",
                                      progress=False)
                events = result.replay.events_produced
                bound_ms = YSB_BOUND_MS
                job_name = "ysb"
                expected = result.run_dir / "expected_views.parquet"
                check = lambda windows_dir, expected=expected: _ysb_identical(windows_dir, expected)  # noqa: E731
        for run in range(runs):
            for setup in (*EXCHANGE_RUNS, *(YSB_EXTRA_RUNS if job == "ysb" else ())):
                bar.set_postfix_str(f"{job} {setup.strategy} run {run + 1}")
                label = row_label({"strategy": setup.strategy, "topic_placement": setup.placement})
                run_id = f"{work.name}-{job}-{label}-{run}".replace("_", "-").replace("@", "-on-")
                result = run_keyshift_job(settings, job_name, topics[setup.placement], run_id, setup.exchange, events, partitions,
                                          bound_ms, per_trigger, timeout_s)
                result["results_identical"] = check(Path(result["run_dir"]) / "windows") and result["reconciled"]
                rows.append({"job": job, "strategy": setup.strategy, "exchange": setup.exchange, "topic_placement": setup.placement,
                             "engine": "keyshift", "run": run, **result})
                log.info("exchange %s %s run %d: %.0f ev/s, shuffle %s bytes, identical %s", job, label, run,
                         result["events_per_second"] or 0, result["shuffle_bytes"], result["results_identical"])
                _save(out, rows, settings_of())
                bar.update()
            if job == "ysb":
                bar.set_postfix_str(f"ysb plain Spark run {run + 1}")
                plain = run_plain_ysb_job(settings, topics["hash"], partitions, work / f"plain-ysb-{run}", per_trigger, timeout_s)
                plain["results_identical"] = _ysb_identical(Path(plain["windows_dir"]), expected, plain["final_watermark_ms"])
                rows.append({"job": "ysb", "strategy": "plain_spark", "exchange": "spark_builtin", "topic_placement": "hash",
                             "engine": "spark", "run": run, **plain})
                _save(out, rows, settings_of())
                bar.update()
    bar.close()
    report = _save(out, rows, settings_of())
    plot_exchange(report, out.with_suffix(".png"))
    return report


def _save(out: Path, rows: Sequence[Mapping[str, Any]], settings: Mapping[str, Any]) -> dict[str, Any]:
    """Write the report so far to `out` (after every run, so a failed run keeps the others)."""
    report = {"rows": list(rows), **summarize(rows), "settings": dict(settings)}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str))
    return report


def check_report(report: Mapping[str, Any]) -> None:
    """Raise JobError when a row lacks one of `ROW_FIELDS` (the file format the issue fixes)."""
    for row in report["rows"]:
        missing = [f for f in ROW_FIELDS if f not in row]
        if missing:
            raise JobError(f"bench exchange row {row.get('job')}/{row.get('strategy')} lacks {', '.join(missing)}")
