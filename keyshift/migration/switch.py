"""The switch: move a running job to another assignment (and parallelism) with its state.

`request_switch` is the one entry point (`keyshift switch`, the `keyshift_switch` DAG). It plans
the new assignment (step 1, `keyshift.migration.plan` on a sample of the topic's recent records,
read as the balance monitor reads them), adds Kafka partitions for a larger P, writes a switch
record in Redis and waits while the job's driver carries it out
(`keyshift.runtime.driver`, steps 2-5):

| step | what | recorded as |
| --- | --- | --- |
| plan | new assignment, moved share against the minimum | `plan` |
| barrier | one more whole batch, the barrier batch, in which the old query hands its state over (`keyshift.processing.operators.handover`); the sink refuses batches after it; the query stops at the batch boundary | `barrier_batch` (outside the pause), `stopped`: last committed batch, its Kafka offsets, the next watermark |
| migrate | state taken from the barrier batch's snapshot, or read from the checkpoint without one; re-keyed, saved (`keyshift.migration.state`) | `migrated`, `state_source` |
| segment | the new query's segment appended to the run's job record: the commit point | `segment` |
| publish | epoch e+1 in Redis (producers and executors follow it) | `published` |
| verify | after the new query's first commit: keys on their slots, state conserved | `verified`, then `done` |

The cut (paper 000 §4.2.3, the barrier). Let C be the last micro-batch the old query commits.
Every Kafka record below the offsets C ended at (`offsets/C` of the old checkpoint) was processed
by the old query under epoch e, and its effect is in the state at C (the barrier batch's snapshot, or the state reader's batch C);
every record at or past those offsets is processed by the new query, under epoch e+1. So each
event is processed under exactly one epoch, and each key's migrated state holds exactly the
events before the cut. The new query starts reading at those offsets, its batch ids continue
the run's (`batch_base` = C + 1 + the old base), and its watermark starts from the old query's
next watermark (`nextBatchWatermarkMs` of `commits/C`), so lateness is decided as without the
switch. Records that producers wrote under epoch e after the cut sit in their old partitions;
the new query places them by key under e+1 all the same (only Ahead KeyBy is lost for them).

Crash safety. Every step is idempotent and recorded; the commit point is the segment. A driver
that dies before it (kill -9 at any step) leaves the old checkpoint untouched and nothing
published: the resumed driver (`keyshift switch` again restarts it, or the supervisor does)
redoes the switch from the old checkpoint at rest (with the barrier batch's snapshot if that
batch was committed, since the snapshot is written before the commit and named by switch and
batch; else with the state reader at the last committed batch). A driver that dies after it resumes the new
segment (the saved initial state is handed again until its first commit) and finishes publish
and verify. A new query that fails before its first commit rolls back: the segment is removed,
the old assignment republished as a newer epoch, and the old query resumes. Two switches of
one run never overlap: a Redis lock, and a second request gets a clear error. A run that is alive
but has not started its query yet (no job record) is refused before the lock, nothing written
(`SwitchNotReady`, `refuse_unstarted_run`).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil
import redis

from keyshift import names
from keyshift.errors import ConfigurationError, JobError, StackError, SwitchNotReady
from keyshift.migration.switch_record import SwitchRecord
from keyshift.settings import Settings

log = logging.getLogger(__name__)

STEPS = ("requested", "stopped", "migrated", "segment", "published", "verified", "done")
"""The steps of a switch in order; a record's `step` is the last one completed."""
FINAL_STATES = ("done", "failed", "rolled_back")
LOCK_TTL_S = 900
"""Seconds a switch lock lives without renewal (a requester that died frees it after this, or at
once when its pid is seen dead on this host)."""


def step_index(step: str) -> int:
    """Position of `step` in `STEPS`."""
    return STEPS.index(step)


