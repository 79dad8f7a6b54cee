"""The driver's side of a switch: refusing one a job cannot do, settling one at a stop, test holds.

The switch's own steps are in `keyshift.migration`; these are what the query loop
(`keyshift.runtime.driver`) does around them. Split out of `keyshift.runtime.driver`.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any


from keyshift.console import STEP
from keyshift.errors import JobError
from keyshift.processing.job_config import JobConfig
from keyshift.migration.switch_record import SwitchRecord
from keyshift.processing.job_record import Segment
from keyshift.processing.failpoints import FAILPOINT_ENV, armed
from keyshift.processing.outputs.sinks import KeyedWindowSink
from keyshift.processing.sources.kafka_input import covers, input_reached, marker_room
from keyshift.checkpoint_files import CheckpointFiles
from keyshift.names import RunDir
from keyshift.processing.spark_checkpoint import committed_batches, pending_events, planned_offsets


log = logging.getLogger(__name__)

BARRIER_IDLE_S = 3.0
"""Seconds a switch waits, with no batch in the sink, for the barrier batch to come before it
stops the query at once and reads the state from the checkpoint instead (a feed that stopped:
Spark runs no batch without new data)."""
BARRIER_TIMEOUT_S = 300.0
"""Seconds the barrier batch may take to commit once admitted."""


def await_barrier_batch(query, sink: KeyedWindowSink, checkpoint: Path, stop_requested, switch_id: str,
                        idle_s: float = BARRIER_IDLE_S, timeout_s: float = BARRIER_TIMEOUT_S) -> float | None:
    """Ask `sink` for a switch's barrier batch (`KeyedWindowSink.request_handover`) and wait
    until Spark commits it: the old query runs one more whole batch, in which every slot token
    hands its state over (`keyshift.processing.operators.handover`), and stops taking batches.

    Args:
        query: the old query. sink: its sink. checkpoint: its checkpoint.
        stop_requested: the run's stop event: while no barrier batch is in the sink, a stop
            request ends the wait.
        switch_id: the switch (its snapshot goes to `RunDir.handover(switch_id, batch)`).
        idle_s: seconds without a batch in the sink after which the wait ends (no new data).
        timeout_s: seconds the admitted barrier batch may take to commit.

    Returns:
        Epoch seconds of the barrier batch's commit (its commit file's time), or None when there
        is none: the sink refused the request (its barrier is set), no batch came within
        `idle_s` or a stop was requested first (the request is withdrawn), or the query failed.
        Then the caller stops the query at the batch boundary and the switch reads the state
        from the checkpoint.

    Raises:
        JobError: the barrier batch was not committed within `timeout_s`.
    """
    if not sink.request_handover(switch_id):
        return None
    files = CheckpointFiles(checkpoint)
    idle_since: float | None = None
    admitted_at: float | None = None
    next_check = 0.0
    while True:
        now = time.monotonic()
        if now >= next_check:  # two py4j calls: not at every poll, while the barrier batch runs in this process
            next_check = now + 0.5
            if query.exception() is not None or not query.isActive:
                return None
        batch = sink.handover_batch
        if batch is not None:
            admitted_at = admitted_at or now
            # the commit follows the sink's return: look for it (a remote call on HDFS or S3) only then
            if sink.last_query_batch == batch and not sink.in_flight and files.exists(f"commits/{batch}"):
                return files.modified_s(f"commits/{batch}")
            if now - admitted_at > timeout_s:
                raise JobError(f"the switch's barrier batch {batch} was not committed within {timeout_s:.0f} s")
        elif sink.in_flight:
            idle_since = None
        else:
            idle_since = idle_since or now
            if (now - idle_since > idle_s or stop_requested.is_set()) and sink.withdraw_handover():
                log.info("no batch came for the state handover within %.1f s%s; stopping at once", idle_s,
                         " (stop requested)" if stop_requested.is_set() else "")
                return None
        time.sleep(0.02)


class BackgroundStop:
    """The old query's stop after its barrier batch, run beside the switch's next steps.

    Once the barrier batch is committed the sink refuses every later batch, so the old query can
    write nothing more: what `StreamingQuery.stop()` still does (interrupt the planning of the
    next batch, join the stream thread, close the Kafka consumer: 0.15 to 0.35 s measured on
    `local[*]`) need not be in the pause. The migration reads only committed checkpoint files,
    which the stop does not change. `join` must come before any query starts again: the new
    query, or the old one on a rollback (Spark refuses a query id that is still active).

    Args:
        query: the old query. sink: its sink. checkpoint: its checkpoint folder.
        after: called once the query has stopped (publishes its last progress records).
    """

    def __init__(self, query, sink: KeyedWindowSink, checkpoint: Path, after) -> None:
        import threading

        from keyshift.processing.outputs.sinks import stop_at_batch_boundary

        self._error: BaseException | None = None
        self._after = after
        self._thread: threading.Thread | None = None
        sink.close_barrier()
        if sink.in_flight:  # not after a committed barrier batch: stop as a stop request does, here
            stop_at_batch_boundary(query, sink, checkpoint)
            return

        def stop() -> None:
            # only the stop runs here: reading an HDFS or S3 checkpoint needs the active
            # SparkSession, which pyspark keeps per thread
            try:
                query.stop()
            except BaseException as exc:  # handed to join()
                self._error = exc

        self._thread = threading.Thread(target=stop, name="keyshift-old-query-stop", daemon=True)
        self._thread.start()

    def join(self, timeout_s: float = 300.0) -> None:
        """Wait for the stop, then run `after`.

        Raises:
            JobError: the stop failed or did not end within `timeout_s`.
        """
        started = time.monotonic()
        if self._thread is None:
            self._after()
            return
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise JobError(f"the old query did not stop within {timeout_s:.0f} s")
        if self._error is not None:
            raise JobError(f"stopping the old query failed: {self._error}") from self._error
        waited = time.monotonic() - started
        if waited > 0.05:
            log.info("waited %.2f s for the old query to stop", waited)
        self._after()


def refuse_switch(control, record: SwitchRecord, job: str, exchange: str = "local_merge") -> None:
    """End a switch asked of a key-window job or of a `global_merge` run as failed, with the
    reason; returns None (no switch). A global_merge run keeps its windows in Redis whatever the
    placement, so there is no state to move: restart its producers with the new strategy instead.

    Key windows have no switch yet: `KeyWindowProcessor` declares its state
    (`KEY_WINDOW_STATE_VARIABLES`) and restores it from `initialState`, but the switch's
    conservation check and pending count read the tumbling state. `keyshift.migration.switch.
    request_switch` refuses such a run up front (ConfigurationError); this catches a request
    written to Redis by other means."""
    if exchange == "global_merge":
        reason = (f"run of job {job} uses the global_merge exchange: its windows are in Redis whatever the placement, so a switch "
                  "has no state to move (re-place the producers instead)")
    else:
        reason = f"job {job} computes key windows; switching a key-window job is not supported (restart it with another strategy instead)"
    log.warning("run %s: switch %s refused: %s", control.run_id, record.switch_id, reason)
    control.conclude(record, "failed", error=reason)
    return None


def conservation_check(spark, run_dir: Path, segments: list[Segment], sink: KeyedWindowSink):
    """The flight job's check that a switch conserved its events: pending events at the cut +
    events processed in the new query's first batch - events that batch accounted for (windows,
    late, dead letters) = pending events after it."""
    def check() -> dict[str, Any]:
        old, new = segments[-2], segments[-1]
        first = new.batch_base
        held = sink.pieces.held_events if sink.pieces is not None else (lambda batch_id: 0)
        aggregates = len(sink.spec.aggregates)
        before = pending_events(spark, RunDir(run_dir).checkpoint(old.checkpoint), aggregates=aggregates) + held(first - 1)
        after = pending_events(spark, RunDir(run_dir).checkpoint(new.checkpoint), batch_id=0, aggregates=aggregates) + held(first)
        batch = next((b for b in sink.ledger.batches() if b.batch_id == new.batch_base), None)
        processed = batch.processed_events if batch else 0
        accounted = batch.accounted_events if batch else 0
        return {"pending_before": before, "processed_first_batch": processed, "accounted_first_batch": accounted,
                "pending_after": after, "ok": before + processed - accounted == after}

    return check


def switch_held_for_markers(segment: Segment, state: dict[str, Any]) -> bool:
    """True while a test's failpoint holds the run's n-th switch (n = this segment's index + 1).

    `switch.after_markers_read@n`: until a completed batch has read the end-of-input markers, so
    that the next segment starts past them (`_watch` then writes markers again). Merely planned
    is not enough: a switch stops the query before a planned batch's sink runs, and the new query
    reads that batch's records again. `switch.before_markers_batch@n`: until the markers are
    written (`hold_markers_batch` holds the batch planned to the input's end at the sink until
    the switch refuses it), so that the next segment finds them among its input and ignores
    them (`IngestContext.marker_floor`). Always False outside tests
    (`keyshift.processing.failpoints`)."""
    if FAILPOINT_ENV not in os.environ:
        return False
    number = segment.index + 1
    if armed() == ("switch.after_markers_read", number):
        return state["markers_end"] is None or not covers(state["consumed"], state["markers_end"])
    if armed() == ("switch.before_markers_batch", number):
        return state["markers_end"] is None
    return False


def settle_switch_at_stop(control, switching: SwitchRecord, checkpoint: Path, config: JobConfig,
                           finish_switch) -> None:
    """A run stopped while switch `switching`'s new query ran: finish the switch if that query
    committed a batch and the switch was not verified yet; else leave it at step `published`,
    which the run finishes when it resumes (`_watch`), and say so.

    The stop waits for the batch in the sink (`stop_at_batch_boundary`), so a stop during the new
    query's first batch leaves that batch committed, and the switch can be verified now instead
    of staying unfinished while the run is stopped (a `keyshift switch` or DAG waiting on it would
    wait in vain). Redis unreachable at that moment (a restart) leaves the switch to the resumed
    run as well; the stop itself stands.

    Raises:
        JobError: the verification failed (`in_driver.verify_and_finish`; the switch is `failed`).
    """
    import redis

    from keyshift.migration.switch import FINAL_STATES

    try:
        record = control.current()
        if record is None or record.switch_id != switching.switch_id or record.state in FINAL_STATES:
            return  # verified while the query ran
        committed = committed_batches(checkpoint, config.input.topic)[0]
        if not committed:
            log.warning("run %s: stopped before switch %s's new query committed a batch; the switch stays at step %s and "
                        "completes when the run resumes (keyshift job run ... --resume)", config.run_id, record.switch_id,
                        record.step)
            return
        log.info("run %s: stopped after switch %s's new query committed its first batch; verifying the switch",
                 config.run_id, record.switch_id, extra=STEP)
        # the pause (the cost_aware trigger's migration cost) ends at that commit, not at the stop
        finish_switch(record, CheckpointFiles(checkpoint).modified_s(f"commits/{committed[0]}"))
    except redis.RedisError as exc:
        log.warning("run %s: switch %s not verified at the stop (Redis: %s); it completes when the run resumes",
                    config.run_id, switching.switch_id, exc)


def hold_new_query_batch(sink, segment: Segment, switching: SwitchRecord | None) -> None:
    """Failpoint `switch.hold_first_batch@n` (n = this segment's index, the run's n-th switch): the
    sink holds the first batch of switch n's new query for `HOLD_SECONDS` after its outputs, so
    that a stop asked meanwhile comes before the switch is verified. A no-op outside tests."""
    if FAILPOINT_ENV in os.environ and switching is not None and armed() == ("switch.hold_first_batch", segment.index):
        sink.hold_after_outputs_of = segment.batch_base


def hold_markers_batch(sink, segment: Segment, config: JobConfig, target: dict[int, int] | None,
                        checkpoint: Path) -> None:
    """Failpoint `switch.before_markers_batch@n` (n = this segment's index + 1): the sink holds
    the batch planned to the input's end (the one after which the driver writes the markers)
    until switch n's barrier refuses it, so that the cut comes right before it. A no-op outside
    tests and in runs without `--limit`."""
    if FAILPOINT_ENV not in os.environ or target is None or armed() != ("switch.before_markers_batch", segment.index + 1):
        return
    room = marker_room(config.input.max_offsets_per_trigger, config.placement.partitions)
    sink.hold_until_barrier = lambda: input_reached(target, {}, planned_offsets(checkpoint, config.input.topic), room)
