"""Pure data gathering for the keyshift page: stored records in, frozen values out.

Nothing here talks to Redis; functions take the records `keyshift.ui.store` read (dicts as the
writers stored them) or a run folder, and return small frozen values the plots and pages use.
Where each input comes from:

| input | writer | shape |
| --- | --- | --- |
| `runs/<run_id>/progress.jsonl` | `keyshift.runs.RunRecorder.progress` | one JSON object per micro-batch (a replayed batch appears twice: the last wins) |
| `runs/<run_id>/batches/<id>.json` | the sink's ledger | per batch `per_slot_events` (the authoritative counts) |
| `runs/<run_id>/task_seconds.json` | `keyshift.runtime.run_summary.TaskTimeRecorder` | `{"source"|"stateful": {batch_id: [seconds per task]}}` (source: per ingest task, = per slot when not coalesced; stateful: per stateful partition) |
| `runs/<run_id>/job.json` | the driver | `config` and, after a switch, `segments` (strategy, partitions, epoch per segment) |
| `runs/<run_id>/quality.json`, `pipeline.json` `quality`, `summary.json` `quality` | `keyshift dq run`, the pipeline's `data_quality` task, `keyshift run demo` (its windows suite) | suites with rows, evaluated and failed expectations, `data_docs` (the pipeline's failed check: `success` false and `error`) |
| `runs/<run_id>/summary.json` | the driver at the run's end | events read, late events, dead letters (and by reason), pending events, windows emitted |
| monitor records | `keyshift.monitoring.results.ResultStore.save` | `evaluate.evaluation_record` plus `consumer_lag` |
| switch records | `keyshift.migration.switch.SwitchControl` | see that module's step table |
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keyshift.monitoring.balance import balance_degree, max_over_mean
from keyshift.runs import read_jsonl  # noqa: F401 (the keyshift page reads run files through this module)
from keyshift.names import RunDir

log = logging.getLogger(__name__)

MEASURED_PREFIX = "measured "
"""Series names of measured loads in `strategy_balance_series` (`measured processed`, `measured arrivals`)."""


def read_json(path: Path) -> Any:
    """The JSON document at `path`, or None when it is missing or not valid JSON (logged)."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("could not read %s: %s", path, exc)
        return None


@dataclass(frozen=True)
class BatchLoad:
    """One micro-batch's load per slot.

    Attributes:
        batch_id: run-wide batch id (>= 0; continues across switches).
        slot_events: events each slot processed in the batch, P entries (P of the batch's segment).
        segment: the job segment (0 before the first switch), None when not recorded.
        strategy: the strategy in force for the batch, None when not recorded.
        epoch: the assignment epoch in force for the batch, None when not recorded.
        at_ms: when the batch started, epoch milliseconds, None when not recorded.
    """

    batch_id: int
    slot_events: tuple[int, ...]
    segment: int | None = None
    strategy: str | None = None
    epoch: int | None = None
    at_ms: int | None = None

    @property
    def events(self) -> int:
        """Events of the batch over all slots."""
        return sum(self.slot_events)

    @property
    def balance_degree(self) -> float | None:
        """min/max of `slot_events` (paper 000 eq. 1); None for an empty vector."""
        return balance_degree(self.slot_events) if self.slot_events else None

    @property
    def max_over_mean(self) -> float | None:
        """max/mean of `slot_events` (the batch's makespan over the ideal); None for an empty vector."""
        return max_over_mean(self.slot_events) if self.slot_events else None


def as_int(value: Any) -> int | None:
    """`value` (a number, or text as Redis stores it) as an int; None for None, "" or a non-number."""
    try:
        return None if value is None or value == "" else int(value)
    except (TypeError, ValueError):
        return None


def read_ledger(run_dir: Path) -> dict[int, list[int]]:
    """Per-slot events of each batch in the run's ledger `batches/<id>.json`: batch id -> events per slot."""
    loads = {}
    for path in sorted(RunDir(Path(run_dir)).ledger.glob("*.json")):
        record = read_json(path)
        if isinstance(record, dict) and isinstance(record.get("per_slot_events"), list):
            loads[int(record.get("batch_id", int(path.stem)))] = [int(v) for v in record["per_slot_events"]]
    return loads