class SwitchControl:
    """The switch record, history and lock of one run in Redis (keys in `keyshift.names`).

    Args:
        client: a Redis client with `decode_responses=True`.
        run_id: the run the switches move.
    """

    def __init__(self, client: redis.Redis, run_id: str) -> None:
        self.client = client
        self.run_id = run_id
        self.record_key = names.redis_switch_record_key(run_id)
        self.lock_key = names.redis_switch_lock_key(run_id)
        self.history_key = names.redis_switch_history_key(run_id)

    @classmethod
    def from_settings(cls, settings: Settings, run_id: str) -> SwitchControl:
        """A control on the stack's Redis."""
        return cls(redis.Redis.from_url(settings.redis_url, decode_responses=True, socket_timeout=10), run_id)

    def current(self) -> SwitchRecord | None:
        """The run's current or last switch record, or None."""
        raw = self.client.get(self.record_key)
        return SwitchRecord.from_json(json.loads(raw)) if raw else None

    def pending(self) -> SwitchRecord | None:
        """The current record if a switch is under way (not done, failed or rolled back)."""
        record = self.current()
        return record if record is not None and record.state not in FINAL_STATES else None

    def save(self, record: SwitchRecord) -> SwitchRecord:
        """Write `record` as the current one (stamped `updated_at`); returns it."""
        record.updated_at = time.time()
        self.client.set(self.record_key, json.dumps(record.as_json(), sort_keys=True))
        return record

    def advance(self, record: SwitchRecord, step: str, seconds: float | None = None, **fields: Any) -> SwitchRecord:
        """Mark `step` completed (taking `seconds`), set `fields` (`SwitchRecord.update`), save;
        returns the record."""
        record.update(**fields)
        record.step = step
        record.state = "done" if step == "done" else "running"
        if seconds is not None:
            record.step_seconds[step] = round(seconds, 3)
        log.info("switch %s of run %s: %s%s", record.switch_id, self.run_id, step, f" ({seconds:.2f} s)" if seconds is not None else "")
        return self.save(record)

    def conclude(self, record: SwitchRecord, state: str, **fields: Any) -> SwitchRecord:
        """End the switch as `state` (done, failed, rolled_back): save and push it on the history."""
        record.update(**fields)
        record.state = state
        record.finished_at = time.time()
        self.save(record)
        self.client.lpush(self.history_key, json.dumps(record.as_json(), sort_keys=True))
        return record

    def history(self, count: int = 20) -> list[SwitchRecord]:
        """The last `count` finished switches of the run, newest first."""
        return [SwitchRecord.from_json(json.loads(r)) for r in self.client.lrange(self.history_key, 0, count - 1)]

    def acquire(self, holder: str) -> None:
        """Take the run's switch lock for `holder` ("host:pid:uuid").

        A lock whose holder is a dead process of this host is taken over.

        Raises:
            JobError: another live process holds it (the message names it and the switch under way).
        """
        if self.client.set(self.lock_key, holder, nx=True, ex=LOCK_TTL_S):
            return
        other = self.client.get(self.lock_key) or ""
        host, _, rest = other.partition(":")
        pid = rest.partition(":")[0]
        if host == socket.gethostname() and pid.isdigit() and not psutil.pid_exists(int(pid)):
            log.warning("switch lock of run %s held by dead process %s; taking it over", self.run_id, other)
            self.client.set(self.lock_key, holder, ex=LOCK_TTL_S)
            return
        under_way = self.pending()
        what = f" (switch {under_way.switch_id} to {under_way.strategy_to}, step {under_way.step})" if under_way else ""
        raise JobError(f"another switch of run {self.run_id} is in progress{what}, held by {other}; wait for it to finish")

    def release(self, holder: str) -> None:
        """Free the lock if `holder` still holds it."""
        if self.client.get(self.lock_key) == holder:
            self.client.delete(self.lock_key)


@dataclass(frozen=True)
class SegmentView:
    """What is in force in a run's last segment (read from `runs/<run_id>/job.json`)."""

    strategy: str
    partitions: int
    epoch: int
    topic: str
    assignment: dict[str, int] | None
    split: dict[str, tuple[int, ...]] | None

    def slots_of(self, key: str) -> tuple[int, ...]:
        """The slots `key` is placed on now (one, or a split key's pieces)."""
        if self.split and key in self.split:
            return tuple(self.split[key])
        if self.assignment is not None and key in self.assignment:
            return (int(self.assignment[key]),)
        from keyshift.placement.strategies import strategy_by_name

        rule = self.strategy if self.strategy in ("hash", "modulo") else "hash"
        return (strategy_by_name(rule, self.partitions).slot_of(key),)


