"""Event time per Kafka partition: a clock per input partition, idleness, and the watermark they give.

Spark's Kafka source reads each partition of a micro-batch in proportion to its remaining
offsets. When the partitions hold different shares of different periods (a backfill from
`earliest` of a topic whose keys' popularity changes, or whose partitions start months apart),
they are read months apart in event time, each in perfect order. One clock for the whole stream
(Spark's watermark: max event time over every partition - delay) then runs with the fastest
partition and makes the others' events late. Apache Flink's Kafka source keeps a watermark per
partition (split) and gives the operator the minimum over them, leaving out a split that has been
idle for a timeout (`WatermarkStrategy.withIdleness`; Flink docs, "Generating Watermarks",
"Watermark Strategies and the Kafka Connector", "Dealing With Idle Sources"). keyshift does the
same on Spark.

**Clocks.** For every Kafka partition p of the input the engine keeps `PartitionClock`: the
largest event time of a valid event read from p (ms of event time; plausibility dead letters
excluded), the processing time of the last micro-batch that read a record of p, and whether the
run's end-of-input marker of p was read. They are state of the run, in files under
`runs/<run_id>/partition-clocks/` (`PartitionClockStore`):

- `in-force-<b>.json`: the clocks before run batch b (run-wide ids, so a switch's new query goes
  on from its old query's clocks) and T_b, the processing time the batch is judged at (ms since
  the epoch). Written by the driver before the batch runs, and never rewritten: a batch Spark
  replays after a crash reads the same file, exactly as Spark replays a batch with the watermark
  and timestamp of its offset log.
- `after-<b>.json`: the clocks after batch b, the fold of `in-force-<b>` with the reports of what
  each ingest task of b read per Kafka partition (records, largest valid event time, marker), by
  the query that ran b (reports are kept by the query's checkpoint name: a query that did not
  commit b never counts). Written by the driver after the batch's outputs and before Spark
  commits it.

The tasks do not read these files: the driver publishes each batch's clocks in force through
Redis before the batch runs, and the tasks report back the same way
(`keyshift.eventtime.batch_channel`).

**Active partitions.** p is active at batch b when its marker was not read and
T_b - last_active_ms(p) <= the idle timeout (`--partition-idle-timeout`, seconds of processing
time). A partition of the topic that has delivered nothing yet counts as active with no clock
(event time -inf) from the first batch that lists it, so that it holds the others back until it
delivers or the timeout passes (Flink: a split without data holds the watermark until it is
marked idle). An idle partition rejoins with its next record.

**The reference.** R = min over active partitions of their clocks (+inf when none is active).
How keyshift makes Spark use it: Spark's watermark is the maximum of the `event_ts` column the
ingest stage emits, minus the delay. In every mode but `global`, ingest caps the `event_ts` of a
row read from partition p at M(p) = the min over the active partitions q != p of clock_q
(`cap_event_times`). Every row's capped time is <= its own partition's clock after the batch and
<= every other active partition's clock, so Spark's watermark after batch b is at most
R(after b) - delay, and it reaches it one batch later. So Spark's own watermark, its timers and
everything that reads it (the key modes' fallback, Global Merge, key windows) follow the slowest
active partition instead of the fastest: the rule of Flink's per-partition watermarks, with
Spark's one-batch lag. End-of-input markers are not capped: a run's markers are written after all
of its input, and their event time ends the stream's event time as before.

**Replay.** Everything a batch reads is fixed before it runs (`in-force-<b>`), and what it adds
is a function of its offsets (the task reports), so a replayed batch caps and judges exactly as
the first attempt did, and Spark's watermark (which it logs per batch) is the same.

**Storage.** Only the driver reads and writes the files, in the run folder on its own disk;
executors reach the clocks through Redis (`keyshift.eventtime.batch_channel`).

**The reference is the same for every key.** Flink's operator watermark is the minimum over its
input splits; keyshift's Spark watermark is the minimum over the active partitions for all keys,
also for a key whose records have so far come from one fast partition. That never makes an event
late that a per-key-partition reference would keep (the minimum is at or below every partition's
clock). A reference per key (the clock of the partitions the key's records came from) would be
unsafe on topics keyshift did not write: nothing tells the engine that a producer keeps a key on
one partition (a producer without a record key, a second producer, a repartitioned topic), and
the first record of a key on a slower partition would then be late against the faster
partition's clock. What the shared minimum costs is that a silent key of a fast partition closes
its windows only when the slowest active partition passes them (measured by `keyshift bench
drift`: key mode's peak state on the drifted flights equals the undrifted run's). Watermark
alignment (`keyshift.eventtime.alignment`) bounds how far the fastest partition runs ahead.

**What idleness costs.** Records of a partition that was idle and rejoins are capped like any
other, so they never move the watermark past the others; but while p was idle the watermark may
have passed event times p still holds. Such records are late only against the watermark, which
in the per-key modes trails by the idle lag (`--idle-lag-ms`, 2 days by default): a partition
that pauses for minutes of processing time loses nothing unless its records are older than the
idle lag behind the other partitions. In `partition` mode (bound only) they can be late; size the
timeout above the longest pause a partition can have.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from keyshift.checkpoint_files import CheckpointFiles
from keyshift.errors import JobError
from keyshift.names import RunDir

DEFAULT_IDLE_TIMEOUT_S = 60.0
"""Default seconds of processing time after which a partition without records stops holding the
others back (`--partition-idle-timeout`)."""

NO_EVENT = -(2**62)
"""A partition's clock before its first event (ms): below any event time."""


