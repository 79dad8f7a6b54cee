"""`keyshift bench drift`: event time when Kafka partitions drift apart, measured on real flights.

**Input.** The flights with ten busy and ten quiet origins swapping names half-way through the six
months (`keyshift.data.drift.shifted_flights`, variant `popularity`), written by one plain
kafka-python producer (`write_plain`: Kafka's default partitioner, `json.dumps`) to a fresh
P-partition topic. `--flights N` keeps the first N flights of the file, `--every K` then one in K
of them (so a small run still spans the six months, and its partitions still drift months apart).
Both topics are read from `earliest` in micro-batches of `--per-trigger` records, so Spark's Kafka
source, which prorates `maxOffsetsPerTrigger` over the partitions by their remaining offsets,
reads the drifted topic's partitions months apart in event time.

**Thinning and plausibility.** The job quarantines an event more than A (`--max-ahead-ms`, 7
days by default) ahead of the median event time of its block of 1,000 events of one partition
(`keyshift.eventtime.plausibility`). Thinning by K makes a block of 1,000 events span K times the
event time it spans in the whole file, so with the job's default A a thinned run would send
valid flights to the dead letters in every mode, drifted or not (seen: `--every 100`, 5,000-record
batches: about 7,500 of 30,000 in each run). So when `every` > 1 each keyshift run gets
`--max-ahead-ms` = K x 7 days (the same reach over the same event time as the full data), unless
`max_ahead_ms` is given; with `every` = 1 the job's default holds. The report gives the value
used (`drift_bench.job_max_ahead_ms`, None: the job's default).

**Baseline** (`--baseline`): the same flights without the swap on a second fresh topic.
`plain` (the default) writes them exactly as the drifted ones (`write_plain`, one producer), so
the two topics differ only by the swap (record bytes, partitioner and producer alike). `replay`
writes them with keyshift's own replay instead (`keyshift.data.replay.replay_flights`, strategy
`hash`, its producers and compact JSON); it cannot subsample, so it needs `--every 1`. The report
says which was used (`drift_bench.baseline`).

**Runs**, one at a time, each in a fresh process (like for like: every run pays its own JVM and
session start, none inherits another's warm JVM): first the plain Spark job a user would write
(`keyshift.bench.plain_job`: Spark's one global watermark with a 48-hour delay, no dead letters,
late rows dropped silently) on the drifted topic, so that it reads exactly the flights (keyshift's
runs append their end-of-input markers to the topic they read); then keyshift's flight delay job
(`keyshift job run flight_delays --starting earliest --limit N --partitions P
--max-offsets-per-trigger X --bound-ms B --watermark MODE`, hash placement, default idle timeout
and idle lag) in `global`, `partition`, `key` and `dynamic` mode on the drifted topic and in `key`
mode on the undrifted one.

**Repeats** (`--repeats R`, default 3): key mode then runs R - 1 more times on each topic,
alternating drifted and undrifted, each again a fresh process; every repeat must read every
flight. The key rows keep each run's events/s (`events_per_second_runs`) and their median
(`events_per_second_median`), and the throughput target compares the medians: single runs on a
2-core machine move by several percent (more when another process shares the cores). Each
repeat's run id, late events and dead letters are in the row's `repeats`, and key mode's
lossless target counts them too.

**Per run** (`rows`): events/s = events read / the query's seconds (the summary's
`wall_seconds`, query start to last batch; the plain job's `query_seconds`), not the process's;
steady events/s over the batches after the first that read rows
(`keyshift.bench.watermark.steady_throughput`); late events; dead letters, total and by reason;
peak state store memory and rows (Spark's `memoryUsedBytes` and `numRowsTotal`, max over the
batches of `progress.jsonl`); the event-time spread between the active partitions' clocks at
each batch start (`drift_ms` of `runs/<run_id>/partition-clocks/in-force-<b>.json`) and its
largest value; whether the windows equal pandas' (`keyshift.quality.reference.reference_of`) row by row
(`keyshift.quality.reference.compare_to_reference`); the summary's `reconciled` flag.

**Targets** (issue 32; `evaluate_targets`): 0 late, 0 dead letters and windows equal to pandas in
`partition`, `key` and `dynamic` mode on the drifted topic; key mode's events/s on the drifted
topic at least 90 % of key mode's on the undrifted topic; peak state with a drift bound at most
2x the undrifted run's of the same mode, with the drift bound (`--drift-bound-ms`, default one
hour: keyshift's aligned Kafka source, `keyshift.processing.sources.aligned_kafka`, Flink's watermark
alignment). For that, `partition` and `key` mode also run with the bound on the drifted topic
(rows `<mode>, drift bound (drifted)`, field `drift_bound_ms`) and `partition` mode on the
undrifted topic; the target's value also gives the unbounded runs' ratios.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from keyshift.errors import ConfigurationError, JobError
from keyshift.settings import Settings

log = logging.getLogger(__name__)

DRIFTED_MODES = ("global", "partition", "key", "dynamic")
"""Watermark modes run on the drifted topic, in the order they run."""

LOSSLESS_MODES = ("partition", "key", "dynamic")
"""Modes that must lose nothing to the drift (0 late, 0 dead letters, windows equal to pandas)."""

STATE_MODES = ("key", "partition")
"""Modes run with the drift bound on the drifted topic (and without it on the undrifted one), whose
peak states the state target compares."""

BASELINES = ("plain", "replay")
"""How the undrifted baseline topic is written (module docstring)."""

THROUGHPUT_TOLERANCE = 0.10
"""Key mode on the drifted topic may be at most this fraction slower (events/s) than on the
undrifted one."""

STATE_BOUND_FACTOR = 2.0
"""The issue's state target: peak state with a drift bound at most this many times the undrifted
run's."""

