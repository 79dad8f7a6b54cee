"""What a person sees on the terminal during and after a run of `keyshift job run` or
`keyshift run demo`: step lines and warnings (not every log line), a progress bar of the events
accounted for, and at the end a short summary table plus the warnings that matter, once.

- `summary_rows`, `render_summary`: the summary dict (`keyshift.runtime.run_summary.build_summary`,
  with the demo's checks) as a two-column table (rich), plain text for a given width.
- `summary_notes`: the warnings a summary calls for (late events, dead letters, a run that does
  not reconcile), one line each.
- `EventsBar`: a tqdm bar of a job run's events accounted for against its target, fed with the
  run's progress records.
- `STEP` and `show_steps_and_warnings`: log records marked `extra=STEP` are steps the terminal
  shows although they are INFO; every other INFO line goes only to the run's driver log
  (`keyshift.runlog`). Under Airflow nothing of this applies: its task log shows every line.
"""

from __future__ import annotations

import io
import logging
import sys
from pathlib import Path
from collections.abc import Mapping
from typing import Any, TextIO

from keyshift.names import DEAD_LETTER_TOPIC, LATE_TOPIC, RunDir

STEP = {"step": True}
"""`extra=` of a log record that is a step of a run: the terminal shows it even at INFO."""

PLAIN_WIDTH = 100
"""Characters per line of the summary table printed to a file or pipe (not a terminal)."""

TERMINAL_FORMAT = "%(asctime)s %(message)s"
"""Format of a step line on the terminal (warnings add their level and logger)."""


class TerminalFilter(logging.Filter):
    """Passes warnings and errors, and records marked as steps (`extra=STEP`); drops the rest.

    Python warnings routed to logging (`py.warnings`) are dropped too: they are library
    deprecations, kept in the driver log.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether `record` goes to the terminal: a step (`extra=STEP`), or a warning or worse
        other than `py.warnings`."""
        if getattr(record, "step", False):
            return True
        return record.levelno >= logging.WARNING and record.name != "py.warnings"


