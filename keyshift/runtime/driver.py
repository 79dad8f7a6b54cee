"""Run a keyed window job (any registered spec): Kafka source -> pipeline -> sink, watched until drained or stopped.

`run_job` is the one entry point (the CLI, spark_jobs/keyshift_job.py and the Airflow
DAG all call it). A bounded run (`config.input.limit`) starts its query at once and reads records as
they arrive; its input ends at the topic's end offsets at the moment the topic first holds `limit`
records past the run's start (`InputEnd`; with `wait_for_input`, the query starts only then). It
drains them, writes an end-of-input marker to every partition so the watermark passes the last
windows, waits until every event read is accounted for (Σ window counts + late + dead letters),
stops and writes `runs/<run_id>/summary.json`. A continuous run goes on until SIGTERM or Ctrl-C
(SIGINT), then stops at a batch boundary and writes its summary (`StopSignals`).

This module is the query loop: the run's segments (`_run_segments`: one query each, a switch
between two) and the watch of each query (`_watch`). What it uses lives beside it:
`kafka_input` (start offsets, a bounded run's end, the end-of-input markers, the Kafka source),
`job_record` (`job.json` and its segments), `spark_checkpoint` (committed and planned batches,
state read from the checkpoint), `run_summary` (progress records, task times, the summary) and
`driver_switch` (the driver's side of a switch; the switch's steps are `keyshift.migration`'s).
"""

from __future__ import annotations

import functools
import logging
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from keyshift import runlog
from keyshift.console import STEP, EventsBar
from keyshift.errors import ConfigurationError, JobError
from keyshift.eventtime.key_windows import SlidingWindow
from keyshift.kafka_clients import client_options
from keyshift.checkpoint_files import CheckpointFiles
from keyshift.eventtime.batch_channel import BatchChannel
from keyshift.processing.job_query import job_stream
from keyshift.processing.job_config import LEARNED_STRATEGIES, JobConfig, check_job_strategy
from keyshift.processing.operators.processor import state_variables
from keyshift.processing.failpoints import InjectedFailure, fail_here
from keyshift.runtime.resources import ResourceSampler
from keyshift.runtime.warmup import start_python_workers
from keyshift.runtime.session import build_spark_session, job_spark_conf
from keyshift.processing.outputs.side_outputs import TransactionalSideOutputs
from keyshift.processing.outputs.pieces import PieceAssembler
from keyshift.processing.outputs.clocked_batches import ClockedBatches
from keyshift.processing.outputs.sinks import KeyedWindowSink, stop_at_batch_boundary
from keyshift.processing.outputs.key_window_sink import KeyWindowSink, kept_events
from keyshift.runs import RunRecorder
from keyshift.settings import Settings
from keyshift.runtime.driver_switch import (
    BackgroundStop, await_barrier_batch, conservation_check, hold_markers_batch, hold_new_query_batch, refuse_switch, settle_switch_at_stop,
    switch_held_for_markers
)
from keyshift.migration.switch_record import SwitchRecord
from keyshift.processing.job_record import (
    Segment, has_checkpoint, load_job_record, load_segments, save_job_record
)
from keyshift.processing.sources.kafka_input import (
    InputEnd, concrete_offsets, covers, ensure_side_output_topics, input_reached, kafka_offsets, marker_room, read_kafka,
    send_end_of_input, starting_offsets, wait_for_records
)
from keyshift.runtime.run_summary import (
    TaskTimeRecorder, attempts_summary, build_summary, driver_jvm_pid, publish_progress, shuffle_write_bytes,
    task_time_summary
)
from keyshift.processing.spark_checkpoint import committed_batches, pending_events, planned_offsets
from keyshift.names import RunDir

log = logging.getLogger(__name__)