PLAIN_JOB_WATERMARK = "global, 48 h delay"
"""The plain Spark job's watermark, as its rows name it (`keyshift.processing.builtin.BOUND`)."""

PLAIN_JOB_DELAY_MS = 48 * 3_600_000
"""The plain Spark job's watermark delay (`keyshift.processing.builtin.BOUND`, 48 hours), ms."""

HOUR_MS = 3_600_000
"""The jobs' window size (1 hour), ms."""

DAY_MS = 86_400_000
"""One day, ms."""

DEFAULT_DRIFT_BOUND_MS = 3_600_000
"""The bench's default drift bound (`--max-partition-drift-ms` of the bounded rows), ms of event time."""

DEFAULT_MAX_AHEAD_MS = 7 * DAY_MS
"""The job's default plausibility limit A (`keyshift.eventtime.plausibility.PlausibilityLimits`),
ms of event time; a thinned run gets `every` times it."""

ROW_FIELDS = ("run", "job", "watermark", "topic", "run_id", "events", "seconds", "events_per_second", "steady_events_per_second",
              "late_events", "dead_letters", "dead_letters_by_reason", "reconciled", "state_memory_bytes_peak",
              "state_rows_peak", "max_partition_drift_days", "drift_per_batch", "windows_equal_reference", "windows",
              "reference_windows", "window_events", "lost_events", "drift_bound_ms")
"""Fields every row of the report has (None where a run does not measure it)."""


@dataclass(frozen=True)
class DriftBenchSettings:
    """What `keyshift bench drift` runs.

    Attributes:
        flights: the first N flights of the file (int >= 1); None: all 3,000,000.
        every: keep one flight in `every` of those (int >= 1; rows 0, every, 2 every, ... of the
            selection), so a smaller run still spans the six months of drift.
        per_trigger: records per micro-batch (`maxOffsetsPerTrigger`), int >= 1.
        partitions: P, the topics' partitions and the job's slots, int >= 1.
        bound_ms: the watermark bound, ms of event time, int >= 0.
        baseline: how the undrifted topic is written, `"plain"` or `"replay"` (module docstring;
            `"replay"` needs `every == 1`).
        timeout_s: seconds one run (child process) may take before the bench fails, > 0.
        repeats: runs of key mode on each topic, alternating drifted and undrifted, int >= 1;
            the throughput target compares their medians.
        max_ahead_ms: the job's `--max-ahead-ms` (ms of event time, int >= 1) for every keyshift
            run; None: `every` x 7 days when `every` > 1, else the job's default (module
            docstring, "Thinning and plausibility").
        drift_bound_ms: the bounded rows' `--max-partition-drift-ms` (ms of event time, int >= 0).
    """

    flights: int | None = None
    every: int = 1
    per_trigger: int = 250_000
    partitions: int = 8
    bound_ms: int = 60_000
    baseline: str = "plain"
    timeout_s: float = 3_600.0
    repeats: int = 3
    max_ahead_ms: int | None = None
    drift_bound_ms: int = DEFAULT_DRIFT_BOUND_MS

    def job_max_ahead_ms(self) -> int | None:
        """The `--max-ahead-ms` the keyshift runs get (ms of event time), None for the job's default."""
        if self.max_ahead_ms is not None:
            return int(self.max_ahead_ms)
        return self.every * DEFAULT_MAX_AHEAD_MS if self.every > 1 else None

    def check(self) -> None:
        """Check the settings.

        Raises:
            ConfigurationError: a count below 1 (flights, every, per_trigger, partitions,
                repeats), a negative bound or drift bound, a timeout <= 0, max_ahead_ms < 1, an unknown
                baseline, or `baseline="replay"` with `every` > 1.
        """
        if (self.flights is not None and self.flights < 1) or min(self.every, self.per_trigger, self.partitions, self.repeats) < 1:
            raise ConfigurationError(f"bench drift needs flights, every, per_trigger, partitions and repeats >= 1, got {self}")
        if self.bound_ms < 0 or self.drift_bound_ms < 0 or self.timeout_s <= 0 or (self.max_ahead_ms is not None and self.max_ahead_ms < 1):
            raise ConfigurationError(f"bench drift needs bound_ms >= 0, timeout_s > 0 and max_ahead_ms >= 1, got {self}")
        if self.baseline not in BASELINES:
            raise ConfigurationError(f"baseline must be one of {', '.join(BASELINES)}, got {self.baseline!r}")
        if self.baseline == "replay" and self.every != 1:
            raise ConfigurationError("the replay baseline writes every flight of the selection, so it needs every == 1; "
                                     "use the plain baseline to subsample")