class TerminalFormatter(logging.Formatter):
    """`HH:MM:SS message` for a step; `HH:MM:SS WARNING logger: message` for anything else."""

    def __init__(self) -> None:
        super().__init__(TERMINAL_FORMAT, datefmt="%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        """The record as one terminal line (class docstring)."""
        text = super().format(record)
        if getattr(record, "step", False) or record.levelno < logging.WARNING:
            return text
        time_part, _, message = text.partition(" ")
        return f"{time_part} {record.levelname} {record.name}: {message}"


def show_steps_and_warnings() -> bool:
    """Make the terminal's log handlers (the root logger's stream handlers on stdout or stderr)
    show steps and warnings only (`TerminalFilter`, `TerminalFormatter`).

    Does nothing when the root logger is at DEBUG (`keyshift -v`): then the terminal shows every
    line, as before. Returns whether the terminal was changed.
    """
    root = logging.getLogger()
    if root.level <= logging.DEBUG:
        return False
    changed = False
    for handler in root.handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream in (sys.stdout, sys.stderr):
            if not any(isinstance(f, TerminalFilter) for f in handler.filters):
                handler.addFilter(TerminalFilter())
            handler.setFormatter(TerminalFormatter())
            changed = True
    logging.captureWarnings(True)
    return changed


def _count(value: Any) -> str:
    return "?" if value is None else f"{int(value):,}"


def _seconds(ms: Any) -> str:
    """A duration in ms as the shortest exact unit: 60000 -> '1 min', 3600000 -> '1 h'."""
    if ms is None:
        return "?"
    ms = int(ms)
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if ms >= size and ms % size == 0:
            return f"{ms // size} {unit}"
    return f"{ms} ms"


def _where(path: str | Path, cwd: Path | None = None) -> str:
    """`path` relative to the working directory when it lies under it, else as given."""
    path = Path(path)
    try:
        return str(path.relative_to(cwd or Path.cwd()))
    except ValueError:
        return str(path)


def run_folder(summary: dict[str, Any]) -> Path | None:
    """The run's folder `runs/<run_id>/`, from the summary's windows path (None if it has none)."""
    windows = summary.get("key_windows_path") or summary.get("windows_path")
    return Path(windows).parent if windows else None


def summary_rows(summary: dict[str, Any], cwd: Path | None = None) -> list[tuple[str, str]]:
    """The summary table's rows, (label, text), for a job run's summary or the demo's.

    Rows: job, events, throughput, balance, windows (or key-window updates), late events, dead
    letters, reconciled; then, where the summary has them, switches, quality (Great
    Expectations), vs pandas (`reference`), global mode, built-in; last, outputs (the run folder
    and its files). Paths are shown relative to `cwd` (default: the working directory) when
    they lie under it.

    Args:
        summary: a summary dict as `run_job` or `run_demo` return it (and as
            `runs/<run_id>/summary.json` holds it); missing fields show as `?`.

    Returns:
        A list of (label, text) pairs, in display order.
    """
    s = summary
    rows: list[tuple[str, str]] = []
    watermark = s.get("watermark") or "global"
    rows.append(("job", f"{s.get('job') or 'flight_delays'}, strategy {s.get('strategy', '?')}, P = {s.get('partitions', '?')}, "
                        f"epoch {s.get('epoch', '?')}, {watermark} watermark, bound {_seconds(s.get('bound_ms'))}"))
    events = f"{_count(s.get('events_read'))} read"
    if s.get("events_produced") is not None:
        events += f" of {_count(s['events_produced'])} replayed"
    events += f" from {s.get('topic', '?')}, {_count(s.get('batches'))} micro-batches"
    rows.append(("events", events))
    rate = s.get("events_per_second")
    wall = s.get("wall_seconds")
    throughput = (f"{rate:,.0f} events/s" if rate is not None else "?") + (f" ({wall:,.1f} s)" if wall is not None else "")
    attempts = s.get("attempts") or []
    if len(attempts) > 1:  # a resumed run: the run's events over all its attempts' seconds, then this attempt's own
        last = attempts[-1]
        own = f"{last['events_per_second']:,.0f} events/s" if last.get("events_per_second") is not None else "? events/s"
        throughput = (f"{rate:,.0f} events/s" if rate is not None else "?") + f" over {wall:,.1f} s in {len(attempts)} attempts" \
            f" (this attempt: {last['events']:,} events in {last['seconds']:,.1f} s, {own})"
    rows.append(("throughput", throughput))
    per_slot = s.get("per_slot_events") or []
    balance = s.get("balance_degree")
    text = f"{balance:.2f}" if balance is not None else "?"
    if per_slot:
        text += f" (min/max events per slot: {min(per_slot):,} / {max(per_slot):,}, {len(per_slot)} slots)"
    rows.append(("balance degree", text))
    if s.get("key_window_updates") is not None:
        rows.append(("key windows", f"{_count(s['key_window_updates'])} updates for {_count(s.get('native_window_rows'))} "
                                    f"rows of Spark's sliding windows"))
    else:
        rows.append(("windows", f"{_count(s.get('windows_emitted'))} windows, {_count(s.get('alerts'))} alerts"
                                + (f", {_count(s['merged_window_pieces'])} split-key pieces merged"
                                   if s.get("merged_window_pieces") else "")))
    late = s.get("late_events")
    rows.append(("late events", _count(late) + (f" (in {LATE_TOPIC}, not in the windows)" if late else "")))
    dead = s.get("dead_letters")
    reasons = s.get("dead_letters_by_reason") or {}
    rows.append(("dead letters", _count(dead) + (
        " (" + ", ".join(f"{reason}: {n:,}" for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1])) + ")"
        if dead and reasons else "")))
    in_windows = "retired from key windows" if s.get("key_window_updates") is not None else "in windows"
    balance_text = (f"{_count(s.get('events_read'))} read = {_count(s.get('sum_window_counts'))} {in_windows} + "
                    f"{_count(late)} late + {_count(dead)} dead letters + "
                    + (f"{_count(s['filtered_events'])} filtered + " if s.get("filtered_events") else "")
                    + f"{_count(s.get('pending_events'))} pending")
    rows.append(("reconciled", ("yes: " if s.get("reconciled") else "NO: ") + balance_text))
    if s.get("switches"):
        rows.append(("switches", ", ".join(s["switches"])))
    quality = s.get("quality")
    if quality:
        failed = quality.get("failed") or []
        if quality.get("success"):
            rows.append(("quality", f"passed: {_count(quality.get('evaluated'))} expectations on {_count(quality.get('rows'))} rows"))
        else:
            names = ", ".join(str(f.get("type", f)) if isinstance(f, dict) else str(f) for f in failed[:3])
            rows.append(("quality", f"FAILED: {len(failed)} of {_count(quality.get('evaluated'))} expectations ({names})"))
    reference = s.get("reference")
    if reference:
        if reference.get("equal"):
            rows.append(("vs pandas", f"equal: {_count(reference.get('windows'))} windows"))
        else:
            rows.append(("vs pandas", f"DIFFERENT: {_count(reference.get('only_ours'))} only ours, "
                                      f"{_count(reference.get('only_reference'))} only pandas', "
                                      f"{_count(reference.get('field_mismatches'))} with other values"))
    other = s.get("global_mode")
    if other:
        rows.append(("global mode", f"{_count(other.get('late_events'))} late events with the same bound "
                                    f"(against {_count(late)} with {watermark} watermarks; run {other.get('run_id', '?')})"))
    builtin = s.get("builtin")
    if builtin:
        rows.append(("Spark built-in", comparison_text(builtin)))
    folder = run_folder(s)
    if folder is not None:
        files = [RunDir.SUMMARY, RunDir.DRIVER_LOG, (RunDir.WINDOWS if s.get("key_window_updates") is None else RunDir.KEY_WINDOWS) + "/"]
        if quality and quality.get("data_docs"):
            files.append(_where(quality["data_docs"], folder))
        rows.append(("outputs", f"{_where(folder, cwd)}/: " + ", ".join(files)))
    return rows


def summary_table(summary: dict[str, Any], cwd: Path | None = None):
    """The summary as a rich `Table` (two columns, no header; see `summary_rows`)."""
    from rich import box
    from rich.table import Table

    outcome = "reconciled" if summary.get("reconciled") else "does NOT reconcile"
    table = Table(title=f"keyshift run {summary.get('run_id', '?')}: {outcome}", title_justify="left", show_header=False,
                  box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("what", style="bold", no_wrap=True)
    table.add_column("measured", overflow="fold")
    for label, text in summary_rows(summary, cwd):
        style = "red" if text.startswith(("NO:", "FAILED", "DIFFERENT")) else None
        table.add_row(label, text, style=style)
    return table


def render_summary(summary: dict[str, Any], width: int = 100, cwd: Path | None = None) -> str:
    """The summary table as plain text (no colour, no control codes), `width` characters wide.

    A pure function of its arguments: the same summary gives the same text.
    """
    from rich.console import Console

    buffer = io.StringIO()
    console = Console(file=buffer, width=width, color_system=None, force_terminal=False, no_color=True,
                      highlight=False, emoji=False, legacy_windows=False)
    console.print(summary_table(summary, cwd))
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"


def summary_notes(summary: dict[str, Any]) -> list[str]:
    """The warnings a run's summary calls for, one sentence each (empty when all is well).

    A run that does not reconcile, late events (with where they went), dead letters (with their
    reasons and where they went).
    """
    notes = []
    if summary.get("reconciled") is False:
        notes.append(f"run {summary.get('run_id')} does not reconcile: events read {_count(summary.get('events_read'))} != "
                     f"windows {_count(summary.get('sum_window_counts'))} + late {_count(summary.get('late_events'))} + "
                     f"dead letters {_count(summary.get('dead_letters'))} + "
                     + (f"filtered {_count(summary['filtered_events'])} + " if summary.get("filtered_events") else "")
                     + f"pending {_count(summary.get('pending_events'))}")
    late = summary.get("late_events") or 0
    if late:
        watermark = summary.get("watermark") or "global"
        fix = "a larger --bound-ms keeps them" + ("" if watermark == "key" else ", or --watermark key")
        notes.append(f"{late:,} events were late (behind their {watermark} watermark with bound {_seconds(summary.get('bound_ms'))}): "
                     f"they are in topic {LATE_TOPIC}, not in the windows; {fix}")
    dead = summary.get("dead_letters") or 0
    if dead:
        reasons = summary.get("dead_letters_by_reason") or {}
        detail = ", ".join(f"{reason}: {n:,}" for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]))
        notes.append(f"{dead:,} input records were dead letters ({detail or 'reasons not recorded'}): "
                     f"they are in topic {DEAD_LETTER_TOPIC} with their reasons")
    return notes


def print_summary(summary: dict[str, Any], as_json: bool = False, out: TextIO | None = None, err: TextIO | None = None) -> None:
    """Print a run's summary: the table on `out` (default stdout; colours on a terminal, plain
    text `PLAIN_WIDTH` wide elsewhere), then each of `summary_notes` once on `err` (default
    stderr) as `warning: ...`. With `as_json`, the summary as indented JSON (sorted keys) on
    `out` instead of the table; the notes still go to `err`.
    """
    import json

    from rich.console import Console

    out = out or sys.stdout
    err = err or sys.stderr
    if as_json:
        out.write(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    elif out.isatty():
        width = min(Console(file=out).width, 120)
        Console(file=out, width=width, highlight=False, emoji=False).print(summary_table(summary))
    else:  # a file or a pipe: plain text, no trailing blanks
        out.write(render_summary(summary, width=PLAIN_WIDTH))
    out.flush()
    for note in summary_notes(summary):
        err.write(f"warning: {note}\n")
    err.flush()


class EventsBar:
    """A tqdm progress bar (stderr) of a job run's events accounted for (in windows, late, dead
    letters) against the events it has to read: call it with each progress record of the run.

    Args:
        label: the bar's description (e.g. `job <run_id>`).
        enabled: False makes every call a no-op (no bar).

    A record is a dict with `events_accounted` (events), `events_target` (the records a bounded
    run reads, between its start and end offsets; None for a run without end), `batch_id`, and,
    where given, `late_events` and `dead_letters`. The bar appears at `start` or at the first
    record, whichever comes first, so its clock runs from the query's start, not the JVM's.
    """

    def __init__(self, label: str, enabled: bool = True) -> None:
        self._label = label
        self._enabled = enabled
        self._bar = None

    def start(self, total: int | None = None) -> None:
        """Show the bar (at 0) with `total` events to account for (None: unknown)."""
        if self._bar is not None or not self._enabled:
            return
        from tqdm import tqdm

        self._bar = tqdm(total=total, desc=self._label, unit="ev", unit_scale=True, mininterval=0.5, dynamic_ncols=True,
                         file=sys.stderr)

    def __call__(self, record: dict[str, Any]) -> None:
        if not self._enabled:
            return
        target = record.get("events_target")
        self.start(target)
        bar = self._bar
        if target is not None and bar.total != target:
            bar.total = target
        bar.update(int(record.get("events_accounted") or 0) - bar.n)
        postfix = {"batch": record.get("batch_id")}
        for key, label in (("late_events", "late"), ("dead_letters", "dead")):
            if record.get(key) is not None:
                postfix[label] = record[key]
        bar.set_postfix(postfix, refresh=False)
        bar.refresh()

    def finish(self) -> None:
        """Mark the run drained: the bar's total becomes the events accounted for (the records
        between the offsets may include end-of-input markers of other runs, never counted)."""
        if self._bar is not None and self._bar.n:
            self._bar.total = self._bar.n
            self._bar.refresh()

    def close(self) -> None:
        """Leave the bar at its last state and stop drawing it (idempotent)."""
        if self._bar is not None:
            self._bar.close()

    def __enter__(self) -> "EventsBar":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def comparison_text(builtin: Mapping[str, Any]) -> str:
    """The demo's comparison with Spark's built-in as one line: windows equal or not, both
    figures (events/s) and the ratio with its basis, e.g. `equal windows (424,259); built-in
    82,828 events/s vs keyshift 83,100 events/s (keyshift 1.00x; both warm: ...)`.

    Args:
        builtin: the summary's `builtin` entry (`run_demo`): `comparison` (`compare_windows`),
            `events_per_second`, and `builtin_comparison`'s fields.
    """
    comparison = builtin.get("comparison") or {}
    if comparison.get("equal"):
        text = f"equal windows ({int(comparison.get('ours') or 0):,})"
    else:
        text = (f"DIFFERENT windows ({comparison.get('only_ours')} only ours, {comparison.get('only_builtin')} only built-in, "
                f"{comparison.get('field_mismatches')} with other values)")
    speed, ours, ratio = builtin.get("events_per_second"), builtin.get("keyshift_events_per_second"), builtin.get("throughput_ratio")
    text += f"; built-in {speed:,.0f} events/s" if speed is not None else "; built-in ? events/s"
    if ratio is not None and ours is not None:
        return text + f" vs keyshift {ours:,.0f} events/s (keyshift {ratio:.2f}x; {builtin.get('basis')})"
    return text + f" ({builtin.get('basis')})"
