"""The driver's side of a switch: cut, migrate, start the next segment, publish, verify, recover.

The steps and the cut are defined in `keyshift.migration.switch`. This module runs inside the
job's driver (`keyshift.runtime.driver.run_job`), in its SparkSession: the query is
swapped without a new JVM. Each step ends with a record in Redis and a failpoint
`switch.<step>@<n>` (n: the run's n-th switch) so tests can kill the driver there.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from pyspark.sql import SparkSession

from keyshift.checkpoint_files import CheckpointFiles, sibling
from keyshift.console import STEP
from keyshift.errors import JobError
from keyshift.migration.state import read_state, rekey_state, save_migrated, verify_placement
from keyshift.processing.outputs.handover import read_snapshot
from keyshift.processing.operators.state_variables import MapStateVariable
from keyshift.migration.switch import SwitchControl, step_index
from keyshift.migration.switch_record import SwitchRecord
from keyshift.placement.tokens import capped_stateful_partitions, slot_tokens, stateful_partition_of_slot
from keyshift.processing.failpoints import failpoint
from keyshift.names import RunDir
from keyshift.processing.job_record import Segment
from keyshift.settings import Settings

log = logging.getLogger(__name__)


def switch_number(segments: Sequence[Segment], record: SwitchRecord) -> int:
    """1 for the run's first switch, 2 for the second ... (the failpoints' counter)."""
    done = [s for s in segments if s.switch_id and s.switch_id != record.switch_id]
    return len(done) + 1


def read_cut(checkpoint: Path | str, topic: str) -> tuple[int | None, dict[int, int], int]:
    """(last committed batch C of the stopped query or None, Kafka offsets after C, the watermark
    for the batch after C in ms of event time (`nextBatchWatermarkMs` of `commits/C`, 0 without))."""
    from keyshift.processing.spark_checkpoint import committed_batches

    ids, offsets = committed_batches(checkpoint, topic)
    if not ids:
        return None, {}, 0
    text = CheckpointFiles(checkpoint).read_text(f"commits/{ids[-1]}").splitlines()
    meta = json.loads(text[1]) if len(text) > 1 else {}
    return ids[-1], offsets, int(meta.get("nextBatchWatermarkMs", 0))


def warm_state_reader(spark: SparkSession, checkpoint: Path | str, topic: str, variables: Sequence[MapStateVariable]) -> float | None:
    """Read the state of a running query at its last committed batch, and drop it.

    The first state read of a driver JVM loads and compiles Spark's state data source: on this
    project's 2-core machines the first switch's `migrated` step took 1.9 to 2.7 s against 0.5 to
    1.3 s for the later ones. A switch reads the state only when no barrier batch handed it over
    (`keyshift.processing.operators.handover`); called then, before the old query is asked to
    stop, that cost falls while the old query still runs, not in the switch's pause (the stop
    request to the new query's first commit). The read is the one `read_state` makes at
    the cut, at an earlier committed batch (Spark's state data source reads a committed version
    of the checkpoint; the running query writes later ones).

    Returns:
        Seconds the read took, or None when the query has committed no batch yet (nothing read)
        or the read failed (logged: the switch then pays the first-use cost in its pause).
    """
    from keyshift.processing.spark_checkpoint import committed_batches

    ids, _ = committed_batches(checkpoint, topic)
    if not ids:
        return None
    started = time.monotonic()
    try:
        read_state(spark, checkpoint, variables, ids[-1])
    except Exception as exc:  # a warm-up only: the switch reads the state again at the cut
        log.warning("warming the state reader on %s failed (%s); the switch's first state read pays it", checkpoint, exc)
        return None
    seconds = time.monotonic() - started
    log.info("state reader warmed on batch %d of %s in %.2f s, before the stop", ids[-1], checkpoint, seconds, extra=STEP)
    return seconds


def migrate(
    spark: SparkSession,
    settings: Settings,
    run_dir: Path,
    segments: list[Segment],
    record: SwitchRecord,
    control: SwitchControl,
    variables: Sequence[MapStateVariable],
    save_segments: Callable[[list[Segment]], None],
    stop_requested_at: float,
    max_stateful_partitions: int | None = None,
) -> list[Segment]:
    """Steps stopped, migrated, segment, published of a switch whose old query is stopped.

    Args:
        segments: the run's segments; the last is the stopped query's.
        record: the switch record (state requested, or running at a step before `segment`).
        variables: the job's declared state variables.
        save_segments: writes the segments into the run's job record (the commit point).
        stop_requested_at: wall-clock seconds when the stop was asked (the pause starts there).
        max_stateful_partitions: the run's cap on stateful partitions: the new query takes
            min(P', cap) (`PlacementConfig.max_stateful_partitions`); None: P'.

    Returns:
        The segments with the new one appended.

    Raises:
        JobError: the old query committed no batch (nothing to cut), or a state read failed.
    """
    old = segments[-1]
    topic = old.topic
    number = switch_number(segments, record)
    record.stop_requested_at = stop_requested_at
    old_checkpoint = RunDir(run_dir).checkpoint(old.checkpoint)
    cut, offsets, floor = read_cut(old_checkpoint, topic)
    started = time.monotonic()
    if cut is None:
        offsets = dict(old.start_offsets)
    floor = max(floor, old.watermark_floor_ms)
    base = old.batch_base + (cut + 1 if cut is not None else 0)
    record = control.advance(record, "stopped", time.time() - stop_requested_at, cut_batch=cut, cut_offsets={str(p): o for p, o in sorted(offsets.items())},
                             watermark_floor_ms=floor, batch_base=base, old_checkpoint=old.checkpoint)
    failpoint("switch.stopped", number)

    t = time.monotonic()
    partitions = int(record.partitions_to)
    stateful_partitions = capped_stateful_partitions(partitions, max_stateful_partitions)
    source = "checkpoint"
    if cut is not None:
        # the barrier batch's own snapshot of the state, when it is the cut and complete; else the state reader
        handed = read_snapshot(RunDir(run_dir).handover(record.switch_id, old.batch_base + cut), variables,
                               slot_tokens(old.partitions, old.stateful_partitions))
        state, timers = handed if handed is not None else read_state(spark, old_checkpoint, variables, cut)
        source = "handover" if handed is not None else source
    else:
        import pandas as pd

        state = {v.name: pd.DataFrame(columns=["old_token", "partition_id", "key", *v.value_fields]) for v in variables}
        timers = pd.DataFrame(columns=["old_token", "expiry_ms", "partition_id"])
    shared = {v.name: v.broadcast for v in variables if v.broadcast is not None}
    record = complete_mapping(record, {str(k) for name, frame in state.items() for k in frame["key"]
                                       if name not in shared or not shared[name](str(k))})
    slot_of = slot_function(record)
    migrated = rekey_state(state, timers, variables, slot_of, slot_tokens(partitions, stateful_partitions),
                           slot_tokens(old.partitions, old.stateful_partitions))
    index = old.index + 1
    state_file = RunDir.migrated_state_name(record.switch_id)
    save_migrated(migrated, run_dir / state_file)
    record = control.advance(record, "migrated", time.monotonic() - t, migration=migrated.summary(), state_source=source)
    failpoint("switch.migrated", number)

    t = time.monotonic()
    start = dict(offsets)
    from keyshift.monitoring.stream import read_offsets

    now = read_offsets(settings, topic)
    for partition, beginning in now.beginning.items():
        start.setdefault(partition, beginning)  # a partition added for a larger P starts at its beginning
    learned = record.strategy_to not in ("hash", "modulo")
    segment = Segment(
        index=index, checkpoint=sibling(old.checkpoint, RunDir.checkpoint_name(index)), strategy=record.strategy_to, partitions=partitions,
        stateful_partitions=stateful_partitions, epoch=int(record.epoch_to),
        assignment={k: int(v) for k, v in record.mapping.items()} if learned else None,
        split={k: list(v) for k, v in (record.split or {}).items()} or None, topic=topic,
        start_offsets=dict(start), batch_base=base, watermark_floor_ms=floor,
        initial_state=state_file, switch_id=record.switch_id,
        # end-of-input markers already in the topic were written for the old query: if the cut
        # came before the batch that read them, they sit among input the new query still reads
        # (and alone in a partition added for a larger P), so the new query ignores them and
        # the driver writes markers of its own once this segment's input is planned to its end
        marker_floor={int(p): int(o) for p, o in now.end.items()},
    )
    segments = [*segments, segment]
    save_segments(segments)
    record = control.advance(record, "segment", time.monotonic() - t, new_checkpoint=segment.checkpoint)
    failpoint("switch.segment", number)
    t = time.monotonic()
    publish(settings, record)
    record = control.advance(record, "published", time.monotonic() - t, published_at=time.time())
    failpoint("switch.published", number)
    log.info("switch %s: migrated %s (state from the %s) in %.2f s", record.switch_id, migrated.summary(), source,
             time.monotonic() - started,
             extra=STEP)
    return segments


def slot_function(record: SwitchRecord, placed: Callable[[str], int | None] | None = None) -> Callable[[str], int]:
    """key -> its slot under the switch's new assignment: a split key's first piece, a mapped
    key's slot, else the slot `placed` reports (the shared store's slot of a key the new query
    placed itself, `AssignmentStore.slot_of`), else the rule (hash for a learned strategy's keys
    that no one has placed yet, which `complete_mapping` makes none of those holding state).

    Args:
        record: the switch record (`partitions_to`, `strategy_to`, `mapping`, `split`).
        placed: key -> its recorded slot in the store, or None when it has none; None (the
            default) asks no store, as while the state is being migrated.
    """
    from keyshift.placement.strategies import strategy_by_name

    partitions = int(record.partitions_to)
    mapping, split = record.mapping, {k: tuple(v) for k, v in (record.split or {}).items()}
    rule = strategy_by_name(record.strategy_to if record.strategy_to in ("hash", "modulo") else "hash", partitions)

    def slot_of(key: str) -> int:
        if key in split:
            return int(split[key][0])
        if key in mapping:
            return int(mapping[key])
        slot = placed(key) if placed is not None else None
        return rule.slot_of(key) if slot is None else int(slot)

    return slot_of


def complete_mapping(record: SwitchRecord, keys: set[str]) -> SwitchRecord:
    """Give every key that holds state a slot in a learned strategy's new mapping.

    The plan maps the keys of its sample (the topic's most recent records); a key with state
    but absent from the sample (an airport quiet lately) would otherwise be placed by the job
    through the store's atomic assign, on whatever slot that picks, while its state went
    elsewhere. Such keys go on the least loaded slot, by their state rows, in key order; they
    are published with the rest. Rule strategies need nothing: the rule places every key.
    """
    if record.strategy_to in ("hash", "modulo"):
        return record
    mapping, split = dict(record.mapping), record.split or {}
    missing = sorted(k for k in keys if k not in mapping and k not in split)
    if missing:
        partitions = int(record.partitions_to)
        held = [0] * partitions
        for slot in mapping.values():
            held[int(slot)] += 1
        for key in missing:
            slot = min(range(partitions), key=lambda s: (held[s], s))
            mapping[key] = slot
            held[slot] += 1
        log.info("switch %s: %d key(s) with state but not in the plan's sample placed on the least loaded slots: %s",
                 record.switch_id, len(missing), ", ".join(missing[:10]))
        record.mapping = mapping
        record.keys_added_to_plan = len(missing)
    return record


def publish(settings: Settings, record: SwitchRecord, restore: bool = False) -> int:
    """Publish the switch's assignment as epoch `epoch_to` in Redis, unless an epoch at least
    that new is in force already (idempotent). With `restore`, publish the assignment the switch
    left (`mapping_from`, or the rule) as a new epoch instead (a rollback). Returns the epoch in force."""
    from keyshift.errors import PlacementError
    from keyshift.placement.assignment_store import AssignmentStore

    store = AssignmentStore.from_settings(settings, record.topic)
    try:
        current = store.epoch()
    except PlacementError:
        current = 0
    if restore:
        mapping = record.mapping_from or {}
        return store.publish(record.strategy_from, int(record.partitions_from), mapping,
                             split={k: tuple(v) for k, v in (record.split_from or {}).items()} or None)
    if current >= int(record.epoch_to):
        return current
    split = {k: tuple(v) for k, v in (record.split or {}).items()}
    return store.publish(record.strategy_to, int(record.partitions_to), record.mapping, epoch=int(record.epoch_to),
                         split=split or None)


def verify_and_finish(
    spark: SparkSession,
    settings: Settings,
    run_dir: Path,
    segment: Segment,
    record: SwitchRecord,
    control: SwitchControl,
    variables: Sequence[MapStateVariable],
    first_commit_at: float,
    conservation: Callable[[], dict[str, Any]] | None = None,
) -> SwitchRecord:
    """Steps verified and done, once the new query committed its first batch.

    Every key's state must sit on the stateful partition of its assigned slot (state reader
    `partition_id`; `keyshift.placement.tokens.stateful_partition_of_slot`): the plan's slot,
    or, for a learned strategy's key first seen after the cut, the slot the shared store gave it
    (`AssignmentStore.slot_of`); `conservation`
    (the job's own check, e.g. pending events before + processed - emitted = pending after) is
    recorded beside it. The pause (the barrier batch's commit, or the stop request without one,
    to the first commit) becomes the topic's measured migration cost for the cost_aware trigger.

    Raises:
        JobError: a key's state is on a slot its assignment does not give it.
    """
    pause = first_commit_at - float(record.stop_requested_at or first_commit_at)
    if record.query_started_at:
        record.step_seconds["first_batch"] = round(first_commit_at - float(record.query_started_at), 3)
    split = {k: tuple(v) for k, v in (record.split or {}).items()}
    # A key first seen in the new query's first batch (absent from the plan and from the migrated
    # state) was placed by the store's atomic assign (`assignment_token_lookup`), not by the rule.
    placed = None
    if record.strategy_to not in ("hash", "modulo"):
        from keyshift.placement.assignment_store import AssignmentStore

        placed = AssignmentStore.from_settings(settings, record.topic).slot_of
    slot_of = slot_function(record, placed)

    partitions = segment.partitions
    stateful_partitions = segment.stateful_partitions or partitions

    def slots_of(key: str) -> tuple[int, ...]:  # the stateful partitions that may hold the key's state
        return tuple(stateful_partition_of_slot(slot, partitions, stateful_partitions) for slot in split.get(key) or (slot_of(key),))

    t = time.monotonic()
    placement = verify_placement(spark, RunDir(run_dir).checkpoint(segment.checkpoint), variables, slots_of, batch_id=0)
    conserved = conservation() if conservation is not None else None
    if not placement["ok"]:
        control.conclude(record, "failed", error=f"state on the wrong slot: {placement['misplaced']}", verify=placement)
        raise JobError(f"switch {record.switch_id}: state on the wrong slot after the switch: {placement['misplaced']}")
    record = control.advance(record, "verified", time.monotonic() - t, verify={"placement": placement, "conservation": conserved},
                             pause_seconds=round(pause, 3))
    record = control.advance(record, "done")
    record = control.conclude(record, "done")
    _record_cost(settings, record)
    log.info("switch %s done: %s -> %s, P %s -> %s, pause %.2f s, %s state rows migrated",
             record.switch_id, record.strategy_from, record.strategy_to, record.partitions_from,
             record.partitions_to, pause, sum((record.migration or {}).get("state_rows_written", {}).values()),
             extra=STEP)
    return record


def _record_cost(settings: Settings, record: SwitchRecord) -> None:
    """Make this switch the topic's last switch for the balance monitor's triggers: when, from,
    to, and its measured cost (the pause, seconds, which includes moving the state), so that
    cost_aware's margin and cool-down count real switches, by hand or by the monitor."""
    import redis

    from keyshift.names import redis_balance_switch_key

    try:
        client = redis.Redis.from_url(settings.redis_url, decode_responses=True, socket_timeout=10)
        client.hset(redis_balance_switch_key(record.topic), mapping={
            "at_s": repr(float(record.finished_at or time.time())), "strategy_from": record.strategy_from,
            "strategy_to": record.strategy_to, "migration_s": repr(float(record.pause_seconds)),
            "state_bytes_moved": int((record.migration or {}).get("state_bytes_moved", 0)),
        })
    except redis.RedisError as exc:  # the switch is done; a missing cost only leaves the previous one in use
        log.warning("switch %s: its cost was not recorded for the monitor (%s)", record.switch_id, exc)


def roll_back(settings: Settings, segments: list[Segment], record: SwitchRecord, control: SwitchControl,
              save_segments: Callable[[list[Segment]], None], error: str) -> list[Segment]:
    """Undo a switch whose new query failed before its first commit: drop its segment,
    republish the old assignment as a newer epoch if the new one was published, record it."""
    if segments and segments[-1].switch_id == record.switch_id:
        segments = segments[:-1]
        save_segments(segments)
    if step_index(record.step) >= step_index("published"):
        publish(settings, record, restore=True)
    control.conclude(record, "rolled_back", error=error)
    log.warning("switch %s rolled back: %s", record.switch_id, error)
    return segments