def drift_per_batch(run_dir: Path) -> list[dict[str, Any]]:
    """The partition drift at each batch of a run, from its partition clocks.

    Reads every `runs/<run_id>/partition-clocks/in-force-<b>.json` (written by the driver before
    batch b; `keyshift.eventtime.partition_clocks`).

    Args:
        run_dir: the run's folder, `runs/<run_id>`.

    Returns:
        One entry per batch, by batch id: `batch_id` (int, run-wide), `drift_ms` (int, ms of
        event time: the spread max - min of the active partitions' clocks when the batch started,
        0 with fewer than two), `idle_partitions` (int, partitions idle at that batch). [] when the
        run has no partition clocks.

    Raises:
        JobError: a clocks file cannot be read or is not valid JSON with `batch_id` and
            `drift_ms`.
    """
    folder = Path(run_dir) / "partition-clocks"
    if not folder.is_dir():
        return []
    found = []
    for path in folder.glob("in-force-*.json"):
        try:
            body = json.loads(path.read_text())
            found.append({"batch_id": int(body["batch_id"]), "drift_ms": int(body["drift_ms"]),
                          "idle_partitions": len(body.get("idle") or [])})
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise JobError(f"partition clocks file {path} cannot be read ({error!r})") from error
    return sorted(found, key=lambda entry: entry["batch_id"])


def build_row(name: str, mode: str, topic_kind: str, summary: Mapping[str, Any], progress: Sequence[Mapping[str, Any]],
              drift: Sequence[Mapping[str, Any]], comparison: Mapping[str, Any], drift_bound_ms: int | None = None) -> dict[str, Any]:
    """One row of the report from the outputs of a keyshift run.

    Args:
        name: the row's label (e.g. `"key (drifted)"`).
        mode: the run's watermark mode. topic_kind: `"drifted"` or `"undrifted"`.
        summary: the run's `summary.json` (`run_id`, `events_read`, `wall_seconds` in s,
            `events_per_second`, `late_events`, `dead_letters`, `dead_letters_by_reason`,
            `reconciled`).
        progress: its progress records, one per batch (`keyshift.bench.watermark.read_progress`:
            `input_rows`, `batch_duration_ms`, `state_store.memory_bytes` and `.rows`).
        drift: its drift per batch (`drift_per_batch`).
        comparison: `keyshift.quality.reference.compare_to_reference` of its windows against
            pandas (`equal`, `windows`, `reference_windows`, `events`).
        drift_bound_ms: the run's `--max-partition-drift-ms` (ms), None for none.

    Returns:
        A dict with every field of `ROW_FIELDS`: events/s (events / query seconds), steady
        events/s, late events, dead letters (total and by reason), `state_memory_bytes_peak`
        (bytes) and `state_rows_peak`, `max_partition_drift_days` (days, 2 decimals) and the
        drift per batch, `windows_equal_reference`, `window_events` (events in the windows),
        `lost_events` (events read but in no window: late + dead letters when reconciled), plus
        `max_partition_drift_ms`, `idle_partition_batches`, `cpu_seconds`.

    Raises:
        KeyError: the summary lacks `events_read`.
    """
    from keyshift.bench.watermark import peak_state_store, steady_throughput

    peak = peak_state_store(progress)
    largest = max((int(d["drift_ms"]) for d in drift), default=0)
    events = summary["events_read"]
    window_events = comparison.get("events")
    return {
        "run": name, "job": "keyshift", "watermark": mode, "topic": topic_kind, "run_id": summary.get("run_id"),
        "events": events, "seconds": summary.get("wall_seconds"), "events_per_second": summary.get("events_per_second"),
        "steady_events_per_second": steady_throughput(progress)["events_per_second"],
        "late_events": summary.get("late_events"), "dead_letters": summary.get("dead_letters"),
        "dead_letters_by_reason": dict(summary.get("dead_letters_by_reason") or {}), "reconciled": summary.get("reconciled"),
        "state_memory_bytes_peak": peak["state_memory_bytes_peak"], "state_rows_peak": peak["state_rows_peak"],
        "max_partition_drift_ms": largest, "max_partition_drift_days": round(largest / DAY_MS, 2),
        "idle_partition_batches": sum(1 for d in drift if d.get("idle_partitions")),
        "drift_per_batch": [dict(d) for d in drift],
        "windows_equal_reference": bool(comparison.get("equal")), "windows": comparison.get("windows"),
        "reference_windows": comparison.get("reference_windows"), "window_events": window_events,
        "lost_events": events - window_events if window_events is not None else None,
        "cpu_seconds": (summary.get("cpu_seconds") or {}).get("total"), "drift_bound_ms": drift_bound_ms,
    }