def batch_loads(progress: Iterable[Mapping[str, Any]], ledger: Mapping[int, Sequence[int]] | None = None) -> list[BatchLoad]:
    """The run's batches in batch-id order, each with its per-slot events.

    Args:
        progress: progress records (`progress.jsonl` order); a batch Spark replayed after a crash
            appears more than once, and its last record wins.
        ledger: batch id -> per-slot events from the ledger (`read_ledger`), which wins over the
            progress record's `processed_rows_per_slot` (both count the same events; the ledger
            is rewritten when a batch is replayed). Batches only in the ledger are included
            without segment, strategy, epoch and time.

    Returns:
        One `BatchLoad` per batch id.
    """
    latest: dict[int, Mapping[str, Any]] = {}
    for record in progress:
        batch = as_int(record.get("batch_id"))
        if batch is not None and batch >= 0:
            latest[batch] = record
    ledger = ledger or {}
    batches = []
    for batch in sorted(set(latest) | set(ledger)):
        record = latest.get(batch, {})
        slots = ledger.get(batch) or record.get("processed_rows_per_slot") or []
        batches.append(BatchLoad(
            batch_id=batch, slot_events=tuple(int(v) for v in slots), segment=as_int(record.get("segment")),
            strategy=record.get("strategy"), epoch=as_int(record.get("epoch")), at_ms=as_int(record.get("timestamp_ms")),
        ))
    return batches


def segment_starts(batches: Sequence[BatchLoad]) -> list[BatchLoad]:
    """The first batch of each placement (strategy, epoch) in `batches`: where a switch took effect."""
    starts: list[BatchLoad] = []
    for batch in batches:
        if not starts or (batch.strategy, batch.epoch, len(batch.slot_events)) != (
                starts[-1].strategy, starts[-1].epoch, len(starts[-1].slot_events)):
            starts.append(batch)
    return starts


def task_seconds(document: Mapping[str, Any] | None) -> dict[str, list[tuple[int, tuple[float, ...]]]]:
    """Per stage, each batch's executor seconds per task, in batch order.

    Args:
        document: the content of `task_seconds.json` (`{"source"|"stateful": {batch id: [s per task]}}`:
            the source's tasks are slots, the stateful stage's its stateful partitions), or None.

    Returns:
        `{stage: [(batch id, seconds per task), ...]}` for the stages that hold any batch.
    """
    stages: dict[str, list[tuple[int, tuple[float, ...]]]] = {}
    for stage, per_batch in (document or {}).items():
        if not isinstance(per_batch, Mapping):
            continue
        rows = sorted((int(batch), tuple(float(s) for s in seconds)) for batch, seconds in per_batch.items() if seconds)
        if rows:
            stages[stage] = rows
    return stages


@dataclass(frozen=True)
class InForce:
    """The placement a run uses now.

    Attributes:
        strategy: strategy name (`hash`, `least_count`, ...), None when unknown.
        partitions: P, None when unknown.
        epoch: the assignment epoch in force, None when unknown.
        segment: the job segment (number of switches done before it), None when unknown.
        source: where it was read (`job.json segments`, `progress`, `run record`, `summary`).
    """

    strategy: str | None
    partitions: int | None
    epoch: int | None
    segment: int | None
    source: str


def recorded_config(job: Mapping[str, Any] | None) -> dict[str, Any]:
    """The config of a run's `job.json` as flat option names (`topic`, `strategy`, `partitions`,
    ...; `keyshift.processing.job_config.recorded_options`), grouped or flat as stored; {} when
    there is none or it is not a JSON object."""
    from keyshift.processing.job_config import recorded_options

    config = (job or {}).get("config")
    try:
        return recorded_options(config) if isinstance(config, Mapping) else {}
    except AttributeError:  # a group that is not an object: show what there is elsewhere
        return {}


