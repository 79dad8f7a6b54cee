"""A keyed window job's pipeline as a function from the Kafka source to the processor's output.

source (Kafka rows: key, value, partition, offset), coalesced to `JobConfig.source_tasks`
tasks (each reads a range of Kafka partitions)
-> ingest, one mapInArrow (`keyshift.processing.operators.ingest`): keep this run's records, parse and
   validate (the job spec's record rules), event-time plausibility (implausible events become
   dead letters before the watermark can see them), the key lookup of a `key_lookup` spec,
   dead-letter payloads, then Local Merge: partials per (key, window) with the slot token from
   the assignment, each carrying its largest event time
-> event-time watermark over that largest event time -> drop end-of-input markers
-> groupBy(token).transformWithStateInPandas(KeyedWindowProcessor) (drops duplicated event ids),
   over `JobConfig.stateful_partitions` Spark partitions (each slot a token of its own)

A spec with `window="key_windows"` (sliding windows, paper 003) shares the ingest (without Local
Merge: one row per event) and the watermark, then takes
`keyshift.processing.operators.key_window_stream.key_window_stream` instead of KeyedWindowProcessor: slot
token per event -> KeyWindowProcessor.

The result is a streaming DataFrame of `keyshift.processing.operators.processor.output_schema(spec)` rows
that the sink (`keyshift.processing.outputs.sinks.KeyedWindowSink`) splits into windows, alerts, late
events, dead letters and per-slot loads. Which job runs is `JobConfig.job` (the
flights by default); its spec says what is computed (`keyshift.jobs`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from keyshift.errors import ConfigurationError
from keyshift.eventtime.partition_clocks import DEFAULT_IDLE_TIMEOUT_S
from keyshift.eventtime.plausibility import PlausibilityLimits
from keyshift.eventtime.watermarks import WatermarkPolicy
from keyshift.eventtime.windows import HOUR_MS
from keyshift.names import FLIGHTS_TOPIC, RunDir
from keyshift.placement.learning import LEARNED_STRATEGIES
from keyshift.placement.tokens import slot_tokens
from keyshift.processing.operators.ingest import (
    CONTROL_COLUMN, DEFAULT_CHUNK_RECORDS, EVENT_TS_COLUMN, IngestContext, event_times_of_events, event_times_of_partials, events_schema, ingest_function,
    stage_schema,
)
from keyshift.processing.operators.exchange import check_exchange, parse_emit
from keyshift.processing.operators.local_merge import partial_schema, partials_function
from keyshift.processing.operators.processor import KeyedWindowProcessor, output_schema
from keyshift.jobs.spec import JobSpec

RULE_STRATEGIES = ("hash", "modulo")
"""Strategies each executor can compute itself: a pure function of the key."""
JOB_STRATEGIES = RULE_STRATEGIES + LEARNED_STRATEGIES
"""Strategies the job places with. The learned ones (`LEARNED_STRATEGIES`: least_key, least_count
of paper 000 Algorithm 1, and our hot_split) have a history map: the job reads the assignment
published in Redis under the input topic's name (`keyshift.placement.assignment_store`) at
start, so every executor and every producer place a key on the same slot (a split key's event
on the same piece's slot)."""


def check_job_strategy(name: str) -> str:
    """Return `name` if the job can place keys with it.

    Raises:
        ConfigurationError: for a strategy the job does not place with (weight: its random
            landing would differ between executors).
    """
    if name not in JOB_STRATEGIES:
        raise ConfigurationError(
            f"a keyshift job cannot use strategy {name!r}; use one of {', '.join(JOB_STRATEGIES)}"
        )
    return name


@dataclass(frozen=True)
class JobConfig:
    """What one run of a keyed window job does (the flight delay job by default).

    Attributes:
        run_id: names the run's folder `runs/<run_id>/` and its Redis records.
        job: the job's name (`keyshift.jobs.job_spec`), default `flight_delays`.
        strategy: placement strategy name, one of `JOB_STRATEGIES`.
        partitions: P slots = Kafka partitions of the input.
        max_stateful_partitions: Spark's stateful partitions at most; the query takes
            `stateful_partitions` = min(P, this) (`spark.sql.shuffle.partitions`) and spreads the
            slots over them by range (`keyshift.placement.tokens.stateful_partition_of_slot`);
            its ingest stage runs as many tasks (`source_tasks`).
            None: one per slot (S = P). A new run started by
            `keyshift.runtime.driver.run_job` without one gets
            `default_max_stateful_partitions` of its engine's cores, kept in its job record.
        epoch: the assignment epoch in force, written on every window.
        bound_ms: watermark bound, ms of event time: watermark = max event time seen - bound.
        window_ms: window size p, ms of event time (tumbling; or the sliding window's size of a
            key-window job, whose slide is the spec's `slide_ms`).
        topic: the input topic.
        max_offsets_per_trigger: records per micro-batch at most (None: all available).
        limit: bounded run: wait for at least this many records in the topic, drain, flush the
            last windows, stop. None: run until stopped.
        idle_timeout_s: a bounded run fails when no batch completes for this long (seconds); a
            continuous run waits for input as long as it takes.
        end_offsets: a bounded run's end, partition -> offset (exclusive), set by the driver
            once the input is there: records at or past it belong to someone else's later
            replay and are ignored, so a run reads exactly [start, end) plus its own markers.
        assignment: a learned strategy's key -> slot map (its first slot for a split key), read
            from Redis at start; None for a rule strategy.
        redis_url: where executors ask the store's atomic assign for keys `assignment` lacks.
        split: hot_split's split keys -> their slots (two or more; piece i on element i).
        max_ahead_ms: event-time plausibility, ms of event time an event may be ahead of the
            stream (watermark + bound, or its chunk's median) or of its batch's timestamp before
            it is a dead letter (`keyshift.eventtime.plausibility`); default 7 days.
        max_behind_ms: ms of event time an event may be behind the watermark (in the first
            batch: its chunk's median) before it is a dead letter; default 30 days.
        reference_min_events: events a chunk needs for its median event time to count as a
            reference of the stream; default 50.
        watermark: the watermark mode, one of `keyshift.eventtime.watermarks.WATERMARK_MODES`:
            `global` (Spark's, the default), `partition` (the minimum over the active Kafka
            partitions' clocks minus `bound_ms`, Flink's), `key`, `nkey`, `dynamic` (`bound_ms`
            is then the maximum bound M).
        watermark_groups: N, watermark groups of `nkey` mode.
        idle_fallback: `global` or `timeout`: how a silent key's windows close (per-key modes).
        idle_lag_ms: per-key modes: every watermark is at least the stream's event time minus
            this (ms of event time): the minimum over the active Kafka partitions' clocks
            (`keyshift.eventtime.partition_clocks`); default two days.
        partition_idle_timeout_s: seconds of processing time after which a Kafka partition that
            delivered no record stops holding the others' watermark back (until its next record);
            default 60.
        max_partition_drift_ms: watermark alignment: no Kafka partition is read more than this
            (ms of event time) ahead of the slowest one with records to read; the input is then
            read by keyshift's aligned Kafka source (`keyshift.processing.sources.aligned_kafka`) instead
            of Spark's. None (default): Spark's Kafka source, no bound.
        key_idle_timeout_s: `timeout` fallback: seconds of processing time without events after
            which a key closes all its windows.
        exchange: how events reach a key's windows (`keyshift.processing.operators.exchange.EXCHANGES`):
            `local_merge` (default), `plain` (every event crosses the shuffle) or `global_merge`
            (no shuffle; windows merged in Redis, `keyshift.processing.operators.global_merge`).
        emit: Local Merge's emit mode, `batch` (default), `window` or `count:N`
            (`keyshift.processing.operators.exchange`); ignored by `plain`.
    """

    run_id: str
    job: str = "flight_delays"
    strategy: str = "hash"
    partitions: int = 8
    max_stateful_partitions: int | None = None
    epoch: int = 0
    bound_ms: int = HOUR_MS
    window_ms: int = HOUR_MS
    topic: str = FLIGHTS_TOPIC
    max_offsets_per_trigger: int | None = 250_000
    limit: int | None = None
    idle_timeout_s: float = 300.0
    end_offsets: dict[int, int] | None = None
    assignment: dict[str, int] | None = None
    redis_url: str | None = None
    split: dict[str, tuple[int, ...]] | None = None
    max_ahead_ms: int = PlausibilityLimits.max_ahead_ms
    max_behind_ms: int = PlausibilityLimits.max_behind_ms
    reference_min_events: int = PlausibilityLimits.reference_min_events
    watermark: str = "global"
    watermark_groups: int = WatermarkPolicy.groups
    idle_fallback: str = WatermarkPolicy.idle_fallback
    idle_lag_ms: int = WatermarkPolicy.idle_lag_ms
    key_idle_timeout_s: float = WatermarkPolicy.idle_timeout_s
    partition_idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    max_partition_drift_ms: int | None = None
    exchange: str = "local_merge"
    emit: str = "batch"

    @property
    def spec(self) -> JobSpec:
        """The job's spec (raises ConfigurationError for an unknown job)."""
        from keyshift.jobs import job_spec

        return job_spec(self.job)

    @property
    def stateful_partitions(self) -> int:
        """S, the query's stateful partitions (`spark.sql.shuffle.partitions`): min(P,
        `max_stateful_partitions`), or P when that is None.

        Raises:
            PlacementError: `max_stateful_partitions` < 1.
        """
        from keyshift.placement.tokens import capped_stateful_partitions

        return capped_stateful_partitions(self.partitions, self.max_stateful_partitions)

    @property
    def source_tasks(self) -> int:
        """Tasks of the ingest stage per micro-batch: S (`stateful_partitions`), each reading
        P/S Kafka partitions one after the other (`DataFrame.coalesce`, no shuffle), so the
        ingest stage pays the per-task cost S times, not P; P for `global_merge`, whose tasks
        each merge one Kafka partition's slot into Redis (`keyshift.processing.operators.global_merge`).

        Raises:
            PlacementError: `max_stateful_partitions` < 1.
        """
        return self.partitions if self.exchange == "global_merge" else self.stateful_partitions

    @property
    def watermark_policy(self) -> WatermarkPolicy:
        """The run's watermark policy (raises ConfigurationError for a bad mode or value)."""
        return WatermarkPolicy(
            mode=self.watermark, bound_ms=self.bound_ms, groups=self.watermark_groups, idle_fallback=self.idle_fallback,
            idle_lag_ms=self.idle_lag_ms, idle_timeout_s=self.key_idle_timeout_s,
        )

    def check_exchange(self) -> None:
        """Check `exchange` and `emit` against the job and the watermark mode.

        Raises:
            ConfigurationError: an unknown exchange or emit mode; `global_merge` with a per-key
                watermark mode or a key-window job; `plain`/`global_merge` are for tumbling jobs.
        """
        check_exchange(self.exchange)
        parse_emit(self.emit)
        if self.exchange != "local_merge" and self.spec.key_windows:
            raise ConfigurationError(f"job {self.job} computes key windows, which take events one by one; "
                                     f"exchange {self.exchange!r} is for tumbling-window jobs")
        if self.exchange == "global_merge" and self.watermark_policy.per_key:
            raise ConfigurationError(f"exchange global_merge closes windows on the global watermark; "
                                     f"watermark mode {self.watermark!r} keeps per-key clocks in the processor's state")

    @property
    def plausibility(self) -> PlausibilityLimits:
        """The event-time plausibility limits of this run (raises ConfigurationError if < 1)."""
        return PlausibilityLimits(self.max_ahead_ms, self.max_behind_ms, self.reference_min_events)


def default_checkpoint_dir(run_id: str) -> Path:
    """`runs/<run_id>/checkpoint` under the default settings' runs folder, where
    `keyshift.runtime.driver.run_job` puts a run's checkpoint."""
    from keyshift.settings import Settings

    return RunDir.of(Settings().runs_dir, run_id).checkpoint()


def job_stream(
    kafka_rows: DataFrame,
    config: JobConfig,
    checkpoint_dir: str | Path | None = None,
    initial_state=None,
    watermark_floor_ms: int = 0,
    marker_floor: Mapping[int, int] | None = None,
    clocks_dir: Path | str | None = None,
    batch_base: int = 0,
) -> DataFrame:
    """Chain parse -> plausibility -> watermark -> Local Merge with slot tokens -> stateful processor.

    Args:
        kafka_rows: the Kafka source's rows (`key`, `value`, `partition`, `offset`), streaming.
        config: the run's configuration.
        checkpoint_dir: the `checkpointLocation` the query will be started with: the
            plausibility check reads each batch's watermark from its offset log. Default:
            `default_checkpoint_dir(config.run_id)`. A batch whose offsets file is not there
            fails the query (JobError) rather than being judged without its watermark.
        initial_state: after a switch, the migrated state grouped by token
            (`keyshift.processing.operators.state_variables.initial_state_frame`); None: start empty.
        watermark_floor_ms: after a switch, the old query's next watermark (ms of event time):
            lateness, window closing and the plausibility reference never go below it.
        marker_floor: after a switch, partition -> the topic's end offset when the segment was
            made: the run's end-of-input markers below it are ignored (`IngestContext`).
        clocks_dir: the run's folder, where the driver keeps the partition clocks
            (`keyshift.eventtime.partition_clocks`; the driver must prepare and seal every batch,
            `keyshift.runtime.driver`); None: no partition clocks (plausibility against
            Spark's watermark, no capping).
        batch_base: the run-wide id of this query's batch 0.

    Returns:
        A streaming DataFrame of processor output rows, append mode: `output_schema(config.spec)`
        for a tumbling spec; for a key-window spec (`config.spec.key_windows`) the rows of
        `keyshift.processing.operators.key_window_stream.key_window_stream`. With `exchange` =
        `global_merge`: the ingest stage's rows after the watermark, markers kept, for
        `keyshift.processing.operators.global_merge.GlobalMergeSink` (no stateful operator).

    Raises:
        ConfigurationError: a key-window job with split keys or the `timeout` idle fallback; an
            exchange the run cannot use (`JobConfig.check_exchange`).

    The watermark column is dropped before the stateful operator on purpose: the processor itself
    decides lateness per event (window end <= watermark) and sends late events to a side output,
    so Spark must not filter them out silently first.
    """
    policy, spec = config.watermark_policy, config.spec
    context = IngestContext(
        run_id=config.run_id, end_offsets=config.end_offsets,
        checkpoint_dir=str(checkpoint_dir or default_checkpoint_dir(config.run_id)),
        bound_ms=policy.spark_delay_ms, limits=config.plausibility, watermark_floor_ms=watermark_floor_ms,
        marker_floor={int(p): int(o) for p, o in marker_floor.items()} if marker_floor else None,
        chunk_records=int(kafka_rows.sparkSession.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch",
                                                           str(DEFAULT_CHUNK_RECORDS))),
        clocks_dir=str(clocks_dir) if clocks_dir is not None else None, batch_base=int(batch_base),
        query=Path(str(checkpoint_dir or default_checkpoint_dir(config.run_id))).name, cap_event_time=policy.caps_event_time,
    )
    store = (config.redis_url, config.topic) if config.assignment is not None else None
    lookup = None
    if spec.key_lookup is not None:  # the executors read the lookup map from the run's Redis
        from keyshift.settings import Settings

        lookup = (config.redis_url or Settings().redis_url, config.topic)
    if spec.key_windows:
        from keyshift.processing.operators.key_window_stream import check_key_window_run, key_window_stream

        check_key_window_run(spec, config.split, policy)
        rows_of, row_schema = None, events_schema(spec)
        event_times_of = event_times_of_events(spec)
    else:
        config.check_exchange()
        emit = None if config.exchange == "plain" else parse_emit(config.emit)
        rows_of = partials_function(spec, config.strategy, config.partitions, config.window_ms, config.assignment, store, config.split,
                                    emit, config.stateful_partitions)
        row_schema, event_times_of = partial_schema(spec), event_times_of_partials
    source = kafka_rows.select("key", "value", "partition", "offset")
    if config.source_tasks < config.partitions:  # no shuffle: each task reads a range of Kafka partitions
        source = source.coalesce(config.source_tasks)
    staged = source.mapInArrow(
        ingest_function(spec, context, rows_of, row_schema, event_times_of, lookup), stage_schema(row_schema),
    )
    if config.exchange == "global_merge":  # no shuffle: foreachBatch merges (keyshift.processing.operators.global_merge)
        return staged.withWatermark(EVENT_TS_COLUMN, f"{policy.spark_delay_ms} milliseconds")
    rows = (
        # per-key modes: Spark's watermark is the fallback every key's watermark stays above
        staged.withWatermark(EVENT_TS_COLUMN, f"{policy.spark_delay_ms} milliseconds")
        # Markers must pass the watermark operator before they are dropped; Spark pushes a filter
        # below EventTimeWatermark unless it references the event-time column, so this one does.
        .where(~(F.col(CONTROL_COLUMN) & F.col(EVENT_TS_COLUMN).isNotNull()))
        .drop(EVENT_TS_COLUMN, CONTROL_COLUMN)
    )
    if spec.key_windows:
        return key_window_stream(rows, spec, config.strategy, config.partitions, config.window_ms,
                                 policy, config.assignment, store, watermark_floor_ms, initial_state, config.stateful_partitions)
    return (
        rows.groupBy("token")
        .transformWithStateInPandas(
            statefulProcessor=KeyedWindowProcessor(spec, slot_tokens(config.partitions, config.stateful_partitions), config.window_ms,
                                                   watermark_floor_ms, policy),
            outputStructType=output_schema(spec),
            outputMode="Append",
            timeMode="EventTime",
            initialState=initial_state,
        )
    )