def open_at_end_events(reference: Any, last_event_ms: int, delay_ms: int = PLAIN_JOB_DELAY_MS, window_ms: int = HOUR_MS) -> int:
    """Events of the windows an append-mode query with a global watermark never emits: those still
    open when its input ends.

    Spark emits a window once the watermark (largest event time read - delay) reaches its end;
    at the end of the input the watermark is `last_event_ms - delay_ms`, so a window ending
    after that is never written, though none of its events was late.

    Args:
        reference: the pandas windows (`keyshift.quality.reference.reference_of`: `window_start`
            datetime64[ns, UTC], `count` int).
        last_event_ms: the largest event time of the input, ms since the epoch (UTC).
        delay_ms: the watermark delay, ms (default the plain job's 48 hours).
        window_ms: the window size, ms (default 1 hour).

    Returns:
        The summed `count` of the windows with window_start + window_ms > last_event_ms -
        delay_ms (int >= 0).
    """
    starts_ms = reference["window_start"].astype("int64") // 1_000_000
    return int(reference.loc[starts_ms + window_ms > last_event_ms - delay_ms, "count"].sum())


def plain_row(result: Mapping[str, Any], comparison: Mapping[str, Any], flights: int, open_at_end: int | None = None) -> dict[str, Any]:
    """The row of the plain Spark job's run on the drifted topic.

    Args:
        result: the JSON line `python -m keyshift.bench.plain_job` prints (`events` read,
            `query_seconds` in s, `steady_events_per_second`, `cpu_seconds`).
        comparison: `compare_to_reference` of its windows against pandas.
        flights: flights written to the topic (events it should have counted).
        open_at_end: events of the windows still open when the input ends (`open_at_end_events`),
            None if unknown.

    Returns:
        A dict with every field of `ROW_FIELDS`: `events_per_second` = events / query seconds
        (None without seconds), `lost_events` = flights - events in its windows,
        `open_at_end_events` (= `open_at_end`) and `late_dropped_events` = lost - open at end
        (rows it dropped as late, silently; None when either is unknown); late events, dead
        letters, state and drift are None (the plain job counts none of them).
    """
    events, seconds = result.get("events"), result.get("query_seconds")
    window_events = comparison.get("events")
    lost = flights - window_events if window_events is not None else None
    return {
        "run": "plain Spark job (drifted)", "job": "plain", "watermark": PLAIN_JOB_WATERMARK, "topic": "drifted", "run_id": None,
        "events": events, "seconds": seconds,
        "events_per_second": round(events / seconds, 1) if events and seconds else None,
        "steady_events_per_second": result.get("steady_events_per_second"),
        "late_events": None, "dead_letters": None, "dead_letters_by_reason": None, "reconciled": None,
        "state_memory_bytes_peak": None, "state_rows_peak": None, "max_partition_drift_days": None, "drift_per_batch": [],
        "windows_equal_reference": bool(comparison.get("equal")), "windows": comparison.get("windows"),
        "reference_windows": comparison.get("reference_windows"), "window_events": window_events,
        "lost_events": lost, "open_at_end_events": open_at_end,
        "late_dropped_events": max(lost - open_at_end, 0) if lost is not None and open_at_end is not None else None,
        "cpu_seconds": (result.get("cpu_seconds") or {}).get("total"), "drift_bound_ms": None,
    }