def sample_key_loads(settings: Settings, topic: str, max_events: int = 100_000) -> dict[str, int]:
    """Events per key among the topic's most recent `max_events` records (every record kept),
    read as the balance monitor reads its sample (`keyshift.monitoring.stream.sample_topic`)."""
    from keyshift.monitoring.loads import bounded_ranges
    from keyshift.monitoring.sampling import Sampler
    from keyshift.monitoring.stream import read_offsets, sample_topic

    offsets = read_offsets(settings, topic)
    ranges = bounded_ranges({p: (offsets.beginning[p], offsets.end[p]) for p in offsets.end}, max_events)
    sampler = Sampler(every=1)
    sample_topic(settings, topic, ranges, sampler)
    return dict(sampler.counts)


def _driver_alive(settings: Settings, run_id: str) -> bool:
    from keyshift.runs import run_record

    record = run_record(settings, run_id)
    if record is None or record.state != "running" or not record.pid:
        return False
    if record.host not in (None, "", socket.gethostname()):
        return True  # another host's driver: trust its state
    return _pid_alive(record.pid)


def _pid_alive(pid: int | None) -> bool:
    """Whether `pid` (a run record's) is a live process of this host, not a zombie."""
    if not pid or pid < 1:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.AccessDenied:  # another user's: it exists
        return True
    except psutil.Error:  # no such process (or it ended meanwhile)
        return False


def refuse_unstarted_run(settings: Settings, run_id: str) -> None:
    """Raise the right error for a switch of `run_id`, whose `runs/<run_id>/job.json` does not exist.

    The driver writes the job record just before it starts Spark and its query, so a run without
    one has no query to cut yet (or is no run at all). The rule, from the run's Redis record
    (`keyshift:run:<run_id>`, `keyshift.runs`): a run whose
    state is starting, running or restarting with its driver (`pid`) or supervisor
    (`supervisor_pid`) alive on this host (or recorded on another host: its state is trusted) is
    alive but not ready; any other is unknown, dead or ended. Reads only; writes nothing.

    Args:
        settings: the stack (Redis, the runs folder).
        run_id: the run asked to switch.

    Raises:
        SwitchNotReady: the run is alive and has not started its query yet (waiting for records,
            or starting); the message says so and that nothing was switched.
        ConfigurationError: no such run (no run record either), or a run that ended or whose
            driver died before it started its query: nothing will ever be there to switch.
        StackError: Redis unreachable.
    """
    from keyshift.names import redis_run_key
    from keyshift.runs import ACTIVE_STATES, run_record

    run_dir = settings.runs_dir / run_id
    record = run_record(settings, run_id)
    if record is None:
        raise ConfigurationError(f"run {run_id!r} is unknown: no job record in {run_dir} and no run record {redis_run_key(run_id)} "
                                 "in Redis; name a run of a keyshift job (`keyshift job run`, the keyshift_pipeline DAG)")
    state, pid, topic = record.state, record.pid, record.topic or "?"
    elsewhere = record.host not in (None, "", socket.gethostname())
    alive = elsewhere or _pid_alive(pid) or _pid_alive(record.supervisor_pid)
    if state in ACTIVE_STATES and alive:
        if state == "running":
            doing = (f"its driver{f' (pid {pid})' if pid else ''} is waiting for records in topic {topic!r} or still preparing its "
                     "query; a bounded run with --wait-for-input starts it once the topic holds its --limit records")
        elif state == "restarting":
            doing = "its supervisor is restarting its driver"
        else:
            doing = "its driver is starting"
        raise SwitchNotReady(f"run {run_id} has not started its query yet: {doing}; nothing was switched; retry when its query "
                             "runs (the balance monitor asks again at its next evaluation)")
    if state in ACTIVE_STATES:
        raise ConfigurationError(f"run {run_id} never started its query (no job record in {run_dir}) and its driver{f' (pid {pid})' if pid else ''} "
                                 f"is gone though its record says {state!r}; nothing to switch: start a new run")
    error = f": {record.error[:300]}" if record.error else ""
    raise ConfigurationError(f"run {run_id} ended (state {state!r}{error}) before it started its query (no job record in {run_dir}); "
                             "nothing to switch: start a new run")


