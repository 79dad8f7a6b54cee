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
   over `PlacementConfig.stateful_partitions` Spark partitions (each slot a token of its own)

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
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from keyshift.checkpoint_files import checkpoint_name
from keyshift.names import RunDir
from keyshift.placement.tokens import slot_tokens
from keyshift.processing.job_config import JobConfig
from keyshift.processing.operators.ingest import (
    CONTROL_COLUMN, DEFAULT_CHUNK_RECORDS, EVENT_TS_COLUMN, IngestContext, event_times_of_events, event_times_of_partials, events_schema, ingest_function,
    stage_schema,
)
from keyshift.processing.operators.exchange import parse_emit
from keyshift.processing.operators.local_merge import partial_schema, partials_function
from keyshift.processing.operators.processor import KeyedWindowProcessor, output_schema

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
    batch_channel: str | None = None,
    batch_base: int = 0,
) -> DataFrame:
    """Chain parse -> plausibility -> watermark -> Local Merge with slot tokens -> stateful processor.

    Args:
        kafka_rows: the Kafka source's rows (`key`, `value`, `partition`, `offset`), streaming.
        config: the run's configuration.
        checkpoint_dir: the `checkpointLocation` the query will be started with (a path or a
            Hadoop URI); its last name tags the ingest tasks' reports. Default:
            `default_checkpoint_dir(config.run_id)`.
        initial_state: after a switch, the migrated state grouped by token
            (`keyshift.processing.operators.state_variables.initial_state_frame`); None: start empty.
        watermark_floor_ms: after a switch, the old query's next watermark (ms of event time):
            lateness, window closing and the plausibility reference never go below it.
        marker_floor: after a switch, partition -> the topic's end offset when the segment was
            made: the run's end-of-input markers below it are ignored (`IngestContext`).
        batch_channel: the Redis URL of the run's batch channel
            (`keyshift.eventtime.batch_channel`): the driver publishes each batch's partition
            clocks and plausibility reference there before the batch runs and seals the batch
            from the tasks' reports (`keyshift.processing.outputs.clocked_batches.ClockedBatches`,
            which `keyshift.runtime.driver` wraps every sink in; a batch without a published
            context fails with JobError rather than being judged without it). None: no partition
            clocks (plausibility without a watermark, no capping).
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
    policy, spec = config.event_time.policy, config.spec
    context = IngestContext(
        run_id=config.run_id, end_offsets=config.input.end_offsets,
        bound_ms=policy.spark_delay_ms, limits=config.event_time.plausibility, watermark_floor_ms=watermark_floor_ms,
        marker_floor={int(p): int(o) for p, o in marker_floor.items()} if marker_floor else None,
        chunk_records=int(kafka_rows.sparkSession.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch",
                                                           str(DEFAULT_CHUNK_RECORDS))),
        batch_channel=batch_channel, batch_base=int(batch_base),
        query=checkpoint_name(checkpoint_dir or default_checkpoint_dir(config.run_id)), cap_event_time=policy.caps_event_time,
    )
    store = (config.redis_url, config.input.topic) if config.placement.assignment is not None else None
    lookup = None
    if spec.key_lookup is not None:  # the executors read the lookup map from the run's Redis
        from keyshift.settings import Settings

        lookup = (config.redis_url or Settings().redis_url, config.input.topic)
    if spec.key_windows:
        from keyshift.processing.operators.key_window_stream import check_key_window_run, key_window_stream

        check_key_window_run(spec, config.placement.split, policy)
        rows_of, row_schema = None, events_schema(spec)
        event_times_of = event_times_of_events(spec)
    else:
        config.check_exchange()
        emit = None if config.exchange.mode == "plain" else parse_emit(config.exchange.emit)
        rows_of = partials_function(spec, config.placement.strategy, config.placement.partitions, config.window_ms, config.placement.assignment, store, config.placement.split,
                                    emit, config.placement.stateful_partitions)
        row_schema, event_times_of = partial_schema(spec), event_times_of_partials
    source = kafka_rows.select("key", "value", "partition", "offset")
    if config.source_tasks < config.placement.partitions:  # no shuffle: each task reads a range of Kafka partitions
        source = source.coalesce(config.source_tasks)
    # a keyed window job's switch hands its state over in a barrier batch that reaches every token
    barrier = None if spec.key_windows or config.exchange.mode == "global_merge" \
        else slot_tokens(config.placement.partitions, config.placement.stateful_partitions)
    staged = source.mapInArrow(
        ingest_function(spec, context, rows_of, row_schema, event_times_of, lookup, barrier), stage_schema(row_schema),
    )
    if config.exchange.mode == "global_merge":  # no shuffle: foreachBatch merges (keyshift.processing.operators.global_merge)
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
        return key_window_stream(rows, spec, config.placement.strategy, config.placement.partitions, config.window_ms,
                                 policy, config.placement.assignment, store, watermark_floor_ms, initial_state, config.placement.stateful_partitions)
    return (
        rows.groupBy("token")
        .transformWithStateInPandas(
            statefulProcessor=KeyedWindowProcessor(spec, slot_tokens(config.placement.partitions, config.placement.stateful_partitions), config.window_ms,
                                                   watermark_floor_ms, policy),
            outputStructType=output_schema(spec),
            outputMode="Append",
            timeMode="EventTime",
            initialState=initial_state,
        )
    )
