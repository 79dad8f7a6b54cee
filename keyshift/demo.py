"""The demo: all 3,000,000 real flights through Kafka, the keyshift job, and Spark's built-in.

Steps: (re)create the flight topics with P partitions -> replay the flights (keyed by origin,
placed by the strategy) -> run the flight delay job until drained, by default with key-level
watermarks and a one-minute bound -> check the windows table with Great Expectations -> compare it
with the same windows computed by pandas from the data file -> run the job again in `global`
watermark mode with the same bound, to show what a query-wide watermark loses -> run Spark's
built-in window aggregation on the same records -> compare -> print and save the summary.

The throughput comparison with the built-in is like with like: all runs share one driver JVM, and
the first query in it pays the JVM's cold start (class loading, JIT, the Python workers' start),
so the built-in (run last, warm) is compared with keyshift's global-mode run (second, warm), not
with the first run; the basis is printed next to the ratio and saved with it (`builtin_comparison`,
`keyshift.console.comparison_text`). Without a warm keyshift run (`compare_global` off, or `global` watermarks)
there is no ratio. `keyshift bench throughput` compares both jobs each in a fresh process.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from keyshift import runlog
from keyshift.console import STEP, comparison_text
from keyshift.eventtime.watermarks import BACKFILL_IDLE_LAG_MS
from keyshift.names import FLIGHT_TOPICS, FLIGHTS_TOPIC
from keyshift.placement.learning import LEARNED_STRATEGIES, learn_and_publish
from keyshift.settings import DEFAULT_PARTITIONS, Settings

log = logging.getLogger(__name__)

WARM_BASIS = "both warm: same driver JVM, after the demo's first run"
"""The basis of the demo's built-in throughput ratio when it has one: keyshift's figure is its
global-mode run (the second query in the demo's driver JVM), the built-in's the third; both are
events / seconds from query start to the last batch."""


def builtin_comparison(builtin_events_per_second: float | None, warm_run: Mapping[str, Any] | None) -> dict[str, Any]:
    """The built-in's throughput against keyshift's on one basis, with the basis said.

    Args:
        builtin_events_per_second: the built-in run's events/s (query start to last batch), or None.
        warm_run: the keyshift run that ran warm in the same driver JVM before the built-in
            (the demo's global-mode run: a mapping with `run_id` and `events_per_second`,
            events/s from query start to last batch), or None when the demo had none.

    Returns:
        {"keyshift_run_id": str | None, "keyshift_events_per_second": float | None (events/s),
         "throughput_ratio": keyshift / built-in events/s (3 decimals) or None, "basis": str}.
        Without a warm keyshift run (or a figure missing) the ratio is None and `basis` says why:
        the demo's first run includes the JVM's cold start and the built-in's does not.
    """
    ours = warm_run.get("events_per_second") if warm_run else None
    if ours is None or not builtin_events_per_second:
        return {"keyshift_run_id": None, "keyshift_events_per_second": None, "throughput_ratio": None,
                "basis": "no ratio: keyshift's only run in this driver JVM was its first (cold start included), the built-in "
                         "ran after it (warm); --compare-global adds a warm keyshift run, `keyshift bench throughput` runs "
                         "both in fresh processes"}
    return {"keyshift_run_id": warm_run.get("run_id"), "keyshift_events_per_second": ours,
            "throughput_ratio": round(ours / builtin_events_per_second, 3),
            "basis": f"{WARM_BASIS}; keyshift: run {warm_run.get('run_id')}"}


def run_demo(
    settings: Settings,
    run_id: str,
    partitions: int = DEFAULT_PARTITIONS,
    strategy: str = "hash",
    limit: int | None = None,
    rate: float | None = None,
    bound_ms: int = 60_000,
    max_offsets_per_trigger: int = 250_000,
    builtin: bool = True,
    watermark: str = "key",
    compare_global: bool = True,
    builtin_bound_ms: int = 172_800_000,
    topic: str = FLIGHTS_TOPIC,
    idle_lag_ms: int = BACKFILL_IDLE_LAG_MS,
    driver_log: bool = False,
    progress: bool = False,
) -> dict[str, Any]:
    """Run the demo end to end and return the job's summary with the demo's checks.

    The summary (also `runs/<run_id>/summary.json`) adds `quality`, `reference`, with
    `compare_global` `global_mode` and `late_events_vs_global`, and with `builtin` a `builtin`
    entry: the built-in run's `events`, `windows`, `wall_seconds`, `events_per_second` (events/s,
    query start to last batch), `comparison` (`compare_windows`: its windows against the first
    run's, field by field) and `builtin_comparison`'s `keyshift_run_id`,
    `keyshift_events_per_second`, `throughput_ratio` and `basis` (module docstring).

    Args:
        settings: the local stack. run_id: names runs/<run_id>/.
        partitions: P slots. strategy: placement strategy name; least_key and least_count are
            learned from the first 10 % of the flights and shared through Redis.
        limit: flights to replay (None: all 3,000,000). rate: replay rate, events/s (None: max).
        bound_ms: watermark bound, ms of event time (default one minute).
        max_offsets_per_trigger: records per micro-batch at most.
        builtin: also run Spark's built-in aggregation on the same records and compare its
            windows with the first run's and its events/s with the global-mode run's (both warm).
        watermark: the job's watermark mode (`keyshift.eventtime.watermarks`), default `key`.
        compare_global: also run the job in `global` mode with the same bound on the same
            records and report its late events (`global_mode` in the summary); its events/s is
            keyshift's figure in the built-in comparison (without it there is no ratio).
        builtin_bound_ms: the built-in job's watermark delay: a plain Spark job needs two days
            on a backfill of the flights to lose nothing (its late rows are dropped silently).
        topic: the input topic. The default `flights` is recreated with the side-output topics;
            another name is recreated alone and the side outputs (shared, every record tagged
            with its run) are only created if missing, so the demo can run beside other runs.
        idle_lag_ms: per-key watermark modes: the fallback's lag behind the query's max event
            time (`WatermarkPolicy.idle_lag_ms`). In a backfill it must exceed how far the
            partitions' event times drift apart, or the slow partitions' events are late: two
            days covers P = 8 (21.5 h with hash, 37 h with least_count); hot_split at P = 32
            drifts about a week, so the demo's default is eight days (the job's is two). Only
            silent keys wait for it.
        driver_log: send the log lines of every step (this process's, Spark's, the Python
            workers') to `runs/<run_id>/driver.log` (`keyshift.runlog`), the global-mode run's too.
        progress: show progress bars on stderr: the replay's events, and each job run's events
            accounted for against its target.

    Raises:
        KeyshiftError subclasses from each step (stack down, data missing, job failure).
    """
    from keyshift.data.flights import flights_path
    from keyshift.data.replay import replay_flights
    from keyshift.runtime.driver import StopSignals
    from keyshift.runtime.session import build_spark_session, job_spark_conf
    from keyshift.topics import create_topics, describe_topics

    log_path = runlog.attach(runlog.driver_log_path(settings.runs_dir / run_id)) if driver_log else None
    if log_path is not None:
        log.info("demo %s: log lines go to %s", run_id, log_path, extra=STEP)
    if topic == FLIGHTS_TOPIC:
        log.info("demo %s: creating topics %s with %d partitions", run_id, ", ".join(FLIGHT_TOPICS), partitions, extra=STEP)
        create_topics(settings, FLIGHT_TOPICS, partitions, recreate=True)
    else:
        log.info("demo %s: creating topic %s with %d partitions", run_id, topic, partitions, extra=STEP)
        create_topics(settings, [topic], partitions, recreate=True)
        missing = [t for t in FLIGHT_TOPICS if t != FLIGHTS_TOPIC and t not in describe_topics(settings, [t])]
        if missing:
            create_topics(settings, missing, 8)
    if strategy in LEARNED_STRATEGIES:  # the replay and the job read what this publishes
        learn_and_publish(settings, topic, strategy, partitions, limit, flights=flights_path(settings))
    replay = replay_flights(settings, topic, limit=limit, rate=rate, strategy=strategy, partitions=partitions, progress=progress)
    log.info("demo %s: replayed %d flights; starting Spark", run_id, replay.events_produced, extra=STEP)

    spark = build_spark_session(f"keyshift-demo-{run_id}", settings.spark_master, job_spark_conf(settings, partitions)[0],
                                output=log_path)
    stop = StopSignals(run_id)  # Ctrl-C between the demo's steps ends it after the step (a job run handles its own)
    stop.install()
    try:
        return _steps(settings, spark, run_id, topic, replay, partitions, strategy, bound_ms, max_offsets_per_trigger, watermark,
                      idle_lag_ms, compare_global, builtin, builtin_bound_ms, progress, stop.event)
    finally:
        stop.restore()


def _steps(settings: Settings, spark, run_id: str, topic: str, replay, partitions: int, strategy: str, bound_ms: int,
           max_offsets_per_trigger: int, watermark: str, idle_lag_ms: int, compare_global: bool, builtin: bool,
           builtin_bound_ms: int, progress: bool, stopped) -> dict[str, Any]:
    """The demo's steps once Spark is up (`run_demo`); `stopped` (an Event set by Ctrl-C or
    SIGTERM) ends it after the step in progress, with the job run's summary as it is."""
    import pandas as pd

    from keyshift.data.flights import flights_path
    from keyshift.processing.builtin import compare_windows, run_builtin_windows
    from keyshift.runtime.driver import run_job
    from keyshift.processing.sources.kafka_input import END_OF_INPUT_EVENT_TIME_MS, read_kafka
    from keyshift.processing.job_config import JobConfig
    from keyshift.quality.reference import compare_to_reference, reference_windows
    from keyshift.quality.windows import validate_windows
    from keyshift.runs import RunRecorder

    config = JobConfig.from_options(
        run_id=run_id,
        strategy=strategy,
        partitions=partitions,
        bound_ms=bound_ms,
        max_offsets_per_trigger=max_offsets_per_trigger,
        limit=replay.events_produced,
        watermark=watermark,
        topic=topic,
        idle_lag_ms=idle_lag_ms,
    )
    summary = run_job(settings, config, starting="replay", spark=spark, progress=progress)
    recorder = RunRecorder(settings, run_id)
    if summary.get("outcome") == "stopped" or stopped.is_set():
        log.warning("demo %s: stopped (Ctrl-C or SIGTERM) after the job run; no checks or comparisons; resume the run with "
                    "`keyshift job run --resume %s`", run_id, run_id)
        return summary
    log.info("demo %s: checking the windows table (Great Expectations suite, pandas' windows of the same flights)", run_id,
             extra=STEP)
    # the committed flight_delay_windows suite; its result and Data Docs go to runs/<run_id>/
    summary["quality"] = validate_windows(pd.read_parquet(recorder.folder.windows), partitions,
                                          run_dir=recorder.run_dir, run_id=run_id)
    reference = reference_windows(flights_path(settings), limit=replay.events_produced, window_ms=config.window_ms)
    summary["reference"] = compare_to_reference(recorder.folder.windows, reference)
    log.info("demo %s: windows vs pandas: %s", run_id, summary["reference"])
    if compare_global and watermark != "global" and not stopped.is_set():
        global_id = f"{run_id}-global"
        log.info("demo %s: running the job again in global watermark mode (bound %d ms) as %s", run_id, bound_ms, global_id,
                 extra=STEP)
        other = run_job(settings, replace(config, run_id=global_id, event_time=replace(config.event_time, mode="global")), starting="replay", spark=spark,
                                  progress=progress)
        summary["global_mode"] = {
            "run_id": global_id, "bound_ms": bound_ms, "late_events": other["late_events"], "events_read": other["events_read"],
            "events_per_second": other["events_per_second"], "reconciled": other["reconciled"], "outcome": other.get("outcome"),
        }
        summary["late_events_vs_global"] = {"key_level" if watermark == "key" else watermark: summary["late_events"],
                                            "global": other["late_events"]}
    if builtin and not stopped.is_set() and summary.get("global_mode", {}).get("outcome", "done") == "done":
        start = summary["start_offsets"]
        start = start if isinstance(start, str) else {int(p): o for p, o in start.items()}
        source = read_kafka(spark, settings, topic, start, max_offsets_per_trigger)
        log.info("demo %s: running the plain Spark job (built-in window aggregation, keyshift bench throughput's baseline) on the same records", run_id, extra=STEP)
        end = {int(p): o for p, o in summary["end_offsets"].items()}
        result = run_builtin_windows(source, recorder.folder.builtin_windows, run_id, builtin_bound_ms, END_OF_INPUT_EVENT_TIME_MS, end)
        result["bound_ms"] = builtin_bound_ms
        result["comparison"] = compare_windows(recorder.folder.windows, recorder.folder.builtin_windows)
        # like with like: the first run's figure includes the JVM's cold start, the built-in's (third) does not
        result.update(builtin_comparison(result["events_per_second"], summary.get("global_mode")))
        summary["builtin"] = result
        log.info("demo %s: Spark built-in: %s", run_id, comparison_text(result), extra=STEP)
    if stopped.is_set():
        log.warning("demo %s: stopped (Ctrl-C or SIGTERM); the steps after the one in progress were skipped", run_id)
    recorder.finish(summary, state="stopped" if stopped.is_set() else "succeeded")
    spark.stop()
    return summary