def add_partitions(settings: Settings, topic: str, partitions: int) -> int:
    """Grow `topic` to `partitions` partitions with the admin API (Kafka cannot remove any: a
    smaller P leaves the surplus partitions unwritten). Returns the partition count after."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewPartitions

    from keyshift.kafka_clients import client_options
    from keyshift.monitoring.stream import read_offsets

    have = len(read_offsets(settings, topic).end)
    if partitions <= have:
        return have
    admin = KafkaAdminClient(bootstrap_servers=settings.bootstrap_servers, client_id="keyshift-switch", **client_options(settings))
    try:
        admin.create_partitions({topic: NewPartitions(total_count=partitions)})
    finally:
        admin.close()
    log.info("topic %s: partitions %d -> %d", topic, have, partitions)
    return partitions


def relaunch_driver(settings: Settings, run_id: str) -> subprocess.Popen:
    """Start the run's driver again from its checkpoint (`keyshift job run --resume RUN_ID`: the
    job, flight_delays or ysb, and its options come from `runs/<run_id>/job.json`), detached,
    logging to `runs/<run_id>/driver-resume-<time>.log`; it finishes or redoes the switch under
    way before it goes on."""
    log_path = settings.runs_dir / run_id / f"driver-resume-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}.log"
    env = {k: v for k, v in os.environ.items() if k != "KEYSHIFT_FAILPOINT"}
    command = [str(Path(sys.executable).with_name("keyshift")), "job", "run", "--resume", run_id]
    with log_path.open("ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    log.info("run %s: driver restarted with --resume (pid %d), log %s", run_id, process.pid, log_path)
    return process


def request_switch(
    settings: Settings,
    run_id: str,
    strategy: str | None,
    partitions: int | None = None,
    *,
    reason: str = "requested by hand",
    wait_timeout_s: float = 600.0,
    sample_events: int = 100_000,
    on_update: Callable[[SwitchRecord], None] | None = None,
) -> SwitchRecord:
    """Switch run `run_id` to `strategy` (and `partitions`), or finish a switch left unfinished.

    Args:
        settings: the stack.
        run_id: a running (or crashed, resumable) run of a tumbling-window job (flight_delays, ysb).
        strategy: the strategy to move to (one the job places with); None only to finish a
            switch left unfinished.
        partitions: P2; None keeps P.
        reason: why (the monitor's decision, or a person's), recorded.
        wait_timeout_s: seconds to wait for the switch to be done.
        sample_events: records sampled for the plan.
        on_update: called with the record whenever its step changes (progress for the CLI).

    Returns:
        The finished switch record (state done, or rolled_back with the reason).

    Raises:
        SwitchNotReady: the run is alive but has not started its query yet (no `job.json`: its
            driver is starting, or waits for its `--limit` records); checked before the lock is
            taken, so nothing is written to Redis (`refuse_unstarted_run`). A JobError.
        ConfigurationError: unknown strategy, P < 1, an unknown run or one that ended or died
            before it started its query, or a run of a key-window job
            (`JobSpec.window == "key_windows"`: no switch for those yet). JobError: another switch holds the
            lock, or the switch failed or timed out (the record says at which step).
        StackError: Redis or Kafka unreachable.
    """
    from keyshift.jobs import job_spec
    from keyshift.processing.job_record import JobRecord, load_segments
    from keyshift.processing.job_config import check_job_strategy

    if strategy is not None:
        check_job_strategy(strategy)
    if partitions is not None and partitions < 1:
        raise ConfigurationError(f"partitions must be >= 1, got {partitions}")
    run_dir = settings.runs_dir / run_id
    job = JobRecord.job_name(run_dir)
    if job is None:
        refuse_unstarted_run(settings, run_id)  # always raises: not ready yet, or no run to switch
    if job_spec(job).key_windows:
        raise ConfigurationError(f"run {run_id!r} runs job {job}, which computes key windows: switching a key-window job is not "
                                 "supported; stop it and start a new run with the other strategy or P")
    control = SwitchControl.from_settings(settings, run_id)
    holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    try:
        control.acquire(holder)
    except redis.RedisError as exc:
        raise StackError(f"cannot reach Redis at {settings.redis_url}: {exc}; start it with `keyshift stack up`") from exc
    try:
        record = control.pending()
        if record is None:
            if strategy is None:
                raise ConfigurationError(f"run {run_id} has no switch under way; name the strategy to switch to (--strategy)")
            segments = load_segments(run_dir)
            last = segments[-1]
            view = SegmentView(last.strategy, last.partitions, last.epoch, last.topic, last.assignment, last.split_slots)
            record = _plan_record(settings, control, view, strategy, partitions or view.partitions, reason, sample_events)
        else:
            log.info("run %s: finishing switch %s (step %s)", run_id, record.switch_id, record.step)
        if not _driver_alive(settings, run_id):
            record.in_driver = False
            control.save(record)
            relaunch_driver(settings, run_id)
        return _wait(control, record.switch_id, wait_timeout_s, on_update, lambda: _driver_alive(settings, run_id))
    finally:
        control.release(holder)


def _plan_record(settings: Settings, control: SwitchControl, view: SegmentView, strategy: str, partitions: int,
                 reason: str, sample_events: int) -> SwitchRecord:
    from keyshift.migration.plan import plan_switch
    from keyshift.placement.assignment_store import AssignmentStore

    started = time.monotonic()
    loads = sample_key_loads(settings, view.topic, sample_events)
    plan = plan_switch(loads, view.slots_of, strategy, partitions)
    if partitions > view.partitions:
        add_partitions(settings, view.topic, partitions)
    try:
        published = AssignmentStore.from_settings(settings, view.topic).epoch()
    except Exception:  # nothing published yet (a rule strategy run)
        published = 0
    record = SwitchRecord(
        switch_id=f"sw-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:4]}",
        run_id=control.run_id, topic=view.topic, reason=reason, requested_at=time.time(),
        strategy_from=view.strategy, strategy_to=strategy, partitions_from=view.partitions, partitions_to=partitions,
        epoch_from=view.epoch, epoch_to=max(view.epoch, published) + 1,
        mapping=dict(plan.mapping), split={k: list(v) for k, v in plan.split.items()},
        mapping_from=dict(view.assignment or {}), split_from={k: list(v) for k, v in (view.split or {}).items()},
        plan=plan.as_record(), sampled_events=sum(loads.values()), in_driver=True,
    )
    record = control.advance(record, "requested", time.monotonic() - started)
    record.state = "requested"
    return control.save(record)


def _wait(control: SwitchControl, switch_id: str, timeout_s: float, on_update, driver_alive: Callable[[], bool]) -> SwitchRecord:
    deadline = time.monotonic() + timeout_s
    last_step = None
    next_check = time.monotonic() + 20.0  # a relaunched driver needs a few seconds to record itself
    while time.monotonic() < deadline:
        record = control.current()
        if record is None or record.switch_id != switch_id:
            raise JobError(f"switch {switch_id} of run {control.run_id} vanished from Redis")
        if record.step != last_step or record.state in FINAL_STATES:
            last_step = record.step
            if on_update is not None:
                on_update(record)
        if record.state == "done":
            return record
        if record.state in ("failed", "rolled_back"):
            raise JobError(f"switch {switch_id} of run {control.run_id} {record.state} at step {record.step}: {record.error}")
        if time.monotonic() >= next_check:
            next_check = time.monotonic() + 2.0
            if not driver_alive():
                raise JobError(f"the driver of run {control.run_id} is not running (switch {switch_id} left at step {record.step});"
                               f" run `keyshift switch --run {control.run_id}` again to finish it")
        time.sleep(0.5)
    raise JobError(f"switch {switch_id} of run {control.run_id} not done after {timeout_s:.0f} s (step {last_step}); run `keyshift switch --run {control.run_id}` again to finish it")
