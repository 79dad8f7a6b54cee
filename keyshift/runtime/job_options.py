"""The options of a keyshift job run and how they become a run: shared by `keyshift job run` and
the `spark_jobs/keyshift_job.py` entry that `spark-submit` launches (Airflow), so neither imports
the other. `job_options` is the click options decorator, `run_from_options` builds the `JobConfig`
and calls `keyshift.runtime.driver.run_job`."""

from __future__ import annotations

import secrets
import time

import click

from keyshift.eventtime.plausibility import PlausibilityLimits
from keyshift.eventtime.partition_clocks import DEFAULT_IDLE_TIMEOUT_S
from keyshift.eventtime.watermarks import IDLE_FALLBACKS, WATERMARK_MODES, WatermarkPolicy
from keyshift.eventtime.windows import HOUR_MS
from keyshift.jobs import job_names
from keyshift.names import FLIGHTS_TOPIC, RunDir
from keyshift.processing.operators.exchange import EXCHANGES
from keyshift.processing.job_config import JOB_STRATEGIES
from keyshift.settings import DEFAULT_PARTITIONS


def new_run_id(prefix: str = "fd") -> str:
    """A run id like `fd-20261122T021500Z-3f9a`: UTC start time and 4 random hex digits."""
    return f"{prefix}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(2)}"


def job_options(function):
    """The click options of a job run (`keyshift job run` and spark_jobs/keyshift_job.py), applied to `function`."""
    options = [
        click.option("--job", "job_name", type=click.Choice(job_names()), default=None,
                     help="The job spec to run (default flight_delays): flight_delays (tumbling windows, alerts), "
                          "flight_delays_sliding (1 h windows every minute, as key windows) or ysb (views per campaign per 10 s)."),
        click.option("--run-id", default=None, help="Run id; default fd-<UTC time>-<hex>. Names runs/<run_id>/."),
        click.option("--checkpoint-location", default=None, metavar="URI",
                     help="Where the run keeps its Spark checkpoints, under <URI>/<run_id>/: a Hadoop URI every executor and a "
                          "restarted driver reach (hdfs://namenode:8020/keyshift/checkpoints, s3a://bucket/keyshift) or a path. "
                          "Default: KEYSHIFT_CHECKPOINT_LOCATION, else the run's folder. A resumed run keeps its own."),
        click.option("--strategy", type=click.Choice(JOB_STRATEGIES), default="hash", help="Placement strategy of keys to slots."),
        click.option("--partitions", type=click.IntRange(min=1), default=DEFAULT_PARTITIONS, help="P slots = topic partitions."),
        click.option("--max-stateful-partitions", type=click.IntRange(min=1), default=None,
                     help="Spark stateful partitions at most (spark.sql.shuffle.partitions = min(P, this); the slots are spread "
                          "over them by range). Default: 1 per core of the engine (2 on 2 cores); the ingest stage runs as many tasks."),
        click.option("--epoch", type=click.IntRange(min=0), default=0, help="Assignment epoch written on every window."),
        click.option("--bound-ms", type=click.IntRange(min=0), default=HOUR_MS, help="Watermark bound, ms of event time."),
        click.option("--watermark", type=click.Choice(WATERMARK_MODES), default="global", show_default=True,
                     help="Watermark mode: global (Spark's, one per query: max event time over every partition - bound), "
                          "partition (one per query: min over the active Kafka partitions' max event times - bound, Flink's), "
                          "key (one per key), nkey (one per group of keys), dynamic (per key, bound follows the key's disorder "
                          "up to --bound-ms)."),
        click.option("--watermark-groups", type=click.IntRange(min=1), default=WatermarkPolicy.groups, show_default=True,
                     help="nkey mode: N watermark groups (murmur2(key) mod N)."),
        click.option("--idle-fallback", type=click.Choice(IDLE_FALLBACKS), default=WatermarkPolicy.idle_fallback, show_default=True,
                     help="Per-key modes: how a silent key's windows close: global (once the stream is --idle-lag-ms past them) "
                          "or timeout (also after --key-idle-timeout seconds without events)."),
        click.option("--idle-lag-ms", type=click.IntRange(min=0), default=WatermarkPolicy.idle_lag_ms, show_default=True,
                     help="Per-key modes: no key's watermark stays further than this behind the slowest active Kafka partition's "
                          "max event time (ms)."),
        click.option("--partition-idle-timeout", type=click.FloatRange(min=0, min_open=True), default=DEFAULT_IDLE_TIMEOUT_S,
                     show_default=True, help="Seconds without records after which a Kafka partition stops holding the watermark "
                                             "of the others back (every mode but global), until its next record."),
        click.option("--max-partition-drift-ms", type=click.IntRange(min=0), default=None,
                     help="Watermark alignment (Flink's FLIP-182): read no Kafka partition more than this (ms of event time) "
                          "ahead of the slowest one, pausing the partitions ahead; reads the input with keyshift's aligned "
                          "Kafka source. Default: Spark's Kafka source, no bound."),
        click.option("--key-idle-timeout", type=click.FloatRange(min=0, min_open=True), default=WatermarkPolicy.idle_timeout_s,
                     show_default=True, help="timeout fallback: seconds without events after which a key closes its windows."),
        click.option("--exchange", type=click.Choice(EXCHANGES), default="local_merge", show_default=True,
                     help="How events reach a key's windows (paper 000 §4.3): local_merge (partials per key and window "
                          "before the shuffle), plain (every event crosses the shuffle) or global_merge (no shuffle; "
                          "each task merges into one window state in Redis; global or partition watermark only)."),
        click.option("--emit", default="batch", show_default=True, metavar="batch|window|count:N",
                     help="Local Merge's emit mode: batch (a task's whole slice), window (a key's partial ends at its "
                          "window boundary) or count:N (a partial per N events of the slice)."),
        click.option("--window-ms", type=click.IntRange(min=1), default=None, show_default=f"the job's ({HOUR_MS} for the flights)",
                     help="Window size, ms of event time (a key-window job slides by its spec's slide_ms)."),
        click.option("--topic", default=None, show_default=f"the job's ({FLIGHTS_TOPIC} for the flights)", help="Input topic."),
        click.option("--max-offsets-per-trigger", type=click.IntRange(min=1), default=250_000, help="Records per micro-batch at most."),
        click.option("--limit", type=click.IntRange(min=1), default=None,
                     help="Bounded run: read LIMIT records past the start as they arrive (at least LIMIT: every record in the topic "
                          "when it first holds LIMIT), drain, flush, stop. Default: run until stopped (SIGTERM or Ctrl-C)."),
        click.option("--wait-for-input", is_flag=True, default=False,
                     help="Bounded run: start the query only once the topic holds LIMIT records (a backfill read in full "
                          "micro-batches) instead of reading records as they arrive."),
        click.option("--starting", type=click.Choice(["replay", "earliest", "latest"]), default="replay", help="Start offsets: where the last replay into the topic began, or earliest/latest."),
        click.option("--resume", "resume", default=None, metavar="RUN_ID", help="Continue the run RUN_ID from its checkpoint after its driver died (its other options come from runs/RUN_ID/job.json)."),
        click.option("--idle-timeout", type=click.FloatRange(min=1), default=300.0, help="Bounded run: fail when no batch completes for this many seconds."),
        click.option("--max-ahead-ms", type=click.IntRange(min=1), default=PlausibilityLimits.max_ahead_ms, show_default=True,
                     help="Event-time plausibility: an event further ahead of the stream (watermark + bound, or its chunk's median) or of its batch's time than this many ms is a dead letter."),
        click.option("--max-behind-ms", type=click.IntRange(min=1), default=PlausibilityLimits.max_behind_ms, show_default=True,
                     help="Event-time plausibility: an event further behind the watermark (first batch: its chunk's median) than this many ms is a dead letter."),
        click.option("--reference-min-events", type=click.IntRange(min=1), default=PlausibilityLimits.reference_min_events, show_default=True,
                     help="Event-time plausibility: events a chunk needs for its median event time to count as the stream's reference."),
    ]
    for option in reversed(options):
        function = option(function)
    return function