@dataclass(frozen=True)
class PartitionClock:
    """The event-time state of one Kafka partition of a run's input.

    Attributes:
        max_event_time_ms: the largest event time of a valid event read from it (ms of event
            time), or None before its first.
        last_active_ms: processing time (ms since the epoch) of the last batch that read a record
            of it, or of the first batch that listed it.
        finished: its end-of-input marker has been read.
    """

    max_event_time_ms: int | None
    last_active_ms: int
    finished: bool = False

    def as_json(self) -> dict:
        """The clock as a JSON object."""
        return {"max_event_time_ms": self.max_event_time_ms, "last_active_ms": self.last_active_ms, "finished": self.finished}

    @classmethod
    def from_json(cls, value: Mapping) -> "PartitionClock":
        """Inverse of `as_json`."""
        top = value.get("max_event_time_ms")
        return cls(None if top is None else int(top), int(value["last_active_ms"]), bool(value.get("finished", False)))


@dataclass(frozen=True)
class SliceReport:
    """What one ingest task read of one Kafka partition in one batch.

    Attributes:
        records: records read (events, dead letters, markers, other runs' records).
        max_event_time_ms: the largest event time of a valid event among them, or None.
        marker: the run's own end-of-input marker was among them.
    """

    records: int
    max_event_time_ms: int | None = None
    marker: bool = False

    def merge(self, other: "SliceReport") -> "SliceReport":
        """Two reports of the same partition (two tasks, or two chunks of one) as one."""
        tops = [t for t in (self.max_event_time_ms, other.max_event_time_ms) if t is not None]
        return SliceReport(self.records + other.records, max(tops) if tops else None, self.marker or other.marker)