def evaluate_targets(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets (module docstring) against the report's rows.

    Args:
        rows: rows of `build_row` (keyshift runs) and `plain_row`; keyshift rows are found by
            (watermark, topic).

    Returns:
        Five dicts `{"target": str, "value": ..., "met": bool | None}`, always in this order:
        one per mode of `LOSSLESS_MODES` (value: late events and dead letters, summed over the
        row's run and its `repeats`, windows equal to pandas (the row's run), run ids; met when
        0, 0 and equal), the throughput target (value: ratio of key
        mode's events/s drifted over undrifted, both figures and each run's, the steady-state
        ratio of the first runs; the figures are the rows' `events_per_second_median` when they
        have one, else their `events_per_second`; met when the ratio >= 1 -
        `THROUGHPUT_TOLERANCE`), the state target (value per mode of `STATE_MODES`: the peak state
        bytes of its undrifted run, of its bounded run on the drifted topic (a row with
        `drift_bound_ms`) and their ratio, and the unbounded drifted run's bytes and ratio; met when
        every bounded ratio <= `STATE_BOUND_FACTOR`). `met` is None (and the value
        None or partial) when a row it needs is missing or lacks the figure.
    """
    keyshift = {(r["watermark"], r["topic"]): r for r in rows if r.get("job") == "keyshift" and r.get("drift_bound_ms") is None}
    targets: list[dict[str, Any]] = []
    for mode in LOSSLESS_MODES:
        row = keyshift.get((mode, "drifted"))
        text = f"{mode} mode on the drifted topic: 0 late events, 0 dead letters, windows equal to pandas"
        if row is None or row.get("late_events") is None or row.get("dead_letters") is None:
            targets.append({"target": text, "value": None, "met": None})
            continue
        equal = bool(row.get("windows_equal_reference"))
        repeats = row.get("repeats") or []
        late = row["late_events"] + sum(r.get("late_events") or 0 for r in repeats)
        dead = row["dead_letters"] + sum(r.get("dead_letters") or 0 for r in repeats)
        value = {"late_events": late, "dead_letters": dead, "windows_equal_reference": equal, "run_id": row.get("run_id")}
        if repeats:
            value["repeat_run_ids"] = [r.get("run_id") for r in repeats]
        targets.append({"target": text, "value": value, "met": late == 0 and dead == 0 and equal})
    drifted, undrifted = keyshift.get(("key", "drifted")), keyshift.get(("key", "undrifted"))
    text = (f"key mode's events/s on the drifted topic >= {1 - THROUGHPUT_TOLERANCE:.0%} of key mode's on the undrifted topic "
            "(medians of the repeats)")
    fast, slow = _speed(drifted or {}), _speed(undrifted or {})
    if fast and slow:
        ratio = fast / slow
        steady_fast, steady_slow = drifted.get("steady_events_per_second"), undrifted.get("steady_events_per_second")
        targets.append({"target": text,
                        "value": {"ratio": round(ratio, 3), "drifted": fast, "undrifted": slow,
                                  "runs": {"drifted": drifted.get("events_per_second_runs"),
                                           "undrifted": undrifted.get("events_per_second_runs")},
                                  "steady_ratio": round(steady_fast / steady_slow, 3) if steady_fast and steady_slow else None},
                        "met": ratio >= 1 - THROUGHPUT_TOLERANCE})
    else:
        targets.append({"target": text, "value": None, "met": None})
    bounded = {r["watermark"]: r for r in rows if r.get("job") == "keyshift" and r.get("drift_bound_ms") is not None
               and r["topic"] == "drifted"}
    value: dict[str, Any] = {}
    met: bool | None = True
    for mode in STATE_MODES:
        base = (keyshift.get((mode, "undrifted")) or {}).get("state_memory_bytes_peak")
        peak = (bounded.get(mode) or {}).get("state_memory_bytes_peak")
        unbounded = (keyshift.get((mode, "drifted")) or {}).get("state_memory_bytes_peak")
        ratio = round(peak / base, 2) if peak and base else None
        value[mode] = {"undrifted bytes": base, "bounded drifted bytes": peak, "x_undrifted": ratio,
                       "drift_bound_ms": (bounded.get(mode) or {}).get("drift_bound_ms"), "unbounded drifted bytes": unbounded,
                       "unbounded x_undrifted": round(unbounded / base, 2) if unbounded and base else None}
        met = None if ratio is None or met is None else met and ratio <= STATE_BOUND_FACTOR
    targets.append({"target": f"peak state with the drift bound <= {STATE_BOUND_FACTOR:g}x the undrifted run's of the same mode",
                    "value": value, "met": met})
    return targets


def _speed(row: Mapping[str, Any]) -> float | None:
    """A row's events/s for the throughput target: the median of its repeats, else its own."""
    return row.get("events_per_second_median") or row.get("events_per_second")


