"""Real per-slot loads, measured rather than sampled: what arrived in each slot, what the job processed.

A slot is a Kafka partition of the input topic and the matching Spark stateful partition
(DESIGN.md vocabulary), so two measured loads sit beside the sampled figures of
`keyshift.monitoring.evaluate`:

* **arrivals**: events that arrived in each partition between two evaluations, the difference
  of the partition's end offsets (`arrival_ranges`; the end offsets of the previous evaluation
  are kept in Redis by `keyshift.monitoring.results.ResultStore`).
* **processed**: events the streaming job processed per slot, from its run record: the
  `per_slot_events` of `runs/<run_id>/summary.json` once the run has ended, else the sum of
  `processed_rows_per_slot` over `runs/<run_id>/progress.jsonl` (both written by
  `keyshift.runs.RunRecorder`). The counts are cumulative per run; `since_previous` turns two
  reads into the events of the span between them.

Both are scored with the same metrics as the samples (`measured_loads`): balance degree (paper
000 eq. 1), extra compute time (eq. 2), max/mean, max and mean load.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import redis

from keyshift.errors import ConfigurationError
from keyshift.monitoring.balance import balance_degree, extra_compute_time, max_over_mean
from keyshift.names import REDIS_PREFIX, RunDir, redis_progress_key, redis_run_key
from keyshift.runs import RunRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MeasuredLoads:
    """Figures of one measured per-slot load vector.

    Attributes:
        source: `arrivals` (Kafka end-offset deltas) or `processed` (the job's per-slot counts).
        loads: events per slot, P entries.
        events: sum of `loads` (events).
        balance_degree: min/max, paper 000 eq. 1 (1.0 is even; 1.0 when nothing arrived).
        extra_compute_time: (max - mean)/mean, paper 000 eq. 2 (0.0 is even).
        max_over_mean: max/mean, the makespan over the ideal (1.0 is even).
        max_load: the busiest slot's events (the makespan in events).
        mean_load: events per slot on average.
        detail: where the numbers come from (offsets, run id, file), one line.
    """

    source: str
    loads: tuple[int, ...]
    events: int
    balance_degree: float
    extra_compute_time: float
    max_over_mean: float
    max_load: int
    mean_load: float
    detail: str = ""


def measured_loads(source: str, loads: Sequence[int], detail: str = "") -> MeasuredLoads:
    """Score one per-slot load vector (events) with paper 000 eq. 1, eq. 2 and max/mean.

    Raises:
        ValueError: `loads` is empty or has a negative value (from `keyshift.monitoring.balance`).
    """
    values = tuple(int(load) for load in loads)
    return MeasuredLoads(
        source=source,
        loads=values,
        events=sum(values),
        balance_degree=balance_degree(values),
        extra_compute_time=extra_compute_time(values),
        max_over_mean=max_over_mean(values),
        max_load=max(values),
        mean_load=sum(values) / len(values),
        detail=detail,
    )


def arrival_ranges(
    previous: Mapping[int, int] | None, current: Mapping[int, int], beginning: Mapping[int, int] | None = None
) -> dict[int, tuple[int, int]]:
    """Offsets `[start, end)` of the records that arrived in each partition since the previous read.

    `end` is the partition's current end offset. `start` is the previous end offset, except:
    a partition with no previous offset (the first evaluation, or a partition added since)
    starts at its beginning offset (the oldest record still held; 0 when `beginning` is None),
    and so does a partition whose end offset went backwards (the topic was deleted and created
    again), since its offsets restarted.

    Args:
        previous: partition -> end offset at the previous evaluation, or None for none.
        current: partition -> end offset now.
        beginning: partition -> beginning offset now (None: 0).

    Returns:
        partition -> (start, end), for every partition of `current`, sorted; end - start events arrived.
    """
    previous = previous or {}
    beginning = beginning or {}
    ranges: dict[int, tuple[int, int]] = {}
    for partition, end in sorted(current.items()):
        floor = int(beginning.get(partition, 0))
        start = previous.get(partition)
        if start is None or start > end:
            if start is not None:
                log.warning("partition %d: end offset %d is below the previous %d (topic recreated?); counting from %d", partition, end, start, floor)
            start = floor
        ranges[partition] = (int(start), int(end))
    return ranges


def arrivals(ranges: Mapping[int, tuple[int, int]]) -> list[int]:
    """Events per partition of `arrival_ranges`' result, in partition order (partitions 0..P-1).

    Raises:
        ConfigurationError: the partitions are not exactly 0..P-1.
    """
    if sorted(ranges) != list(range(len(ranges))):
        raise ConfigurationError(f"partitions must be 0..P-1, got {sorted(ranges)}")
    return [end - start for _, (start, end) in sorted(ranges.items())]


def bounded_ranges(ranges: Mapping[int, tuple[int, int]], max_events: int) -> dict[int, tuple[int, int]]:
    """The most recent records of each range, at most `max_events` in all, shared in proportion.

    When the ranges hold more than `max_events` records, partition p keeps the last
    floor(n_p * max_events / total) records, and the remainder goes one record each to the
    largest fractional shares (ties: the lowest partition), so exactly `max_events` are kept and
    every partition keeps its share of the mix.

    Args:
        ranges: partition -> (start, end) offsets, as `arrival_ranges` returns.
        max_events: the bound, events >= 1.

    Returns:
        partition -> (start', end), start <= start' <= end.

    Raises:
        ConfigurationError: `max_events` < 1.
    """
    if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1:
        raise ConfigurationError(f"max_events must be an int >= 1 (events), got {max_events!r}")
    sizes = {p: max(0, end - start) for p, (start, end) in ranges.items()}
    total = sum(sizes.values())
    if total <= max_events:
        return dict(ranges)
    keep = {p: size * max_events // total for p, size in sizes.items()}
    by_remainder = sorted(sizes, key=lambda p: (-(sizes[p] * max_events % total), p))
    for p in by_remainder[: max_events - sum(keep.values())]:
        keep[p] += 1
    return {p: (end - keep[p], end) for p, (_, end) in ranges.items()}


@dataclass(frozen=True)
class JobCounts:
    """A job run's cumulative processed events per slot, as read at one moment.

    Attributes:
        run_id: the run. state: its run record's state (running, succeeded, stopped, failed, ...).
        per_slot_events: events processed per slot since the run started (P entries).
        source: `summary` (summary.json of an ended run) or `progress` (sum over progress.jsonl).
        path: the file read.
    """

    run_id: str
    state: str
    per_slot_events: tuple[int, ...]
    source: str
    path: str


def latest_job_run(client: redis.Redis, topic: str, states: Collection[str] | None = None) -> str | None:
    """The run id of the most recently started job run that reads `topic`, from the Redis run records.

    Scans `keyshift:run:<run_id>` hashes (see `keyshift.runs`) for `topic` (and a state in
    `states`, when given: `keyshift.runs.LIVE_STATES` for a live run) and picks the largest
    `started_at` (epoch seconds). Returns None when no such run is recorded.

    Raises:
        redis.RedisError: Redis is unreachable.
    """
    keys = [key for key in client.scan_iter(match=f"{REDIS_PREFIX}:run:*", count=500) if not key.endswith(":progress")]
    if not keys:
        return None
    with client.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.hmget(key, "run_id", "topic", "started_at", "state")
        rows = pipe.execute()
    runs = [(float(started or 0), run_id) for run_id, run_topic, started, state in rows
            if run_id and run_topic == topic and (states is None or state in states)]
    return max(runs)[1] if runs else None


def job_counts(client: redis.Redis, runs_dir: Path, run_id: str) -> JobCounts | None:
    """A run's processed events per slot so far: summary.json when it ended, else progress.jsonl.

    Args:
        client: Redis (the run record `keyshift:run:<run_id>` gives state and summary path).
        runs_dir: `settings.runs_dir` (where `runs/<run_id>/` lives when the record names no path).
        run_id: the job run.

    Returns:
        `JobCounts`, or None when the run wrote neither file yet (or they are on another host).

    Raises:
        ConfigurationError: no run record for `run_id` in Redis.
        redis.RedisError: Redis is unreachable.
    """
    raw = client.hgetall(redis_run_key(run_id))
    if not raw:
        raise ConfigurationError(f"no run record {redis_run_key(run_id)} in Redis; name a run the job recorded (see runs/)")
    record = RunRecord.from_redis(raw)
    summary = Path(record.summary_path or RunDir.of(runs_dir, run_id).summary)
    state = record.state or "?"
    if summary.is_file():
        slots = json.loads(summary.read_text(encoding="utf-8")).get("per_slot_events")
        if slots:
            return JobCounts(run_id, state, tuple(int(v) for v in slots), "summary", str(summary))
    progress = RunDir(summary.parent).progress
    if not progress.is_file():
        log.info("run %s (%s) has no summary or progress file under %s yet", run_id, state, summary.parent)
        return None
    totals: list[int] = []
    with progress.open(encoding="utf-8") as lines:
        for line in lines:
            if not line.strip():
                continue
            batch = json.loads(line).get("processed_rows_per_slot") or []
            totals = [a + int(b) for a, b in zip(totals or [0] * len(batch), batch)]
    return JobCounts(run_id, state, tuple(totals), "progress", str(progress)) if totals else None


def job_offsets(client: redis.Redis, runs_dir: Path, run_id: str) -> dict[int, int] | None:
    """The next Kafka offset the job run will read, per partition, as of its last batch.

    From the run's latest progress record in Redis (`keyshift:run:<run_id>:progress`), else the
    last line of `runs/<run_id>/progress.jsonl` (Redis may have missed a batch while it restarted).

    Returns:
        `{partition: offset}`, or None when the run has reported no batch yet.

    Raises:
        redis.RedisError: Redis is unreachable.
    """
    latest = client.hget(redis_progress_key(run_id), "latest")
    if latest is None:
        progress = RunDir.of(runs_dir, run_id).progress
        lines = progress.read_text(encoding="utf-8").split() if progress.is_file() else []
        latest = lines[-1] if lines else None
    offsets = json.loads(latest).get("offsets") if latest else None
    return {int(p): int(o) for p, o in offsets.items()} if offsets else None


def since_previous(previous_run: str | None, previous: Sequence[int] | None, current: JobCounts) -> list[int]:
    """Events per slot processed since the previous read of the same run (events).

    The counts are cumulative per run: for the same run with as many slots and no count going
    down, the difference; otherwise (a new run, another P, the first read) the run's counts so far.
    """
    now = list(current.per_slot_events)
    if previous_run != current.run_id or previous is None or len(previous) != len(now) or any(b < a for a, b in zip(previous, now)):
        return now
    return [b - a for a, b in zip(previous, now)]