def run_from_options(*, driver_log: bool = False, progress: bool = False, **options) -> dict:
    """Build the settings and config from CLI options, run the job, return its summary.

    Args:
        driver_log: the run's log lines go to runs/<run_id>/driver.log (`run_job`).
        progress: show a progress bar of the events accounted for (`run_job`).
        options: the options of `job_options`, by parameter name.
    """
    from keyshift.runtime.driver import run_job
    from keyshift.processing.job_config import EventTimeConfig, ExchangeConfig, InputConfig, JobConfig, PlacementConfig
    from keyshift.settings import Settings

    if options.get("resume"):
        if options.get("run_id") not in (None, options["resume"]):
            raise click.UsageError(f"--resume {options['resume']} continues that run; drop --run-id {options['run_id']}")
        _check_resumed_job(options["resume"], options.get("job_name"))
        return run_job(Settings(), JobConfig(run_id=options["resume"]), resume=True, driver_log=driver_log,
                                 progress=progress)
    from keyshift.jobs import job_spec

    spec = job_spec(options.get("job_name") or "flight_delays")
    config = JobConfig(
        run_id=options["run_id"] or new_run_id(),
        job=spec.name,
        window_ms=options["window_ms"] or spec.window_ms,
        checkpoint_location=options.get("checkpoint_location"),
        placement=PlacementConfig(strategy=options["strategy"], partitions=options["partitions"],
                                  max_stateful_partitions=options.get("max_stateful_partitions"), epoch=options["epoch"]),
        event_time=EventTimeConfig(
            mode=options["watermark"], bound_ms=options["bound_ms"], groups=options["watermark_groups"],
            idle_fallback=options["idle_fallback"], idle_lag_ms=options["idle_lag_ms"], key_idle_timeout_s=options["key_idle_timeout"],
            partition_idle_timeout_s=options.get("partition_idle_timeout") or DEFAULT_IDLE_TIMEOUT_S,
            max_ahead_ms=options["max_ahead_ms"], max_behind_ms=options["max_behind_ms"],
            reference_min_events=options["reference_min_events"], max_partition_drift_ms=options.get("max_partition_drift_ms"),
        ),
        exchange=ExchangeConfig(mode=options["exchange"], emit=options["emit"]),
        input=InputConfig(topic=options["topic"] or spec.topics.input, max_offsets_per_trigger=options["max_offsets_per_trigger"],
                          limit=options["limit"], idle_timeout_s=options["idle_timeout"]),
    )
    return run_job(Settings(), config, starting=options["starting"], driver_log=driver_log, progress=progress,
                             wait_for_input=bool(options.get("wait_for_input")))


def _check_resumed_job(run_id: str, job_name: str | None) -> None:
    """Refuse `--resume RUN_ID` with a job name other than the one the run was started with (its
    `runs/<run_id>/job.json`); no name, or a run without a record (the driver says so), passes.

    Raises:
        click.UsageError: naming both jobs.
    """
    from keyshift.processing.job_record import JobRecord
    from keyshift.settings import Settings

    if not job_name:
        return
    started = JobRecord.job_name(RunDir.of(Settings().runs_dir, run_id).path)
    if started is not None and started != job_name:
        raise click.UsageError(f"run {run_id} runs job {started}, not {job_name}; resume it with `keyshift job run --resume {run_id}`")
