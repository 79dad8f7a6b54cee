"""`keyshift bench all`: every benchmark of the project in turn, at sizes that fit a 2-core machine.

Each bench runs as `python -m keyshift.cli bench <name> --out DIR/<name>.json ...` in a process of
its own (a Spark session, a JVM or a crash stays in it), its output going to `DIR/<name>.log`. A
bench that fails (non-zero exit, no report, or past its time limit) is recorded with the last
lines of its log and the next one runs. After each bench `DIR/bench-all.json` (`MANIFEST`) says
what ran, when, for how long and how it ended; `keyshift.bench.report.render_report` turns that
and the reports into `DIR/report.html`.

The sizes (`SUITE`) are chosen so the whole set takes about half an hour on 2 cores, estimated
from the run times the README gives for the benches' defaults; each bench's full-size run is its
own command (`keyshift bench <name> --help`).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from keyshift.bench.report import BenchOutcome, identify_bench

log = logging.getLogger("keyshift.bench.suite")

MANIFEST = "bench-all.json"
"""The file in the output folder that records each bench's outcome."""

UTC_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
"""How start times are written: ISO 8601 UTC to the second."""

ERROR_LINES = 15
"""Lines of a failed bench's log kept as its error."""


@dataclass(frozen=True)
class BenchPlan:
    """One bench of the suite and the options it runs with.

    Attributes:
        name: the `keyshift bench` subcommand.
        options: options after `--out DIR/<name>.json`.
        size: what the options choose, for people (progress lines, README).
        estimate_s: expected wall-clock seconds on 2 cores (an estimate, shown with the progress).
    """

    name: str
    options: tuple[str, ...]
    size: str
    estimate_s: float


SUITE: tuple[BenchPlan, ...] = (
    BenchPlan("placement", ("--no-progress",),
              "every strategy, flights and 3,000,000 synthetic events, P = 4, 8, 16, 32 (the default)", 60),
    BenchPlan("keywindows", ("--flights", "1000000", "--no-progress"),
              "first 1,000,000 flights, 1 h windows every 1 min, bounds 0, 10 min, 1 h, 1 day", 180),
    BenchPlan("throughput", ("--flights", "300000", "--runs", "1", "--max-offsets-per-trigger", "50000", "--no-progress"),
              "300,000 flights in 50,000-record batches, one run of each job at P=8 hash and P=32 hot_split, "
              "then one cold-start run of each (30,000 flights in 10,000-record batches)", 360),
    BenchPlan("switch", ("--flights", "60000", "--no-progress"),
              "60,000 flights fed at 3,000 events/s, the default five switches", 420),
    BenchPlan("drift", ("--every", "10", "--per-trigger", "25000", "--no-progress"),
              "one flight in 10 of the six months (300,000) whose busy and quiet origins swap half-way, 25,000-record "
              "batches: the plain Spark job, global, partition, key and dynamic mode, partition and key mode with a "
              "one-hour drift bound, key and partition mode undrifted, key mode three times on each topic (375 s measured "
              "before the three runs with and for the bound; about 55 s each for those measured alone)", 560),
    BenchPlan("watermark", ("--flights", "30000", "--disorder", "0", "--disorder", "0.5", "--no-progress"),
              "30,000 flights, disorder 0 and 0.5, every mode, paced at 5,000 events/s", 900),
)
"""The benches of `keyshift bench all`, in the order they run (quick ones first)."""

BENCH_NAMES: tuple[str, ...] = tuple(plan.name for plan in SUITE)


def select(only: Sequence[str] = (), skip: Sequence[str] = ()) -> list[BenchPlan]:
    """The plans of `SUITE` named in `only` (all when empty) and not in `skip`, in suite order.

    Raises:
        ValueError: a name that is not a bench of `SUITE`.
    """
    unknown = sorted((set(only) | set(skip)) - set(BENCH_NAMES))
    if unknown:
        raise ValueError(f"unknown bench {', '.join(unknown)}; the benches are {', '.join(BENCH_NAMES)}")
    return [plan for plan in SUITE if (not only or plan.name in only) and plan.name not in skip]


def utc_now() -> str:
    """The current time, ISO 8601 UTC to the second (`2026-11-23T10:04:05Z`)."""
    return datetime.now(timezone.utc).strftime(UTC_FORMAT)


def log_tail(path: Path, lines: int = ERROR_LINES) -> str:
    """The last `lines` non-blank lines of a text file ("" when it is missing)."""
    if not path.is_file():
        return ""
    kept = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return "\n".join(kept[-lines:])