def add_repeat(row: dict[str, Any], summary: Mapping[str, Any], flights: int) -> None:
    """Add a repeated key-mode run to its row and update the row's median events/s.

    Args:
        row: a key-mode row of `build_row`, changed in place: `events_per_second_runs` (the
            events/s of every run of it in order, the row's own first), `events_per_second_median`,
            `repeat_run_ids`, and `repeats` (per repeat: `run_id`, `events_per_second`,
            `late_events`, `dead_letters`, `reconciled`).
        summary: the repeat's `summary.json` (`run_id`, `events_read`, `events_per_second`,
            `late_events`, `dead_letters`, `reconciled`).
        flights: flights the run had to read.

    Raises:
        JobError: the repeat read another count of events than `flights` (it did not do the
            same work) or gave no events/s.
    """
    if summary.get("events_read") != flights or not summary.get("events_per_second"):
        raise JobError(f"repeat {summary.get('run_id')} of {row['run']} read {summary.get('events_read')} of {flights} events "
                       f"at {summary.get('events_per_second')} events/s")
    runs = row.setdefault("events_per_second_runs", [row["events_per_second"]])
    runs.append(summary["events_per_second"])
    row.setdefault("repeat_run_ids", []).append(summary.get("run_id"))
    row.setdefault("repeats", []).append({key: summary.get(key) for key in
                                          ("run_id", "events_per_second", "late_events", "dead_letters", "reconciled")})
    row["events_per_second_median"] = float(statistics.median(runs))


def plot_rows(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Draw the report's plot as a PNG.

    Left panel: events/s per run (horizontal bars, the median of the repeats for the key rows;
    the plain job grey; late events, dead letters or lost events written beside the bars).
    Right panel: the partition drift in days (spread of the active partitions' clocks at each
    batch start) per micro-batch of each keyshift run on the drifted topic (one input, so their
    lines often coincide: thinner lines drawn over thicker ones), the undrifted key run dashed.

    Args:
        rows: the report's rows (`build_row`, `plain_row`).
        path: the PNG to write (its folder must exist).

    Returns:
        `path`.

    Raises:
        OSError: the file cannot be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [1, 1.1]})
    names = [r["run"] for r in rows]
    speeds = [_speed(r) or 0 for r in rows]
    left.barh(names, speeds, color=["#999999" if r["job"] == "plain" else "#3b7dd8" for r in rows])
    for index, row in enumerate(rows):
        if row["job"] == "plain":
            note = f"lost {row['lost_events']:,}" if row.get("lost_events") is not None else ""
            note += f" ({row['late_dropped_events']:,} late)" if row.get("late_dropped_events") is not None else ""
        else:
            note = f"late {row.get('late_events') or 0:,}, dead {row.get('dead_letters') or 0:,}"
            runs = row.get("events_per_second_runs") or []
            note += f"; median of {len(runs)}" if len(runs) > 1 else ""
        left.text(speeds[index], index, f" {note}", va="center", fontsize=8)
    left.set_xlabel("events/s (events / query seconds; each run a fresh process)")
    left.set_xlim(0, max(speeds + [1]) * 1.45)
    left.invert_yaxis()
    drifted = [r for r in rows if r.get("drift_per_batch") and r.get("topic") == "drifted"]
    for row in rows:
        if not row.get("drift_per_batch"):
            continue
        batches = [d["batch_id"] for d in row["drift_per_batch"]]
        days = [d["drift_ms"] / DAY_MS for d in row["drift_per_batch"]]
        if row.get("topic") == "drifted":
            right.plot(batches, days, marker=".", label=row["run"], linewidth=1 + 1.5 * (len(drifted) - 1 - drifted.index(row)))
        else:
            right.plot(batches, days, linestyle="--", color="#777777", label=row["run"])
    right.set_xlabel("micro-batch")
    right.set_ylabel("partition drift at batch start (days)")
    right.grid(alpha=0.3)
    if right.get_legend_handles_labels()[0]:
        right.legend(fontsize=8)
    figure.suptitle("keyshift bench drift: busy and quiet origins swap half-way, one plain producer, read from earliest")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _child(command: list[str], log_path: Path, timeout_s: float) -> str:
    """Run `command` (stderr appended to `log_path`) and return its stdout.

    Raises:
        JobError: a non-zero exit (with the log's last lines) or a timeout.
    """
    with log_path.open("ab") as err:
        try:
            done = subprocess.run(command, stdout=subprocess.PIPE, stderr=err, timeout=timeout_s, env=os.environ.copy())
        except subprocess.TimeoutExpired as exc:
            raise JobError(f"{' '.join(command[:6])} took more than {timeout_s:.0f} s; log {log_path}") from exc
    if done.returncode != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-15:]
        raise JobError(f"{' '.join(command[:6])} exited {done.returncode}; log {log_path}:\n" + "\n".join(tail))
    return done.stdout.decode(errors="replace")


