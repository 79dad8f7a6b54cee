"""The report of `keyshift bench all`: every goal of every benchmark against its measured figure.

Each benchmark writes a JSON report of its own shape; one small pure function per benchmark
(`GOAL_EXTRACTORS`) turns it into `Goal` rows:

* placement (`keyshift.bench.placement.check_targets`): `targets`, each `{"target", "metric",
  "value", "bound", "met"}`;
* switch (`keyshift.bench.switch.summarize` and `build_report`): `goals`, a mapping name ->
  `{"value", "goal", "met"}`, plus `outputs_identical` (the oracle comparison, goal True) and
  `late_events_from_switches` (goal 0);
* keywindows (`keyshift.bench.key_windows.run_key_windows_bench`): no goal section; paper 003's
  bound "at most 2n updates for n events" (`updates_per_event` <= 2 in every row) and the
  incremental run equal to the batch computation (`incremental_equals_batch` in every row);
* watermark (`keyshift.bench.watermark.evaluate_targets`): `targets`, each `{"target", "value",
  "met"}` whose value is a mapping per disorder level;
* throughput (`keyshift.bench.throughput.summarize`): `goals`, each `{"goal", "target",
  "measured", "met"}`;
* drift (`keyshift.bench.drift.evaluate_targets`): `targets`, each `{"target", "value", "met"}`.

`met` is True, False or None (not measured). `render_report` writes one self-contained HTML page
(jinja2, autoescaped; the plots embedded as base64 PNG) from the `BenchOutcome` of each benchmark.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TEMPLATE = "report.html.j2"
"""The page's jinja2 template, beside this module."""

KEY_WINDOW_UPDATES_PER_EVENT_BOUND = 2.0
"""Paper 003: key windows emit at most 2 updates per event (one when it enters, one when it leaves)."""


@dataclass(frozen=True)
class Goal:
    """One goal of a benchmark and what the run measured.

    Attributes:
        benchmark: the bench's name (`placement`, `switch`, `keywindows`, `drift`, `watermark`, `throughput`).
        goal: the goal as the bench states it (e.g. "steady-state ratio >= 1.0").
        target: the bound or expected value, as JSON-like data (a number, True, a text).
        measured: the measured value, as JSON-like data (a number, a mapping per level, None).
        met: True when met, False when not, None when not measured.
    """

    benchmark: str
    goal: str
    target: Any
    measured: Any
    met: bool | None


@dataclass(frozen=True)
class BenchOutcome:
    """What one benchmark of a `bench all` run left: its report, or why there is none.

    Attributes:
        name: the bench's name.
        status: `ok` (the JSON report was written), `failed` (the bench exited non-zero or wrote
            no report) or `skipped` (not asked for).
        json_path: the JSON report, None when there is none.
        started_utc: when the bench started, ISO 8601 UTC (or the JSON file's mtime), None if unknown.
        seconds: wall-clock seconds the bench took, None if unknown.
        error: why it failed (the last lines of its log), None when it did not.
        log_path: the bench's output (stdout and stderr), None when not kept.
    """

    name: str
    status: str
    json_path: Path | None = None
    started_utc: str | None = None
    seconds: float | None = None
    error: str | None = None
    log_path: Path | None = None


def placement_goals(report: Mapping[str, Any]) -> list[Goal]:
    """Goals of a placement report: one per entry of `targets` (target = its `bound`)."""
    return [Goal("placement", t["target"], t["bound"], t["value"], t["met"]) for t in report.get("targets", [])]


def switch_goals(report: Mapping[str, Any]) -> list[Goal]:
    """Goals of a switch report: each entry of `goals` ("median_pause_in_driver_s" reads
    "median pause in driver (s) <= 3.0"; an entry with `at_least` reads ">="), then identical outputs and no late event from the switches."""
    goals = []
    for name, entry in report.get("goals", {}).items():
        text = name.removesuffix("_s").replace("_", " ") + (" (s)" if name.endswith("_s") else "")
        goals.append(Goal("switch", f"{text} {'>=' if entry.get('at_least') else '<='} {entry['goal']}", entry["goal"], entry["value"], entry["met"]))
    if "outputs_identical" in report:
        identical = report["outputs_identical"]
        goals.append(Goal("switch", "windows identical to the oracle run without switches", True, identical, identical is True))
    if "late_events_from_switches" in report:
        late = report["late_events_from_switches"]
        goals.append(Goal("switch", "no late event from the switches", 0, late, None if late is None else late == 0))
    return goals


def key_windows_goals(report: Mapping[str, Any]) -> list[Goal]:
    """Goals of a keywindows report, over all its rows: the worst `updates_per_event` <=
    `KEY_WINDOW_UPDATES_PER_EVENT_BOUND`, and `incremental_equals_batch` in every row."""
    rows = report.get("rows", [])
    if not rows:
        return [Goal("keywindows", "at most 2n updates for n events", KEY_WINDOW_UPDATES_PER_EVENT_BOUND, None, None)]
    worst = max(row["updates_per_event"] for row in rows)
    equal = all(row["incremental_equals_batch"] for row in rows)
    return [
        Goal("keywindows", "at most 2n updates for n events (worst updates per event)", KEY_WINDOW_UPDATES_PER_EVENT_BOUND, worst,
             worst <= KEY_WINDOW_UPDATES_PER_EVENT_BOUND),
        Goal("keywindows", "incremental run's updates equal the batch computation, every bound", True, equal, equal),
    ]