def in_force(job: Mapping[str, Any] | None, record: Mapping[str, Any] | None, batches: Sequence[BatchLoad] = (),
             summary: Mapping[str, Any] | None = None) -> InForce:
    """What placement a run is using: its last segment, else its last batch, record or summary.

    Args:
        job: `job.json` (its `segments`, else its `config`), or None.
        record: the Redis run record (`strategy`, `partitions`, `epoch`, `segment` as text), or None.
        batches: the run's batches (`batch_loads`), whose last one carries strategy and epoch.
        summary: `summary.json`, or None.
    """
    segments = (job or {}).get("segments") or []
    if segments:
        last = segments[-1]
        return InForce(last.get("strategy"), as_int(last.get("partitions")), as_int(last.get("epoch")),
                       as_int(last.get("index", len(segments) - 1)), "job.json segments")
    if batches and batches[-1].strategy:
        last_batch = batches[-1]
        return InForce(last_batch.strategy, len(last_batch.slot_events) or None, last_batch.epoch, last_batch.segment, "progress")
    for source, values in (("run record", record), ("summary", summary), ("job.json config", recorded_config(job))):
        if values and values.get("strategy"):
            return InForce(values.get("strategy"), as_int(values.get("partitions")), as_int(values.get("epoch")),
                           as_int(values.get("segment")), source)
    return InForce(None, None, None, None, "nothing recorded")


@dataclass(frozen=True)
class SwitchRow:
    """One switch of a run, as the page shows it.

    Attributes:
        switch_id: `sw-<UTC time>-<4 hex>`.
        requested_at_s: when it was requested, epoch seconds (None if not recorded).
        finished_at_s: when it concluded, epoch seconds (None while under way).
        strategy_from, strategy_to: strategies left and chosen.
        partitions_from, partitions_to: P before and after.
        epoch_from, epoch_to: assignment epochs before and after.
        reason: why (the monitor's decision or a person's words).
        state: `running`, `done`, `failed` or `rolled_back`; step: the last step completed.
        pause_s: from the old query's last commit (its barrier batch's, or the stop request without one) to the new query's first commit, seconds (None until verified).
        keys_moved, keys_total: keys whose state changed slot, of all keys with state.
        state_bytes_moved, state_bytes: bytes of state that moved, of all state bytes.
        placement_ok: every key's state on its assigned slot after the switch (None until checked).
        conservation_ok: events conserved across the cut (None until checked).
        error: why it failed or rolled back ("" otherwise).
    """

    switch_id: str
    requested_at_s: float | None
    finished_at_s: float | None
    strategy_from: str
    strategy_to: str
    partitions_from: int | None
    partitions_to: int | None
    epoch_from: int | None
    epoch_to: int | None
    reason: str
    state: str
    step: str
    pause_s: float | None
    keys_moved: int | None
    keys_total: int | None
    state_bytes_moved: int | None
    state_bytes: int | None
    placement_ok: bool | None
    conservation_ok: bool | None
    error: str

    @property
    def verified(self) -> bool | None:
        """True when placement and conservation both checked out; False when one failed; None before."""
        checks = [c for c in (self.placement_ok, self.conservation_ok) if c is not None]
        return None if not checks else all(checks)


def as_float(value: Any) -> float | None:
    """`value` (a number, or text as Redis stores it) as a float; None for None, "" or a non-number."""
    try:
        return None if value is None or value == "" else float(value)
    except (TypeError, ValueError):
        return None


def switch_row(record: Mapping[str, Any]) -> SwitchRow:
    """One switch record (`SwitchControl.current` or a history entry) as a `SwitchRow`."""
    migration = record.get("migration") or {}
    verify = record.get("verify") or {}
    placement = verify.get("placement") if isinstance(verify, Mapping) else None
    conservation = verify.get("conservation") if isinstance(verify, Mapping) else None
    if placement is None and "misplaced" in verify:  # a failed check stores the placement itself
        placement = verify
    return SwitchRow(
        switch_id=str(record.get("switch_id", "?")),
        requested_at_s=as_float(record.get("requested_at")),
        finished_at_s=as_float(record.get("finished_at")),
        strategy_from=str(record.get("strategy_from", "?")), strategy_to=str(record.get("strategy_to", "?")),
        partitions_from=as_int(record.get("partitions_from")), partitions_to=as_int(record.get("partitions_to")),
        epoch_from=as_int(record.get("epoch_from")), epoch_to=as_int(record.get("epoch_to")),
        reason=str(record.get("reason") or ""), state=str(record.get("state") or "?"), step=str(record.get("step") or "?"),
        pause_s=as_float(record.get("pause_seconds")),
        keys_moved=as_int(migration.get("keys_moved")), keys_total=as_int(migration.get("keys_total")),
        state_bytes_moved=as_int(migration.get("state_bytes_moved")), state_bytes=as_int(migration.get("state_bytes")),
        placement_ok=None if not isinstance(placement, Mapping) or "ok" not in placement else bool(placement["ok"]),
        conservation_ok=None if not isinstance(conservation, Mapping) or "ok" not in conservation else bool(conservation["ok"]),
        error=str(record.get("error") or ""),
    )