def _keyshift_run(config: DriftBenchSettings, topic: str, mode: str, flights: int, log_path: Path,
                  drift_bound_ms: int | None = None) -> str:
    """Run the flight delay job on `topic` in a fresh process; return its run id.

    Raises:
        JobError: the run failed or took longer than `config.timeout_s`.
    """
    run_id = f"bench-drift-{mode}-{uuid.uuid4().hex[:6]}"
    _child([sys.executable, "-m", "keyshift.cli", "job", "run", "flight_delays", "--run-id", run_id, "--topic", topic,
            "--strategy", "hash", "--partitions", str(config.partitions), "--watermark", mode, "--bound-ms", str(config.bound_ms),
            "--limit", str(flights), "--starting", "earliest", "--max-offsets-per-trigger", str(config.per_trigger),
            *(["--max-ahead-ms", str(config.job_max_ahead_ms())] if config.job_max_ahead_ms() is not None else []),
            *(["--max-partition-drift-ms", str(drift_bound_ms)] if drift_bound_ms is not None else [])],
           log_path, config.timeout_s)
    return run_id


def _plain_run(config: DriftBenchSettings, topic: str, out: Path, log_path: Path) -> dict[str, Any]:
    """Run `python -m keyshift.bench.plain_job` on `topic` in a fresh process; return its figures.

    Raises:
        JobError: the run failed, took longer than `config.timeout_s`, or printed no JSON line.
    """
    stdout = _child([sys.executable, "-m", "keyshift.bench.plain_job", "--topic", topic, "--partitions", str(config.partitions),
                     "--out", str(out), "--max-offsets-per-trigger", str(config.per_trigger)], log_path, config.timeout_s)
    try:
        return json.loads(stdout.strip().splitlines()[-1])
    except (IndexError, ValueError) as exc:
        raise JobError(f"the plain job printed no figures; log {log_path}") from exc


def _write_topics(settings: Settings, config: DriftBenchSettings,
                  say: Callable[[str], None]) -> tuple[dict[str, str], dict[str, Any], int, str, int]:
    """Build both frames, create both topics and write them; return (topics, pandas references,
    flights per topic, a sentence on the baseline, the drifted frame's largest event time in ms)."""
    from keyshift.data.drift import plain_flights, shifted_flights, write_plain
    from keyshift.quality.reference import reference_of
    from keyshift.data.flights import flights_path
    from keyshift.data.replay import replay_flights
    from keyshift.kafka_clients import client_options
    from keyshift.topics import create_topics

    path = flights_path(settings)
    frames = {"drifted": shifted_flights(path, limit=config.flights, variant="popularity", partitions=config.partitions),
              "undrifted": plain_flights(path, limit=config.flights)}
    topics, references = {}, {}
    for kind, frame in frames.items():
        frame = frame.iloc[::config.every].reset_index(drop=True)
        topic = f"bench-drift-{kind}-{uuid.uuid4().hex[:6]}"
        create_topics(settings, [topic], config.partitions)
        started = time.monotonic()
        if kind == "undrifted" and config.baseline == "replay":
            replay_flights(settings, topic, limit=config.flights, strategy="hash", partitions=config.partitions, progress=False)
        else:
            write_plain(settings.bootstrap_servers, topic, frame, config.partitions, client_options=client_options(settings))
        say(f"wrote {len(frame):,} {kind} flights to {topic} in {time.monotonic() - started:.0f} s")
        topics[kind], references[kind], frames[kind] = topic, reference_of(frame), frame
    if len(frames["drifted"]) != len(frames["undrifted"]):
        raise JobError(f"the drifted and undrifted frames differ in length ({len(frames['drifted'])} and {len(frames['undrifted'])})")
    baseline = ("the same flights without the swap, written by one plain kafka-python producer as the drifted ones (write_plain)"
                if config.baseline == "plain" else
                "the same flights without the swap, written by keyshift's replay (replay_flights, strategy hash)")
    return topics, references, len(frames["drifted"]), baseline, int(frames["drifted"]["event_time"].max())