def run_job(
    settings: Settings,
    config: JobConfig,
    starting: str = "replay",
    spark: SparkSession | None = None,
    wait_timeout_s: float = 600.0,
    resume: bool = False,
    driver_log: bool = False,
    progress: bool = False,
    wait_for_input: bool = False,
) -> dict[str, Any]:
    """Run a keyed window job (`config.job`), or resume a crashed run, and return its summary (also written
    to summary.json).

    Args:
        settings: the stack's addresses and the runs folder.
        config: the run (strategy, P, bound, limit ...). With `resume`, only `config.run_id`
            counts: the rest comes from the run's job record (`runs/<run_id>/job.json`).
        starting: `replay` (default: where the last replay into the topic began), `earliest` or
            `latest`; resolved to concrete offsets at start and recorded.
        spark: an existing session (tests); by default one is built with the connector jars.
        wait_timeout_s: seconds a bounded run goes on without a new record in the topic while the
            topic holds fewer than `limit` records past its start (then JobError).
        resume: continue run `config.run_id` from its checkpoint after its driver died: Spark
            replays the batch that was running (same offsets, same watermark), the sink's
            ledger and side-output transactions make that replay count and send nothing twice,
            and the summary covers the whole run, as if it had never crashed.
        driver_log: send this process's log lines, and, when this call starts the driver JVM,
            Spark's log and the Python workers' output, to `runs/<run_id>/driver.log`
            (`keyshift.runlog`; from the moment the run's folder is made, after the checks that
            need no folder). The run record's `log_path` names the driver log in use, if any.
        progress: show a progress bar on stderr of the events accounted for (in windows, late,
            dead letters) against the events a bounded run reads (`keyshift.console.EventsBar`).
        wait_for_input: a bounded run starts its query only once the topic holds `limit` records
            past its start (a backfill read in full batches); by default it starts at once and
            reads records as they arrive (`InputEnd`).

    Stopping: SIGTERM or Ctrl-C (SIGINT) stops the run at the next batch boundary with its
    summary (state `stopped`); a second Ctrl-C stops at once, like a crash (`StopSignals`). Either
    way `--resume` continues it exactly.

    Returns:
        The summary dict (see `build_summary`).

    Raises:
        JobError: the query failed, stalled for `config.input.idle_timeout_s`, the counts do not
            reconcile (events read != Σ window counts + late + dead letters + pending), a bounded
            run's topic stopped growing short of `limit` records, or a stop came before the query
            started (`wait_for_input`).
        KeyboardInterrupt: a second Ctrl-C (the run stopped at once; resume it).
        ConfigurationError: a new run whose `runs/<run_id>/checkpoint` already exists (resume it
            instead), a resume of a run without checkpoint or job record, or a strategy the job
            cannot place with (`JOB_STRATEGIES`).
        StackError: Kafka or Redis is not reachable.
    """
    from keyshift.stack import require

    run_dir = (settings.runs_dir / config.run_id).absolute()  # the JVM may run in another folder (session._driver_folder)
    resumable = has_checkpoint(run_dir)
    if resume and not resumable:
        raise ConfigurationError(f"run {config.run_id!r} has no checkpoint to resume from (no {RunDir(run_dir).checkpoint()} and no "
                                 "job record naming one elsewhere); start it without --resume")
    if not resume and resumable:
        raise ConfigurationError(
            f"run {config.run_id!r} already has a checkpoint; resume it with --resume {config.run_id} or choose another --run-id"
        )
    if resume:
        config, start, replay = load_job_record(run_dir)
    elif config.checkpoint_location is None and settings.checkpoint_location:
        config = replace(config, checkpoint_location=settings.checkpoint_location)
    check_job_strategy(config.placement.strategy)
    config.check_exchange()
    require(settings, "kafka", "redis")  # one line naming the fix, before anything starts
    if not resume:
        kafka_offsets(settings, config.input.topic)  # a missing topic: one line naming the fix
    recorder = RunRecorder(settings, config.run_id)
    if driver_log:
        log.info("run %s: log lines go to %s", config.run_id, runlog.attach(runlog.driver_log_path(recorder.run_dir)), extra=STEP)
    recorder.start(strategy=config.placement.strategy, partitions=config.placement.partitions, epoch=config.placement.epoch, topic=config.input.topic,
                   log_path=runlog.active())
    if resume:
        resumes = recorder.count_resume()
        recorder.attempt = resumes
        log.info("run %s: resuming from its checkpoint (resume %d)", config.run_id, resumes, extra=STEP)
    stop_signals = StopSignals(config.run_id)
    stop_requested = stop_signals.event
    stop_signals.install()
    bar = EventsBar(f"job {config.run_id}", enabled=progress)
    try:
        if not resume:
            replay = recorder.replay_record(config.input.topic)  # read now: a later replay overwrites it
            start = concrete_offsets(settings, config.input.topic, starting_offsets(replay, config.input.topic, starting))
            if config.input.limit and wait_for_input:
                config = config.with_end_offsets(wait_for_records(settings, config.input.topic, config.input.limit, start, wait_timeout_s,
                                                                   stop_requested, config.run_id))
            elif config.input.limit:
                end = InputEnd(settings, config.input.topic, config.input.limit, start, None, wait_timeout_s)
                end.poll()
                config = config.with_end_offsets(end.offsets)
            if config.placement.strategy in LEARNED_STRATEGIES:
                config = _with_learned_assignment(settings, config)
            if config.placement.max_stateful_partitions is None:
                config = _with_default_stateful_partitions(config, spark, settings)
            save_job_record(run_dir, config, start, replay)
        input_end = InputEnd(settings, config.input.topic, config.input.limit, start, config.input.end_offsets if config.input.limit else None,
                             wait_timeout_s)
        recorder.on_progress = lambda record: bar({**record, "events_target": input_end.events_target()})
        ensure_side_output_topics(settings, config.placement.partitions, config.spec.topics)
        own_session = spark is None
        archive = None
        if spark is None:
            conf, archive = job_spark_conf(settings, config.placement.stateful_partitions)
            log.info("run %s: starting Spark (%s)", config.run_id, settings.spark_master, extra=STEP)
            spark = build_spark_session(f"keyshift-flight-delays-{config.run_id}", settings.spark_master, conf,
                                        output=runlog.active() if driver_log else None)
            start_python_workers(spark)  # meanwhile the driver sets up the query; batch 0 then finds them started
        stop_signals.install()  # again: making the SparkContext installed pyspark's SIGINT handler (it cancels every job)
        sampler = ResourceSampler(driver_jvm_pid(spark))
        sampler.start()
        task_times = TaskTimeRecorder(spark, run_dir)
        task_times.start()
        side_outputs = TransactionalSideOutputs(settings.bootstrap_servers, config.run_id, client_options(settings))
        started = time.monotonic()
        recorder.attempt_started_at = time.time()
        bar.start(input_end.events_target())
        try:
            segments, watch, sink = _run_segments(spark, settings, config, run_dir, recorder, input_end, stop_requested, side_outputs,
                                                  task_times)
            if watch.get("outcome") == "done":
                bar.finish()
        finally:
            sampler.stop()
            task_times.stop()
            side_outputs.close()
            bar.close()
        last = segments[-1]
        checkpoint = RunDir(run_dir).checkpoint(last.checkpoint)
        wall_seconds = watch["last_batch_at"] - started if watch["last_batch_at"] else time.monotonic() - started
        if config.spec.key_windows:
            pending = kept_events(spark, checkpoint)
        elif config.exchange.mode == "global_merge":
            pending = _global_merge_state(settings, config).pending_events()
        else:
            pending = pending_events(spark, checkpoint, aggregates=len(config.spec.aggregates)) + (sink.pieces.held_events() if sink.pieces is not None else 0)
        _, consumed = committed_batches(checkpoint, config.input.topic)
        consumed = consumed or dict(last.start_offsets)
        watch["records_read"] = sum(o - start.get(p, 0) for p, o in consumed.items())
        config = last.config(config).with_end_offsets(input_end.offsets)
        summary = build_summary(config, replay, sink, watch, wall_seconds, sampler, pending)
        summary.update(attempts_summary(recorder, summary["events_read"], wall_seconds))
        summary.update(task_time_summary(task_times.times, config.placement.partitions, config.placement.stateful_partitions, config.source_tasks))
        summary["stateful_partitions"] = config.placement.stateful_partitions
        summary["source_tasks"] = config.source_tasks
        summary["shuffle_write_bytes"] = shuffle_write_bytes(spark) if own_session else None
        summary["exchange"], summary["emit"] = config.exchange.mode, config.exchange.emit
        summary["driver_class_archive"] = archive.mode if archive else None
        summary["start_offsets"] = {str(p): o for p, o in sorted(start.items())}
        summary["resumes"] = recorder.resumes()
        summary["segments"] = len(segments)
        summary["switches"] = [s.switch_id for s in segments if s.switch_id]
        summary["outcome"] = watch.get("outcome")  # done: drained to its end; stopped: SIGTERM or Ctrl-C
        if config.input.limit and not summary["reconciled"]:
            recorder.finish(summary, state="failed")
            raise JobError(
                f"run {config.run_id} does not reconcile: events read {summary['events_read']} != "
                f"windows {summary['sum_window_counts']} + late {summary['late_events']} + dead letters {summary['dead_letters']}"
                f" + filtered {summary['filtered_events']} + pending {summary['pending_events']}"
            )
        recorder.finish(summary, state="succeeded" if watch.get("outcome") == "done" else "stopped")
        return summary
    except BaseException as exc:
        recorder.fail(f"{type(exc).__name__}: {exc}")
        raise
    finally:
        bar.close()
        stop_signals.restore()