def switch_rows(history: Iterable[Mapping[str, Any]], current: Mapping[str, Any] | None = None) -> list[SwitchRow]:
    """A run's switches, oldest first: its finished ones and the one under way (if any).

    Args:
        history: finished switch records (`SwitchControl.history`, newest first as stored).
        current: the current record (`SwitchControl.current`); added when it is not in the history
            (a switch under way).
    """
    rows = {}
    for record in history:
        row = switch_row(record)
        rows.setdefault(row.switch_id, row)  # newest first: the first one seen of an id is its last state
    if current is not None and current.get("switch_id") not in rows:
        row = switch_row(current)
        rows[row.switch_id] = row
    return sorted(rows.values(), key=lambda r: (r.requested_at_s or 0.0, r.switch_id))


@dataclass(frozen=True)
class SuiteOutcome:
    """One Great Expectations suite of a run's last validation.

    Attributes:
        suite: the suite's name. success: whether every expectation passed.
        rows: rows validated. evaluated: expectations evaluated. failed: expectations that failed.
    """

    suite: str
    success: bool
    rows: int | None
    evaluated: int | None
    failed: int


@dataclass(frozen=True)
class QualityResult:
    """A run's last data-quality result.

    Attributes:
        success: every suite passed. suites: each suite's outcome.
        data_docs: path of the Data Docs' `index.html` relative to the run folder (e.g.
            `data_docs/index.html`), None when the run folder holds none.
        source: the file read (`quality.json` or `pipeline.json`). failures: one line per failed
            expectation (at most what the file holds).
    """

    success: bool
    suites: tuple[SuiteOutcome, ...]
    data_docs: str | None
    source: str
    failures: tuple[str, ...] = ()


def _failure_line(suite: str, failed: Any) -> str:
    """One line for a failed expectation as `quality.json` stores it (`FailedExpectation` fields)."""
    if not isinstance(failed, Mapping):
        return f"{suite}: {failed}"
    arguments = ", ".join(f"{k}={v}" for k, v in (failed.get("kwargs") or {}).items())
    count = failed.get("unexpected_count")
    rows = f" failed on {count} of {failed.get('element_count')} rows" if count is not None else " failed"
    return f"{suite}: {failed.get('expectation')}({arguments}){rows}"[:300]


def _quality_from(document: Mapping[str, Any], source: str, run_dir: Path) -> QualityResult:
    suites = []
    failures: list[str] = list(document.get("failures") or [])
    for suite in document.get("suites") or []:
        failed = suite.get("failed") or []
        count = failed if isinstance(failed, int) else len(failed)
        if isinstance(failed, list):
            failures.extend(_failure_line(str(suite.get("suite")), f) for f in failed)
        suites.append(SuiteOutcome(str(suite.get("suite")), bool(suite.get("success", count == 0)), as_int(suite.get("rows")),
                                   as_int(suite.get("evaluated")), count))
    docs = RunDir(Path(run_dir)).data_docs / "index.html"
    return QualityResult(bool(document.get("success")), tuple(suites), "data_docs/index.html" if docs.is_file() else None, source,
                         tuple(failures))


DEMO_SUITE = "flight_delay_windows"
"""The suite `keyshift run demo` validates its windows table with (`keyshift.quality.windows.validate_windows`)."""