def run_bench(plan: BenchPlan, out_dir: Path, *, timeout_s: float, say: Callable[[str], None],
              python: str = sys.executable, poll_s: float = 60.0) -> BenchOutcome:
    """Run one bench in a child process; its report goes to `out_dir/<name>.json`.

    Args:
        plan: the bench and its options.
        out_dir: the suite's folder (exists).
        timeout_s: seconds after which the child is killed and the bench counts as failed.
        say: called with a progress line at the start, every `poll_s` seconds, and at the end.
        python: the interpreter that runs `-m keyshift.cli`.
        poll_s: seconds between the "still running" lines.

    Returns:
        The outcome: `ok` when the child exited 0 and wrote its report, else `failed` with the
        exit status or the time limit and the last lines of `out_dir/<name>.log`.
    """
    report = out_dir / f"{plan.name}.json"
    log_path = out_dir / f"{plan.name}.log"
    report.unlink(missing_ok=True)  # a report left from an earlier run must not pass for this one's
    argv = [python, "-m", "keyshift.cli", "bench", plan.name, "--out", str(report), *plan.options]
    started_utc, started = utc_now(), time.monotonic()
    log.info("bench %s: %s", plan.name, " ".join(argv))
    with log_path.open("w") as output:
        child = subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        reason = None
        while True:
            try:
                code = child.wait(timeout=poll_s)
                break
            except subprocess.TimeoutExpired:
                elapsed = time.monotonic() - started
                if elapsed >= timeout_s:
                    child.kill()
                    child.wait()
                    code, reason = None, f"stopped after {timeout_s:.0f} s (the time limit)"
                    break
                say(f"{plan.name}: running, {elapsed / 60:.0f} min (about {plan.estimate_s / 60:.0f} min expected)")
    seconds = round(time.monotonic() - started, 1)
    if code is not None and code != 0:
        reason = f"exit status {code}"
    elif code == 0 and not report.is_file():
        reason = "exited 0 but wrote no report"
    error = None if reason is None else f"{reason}\n{log_tail(log_path)}".strip()
    outcome = BenchOutcome(plan.name, "ok" if error is None else "failed", report if report.is_file() else None,
                           started_utc, seconds, error, log_path)
    say(f"{plan.name}: {outcome.status} in {seconds:.0f} s" + ("" if error is None else f" ({reason}; see {log_path})"))
    return outcome


def run_suite(plans: Sequence[BenchPlan], out_dir: Path, *, timeout_s: float, say: Callable[[str], None],
              python: str = sys.executable) -> list[BenchOutcome]:
    """Run `plans` one after another into `out_dir`, keeping on after a failure.

    Benches of `SUITE` not in `plans` are recorded as `skipped`. The manifest is rewritten after
    each bench, so a suite cut short still leaves what it measured.

    Returns:
        One outcome per bench of `SUITE`, in suite order.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    chosen = {plan.name for plan in plans}
    outcomes = {name: BenchOutcome(name, "skipped") for name in BENCH_NAMES if name not in chosen}
    started = time.monotonic()
    for index, plan in enumerate(plans, start=1):
        say(f"[{index}/{len(plans)}] {plan.name}: {plan.size} (elapsed {(time.monotonic() - started) / 60:.0f} min)")
        outcomes[plan.name] = run_bench(plan, out_dir, timeout_s=timeout_s, say=say, python=python)
        write_manifest(out_dir, [outcomes[name] for name in BENCH_NAMES if name in outcomes])
    return [outcomes[name] for name in BENCH_NAMES]


def write_manifest(out_dir: Path, outcomes: Sequence[BenchOutcome]) -> Path:
    """Write `out_dir/MANIFEST`: the outcomes, file paths relative to `out_dir`. Returns its path."""
    def relative(path: Path | None) -> str | None:
        return None if path is None else path.name

    entries = [{"name": o.name, "status": o.status, "json": relative(o.json_path), "log": relative(o.log_path),
                "started_utc": o.started_utc, "seconds": o.seconds, "error": o.error} for o in outcomes]
    path = out_dir / MANIFEST
    path.write_text(json.dumps({"benches": entries}, indent=1) + "\n")
    return path


def outcomes_from_folder(folder: Path) -> list[BenchOutcome]:
    """The outcomes of the reports in `folder`, for a report rebuilt without running anything.

    With `folder/MANIFEST` (left by `run_suite`): its outcomes. Without it: one `ok` outcome per
    JSON file whose bench `identify_bench` recognizes, started at the file's modification time,
    in suite order (files of other shapes are ignored).

    Raises:
        OSError, json.JSONDecodeError: the manifest cannot be read.
    """
    manifest = folder / MANIFEST
    if manifest.is_file():
        entries = json.loads(manifest.read_text())["benches"]
        return [BenchOutcome(e["name"], e["status"], folder / e["json"] if e["json"] else None, e["started_utc"], e["seconds"],
                             e["error"], folder / e["log"] if e["log"] else None) for e in entries]
    found = []
    for path in sorted(folder.glob("*.json")):
        try:
            name = identify_bench(json.loads(path.read_text()))
        except (OSError, ValueError, AttributeError) as exc:
            log.warning("%s is not a bench report: %s", path, exc)
            continue
        if name is None:
            log.info("%s: not a report of a known bench, left out", path)
            continue
        mtime = datetime.fromtimestamp(path.stat().st_mtime, timezone.utc).strftime(UTC_FORMAT)
        found.append(BenchOutcome(name, "ok", path, mtime))
    order = {name: index for index, name in enumerate(BENCH_NAMES)}
    return sorted(found, key=lambda o: order[o.name])