def _run_segments(spark, settings: Settings, config: JobConfig, run_dir: Path, recorder: RunRecorder, input_end: InputEnd,
                  stop_requested, side_outputs: TransactionalSideOutputs, task_times: TaskTimeRecorder):
    """Run the run's segments: the last one's query, then, whenever a switch is asked for, cut,
    migrate and go on with the next (`keyshift.migration`), until the run is done or stopped.

    Returns:
        (segments, the watch state, the last segment's sink).
    """
    from keyshift.migration import in_driver
    from keyshift.processing.operators.state_variables import initial_state_frame
    from keyshift.migration.switch import SwitchControl, step_index
    spec = config.spec
    variables = state_variables(spec)  # the job's declared state, for the switch

    start, replay = load_job_record(run_dir)[1:]
    segments = load_segments(run_dir)

    def save_segments(new_segments):
        nonlocal segments
        segments = new_segments
        save_job_record(run_dir, config, start, replay, new_segments)

    control = SwitchControl.from_settings(settings, config.run_id)
    record = control.pending()
    if record is not None and (spec.key_windows or config.exchange.mode == "global_merge"):
        record = refuse_switch(control, record, spec.name, config.exchange.mode)
    if record is not None and step_index(record.step) < step_index("segment"):
        # a switch asked for, or cut short before its commit point: the old checkpoint is at
        # rest and nothing is published, so do it now, before the old query starts again
        log.info("run %s: carrying out switch %s (left at step %s) before starting", config.run_id, record.switch_id, record.step,
                 extra=STEP)
        segments = in_driver.migrate(spark, settings, run_dir, segments, record, control, variables, save_segments, time.time(),
                                     config.placement.max_stateful_partitions)
        record = control.current()
    elif record is not None and step_index(record.step) < step_index("published"):
        in_driver.publish(settings, record)
        record = control.advance(record, "published", None)
    watch: dict[str, Any] | None = None
    old_stop: BackgroundStop | None = None  # the previous segment's query, stopping after its barrier batch
    reader_warm = False  # the state data source has run in this JVM (`in_driver.warm_state_reader`)
    while True:
        segment = segments[-1]
        seg_config = segment.config(config)
        if seg_config.placement.assignment is not None:
            seg_config = replace(seg_config, redis_url=settings.redis_url)
        checkpoint = RunDir(run_dir).checkpoint(segment.checkpoint)
        recorder.update(strategy=seg_config.placement.strategy, partitions=seg_config.placement.partitions, epoch=seg_config.placement.epoch, segment=segment.index)
        spark.conf.set("spark.sql.shuffle.partitions", str(seg_config.placement.stateful_partitions))
        if spec.key_windows:
            sink = KeyWindowSink(spec, SlidingWindow(seg_config.window_ms, spec.slide_ms), run_dir, config.run_id, seg_config.placement.epoch,
                                 seg_config.placement.partitions, side_outputs, batch_base=segment.batch_base)
        else:
            pieces = PieceAssembler(spec, RunDir(run_dir).pieces, seg_config.placement.split, segment.batch_base) \
                if config.event_time.policy.per_key else None
            sink = KeyedWindowSink(spec, run_dir, config.run_id, seg_config.placement.epoch, seg_config.placement.partitions,
                                   side_outputs, batch_base=segment.batch_base, pieces=pieces)
        initial = initial_state_frame(spark, run_dir / segment.initial_state, variables) if segment.initial_state else None
        stream = job_stream(
            read_kafka(spark, settings, config.input.topic, dict(segment.start_offsets), config.input.max_offsets_per_trigger,
                       config.event_time.max_partition_drift_ms, spec.event_time_field), seg_config,
            checkpoint_dir=checkpoint, initial_state=initial, watermark_floor_ms=segment.watermark_floor_ms,
            marker_floor=segment.marker_floor, batch_channel=settings.redis_url, batch_base=segment.batch_base,
        )
        query_name = f"flight_delays_{config.run_id}_{segment.index}".replace("-", "_")
        batch_function = sink
        if config.exchange.mode == "global_merge":
            from keyshift.placement.tokens import slot_tokens
            from keyshift.processing.operators.global_merge import GlobalMergeSink

            state = _global_merge_state(settings, config)
            if not CheckpointFiles(checkpoint, spark).exists("offsets"):
                state.clear()  # a new run: nothing of an earlier run under this id may count
            batch_function = GlobalMergeSink(sink, state, settings.redis_url, checkpoint, config.event_time.policy.spark_delay_ms,
                                             seg_config.window_ms, slot_tokens(seg_config.placement.partitions, seg_config.placement.stateful_partitions),
                                             segment.watermark_floor_ms)
        batch_function = ClockedBatches(batch_function, run_dir, checkpoint, segment.batch_base, config.event_time.partition_idle_timeout_s,
                                        lambda: input_end.offsets, BatchChannel(settings.redis_url, config.run_id))
        if old_stop is not None:  # before any query starts: the new one, or the old one again after a rollback
            old_stop, stopping = None, old_stop
            stopping.join()
        query = stream.writeStream.foreachBatch(batch_function).queryName(query_name).option("checkpointLocation", str(checkpoint)).start()
        task_times.follow(query_name, segment.batch_base, seg_config.placement.partitions, seg_config.placement.stateful_partitions,
                          seg_config.source_tasks)
        if record is not None and record.switch_id == segment.switch_id and record.state not in ("done", "failed", "rolled_back"):
            record.query_started_at = time.time()
            if record.published_at:
                record.step_seconds["start_query"] = round(record.query_started_at - float(record.published_at), 3)
            control.save(record)
        log.info("run %s: query started: %s (strategy %s, P=%d on %d stateful partitions, epoch %d, %s watermark, bound %d ms, "
                 "batch base %d)", config.run_id, query_name, seg_config.placement.strategy, seg_config.placement.partitions, seg_config.placement.stateful_partitions,
                 seg_config.placement.epoch, config.event_time.mode, config.event_time.bound_ms, segment.batch_base, extra=STEP)
        switching = record if record is not None and record.state not in ("done", "failed", "rolled_back") \
            and record.switch_id == segment.switch_id else None

        def finish_switch(rec, first_commit_at=None, segment=segment, sink=sink):
            """Verify switch `rec` once this segment's query committed a batch (at `first_commit_at`,
            epoch seconds; default now), and finish it."""
            return in_driver.verify_and_finish(spark, settings, run_dir, segment, rec, control, variables,
                                               first_commit_at or time.time(), conservation_check(spark, run_dir, segments, sink))
        try:
            if switching is not None:
                try:
                    fail_here("switch.new_query", in_driver.switch_number(segments[:-1], switching))
                except InjectedFailure as exc:
                    raise JobError(f"the new query failed: {exc}") from exc
            hold_new_query_batch(sink, segment, switching)
            watch = _watch(query, sink, recorder, settings, seg_config, input_end, stop_requested, checkpoint, segment, control, watch,
                           switching, finish_switch, lambda: save_job_record(run_dir, config.with_end_offsets(input_end.offsets),
                                                                             start, replay))
            while (spec.key_windows or config.exchange.mode == "global_merge") and watch.get("outcome") == "switch":  # refused; goes on
                refuse_switch(control, watch.pop("switch_record"), spec.name, config.exchange.mode)
                watch = _watch(query, sink, recorder, settings, seg_config, input_end, stop_requested, checkpoint, segment, control,
                               watch, None, None, lambda: save_job_record(run_dir, config.with_end_offsets(input_end.offsets),
                                                                          start, replay))
        except JobError as exc:
            sink.close_barrier()  # nothing more of this query reaches the outputs
            query.stop()
            if switching is None:
                raise
            if committed_batches(checkpoint, config.input.topic)[0]:
                # its outputs are written: going back to the old checkpoint would count them twice
                control.conclude(switching, "failed", error=str(exc))
                raise
            segments = in_driver.roll_back(settings, segments, switching, control, save_segments, str(exc))
            record = None
            continue
        watch["query_name"] = query_name
        if watch.get("outcome") == "done":  # its last batch is committed
            query.stop()
            return segments, watch, sink
        barrier_at = time.time()
        cut_at = None
        if watch.get("outcome") == "switch":
            # one more whole batch, in which the old query hands its state over and after which it stops
            cut_at = await_barrier_batch(query, sink, checkpoint, stop_requested, watch["switch_record"].switch_id)
            if cut_at is None and not reader_warm:
                # the switch reads the checkpoint: the state reader's first-use cost stays out of the pause
                reader_warm = in_driver.warm_state_reader(spark, checkpoint, config.input.topic, variables) is not None
        stop_at = cut_at or time.time()
        if cut_at is not None:
            # the barrier batch is committed and every later batch refused: the query stops while the switch goes on
            old_stop = BackgroundStop(query, sink, checkpoint, functools.partial(
                publish_progress, query, sink, recorder, seg_config, segment, watch, watch["seen"]))  # batches up to the cut
        else:
            stop_at_batch_boundary(query, sink, checkpoint)
            publish_progress(query, sink, recorder, seg_config, segment, watch, watch["seen"])  # batches up to the cut
        if watch.get("outcome") == "stopped":
            if switching is not None:
                settle_switch_at_stop(control, switching, checkpoint, config, finish_switch)
            return segments, watch, sink
        record = watch.pop("switch_record")
        # the barrier batch, or the wait for one that never came (then the state reader's read is in the pause)
        record.barrier_requested_at = barrier_at
        record.step_seconds["barrier_batch"] = round(stop_at - barrier_at, 3)
        segments = in_driver.migrate(spark, settings, run_dir, segments, record, control, variables, save_segments, stop_at,
                                     config.placement.max_stateful_partitions)
        record = control.current()