def _demo_quality(document: Mapping[str, Any]) -> dict[str, Any]:
    """The demo's result (`summary.json` `quality`: success, evaluated, rows, failed [{type, kwargs, line}])
    in the shape of `quality.json` (one suite)."""
    failed = [f.get("line") or f"{f.get('type')}({f.get('kwargs')})" if isinstance(f, Mapping) else str(f)
              for f in document.get("failed") or []]
    return {"success": document.get("success"), "failures": failed,
            "suites": [{"suite": DEMO_SUITE, "success": document.get("success"), "rows": document.get("rows"),
                        "evaluated": document.get("evaluated"), "failed": len(failed)}]}


def quality_result(run_dir: Path) -> QualityResult | None:
    """The run's last data-quality result, from whichever was written last of `quality.json`
    (`keyshift dq run`), `pipeline.json`'s `quality` (the pipeline's `data_quality` task; a check
    that failed before its suites ran records `success` false and its `error`) and `summary.json`'s
    `quality` (`keyshift run demo`'s windows suite); None when none holds one (or the task was skipped)."""
    candidates = []
    for name in (RunDir.QUALITY, RunDir.PIPELINE, RunDir.SUMMARY):
        path = run_dir / name
        document = read_json(path)
        if name != RunDir.QUALITY:
            document = (document or {}).get("quality") if isinstance(document, dict) else None
        if not isinstance(document, dict) or document.get("skipped") or "success" not in document:
            continue
        if name == RunDir.SUMMARY:
            document = _demo_quality(document)
        elif "suites" not in document:  # the pipeline's record of a check that raised before its suites
            document = {**document, "suites": [], "failures": [str(document.get("error") or "no suite result recorded")]}
        candidates.append((path.stat().st_mtime, name, document))
    if not candidates:
        return None
    _, name, document = max(candidates, key=lambda c: c[0])
    return _quality_from(document, name, run_dir)


@dataclass(frozen=True)
class RunFigures:
    """What a run did with its events, as the overview and the run page show it.

    Attributes:
        events_read: events the run read (None: not known yet).
        late_events: events behind their watermark, sent to the late output.
        dead_letters: records that could not be parsed or validated, sent to the dead-letter topic.
        dead_letter_reasons: the most frequent dead-letter reasons with their counts, most first
            (from the summary; while the run goes on, from its ledger).
        pending: events still in open windows (the summary's `pending_events`; while the run goes
            on, read minus accounted events of its last batch).
        windows: windows emitted (the summary's `windows_emitted`; while the run goes on, its
            ledger's sum; None without one).
        source: `summary` (the run ended), `progress` (its last batch) or `nothing recorded`.
    """

    events_read: int | None
    late_events: int | None
    dead_letters: int | None
    dead_letter_reasons: tuple[tuple[str, int], ...]
    pending: int | None
    windows: int | None
    source: str


TOP_REASONS = 3
"""Dead-letter reasons shown per run."""


def ledger_totals(run_dir: Path) -> tuple[int, dict[str, int]] | None:
    """(windows emitted, dead letters by reason) over a run's recorded batches: the sink's ledger
    (`runs/<run_id>/batches/`, one JSON file per batch, rewritten when Spark replays the batch),
    read without writing; None when it holds no batch."""
    folder = RunDir(Path(run_dir)).ledger
    if not folder.is_dir():
        return None
    windows, reasons, seen = 0, {}, False
    for path in sorted(folder.glob("*.json")):
        record = read_json(path)
        if not isinstance(record, dict):
            continue
        seen = True
        windows += as_int(record.get("windows_emitted")) or 0
        for reason, n in (record.get("dead_letters_by_reason") or {}).items():
            reasons[str(reason)] = reasons.get(str(reason), 0) + (as_int(n) or 0)
    return (windows, reasons) if seen else None


def _top_reasons(reasons: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(((str(k), as_int(v) or 0) for k, v in reasons.items()), key=lambda kv: (-kv[1], kv[0]))[:TOP_REASONS])