@dataclass(frozen=True)
class PartitionClocks:
    """The partition clocks in force for one micro-batch (module docstring).

    Attributes:
        batch_id: the run-wide batch id they are in force for.
        time_ms: T_b, the batch's processing time (ms since the epoch).
        idle_timeout_ms: ms of processing time after which a partition without records is idle.
        clocks: Kafka partition -> its clock.
        end_offsets: Kafka partition -> first offset past a bounded run's input, as the driver
            knew it when it prepared the batch; None while it is not known yet (a bounded run
            reading a topic that does not hold `--limit` records yet; `keyshift.runtime.driver`)
            or in a run without `--limit`. Fixed with the clocks, so a replayed batch keeps
            exactly the records its first attempt kept. A batch prepared without it was planned
            before the end was known, so it holds no record past that end (Kafka's end offsets
            only grow and the end is taken from them).
    """

    batch_id: int
    time_ms: int
    idle_timeout_ms: int
    clocks: dict[int, PartitionClock] = field(default_factory=dict)
    end_offsets: dict[int, int] | None = None

    def active(self, partition: int) -> bool:
        """Whether `partition` holds the watermark back at this batch (not finished, not idle)."""
        clock = self.clocks.get(int(partition))
        return clock is not None and not clock.finished and self.time_ms - clock.last_active_ms <= self.idle_timeout_ms

    def event_time_ms(self, partition: int) -> int | None:
        """`partition`'s clock (ms of event time), None before its first event or when unknown."""
        clock = self.clocks.get(int(partition))
        return None if clock is None else clock.max_event_time_ms

    def reference_ms(self, exclude: int | None = None) -> float:
        """min over the active partitions (but `exclude`) of their clocks, ms of event time:
        -inf when one of them has no event yet, +inf when none is active."""
        found = math.inf
        for partition, clock in self.clocks.items():
            if partition != exclude and self.active(partition):
                found = min(found, -math.inf if clock.max_event_time_ms is None else clock.max_event_time_ms)
        return found

    def caps_ms(self, partitions: int) -> np.ndarray:
        """float64 array of length `partitions`: M(p) = `reference_ms(exclude=p)` for each
        partition id below `partitions` (`cap_event_times`)."""
        return np.array([self.reference_ms(exclude=p) for p in range(partitions)], dtype=np.float64)

    def drift_ms(self) -> int:
        """The event-time spread of the active partitions that have a clock (max - min, ms); 0
        with fewer than two."""
        times = [c.max_event_time_ms for p, c in self.clocks.items() if self.active(p) and c.max_event_time_ms is not None]
        return int(max(times) - min(times)) if len(times) > 1 else 0

    def idle(self) -> list[int]:
        """The partitions that are neither active nor finished (idle), sorted."""
        return sorted(p for p, c in self.clocks.items() if not c.finished and not self.active(p))

    def advance(self, reports: Iterable[Mapping[int, SliceReport]]) -> dict[int, PartitionClock]:
        """The clocks after this batch, given what its ingest tasks read (module docstring).

        A partition with records becomes active at `time_ms`; its clock rises to the largest
        valid event time read; a marker finishes it. Partitions without records keep their clock.
        """
        merged: dict[int, SliceReport] = {}
        for report in reports:
            for partition, piece in report.items():
                partition = int(partition)
                merged[partition] = merged[partition].merge(piece) if partition in merged else piece
        after = dict(self.clocks)
        for partition, piece in merged.items():
            old = after.get(partition)
            tops = [t for t in (old.max_event_time_ms if old else None, piece.max_event_time_ms) if t is not None]
            after[partition] = PartitionClock(
                max(tops) if tops else None,
                self.time_ms if piece.records else (old.last_active_ms if old else self.time_ms),
                bool((old and old.finished) or piece.marker),
            )
        return after

    def as_json(self) -> dict:
        """The clocks as a JSON object (the `in-force-<b>.json` file)."""
        return {"batch_id": self.batch_id, "time_ms": self.time_ms, "idle_timeout_ms": self.idle_timeout_ms,
                "clocks": {str(p): c.as_json() for p, c in sorted(self.clocks.items())},
                "reference_ms": _finite(self.reference_ms()), "drift_ms": self.drift_ms(), "idle": self.idle(),
                "end_offsets": None if self.end_offsets is None else {str(p): int(o) for p, o in sorted(self.end_offsets.items())}}

    @classmethod
    def from_json(cls, value: Mapping) -> "PartitionClocks":
        """Inverse of `as_json`."""
        ends = value.get("end_offsets")
        return cls(int(value["batch_id"]), int(value["time_ms"]), int(value["idle_timeout_ms"]),
                   {int(p): PartitionClock.from_json(c) for p, c in value["clocks"].items()},
                   None if ends is None else {int(p): int(o) for p, o in ends.items()})


def _finite(value: float) -> int | None:
    return None if math.isinf(value) else int(value)


def in_force(after: Mapping[int, PartitionClock], batch_id: int, time_ms: int, idle_timeout_ms: int,
             listed: Iterable[int] = (), end_offsets: Mapping[int, int] | None = None) -> PartitionClocks:
    """The clocks in force for batch `batch_id` from the clocks after the batch before.

    Args:
        after: partition -> clock after the previous batch (empty for a run's first batch).
        batch_id: the run-wide id of the batch.
        time_ms: its processing time T_b (ms since the epoch).
        idle_timeout_ms: ms of processing time after which a partition without records is idle.
        listed: the input's partitions as the batch's offset log lists them: one not seen before
            joins with no clock, active from `time_ms` (module docstring, "Active partitions").
        end_offsets: a bounded run's input end as known now (`PartitionClocks.end_offsets`).
    """
    clocks = dict(after)
    for partition in listed:
        clocks.setdefault(int(partition), PartitionClock(None, int(time_ms)))
    ends = None if end_offsets is None else {int(p): int(o) for p, o in end_offsets.items()}
    return PartitionClocks(int(batch_id), int(time_ms), int(idle_timeout_ms), clocks, ends)