def _global_merge_state(settings: Settings, config: JobConfig):
    """The run's `keyshift.processing.operators.global_merge.GlobalMergeState`."""
    import redis

    from keyshift.processing.operators.global_merge import GlobalMergeState

    return GlobalMergeState(redis.Redis.from_url(settings.redis_url, decode_responses=True, socket_timeout=60), config.run_id, config.spec)


def _watch(
    query, sink: KeyedWindowSink, recorder: RunRecorder, settings: Settings, config: JobConfig, input_end: InputEnd,
    stop_requested, checkpoint: Path, segment: Segment, control, state: dict[str, Any] | None,
    switching: SwitchRecord | None, finish_switch, save_end,
) -> dict[str, Any]:
    """Follow the query batch by batch, publish progress, and decide when a run is done.

    A resumed run starts from what its checkpoint committed (batch ids, consumed offsets), so
    that a run whose crash came after its last batch still sees itself drained and flushed.
    Progress records carry run-wide batch ids (the segment's `batch_base` + the query's id).
    Returns the watch state with `outcome`: `done`, `stopped`, or `switch` (with the request in
    `switch_record`) when a switch of this run is asked for in Redis. `switching`: a switch
    whose new query this is; `finish_switch(record)` verifies it after the first commit. A
    bounded run whose input end is not known yet polls the topic for it (`InputEnd.poll`) and
    `save_end()` records it in the job record once found.
    """
    base = segment.batch_base
    committed, consumed = committed_batches(checkpoint, config.input.topic)
    consumed = consumed or dict(segment.start_offsets)
    seen: set[int] = set(committed)
    if state is None:  # this attempt's first query
        state = {"records_read": 0, "last_batch_at": None, "markers_end": None, "batches": 0, "watermark_ms": None}
        state["batches"] = len(sink.ledger.batches())
        recorder.start_attempt(recorder.attempt_started_at or time.time(), sink.counters.processed_events)
    state["outcome"] = None
    if state["markers_end"] is not None and covers(segment.start_offsets, state["markers_end"]):
        # a switch cut the run after the batch that read its end-of-input markers, before the
        # windows they close were emitted: this query starts past them, so it gets markers of its own
        log.info("run %s: the end-of-input markers were read before this segment's start; writing them again", config.run_id)
        state["markers_end"] = None
    elif state["markers_end"] is not None and covers(segment.marker_floor or {}, state["markers_end"]):
        # a switch cut the run before the batch that read them: they sit among this query's input
        # (alone in a partition added for a larger P, read before other partitions' last events),
        # so this query ignores them (`IngestContext.marker_floor`) and gets markers of its own
        log.info("run %s: the end-of-input markers were written before this segment and not read; "
                 "it ignores them and writes its own", config.run_id)
        state["markers_end"] = None
    state["seen"] = seen
    state["consumed"] = consumed
    hold_markers_batch(sink, segment, config, input_end.offsets, checkpoint)
    last_activity = time.monotonic()
    next_poll = 0.0
    if switching is not None and committed:
        finish_switch(switching)  # died after the new query's first commit, before the check
        switching = None
    while True:
        error = query.exception()
        if error is not None:
            raise JobError(f"the streaming query failed: {error}")
        if publish_progress(query, sink, recorder, config, segment, state, seen):
            last_activity = state["last_batch_at"]
            consumed = state["consumed"] or consumed
            if switching is not None:
                # the pause ends at the first commit itself, not when this loop noticed it (as it starts at the cut's)
                first = committed_batches(checkpoint, config.input.topic)[0]
                finish_switch(switching, CheckpointFiles(checkpoint).modified_s(f"commits/{first[0]}") if first else None)
                switching = None
        if input_end.bounded and input_end.offsets is None and input_end.poll(force=False):
            save_end()
            last_activity = time.monotonic()
        target = input_end.offsets
        if target is not None:
            # The markers go out as soon as a planned batch leaves no more of the input than the
            # next batch takes beside them, while that batch still runs: they land past every
            # offset of the input, so the batch reading the last records reads them too (after
            # every event of the run) instead of a batch of their own after a drain.
            room = marker_room(config.input.max_offsets_per_trigger, config.placement.partitions)
            if state["markers_end"] is None and input_reached(target, consumed, planned_offsets(checkpoint, config.input.topic), room):
                log.info("run %s: input planned to its end %s; writing end-of-input markers", config.run_id, target)
                state["markers_end"] = send_end_of_input(settings, config.input.topic, config.run_id)
                last_activity = time.monotonic()
            elif state["markers_end"] is not None and covers(consumed, state["markers_end"]):
                counters = sink.counters
                # stop only once the batch that emitted the last windows is committed (its
                # progress is reported after the commit); stopping earlier leaves the state store
                # at the previous version and the batch would run again on a restart
                committed_ok = base + max(seen, default=-1) >= sink.last_batch_id
                if counters.accounted_events == counters.processed_events and committed_ok and switching is None:
                    log.info("run %s: all %d events accounted for; stopping", config.run_id, counters.processed_events,
                             extra=STEP)
                    state["outcome"] = "done"
                    return state
        if stop_requested.is_set():
            log.info("run %s: stop requested; stopping at the batch boundary", config.run_id, extra=STEP)
            state["outcome"] = "stopped"
            return state
        if switching is None and time.monotonic() >= next_poll:
            next_poll = time.monotonic() + 0.25
            try:
                request = control.pending()
            except Exception as exc:  # Redis restarting: switches wait, the job goes on
                log.warning("run %s: cannot read switch requests (%s)", config.run_id, exc)
                request = None
            if request is not None and request.step == "requested" and switch_held_for_markers(segment, state):
                request = None  # a test's failpoint: the switch waits until a batch has read the markers
            if request is not None and request.step == "requested":
                log.info("run %s: switch %s requested: %s/P=%d -> %s/P=%s", config.run_id, request.switch_id,
                         config.placement.strategy, config.placement.partitions, request.strategy_to, request.partitions_to, extra=STEP)
                state["outcome"] = "switch"
                state["switch_record"] = request
                return state
        if target is not None and time.monotonic() - last_activity > config.input.idle_timeout_s:
            raise JobError(f"no batch completed for {config.input.idle_timeout_s:.0f} s (consumed {consumed}, target {target})")
        time.sleep(0.1)