def watermark_goals(report: Mapping[str, Any]) -> list[Goal]:
    """Goals of a watermark report: one per entry of `targets` (its text carries the bound, so
    target is that text's condition); a partial report (a run cut short) has none measured."""
    if "targets" not in report:
        return [Goal("watermark", "the issue's watermark goals", None, None, None)]
    return [Goal("watermark", t["target"], t["target"], t["value"], t["met"]) for t in report["targets"]]


def drift_goals(report: Mapping[str, Any]) -> list[Goal]:
    """Goals of a drift report: one per entry of `targets` (`keyshift.bench.drift.evaluate_targets`;
    its text carries the condition, so target is that text); none when the report has no targets."""
    return [Goal("drift", t["target"], t["target"], t["value"], t["met"]) for t in report.get("targets", [])]


def throughput_goals(report: Mapping[str, Any]) -> list[Goal]:
    """Goals of a throughput report: one per entry of `goals`."""
    return [Goal("throughput", g["goal"], g["target"], g["measured"], g["met"]) for g in report.get("goals", [])]


GOAL_EXTRACTORS: dict[str, Callable[[Mapping[str, Any]], list[Goal]]] = {
    "placement": placement_goals,
    "switch": switch_goals,
    "keywindows": key_windows_goals,
    "drift": drift_goals,
    "watermark": watermark_goals,
    "throughput": throughput_goals,
}
"""Bench name -> the function that lists its goals; the order of `keyshift bench all`."""


def identify_bench(report: Mapping[str, Any]) -> str | None:
    """The bench that wrote a report, from the top-level fields only its writer sets, or None."""
    if "partitioner_throughput" in report:
        return "placement"
    if "switches" in report:
        return "switch"
    if "ratio_by_config" in report:
        return "throughput"
    if "window" in report and "counting" in report:
        return "keywindows"
    if "drift_bench" in report:
        return "drift"
    rows = report.get("rows")
    if "definitions" in report or (report.get("partial") and rows is not None):
        return "watermark"
    return None


def display(value: Any) -> str:
    """A measured or target value as table text: floats with up to 4 significant decimals,
    mappings and lists as compact JSON, None as `n/a`."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return "n/a" if math.isnan(value) else f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, (Mapping, list, tuple)):
        return json.dumps(value, separators=(", ", ": "), default=str)
    return str(value)


def verdict(met: bool | None) -> str:
    """`met`, `not met` or `not measured`."""
    return {True: "met", False: "not met", None: "not measured"}[met]


def embed_png(path: Path) -> str:
    """A `data:image/png;base64,...` URI of the PNG at `path` (for an `<img src>`).

    Raises:
        OSError: the file cannot be read.
    """
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def goals_of(outcome: BenchOutcome) -> list[Goal]:
    """The goals of an outcome's JSON report ([] when it has none or its bench is unknown).

    Raises:
        OSError, json.JSONDecodeError: the report cannot be read.
    """
    if outcome.json_path is None:
        return []
    extractor = GOAL_EXTRACTORS.get(outcome.name)
    return extractor(json.loads(outcome.json_path.read_text())) if extractor else []


def render_report(outcomes: Sequence[BenchOutcome], out: Path, *, title: str = "keyshift benchmarks") -> Path:
    """Write the HTML report of a `bench all` run to `out` and return `out`.

    The page holds a table of the benchmarks (status, start, seconds, JSON and log file, the error
    of a failed one), a table with one row per goal (benchmark, goal, target, measured, met, the
    JSON file and its run's start) and each bench's plot (`<json>.png` beside its report) embedded
    as base64, so it shows with no network and when moved. Links to files are relative to `out`'s
    folder. A report that cannot be read counts as its bench failing, with the reason.

    Raises:
        OSError: `out` cannot be written.
    """
    import jinja2

    def relative(path: Path | None) -> str | None:
        return None if path is None else _relative(path, out.parent)

    rows, benches, plots = [], [], []
    for outcome in outcomes:
        error = outcome.error
        try:
            goals = goals_of(outcome)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            goals, error = [], f"{outcome.error + '; ' if outcome.error else ''}its report could not be read: {exc!r}"
        status = "failed" if outcome.status == "ok" and error is not None else outcome.status
        benches.append({"name": outcome.name, "status": status,
                        "started": outcome.started_utc or "", "seconds": display(outcome.seconds) if outcome.seconds is not None else "",
                        "json": relative(outcome.json_path), "log": relative(outcome.log_path), "error": error})
        for goal in goals:
            rows.append({"benchmark": goal.benchmark, "goal": goal.goal, "target": display(goal.target),
                         "measured": display(goal.measured), "met": verdict(goal.met),
                         "json": relative(outcome.json_path), "started": outcome.started_utc or ""})
        plot = outcome.json_path.with_suffix(".png") if outcome.json_path is not None else None
        if plot is not None and plot.is_file():
            plots.append({"name": outcome.name, "src": embed_png(plot), "file": relative(plot)})
    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent), autoescape=True,
                                     undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    counts = {label: sum(1 for r in rows if r["met"] == label) for label in ("met", "not met", "not measured")}
    html = environment.get_template(TEMPLATE).render(title=title, benches=benches, goals=rows, plots=plots, counts=counts)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html, encoding="utf-8")
    return out


def _relative(path: Path, folder: Path) -> str:
    try:
        return path.resolve().relative_to(folder.resolve()).as_posix()
    except ValueError:
        return path.resolve().as_uri()