def run_drift_bench(settings: Settings, out: Path, config: DriftBenchSettings, progress: bool = True) -> dict[str, Any]:
    """Write both topics, run every configuration (module docstring), write the report and plot.

    Args:
        settings: the stack (broker, runs folder, flights file).
        out: the JSON report's path; the plot goes beside it (`out` with suffix `.png`), the
            runs' logs into `out` with suffix `.logs/`.
        config: sizes and options (`DriftBenchSettings`).
        progress: print a line per topic and per run (else log them).

    Returns:
        The report, also written to `out` as JSON: `drift_bench` (the settings, `flights_per_run`,
        the topics, `baseline_description`, `job_max_ahead_ms`, `run_order` (every run as
        `"<row> [<run id>]"` in the order it ran, repeats included), `like_for_like`, `input`; the
        field only this bench writes), `rows` (`build_row`, `plain_row`), `targets` (`evaluate_targets`), `plot` (the
        PNG's path), `machine` (`cpus`), `wall_seconds` (the whole bench, s).

    Raises:
        ConfigurationError: bad settings. JobError: a run failed or timed out.
        StackError: the broker refused the writes. DataError: the flights file is not valid.
    """
    from keyshift.bench.watermark import read_progress
    from keyshift.quality.reference import compare_to_reference

    config.check()
    started = time.monotonic()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    say = print if progress else log.info
    topics, references, flights, baseline, last_event_ms = _write_topics(settings, config, say)
    logs = out.with_suffix(".logs")
    logs.mkdir(exist_ok=True)
    rows = []
    plain_out = logs / f"plain-{uuid.uuid4().hex[:6]}"
    plain = _plain_run(config, topics["drifted"], plain_out, logs / "plain.log")
    rows.append(plain_row(plain, compare_to_reference(plain_out / "windows", references["drifted"]), flights,
                          open_at_end_events(references["drifted"], last_event_ms)))
    order = [f"{rows[-1]['run']} [{plain_out.name}]"]
    say(f"{rows[-1]['run']}: {rows[-1]['events_per_second']} events/s, windows hold {rows[-1]['window_events']} of {flights} "
        f"flights ({rows[-1]['open_at_end_events']} in windows open at the end, {rows[-1]['late_dropped_events']} dropped late), "
        f"equal to pandas {rows[-1]['windows_equal_reference']}")
    runs = [*(("drifted", m, None) for m in DRIFTED_MODES), *(("drifted", m, config.drift_bound_ms) for m in STATE_MODES),
            *(("undrifted", m, None) for m in STATE_MODES)]
    for kind, mode, bound in runs:
        label = f"{mode} ({kind})" if bound is None else f"{mode}, drift bound ({kind})"
        run_id = _keyshift_run(config, topics[kind], mode, flights, logs / f"{label.replace(' ', '-')}.log", bound)
        run_dir = settings.runs_dir / run_id
        summary = json.loads((run_dir / "summary.json").read_text())
        comparison = compare_to_reference(Path(summary["windows_path"]), references[kind])
        row = build_row(label, mode, kind, summary, read_progress(run_dir), drift_per_batch(run_dir), comparison, bound)
        rows.append(row)
        order.append(f"{row['run']} [{run_id}]")
        say(f"{row['run']} [{run_id}]: {row['events_per_second']} events/s, late {row['late_events']}, dead letters "
            f"{row['dead_letters']}, peak state {row['state_memory_bytes_peak']} B, max drift {row['max_partition_drift_days']} days, "
            f"equal to pandas {row['windows_equal_reference']}")
    key_rows = [next(r for r in rows if r["job"] == "keyshift" and r["watermark"] == "key" and r["topic"] == kind
                     and r.get("drift_bound_ms") is None)
                for kind in ("drifted", "undrifted")]
    for row in key_rows:
        row["events_per_second_runs"], row["events_per_second_median"] = [row["events_per_second"]], row["events_per_second"]
    for repeat in range(1, config.repeats):
        for row in key_rows:
            run_id = _keyshift_run(config, topics[row["topic"]], "key", flights, logs / f"{row['topic']}-key-{repeat}.log")
            add_repeat(row, json.loads((settings.runs_dir / run_id / "summary.json").read_text()), flights)
            order.append(f"{row['run']} repeat {repeat} [{run_id}]")
            say(f"{row['run']} repeat {repeat} [{run_id}]: {row['events_per_second_runs'][-1]} events/s")
    report = {
        "drift_bench": {**asdict(config), "flights_per_run": flights, "topics": topics, "baseline_description": baseline,
                        "job_max_ahead_ms": config.job_max_ahead_ms(),
                        "run_order": order,
                        "like_for_like": "every run in a fresh process, one at a time; events/s over each query's own seconds",
                        "input": "popularity variant of keyshift.data.drift (ten busy and ten quiet origins swap names half-way), "
                                 "one plain kafka-python producer, Kafka's default partitioner"},
        "rows": rows,
        "targets": evaluate_targets(rows),
        "plot": str(plot_rows(rows, out.with_suffix(".png"))),
        "machine": {"cpus": os.cpu_count()},
        "wall_seconds": round(time.monotonic() - started, 1),
    }
    out.write_text(json.dumps(report, indent=2, default=str))
    return report