def _with_default_stateful_partitions(config: JobConfig, spark: SparkSession | None, settings: Settings) -> JobConfig:
    """`config` with `max_stateful_partitions` = `default_max_stateful_partitions` of the engine's
    cores: the session's default parallelism when it runs already, else the master's
    (`keyshift.stack.spark_cluster.master_cores`: a local master's, a standalone master's alive
    workers'). When neither is known the cap stays None (S = P), and the log says so."""
    from keyshift.placement.tokens import default_max_stateful_partitions
    from keyshift.stack.spark_cluster import master_cores

    cores = spark.sparkContext.defaultParallelism if spark is not None else master_cores(settings)
    if cores is None:
        log.warning("run %s: the cores of %s are not known: %d stateful partitions, one per slot (the job option"
                    " max_stateful_partitions sets fewer)", config.run_id, settings.spark_master, config.placement.partitions)
        return config
    config = config.with_placement(max_stateful_partitions=default_max_stateful_partitions(cores))
    log.info("run %s: %d slots on %d stateful partitions (at most %d: %d per core of %d)", config.run_id, config.placement.partitions,
             config.placement.stateful_partitions, config.placement.max_stateful_partitions, config.placement.max_stateful_partitions // cores, cores, extra=STEP)
    return config


def _with_learned_assignment(settings: Settings, config: JobConfig) -> JobConfig:
    """`config` with the assignment and epoch published in Redis under the input topic's name.

    Raises:
        ConfigurationError: the published assignment is another strategy's, for another P, or
            per bucket (the job places keys).
        PlacementError: nothing is published under the topic's name.
    """
    from keyshift.placement.assignment_store import AssignmentStore

    snapshot = AssignmentStore.from_settings(settings, config.input.topic).snapshot()
    if snapshot["strategy"] != config.placement.strategy or snapshot["partitions"] != config.placement.partitions or snapshot["buckets"]:
        raise ConfigurationError(
            f"the assignment published for {config.input.topic!r} is {snapshot['strategy']} over {snapshot['partitions']} slots"
            f" (buckets {snapshot['buckets']}); the job asks for {config.placement.strategy} over {config.placement.partitions} slots per key"
        )
    split = {key: tuple(slots) for key, slots in (snapshot.get("split") or {}).items()}
    log.info(
        "run %s: %s assignment of %d keys (%d split: %s), epoch %d, from Redis",
        config.run_id, config.placement.strategy, len(snapshot["mapping"]), len(split),
        ", ".join(f"{key} on {list(slots)}" for key, slots in sorted(split.items())) or "none", snapshot["epoch"],
    )
    return replace(config.with_placement(assignment=dict(snapshot["mapping"]), epoch=int(snapshot["epoch"]), split=split or None),
                   redis_url=settings.redis_url)


class StopSignals:
    """How a run's driver answers SIGTERM and Ctrl-C (SIGINT): stop at the next batch boundary.

    The first SIGTERM or SIGINT sets `event`; the run's watch loop then stops the query at a batch
    boundary and writes the summary (state `stopped`, exit status 0), as Spark's
    `StreamingQuery.stop` after a completed batch would. A second SIGINT stops at once, saying so:
    it raises KeyboardInterrupt in the main thread, the process ends like a crash and `--resume`
    continues the run exactly (the checkpoint, ledger and side-output transactions hold). A
    second SIGTERM changes nothing (a supervisor repeating its request).

    pyspark installs a SIGINT handler of its own whenever a SparkContext is made (it cancels every
    running job: the batch in flight fails mid-way), so `install` is called again right after the
    session is built; the driver JVM runs in its own process group, so a terminal's Ctrl-C reaches
    this process only (`keyshift.runtime.session.build_spark_session`). Handlers can only be
    set from the main thread: elsewhere (a test's thread) `install` does nothing.

    Args:
        run_id: named in the log lines.
    """

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.event = threading.Event()
        self._previous: dict[int, Any] | None = None

    def install(self) -> None:
        """Make this object the SIGTERM and SIGINT handler (again); the first call remembers the
        handlers it replaces, for `restore`."""
        if threading.current_thread() is not threading.main_thread():
            return
        previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGTERM, signal.SIGINT)}
        if self._previous is None:
            self._previous = previous

    def restore(self) -> None:
        """Put back the handlers `install` replaced first."""
        for sig, handler in (self._previous or {}).items():
            signal.signal(sig, handler)
        self._previous = None

    def _handle(self, signum: int, frame) -> None:
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        if not self.event.is_set():
            self.event.set()
            log.warning("run %s: %s: stopping at the next batch boundary (the summary follows)%s", self.run_id, name,
                        "; Ctrl-C again stops at once" if signum == signal.SIGINT else "")
            return
        if signum == signal.SIGINT:
            log.warning("run %s: Ctrl-C again: stopping at once, without a summary; continue the run with "
                        "`keyshift job run --resume %s`", self.run_id, self.run_id)
            raise KeyboardInterrupt