def cap_event_times(event_times_ms: np.ndarray, partitions: np.ndarray, caps_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's event time for Spark's watermark: min(its time, M(its partition)) (module docstring).

    Args:
        event_times_ms: int64 array, each row's largest event time (ms); rows without one are
            masked by the caller.
        partitions: int array, each row's Kafka partition.
        caps_ms: `PartitionClocks.caps_ms`, indexed by partition (+inf: no cap; -inf: the row
            may not move the watermark).

    Returns:
        (int64 capped times, bool array: the row keeps an event time, False where the cap is -inf).
    """
    times = np.asarray(event_times_ms, dtype=np.int64)
    parts = np.asarray(partitions, dtype=np.int64)
    if not len(times):
        return times, np.ones(0, bool)
    caps = np.full(len(times), np.inf)
    inside = parts < len(caps_ms)
    caps[inside] = caps_ms[parts[inside]]
    keeps = caps > -np.inf
    capped = times.copy()
    finite = np.isfinite(caps)
    capped[finite] = np.minimum(times[finite], caps[finite].astype(np.int64))
    return capped, keeps


class PartitionClockStore:
    """The files of a run's partition clocks (module docstring), on the driver's disk.

    Args:
        run_dir: `runs/<run_id>/`.
    """

    def __init__(self, run_dir: Path | str) -> None:
        self.root = RunDir(Path(run_dir)).partition_clocks

    def in_force_path(self, batch_id: int) -> Path:
        """`in-force-<b>.json`."""
        return self.root / f"in-force-{int(batch_id)}.json"

    def after_path(self, batch_id: int) -> Path:
        """`after-<b>.json`."""
        return self.root / f"after-{int(batch_id)}.json"

    def read_in_force(self, batch_id: int) -> PartitionClocks | None:
        """The clocks in force for batch `batch_id`, None if not written (yet).

        Raises:
            JobError: the file exists but cannot be parsed.
        """
        return self._read(self.in_force_path(batch_id), PartitionClocks.from_json)

    def after(self, batch_id: int) -> dict[int, PartitionClock] | None:
        """The clocks after batch `batch_id`, None if it was not sealed."""
        return self._read(self.after_path(batch_id), lambda v: {int(p): PartitionClock.from_json(c) for p, c in v["clocks"].items()})

    def latest_after(self, before: int) -> dict[int, PartitionClock]:
        """The clocks after the last sealed batch below `before` (empty when there is none)."""
        sealed = sorted((int(p.stem.split("-", 1)[1]) for p in self.root.glob("after-*.json")), reverse=True) if self.root.exists() else []
        for batch_id in sealed:
            if batch_id < before:
                return self.after(batch_id) or {}
        return {}

    def prepare(self, batch_id: int, time_ms: int, idle_timeout_ms: int, listed: Iterable[int] = (),
                end_offsets: Mapping[int, int] | None = None) -> PartitionClocks:
        """The clocks in force for `batch_id`: the file if a first attempt wrote it, else made
        from the last sealed batch before it (`in_force`, with the input end `end_offsets` known
        now) and written."""
        found = self.read_in_force(batch_id)
        if found is not None:
            return found
        clocks = in_force(self.latest_after(batch_id), batch_id, time_ms, idle_timeout_ms, listed, end_offsets)
        _write_json(self.in_force_path(batch_id), clocks.as_json())
        return clocks

    def seal(self, batch_id: int, query: str, reports: list[Mapping[int, SliceReport]]) -> dict[int, PartitionClock]:
        """Fold `reports`, what the ingest tasks of query `query` read in batch `batch_id`
        (`keyshift.eventtime.batch_channel.BatchChannel.reports`), into its clocks in force and
        write `after-<b>.json` (module docstring). Returns the clocks after the batch.

        Raises:
            JobError: the batch has no clocks in force (it was not prepared).
        """
        clocks = self.read_in_force(batch_id)
        if clocks is None:
            raise JobError(f"batch {batch_id} has no partition clocks in force under {self.root}; it was not prepared")
        after = clocks.advance(reports)
        _write_json(self.after_path(batch_id), {"batch_id": int(batch_id), "query": query,
                                                "clocks": {str(p): c.as_json() for p, c in sorted(after.items())}})
        return after

    def history(self) -> list[PartitionClocks]:
        """Every batch's clocks in force, by batch id (for reports: drift over a run)."""
        if not self.root.exists():
            return []
        ids = sorted(int(p.stem.split("-", 2)[2]) for p in self.root.glob("in-force-*.json"))
        return [c for c in (self.read_in_force(b) for b in ids) if c is not None]

    @staticmethod
    def _read(path: Path, parse):
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        except OSError as error:
            raise JobError(f"cannot read partition clocks {path}: {error}") from error
        try:
            return parse(json.loads(text))
        except (ValueError, KeyError, TypeError) as error:
            raise JobError(f"partition clocks file {path} is not valid ({error})") from error


def _write_json(path: Path, body: dict) -> None:
    """Write `body` to `path` atomically (a temporary file renamed over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(body, sort_keys=True))
    os.replace(temporary, path)


def listed_partitions(checkpoint_dir: Path | str, query_batch: int) -> list[int]:
    """The Kafka partitions Spark's offset log lists for a batch (`offsets/<b>`: a version
    line, the batch metadata, then one JSON line per source, `{topic: {partition: offset}}`).
    Empty when the file or the line is not there."""
    try:
        lines = CheckpointFiles(checkpoint_dir).read_text(f"offsets/{int(query_batch)}").splitlines()
        sources = json.loads(lines[2])
    except (OSError, IndexError, ValueError):
        return []
    return sorted({int(p) for offsets in sources.values() if isinstance(offsets, dict) for p in offsets})

