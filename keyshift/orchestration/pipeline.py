"""Plain functions behind the `keyshift_pipeline` DAG's tasks (and usable from the CLI).

Each task of `dags/keyshift_pipeline.py` builds a `Settings` at the edge and calls one function
here with plain arguments. Nothing in this module touches Kafka, Redis or files at import time.

Run ids: Airflow's run ids (`manual__2026-01-02T03:04:05.678901+00:00`) contain `:` and `+`,
which are awkward in paths and Spark checkpoint URIs, so a job's run id is the Airflow run id
with every character outside `[A-Za-z0-9._-]` replaced by `_` (`job_run_id`). A run id that is
already clean (the e2e test chooses one) is kept as it is.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from keyshift.errors import ConfigurationError, JobError
from keyshift.settings import PROJECT_ROOT, Settings
from keyshift.names import RunDir

log = logging.getLogger(__name__)

STRATEGIES: tuple[str, ...] = ("hash", "least_key", "least_count", "hot_split")
"""Strategies the pipeline offers in its trigger form (the union over `JOB_STRATEGIES`): those
the flight delay job accepts over the flights' origin keys (`modulo` needs integer keys). The
learned ones (least_key, least_count, hot_split) are learned from the first 10 % of the run's
events and published in Redis under the input topic (for the flights by `publish_assignment`,
for YSB by the generator itself), before the replay and the job read them."""

JOBS: tuple[str, ...] = ("flight_delays", "ysb")
"""The registered jobs (`keyshift.jobs`) the pipeline runs: each has a data source the replay
task can produce (the flights, the YSB generator) and a tumbling-window spec. The pipeline's
`job` param offers these; `flight_delays` is the default."""

JOB_STRATEGIES: dict[str, tuple[str, ...]] = {
    "flight_delays": STRATEGIES,
    "ysb": ("hash", "least_key", "least_count"),
}
"""Strategies the pipeline runs each job with. YSB: the generator places campaigns by hash or
learns least_key / least_count from its own first 10 % of events and publishes it under the
topic (`keyshift.data.ysb.generate_ysb`); `round_robin` scatters a campaign over every slot,
which the job cannot place, and `hot_split` of a job whose key is looked up (YSB's campaign,
from the ad) is not tested yet, so neither is offered."""

YSB_BACKFILL_EVENT_RATE = 100.0
"""YSB with no `rate` param (as fast as possible): the events' times are spaced 1000 / 100 ms
apart (100 events per second of event time, the integration tests' spacing), ending now, and
sent without pacing (a backfill)."""

YSB_CONTINUOUS_EVENTS = 1_000_000
"""YSB in a continuous run (no `limit`): the generator produces this many events before the job
starts (the flights replay sends the whole data set, 3,000,000), and the job runs until stopped."""

APPLICATION: Path = PROJECT_ROOT / "spark_jobs" / "keyshift_job.py"
"""The Spark application the pipeline submits (it sets its own `spark.jars`)."""

SPARK_SUBMIT = "spark-submit"
"""The launcher pyspark installs into the environment's `bin/`."""

_UNSAFE_RUN_ID_CHARS = re.compile(r"[^A-Za-z0-9._-]")


def job_run_id(airflow_run_id: str) -> str:
    """The keyshift run id of an Airflow DAG run: safe for paths, Redis keys and Spark.

    Args:
        airflow_run_id: the DAG run's `run_id`, e.g. `manual__2026-01-02T03:04:05+00:00`.

    Returns:
        The same id with each character outside `[A-Za-z0-9._-]` replaced by `_`
        (`manual__2026-01-02T03_04_05_00_00`). Idempotent.

    Raises:
        ConfigurationError: the id is empty, or nothing but dots (would name `runs/` itself).
    """
    cleaned = _UNSAFE_RUN_ID_CHARS.sub("_", airflow_run_id)
    if not cleaned.strip("."):
        raise ConfigurationError(f"run id {airflow_run_id!r} is empty after cleaning; choose another")
    return cleaned


def is_bounded(limit: int | None) -> bool:
    """Whether a run with this `limit` param is bounded (a positive event count).

    Args:
        limit: events to process; `None` or `0` means a continuous run.

    Raises:
        ConfigurationError: `limit` is negative.
    """
    if limit is None or limit == 0:
        return False
    if limit < 0:
        raise ConfigurationError(f"limit must be a positive event count, or 0/null for a continuous run; got {limit}")
    return True


def validate_job(job: str | None) -> str:
    """Return the job's name (`flight_delays` for None or empty) if the pipeline runs it.

    Raises:
        ConfigurationError: naming the job and the ones the pipeline runs (`JOBS`).
    """
    job = job or "flight_delays"
    if job not in JOBS:
        raise ConfigurationError(f"job {job!r} is not run by the pipeline; choose one of {list(JOBS)}")
    return job


def validate_strategy(strategy: str, job: str | None = None) -> str:
    """Return `strategy` if the pipeline runs `job` (default flight_delays) with it.

    Raises:
        ConfigurationError: an unknown job, or a strategy the pipeline does not run the job with;
            the message names the job's choices (`JOB_STRATEGIES`).
    """
    job = validate_job(job)
    offered = JOB_STRATEGIES[job]
    if strategy not in offered:
        raise ConfigurationError(f"strategy {strategy!r} is not offered by the pipeline for job {job}; choose one of {list(offered)}")
    return strategy


def validate_exchange(exchange: str | None, watermark: str | None = None) -> str:
    """Return the exchange strategy a run uses (None or empty: `local_merge`) if it can run with
    the watermark mode (`global_merge` closes windows on the query's one watermark: `global` or `partition`).

    Raises:
        ConfigurationError: an unknown exchange, or `global_merge` with a per-key watermark mode.
    """
    from keyshift.processing.operators.exchange import check_exchange

    exchange = check_exchange(exchange or "local_merge")
    if exchange == "global_merge" and (watermark or "global") not in ("global", "partition"):
        raise ConfigurationError(f"exchange global_merge closes windows on the query's one watermark; "
                                 f"watermark mode {watermark!r} keeps per-key clocks: choose watermark global or partition")
    return exchange


def job_topics(job: str | None = None) -> tuple[str, ...]:
    """The Kafka topics a run of `job` needs, input first: input, dead letters, late events and,
    where the job sends any, alerts (`JobSpec.topics`).

    Raises:
        ConfigurationError: a job the pipeline does not run.
    """
    from keyshift.jobs import job_spec

    topics = job_spec(validate_job(job)).topics
    return tuple(t for t in (topics.input, topics.dead_letter, topics.late, topics.alerts) if t)


def job_topic(job: str | None = None) -> str:
    """The input topic of `job` (default flight_delays): `flights` or `ysb-ad-events`.

    Raises:
        ConfigurationError: a job the pipeline does not run.
    """
    return job_topics(job)[0]


def run_dir(settings: Settings, run_id: str) -> Path:
    """`runs/<run_id>/`: the folder of one job run (summary, progress, driver log)."""
    return RunDir.of(settings.runs_dir, run_id).path


def summary_path(settings: Settings, run_id: str) -> Path:
    """`runs/<run_id>/summary.json`, written by the job when it finishes."""
    return RunDir.of(settings.runs_dir, run_id).summary


DRIVER_NAME = "driver"
"""A detached driver's process name for `keyshift.stack.process`, with `runs/<run_id>/` as home."""


def driver_log_path(settings: Settings, run_id: str) -> Path:
    """`runs/<run_id>/logs/driver.log`: stdout and stderr of a detached driver
    (`keyshift.stack.process.log_file` with the run folder as home)."""
    from keyshift.stack.process import log_file

    return log_file(run_dir(settings, run_id), DRIVER_NAME)


def provision(settings: Settings, partitions: int, topics: tuple[str, ...] | None = None, job: str | None = None) -> dict[str, int]:
    """Create the pipeline's topics if missing (idempotent) and check their partition counts.

    Args:
        settings: where the broker is.
        partitions: P, the slots of the run; every topic gets P partitions.
        topics: topic names, input first; None: the job's (`job_topics`: the flight delay job's
            input, dead-letter, late and alerts topics; YSB's input, dead-letter and late).
        job: the job (default flight_delays), used when `topics` is None.

    Returns:
        `{topic: partition count}` as read back from the broker.

    Raises:
        ConfigurationError: `partitions` < 1, or the input topic already exists with another
            partition count (a job of P slots on a topic of P' partitions would place keys wrongly;
            delete the topic or run with P').
    """
    from keyshift.topics import create_topics, end_offsets

    if partitions < 1:
        raise ConfigurationError(f"partitions must be >= 1; got {partitions}")
    topics = tuple(topics) if topics else job_topics(job)
    create_topics(settings, list(topics), partitions=partitions, recreate=False)  # the stack's replication
    counts = {topic: len(end_offsets(settings, topic)) for topic in topics}
    log.info("Topics on %s: %s", settings.bootstrap_servers, counts)
    input_count = counts[topics[0]]
    if input_count != partitions:
        raise ConfigurationError(
            f"topic {topics[0]!r} has {input_count} partitions but the run asks for {partitions}; "
            f"trigger the run with partitions={input_count}, or delete the topic first"
        )
    return counts


def publish_assignment(
    settings: Settings, strategy: str, partitions: int, limit: int | None, topic: str | None = None, job: str | None = None
) -> dict[str, Any] | None:
    """Learn and publish a learned strategy's assignment for the run; nothing for a rule strategy.

    Flights, for least_key, least_count and hot_split: `keyshift.placement.learning.learn_and_publish`
    over the first 10 % of the `limit` flights (all 3,000,000 when `limit` is None/0), published
    under `topic` with a new epoch, so the replay and the job place every key alike. YSB: nothing
    here; its keys (campaign ids) are made by the generator from its seed, so the generator learns
    the assignment from its own first 10 % of events and publishes it before it produces (the
    `replay` task; `keyshift.data.ysb.generate_ysb`).

    Args:
        settings: where Redis is. strategy: the run's strategy. partitions: P.
        limit: the run's events (None/0: continuous). topic: the input topic (None: the job's).
        job: the job (default flight_delays).

    Returns:
        None for a rule strategy and for YSB; else `{"strategy", "epoch", "keys", "events",
        "split"}` (split: key -> list of slots), JSON-safe for XCom.

    Raises:
        ConfigurationError: a job or strategy the pipeline does not offer. StackError: Redis is
            down. DataError: the flights are not fetched.
    """
    from keyshift.data.flights import flights_path
    from keyshift.placement.learning import learn_and_publish
    from keyshift.processing.job_config import LEARNED_STRATEGIES

    job = validate_job(job)
    validate_strategy(strategy, job)
    topic = topic or job_topic(job)
    if strategy not in LEARNED_STRATEGIES:
        return None
    if job == "ysb":
        log.info("%s for %r is learned and published by the YSB generator (the replay task) from its own events", strategy, topic)
        return None
    learned = learn_and_publish(settings, topic, strategy, partitions, limit if is_bounded(limit) else None,
                                flights=flights_path(settings))
    log.info(
        "Published %s for %r: epoch %d, %d keys learned from %d flights, split keys %s",
        strategy, topic, learned.epoch, learned.keys, learned.events,
        ", ".join(f"{key} on {list(slots)}" for key, slots in sorted(learned.split.items())) or "none",
    )
    return {
        "strategy": strategy, "epoch": learned.epoch, "keys": learned.keys, "events": learned.events,
        "split": {key: list(slots) for key, slots in sorted(learned.split.items())},
    }


def replay(
    settings: Settings,
    limit: int | None,
    rate: float | None,
    strategy: str,
    partitions: int,
    topic: str | None = None,
    *,
    job: str | None = None,
    run_id: str | None = None,
) -> dict[str, Any]:
    """Produce the run's input into its topic: real flights, or the YSB generator's ad events.

    Args:
        settings: where the broker and Redis are.
        limit: events to produce; `None`/`0`: the flights' whole data set, or
            `YSB_CONTINUOUS_EVENTS` YSB events.
        rate: events per second; `None` is as fast as the producer goes. For YSB it is also the
            spacing of event times (1000 / rate ms; the sends are paced in real time); without it
            a backfill at `YSB_BACKFILL_EVENT_RATE` events per second of event time, ending now.
        strategy: the placement strategy of the producer's partitioner.
        partitions: P, the input topic's partition count.
        topic: the input topic (None: the job's, `job_topic`).
        job: the job (default flight_delays).
        run_id: the job's run id; YSB writes its record (`expected_views.parquet`, `ysb.json`)
            to `runs/ysb-<run_id>/`, where the data quality task finds it through the job's
            replay record. Required for YSB.

    Returns:
        `dataclasses.asdict(ReplayResult)` (JSON-safe, for XCom): at least `events_produced`;
        for YSB also `record_dir`, `views`, `windows` and `events_by_type`.

    Raises:
        ConfigurationError: bad job, strategy or limit, or YSB without a run id. Whatever
            `replay_flights` / `generate_ysb` raise (`DataError`, `StackError`) passes through.
    """
    job = validate_job(job)
    validate_strategy(strategy, job)
    topic = topic or job_topic(job)
    bounded = is_bounded(limit)
    if job == "ysb":
        return _replay_ysb(settings, limit if bounded else YSB_CONTINUOUS_EVENTS, rate, strategy, partitions, topic, run_id)
    from keyshift.data.replay import replay_flights

    log.info(
        "Replaying %s flights into %r at %s events/s with strategy %s over %d partitions",
        limit if bounded else "all", topic, rate or "unbounded", strategy, partitions,
    )
    result = replay_flights(
        settings, topic, limit=limit if bounded else None, rate=rate,
        strategy=strategy, partitions=partitions, progress=False,
    )
    record = _json_safe(result)
    log.info("Replay done: %s events produced into %r", record.get("events_produced"), topic)
    return record


def _json_safe(result: Any) -> dict[str, Any]:
    record = dataclasses.asdict(result) if dataclasses.is_dataclass(result) else dict(vars(result))
    return json.loads(json.dumps(record, default=str))


def ysb_generation(events: int, rate: float | None, now_ms: int) -> dict[str, Any]:
    """How the YSB generator makes exactly `events` events: `{"rate", "duration", "start_ms"}`.

    With a `rate` the events are paced in real time from now (`start_ms` None); without one they
    are a backfill spaced at `YSB_BACKFILL_EVENT_RATE` events per second of event time whose last
    event is at most `now_ms`. The duration is (events + 0.5) / rate seconds, so that the
    generator's floor(rate x duration) is `events` despite float rounding.

    Raises:
        ConfigurationError: `events` < 1 or `rate` <= 0.
    """
    if events < 1:
        raise ConfigurationError(f"a YSB run needs at least one event; got limit {events}")
    if rate is not None and rate <= 0:
        raise ConfigurationError(f"rate must be > 0 events/s; got {rate}")
    spacing = float(rate) if rate else YSB_BACKFILL_EVENT_RATE
    duration = (events + 0.5) / spacing
    start_ms = None if rate else max(0, now_ms - int(events * 1000 / spacing))
    return {"rate": spacing, "duration": duration, "start_ms": start_ms}


def _replay_ysb(settings: Settings, events: int, rate: float | None, strategy: str, partitions: int, topic: str,
                run_id: str | None) -> dict[str, Any]:
    """Generate the YSB events of a pipeline run (see `replay`)."""
    import time

    from keyshift.data.ysb import generate_ysb

    if not run_id:
        raise ConfigurationError("a YSB replay needs the run id (its record goes to runs/ysb-<run_id>/)")
    plan = ysb_generation(events, rate, int(time.time() * 1000))
    log.info("Generating %d YSB events into %r (%s) with strategy %s over %d partitions", events, topic,
             f"paced at {rate} events/s" if rate else f"backfill at {plan['rate']:g} events/s of event time", strategy, partitions)
    result = generate_ysb(settings, topic, rate=plan["rate"], duration=plan["duration"], start_ms=plan["start_ms"],
                          strategy=strategy, partitions=partitions, run_id=run_id, progress=False)
    record = _json_safe(result.replay)
    record.update(record_dir=str(result.run_dir), views=result.views, windows=result.windows, events_by_type=result.events_by_type)
    log.info("YSB generation done: %s events (%d views in %d windows) into %r; record in %s", record["events_produced"],
             result.views, result.windows, topic, result.run_dir)
    return record


def spark_submit_args(
    run_id: str,
    strategy: str,
    partitions: int | str,
    bound_ms: int | str,
    limit: int | str | None = None,
    *,
    topic: str | None = None,
    max_offsets_per_trigger: int | None = None,
    watermark: str | None = None,
    job: str | None = None,
    exchange: str | None = None,
) -> list[str]:
    """The job's own arguments (after the application path, `spark_jobs/keyshift_job.py`).

    Values may be Jinja templates (`"{{ params.partitions }}"`): the DAG passes templates and
    Airflow renders them when the task runs; the detached launch passes plain values.

    Args:
        run_id: the keyshift run id (`job_run_id`).
        strategy: placement strategy name. partitions: P. bound_ms: watermark bound in ms.
        limit: events to process then exit; `None` (or 0) runs until stopped.
        topic: the input topic; None: the job's default (`job_topic`).
        max_offsets_per_trigger: records per micro-batch at most; None: the job's default.
        watermark: the watermark mode (`keyshift.eventtime.watermarks.WATERMARK_MODES`); None
            or empty: the job's default (`global`).
        job: the registered job (`--job`, e.g. `ysb`); None or empty: the application's default
            (flight_delays).
        exchange: the exchange strategy (`keyshift.processing.operators.exchange.EXCHANGES`); None or
            empty: the job's default (`local_merge`).

    Returns:
        `["--run-id", run_id, ("--job", job), "--strategy", s, "--partitions", P, "--bound-ms", b,
        ("--limit", N), ("--topic", t), ("--max-offsets-per-trigger", n), ("--watermark", mode),
        ("--exchange", e)]`.
    """
    args = ["--run-id", str(run_id)]
    if job:
        args += ["--job", str(job)]
    args += [
        "--strategy", str(strategy),
        "--partitions", str(partitions),
        "--bound-ms", str(bound_ms),
    ]
    if limit not in (None, 0, "0", ""):
        args += ["--limit", str(limit)]
    if topic:
        args += ["--topic", str(topic)]
    if max_offsets_per_trigger:
        args += ["--max-offsets-per-trigger", str(max_offsets_per_trigger)]
    if watermark:
        args += ["--watermark", str(watermark)]
    if exchange:
        args += ["--exchange", str(exchange)]
    return args


def resume_args(run_id: str) -> list[str]:
    """The flight delay job's arguments to continue run `run_id` from its checkpoint after its
    driver died: `["--resume", run_id]` (the job reads the rest from `runs/<run_id>/job.json`).
    The supervisor of a detached run restarts its driver with these (`supervisor.py`)."""
    return ["--resume", str(run_id)]


def connector_jars_option() -> str:
    """`spark-submit --jars` value: the Kafka connector jars (fetched into the cache if missing).

    Under spark-submit the driver JVM starts before the job's code, so the job cannot add them
    itself; the DAG renders this at run time (a Jinja macro), never at import.
    """
    from keyshift.settings import Settings
    from keyshift.stack.spark import jars_option

    return jars_option(Settings())


def driver_java_options(settings: Settings | None = None) -> str:
    """`spark.driver.extraJavaOptions` for a spark-submit launch: map the driver JVM's class
    archive when one exists and `settings.spark_class_archive` (`KEYSHIFT_SPARK_CLASS_ARCHIVE`)
    is on, else "" (`keyshift.runtime.class_archive.spark_submit_java_options`). The DAG
    renders it at run time (a Jinja macro), never at import.

    Args:
        settings: a `keyshift.settings.Settings`; None: `Settings()` from the environment.
    """
    from keyshift.runtime.class_archive import spark_submit_java_options
    from keyshift.stack.spark import job_jars

    settings = settings or Settings()
    return spark_submit_java_options(settings.cache, job_jars(settings)) if settings.spark_class_archive else ""


def venv_bin() -> Path:
    """The `bin/` folder of the interpreter running keyshift (where `spark-submit` lives)."""
    return Path(sys.executable).parent


def spark_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment additions for a spark-submit child: the project's interpreter and PATH.

    Python workers must run the project's interpreter (`PYSPARK_PYTHON`, DESIGN.md), and the
    Spark provider finds `spark-submit` on PATH, so the environment's `bin/` goes first.

    Args:
        base: the environment to extend PATH from (default `os.environ`).

    Returns:
        `{"PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PATH"}` to merge over the parent's env.
    """
    base = os.environ if base is None else base
    python = str(venv_bin() / "python")
    path = os.pathsep.join(p for p in (str(venv_bin()), base.get("PATH", "")) if p)
    return {"PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python, "PATH": path}


def consumer_lag(end_offsets: Mapping[int, int], job_offsets: Mapping[str | int, int]) -> dict[int, int]:
    """Per-partition consumer lag of a job: broker end offset − the job's next offset.

    Args:
        end_offsets: `{partition: end offset}` of the input topic (the next offset to be written).
        job_offsets: the job's latest progress `offsets`, `{"<partition>": next offset to read}`;
            a partition the job has not read yet counts from 0.

    Returns:
        `{partition: lag}`, each ≥ 0 (a job ahead of a stale end-offset read counts 0).
    """
    read = {int(p): int(o) for p, o in job_offsets.items()}
    return {int(p): max(0, int(end) - read.get(int(p), 0)) for p, end in sorted(end_offsets.items())}


def read_summary(settings: Settings, run_id: str) -> dict[str, Any]:
    """Load `runs/<run_id>/summary.json`.

    Raises:
        JobError: the file is missing (the job did not finish) or is not a JSON object;
            the message names the path and the driver log.
    """
    path = summary_path(settings, run_id)
    if not path.is_file():
        raise JobError(
            f"run {run_id} wrote no summary at {path}; see the job's log "
            f"({driver_log_path(settings, run_id)} for a detached run, else the Airflow task log)"
        )
    try:
        summary = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise JobError(f"summary {path} is not valid JSON: {exc}") from exc
    if not isinstance(summary, dict):
        raise JobError(f"summary {path} holds a {type(summary).__name__}, expected a JSON object")
    return summary


def summary_problems(
    summary: Mapping[str, Any],
    *,
    run_id: str | None = None,
    expected_events: int | None = None,
    events_replayed: int | None = None,
    complete: bool = True,
) -> list[str]:
    """Everything wrong with a job summary; an empty list means it reconciles.

    The rules: every event read is accounted for exactly once,
    `events_read == sum_window_counts + late_events + dead_letters + filtered_events +
    pending_events` (a late event and a dead letter are counted, never dropped: DESIGN.md
    vocabulary; filtered events are valid records a job's `keep` rule leaves out, YSB's clicks and
    purchases, 0 or absent for the flights; pending events sit in windows still open in the state
    of a stopped continuous run, none after a complete run); a complete run read what was
    produced, `events_read == events_produced`; for a bounded run both equal the `limit`; and the
    replay task's own count agrees.

    Args:
        summary: the parsed `summary.json`.
        run_id: the expected `run_id` field, if known.
        expected_events: the bounded run's `limit`, if any.
        events_replayed: `events_produced` reported by the pipeline's replay task, if any.
        complete: whether the run had to read everything produced (a bounded run); a continuous
            run stopped on request may stop short, so only the accounting rule applies to it.
    """
    problems: list[str] = []
    required = ("events_read", "sum_window_counts", "late_events", "dead_letters") + (("events_produced",) if complete else ())
    missing = [k for k in required if not isinstance(summary.get(k), int)]
    if missing:
        return [f"summary lacks integer field(s) {missing}"]
    read = summary["events_read"]
    pending = int(summary.get("pending_events") or 0)
    filtered = int(summary.get("filtered_events") or 0)
    accounted = summary["sum_window_counts"] + summary["late_events"] + summary["dead_letters"] + filtered + pending
    if read != accounted:
        problems.append(
            f"events_read {read} != sum_window_counts {summary['sum_window_counts']} + late_events "
            f"{summary['late_events']} + dead_letters {summary['dead_letters']} + filtered_events {filtered}"
            f" + pending_events {pending} (= {accounted})"
        )
    if complete and pending:
        problems.append(f"{pending} events still in open windows after a complete run")
    if complete and read != summary["events_produced"]:
        problems.append(f"events_read {read} != events_produced {summary['events_produced']}")
    if expected_events is not None and read != expected_events:
        problems.append(f"events_read {read} != limit {expected_events}")
    if events_replayed is not None and summary.get("events_produced") != events_replayed:
        problems.append(f"events_produced {summary.get('events_produced')} != replayed {events_replayed}")
    if run_id is not None and summary.get("run_id") not in (None, run_id):
        problems.append(f"summary run_id {summary.get('run_id')!r} != {run_id!r}")
    return problems


def verify_summary(
    settings: Settings,
    run_id: str,
    *,
    expected_events: int | None = None,
    events_replayed: int | None = None,
    complete: bool = True,
) -> dict[str, Any]:
    """Read a run's summary, check it reconciles (`summary_problems`), log and return it.

    Raises:
        JobError: no summary, or one that does not reconcile; the message lists every problem
            and the summary's path.
    """
    summary = read_summary(settings, run_id)
    problems = summary_problems(
        summary, run_id=run_id, expected_events=expected_events, events_replayed=events_replayed,
        complete=complete,
    )
    if problems:
        raise JobError(f"summary {summary_path(settings, run_id)} does not reconcile: " + "; ".join(problems))
    log.info(
        "Run %s reconciles: %d events read = %d in windows + %d late + %d dead letters + %d filtered; "
        "balance degree %s; %s events/s",
        run_id, summary["events_read"], summary["sum_window_counts"], summary["late_events"],
        summary["dead_letters"], int(summary.get("filtered_events") or 0), summary.get("balance_degree"),
        summary.get("events_per_second"),
    )
    return summary


def conclude_run(
    settings: Settings,
    run_id: str,
    params: Mapping[str, Any],
    replayed: Mapping[str, Any] | None = None,
    dag_run_id: str | None = None,
) -> dict[str, Any]:
    """The pipeline's last task: verify the run's summary and write `runs/<run_id>/pipeline.json`.

    A bounded run must leave a summary that reconciles with its `limit` and with the replay
    (`verify_summary`). A continuous run that was stopped may have written none; then only the
    pipeline record is written, saying so.

    Args:
        settings: where runs live. run_id: the keyshift run id.
        params: the DAG run's params (strategy, partitions, limit, rate, bound_ms).
        replayed: the replay task's result (`replay`), if it ran.
        dag_run_id: the Airflow run id, recorded for tracing.

    Returns:
        The pipeline record (params, replay, verification outcome, summary fields).

    Raises:
        JobError: a bounded run without a reconciling summary, or a continuous run whose
            summary exists but does not reconcile.
    """
    limit = params.get("limit")
    bounded = is_bounded(limit)
    events_replayed = (replayed or {}).get("events_produced")
    record: dict[str, Any] = {
        "run_id": run_id, "dag_run_id": dag_run_id, "mode": "bounded" if bounded else "continuous",
        "params": dict(params), "replay": dict(replayed) if replayed else None,
        "summary_path": str(summary_path(settings, run_id)),
    }
    try:
        if bounded or summary_path(settings, run_id).is_file():
            summary = verify_summary(
                settings, run_id,
                expected_events=limit if bounded else None,
                # a continuous run may have been stopped before it read everything replayed
                events_replayed=events_replayed if bounded else None,
                complete=bounded,
            )
            record.update(verified=True, summary=summary)
        else:
            log.info("Continuous run %s ended without a summary at %s", run_id, record["summary_path"])
            record.update(verified=False, summary=None)
    except JobError as exc:
        record.update(verified=False, error=str(exc))
        write_pipeline_record(settings, run_id, record)
        raise
    write_pipeline_record(settings, run_id, record)
    return record


def write_pipeline_record(settings: Settings, run_id: str, record: Mapping[str, Any]) -> Path:
    """Write `runs/<run_id>/pipeline.json`: what the DAG run asked for and what it verified.

    Returns:
        The file's path. The write is atomic (temp file, then rename).
    """
    path = RunDir.of(settings.runs_dir, run_id).pipeline
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")
    tmp.replace(path)
    log.info("Wrote %s", path)
    return path