def run_figures(summary: Mapping[str, Any] | None, latest: Mapping[str, Any] | None,
                ledger: tuple[int, Mapping[str, int]] | None = None) -> RunFigures:
    """A run's figures from its summary (once it ended), else its last progress record and its
    ledger.

    Args:
        summary: `summary.json`, or None. latest: the last progress record (`RunRecorder.progress`:
            `events_read`, `events_accounted`, `late_events`, `dead_letters`), or None.
        ledger: while the run goes on, `ledger_totals` of its folder (windows emitted, dead letters
            by reason so far), or None.
    """
    if summary:
        return RunFigures(as_int(summary.get("events_read")), as_int(summary.get("late_events")), as_int(summary.get("dead_letters")),
                          _top_reasons(summary.get("dead_letters_by_reason") or {}), as_int(summary.get("pending_events")),
                          as_int(summary.get("windows_emitted")), "summary")
    if latest:
        read, accounted = as_int(latest.get("events_read")), as_int(latest.get("events_accounted"))
        return RunFigures(read, as_int(latest.get("late_events")), as_int(latest.get("dead_letters")),
                          _top_reasons(ledger[1]) if ledger else (),
                          None if read is None or accounted is None else read - accounted, ledger[0] if ledger else None, "progress")
    return RunFigures(None, None, None, (), None, None, "nothing recorded")


def attention(figures: RunFigures, quality: QualityResult | None) -> tuple[str, ...]:
    """What to mark on a run: late events or dead letters above zero, a failed quality result
    (one short phrase each, e.g. `1,183,168 late events`); empty when none applies."""
    marks = []
    if figures.late_events:
        marks.append(f"{figures.late_events:,} late events")
    if figures.dead_letters:
        marks.append(f"{figures.dead_letters:,} dead letters")
    if quality is not None and not quality.success:
        marks.append("quality failed")
    return tuple(marks)


def strategy_balance_series(records: Iterable[Mapping[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """Balance degree over time of every strategy the monitor scored, and of the measured loads.

    Args:
        records: monitor records (`ResultStore.recent`, oldest first).

    Returns:
        `{name: [(epoch seconds, balance degree), ...]}`: one series per strategy label of the
        evaluations, plus `measured processed` and `measured arrivals` where the records hold them.
    """
    series: dict[str, list[tuple[float, float]]] = {}
    for record in records:
        at = as_float(record.get("at_s"))
        if at is None:
            continue
        for result in (record.get("evaluation") or {}).get("results") or []:
            value = as_float(result.get("balance_degree"))
            if value is not None:
                series.setdefault(str(result.get("strategy")), []).append((at, value))
        for source, measured in (record.get("measured") or {}).items():
            value = as_float((measured or {}).get("balance_degree"))
            if value is not None:
                series.setdefault(MEASURED_PREFIX + source, []).append((at, value))
    return series


def lag_series(records: Iterable[Mapping[str, Any]]) -> list[tuple[float, int]]:
    """Total consumer lag (records) at each monitor evaluation that measured it: [(epoch seconds, lag)]."""
    points = []
    for record in records:
        at = as_float(record.get("at_s"))
        lag = record.get("consumer_lag")
        total = as_int(lag.get("total")) if isinstance(lag, Mapping) else as_int(lag)
        if at is not None and total is not None:
            points.append((at, total))
    return points


def switch_decisions(records: Iterable[Mapping[str, Any]]) -> list[tuple[float, str]]:
    """The monitor evaluations that decided to switch: [(epoch seconds, strategy chosen)]."""
    return [(float(r["at_s"]), str(r["decision"].get("strategy"))) for r in records
            if isinstance(r.get("decision"), Mapping) and r["decision"].get("switch") and r.get("at_s") is not None]


def strategy_in_force(record: Mapping[str, Any]) -> str | None:
    """The strategy a monitor record says was in force (its evaluation's `in_force`)."""
    return (record.get("evaluation") or {}).get("in_force")


def records_of_run(records: Sequence[Mapping[str, Any]], run_id: str, started_s: float | None,
                   finished_s: float | None) -> list[Mapping[str, Any]]:
    """The monitor records about one run: those naming it (`job_run_id`), else those made while it ran.

    Args:
        records: the topic's monitor records, oldest first.
        run_id: the run. started_s, finished_s: its start and end, epoch seconds (None: open).
    """
    named = [r for r in records if r.get("job_run_id") == run_id]
    if named:
        return named
    low = started_s if started_s is not None else float("-inf")
    high = finished_s if finished_s is not None else float("inf")
    return [r for r in records if low <= (as_float(r.get("at_s")) or low - 1) <= high]
