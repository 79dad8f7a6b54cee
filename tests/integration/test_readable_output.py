"""`keyshift run demo` as a person runs it: a short table on the terminal, the noise in the run's log.

One small demo (20,000 real flights, a fresh 4-partition topic, no built-in or global-mode run) in
a fresh interpreter, its stdout and stderr captured apart. The terminal must show the summary
table and the steps, and none of Spark's or the Python workers' lines (log4j WARN lines, worker
start-up banners, the JVM's warnings); `runs/<run_id>/driver.log` must hold them, with keyshift's
own INFO lines; `runs/<run_id>/summary.json` must hold the whole summary.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

FLIGHTS = 20_000
PARTITIONS = 4
KEYSHIFT = str(Path(sys.executable).parent / "keyshift")
NOISE = (
    re.compile(r"\b(WARN|INFO)\b (?!keyshift)"),  # a log4j line: `26/11/23 09:30:09 WARN ResolveWriteToStream: ...`
    re.compile(r"Python worker"),  # "Starting Streaming TransformWithStateInPandas Python worker."
    re.compile(r"TransformWithStateInPySparkStateServer|DAGScheduler|ResolveWriteToStream|NativeCodeLoader"),
    re.compile(r"Using incubator modules|log4j|Setting default log level|sc\.setLogLevel"),
    re.compile(r"Traceback|Exception"),
)


@pytest.fixture(scope="module")
def demo(stack_settings):
    """Run the demo once in a subprocess; yields its run id, return code, stdout and stderr."""
    from keyshift.topics import delete_topics

    settings = stack_settings
    token = uuid.uuid4().hex[:8]
    topic, run_id = f"it-readable-{token}", f"it-readable-{token}"
    proc = subprocess.run(
        [KEYSHIFT, "run", "demo", "--run-id", run_id, "--topic", topic, "--limit", str(FLIGHTS), "--partitions", str(PARTITIONS),
         "--no-builtin", "--no-compare-global", "--max-offsets-per-trigger", "10000"],
        capture_output=True, text=True, timeout=900,
    )
    yield {"run_id": run_id, "run_dir": Path(settings.runs_dir) / run_id, "proc": proc}
    delete_topics(settings, [topic])


def terminal_lines(text: str) -> list[str]:
    """What a terminal shows: progress bars redraw with carriage returns, so split on those too."""
    return [line for line in re.split(r"[\r\n]+", text) if line.strip()]


def test_terminal_shows_the_table_and_steps_not_the_noise(demo):
    proc = demo["proc"]
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    out = proc.stdout.splitlines()
    assert out[0] == f"keyshift run {demo['run_id']}: reconciled", proc.stdout
    assert len(out) < 25, proc.stdout  # a short table, not a JSON dump
    for row in ("job", "events", "throughput", "balance degree", "windows", "late events", "dead letters", "reconciled",
                "quality", "vs pandas", "outputs"):
        assert any(re.match(rf" {row} {{2,}}\S", line) for line in out), (row, proc.stdout)
    assert any(line.startswith(" reconciled ") and f"yes: {FLIGHTS:,} read = " in line for line in out), proc.stdout
    assert any(line.startswith(" outputs ") and "driver.log" in line for line in out), proc.stdout

    shown = terminal_lines(proc.stdout) + terminal_lines(proc.stderr)
    noisy = [line for line in shown if any(pattern.search(line) for pattern in NOISE)]
    assert noisy == [], "\n".join(noisy[:20])
    err = terminal_lines(proc.stderr)
    assert any("query started" in line for line in err), proc.stderr[-3000:]  # a step
    assert any(line.startswith(f"job {demo['run_id']}: 100%") for line in err), proc.stderr[-3000:]  # the events bar, full
    assert any(line.startswith("replay ") for line in err), proc.stderr[-3000:]


def test_driver_log_holds_sparks_and_the_workers_lines(demo):
    log = demo["run_dir"] / "driver.log"
    assert log.is_file()
    text = log.read_text(errors="replace")
    assert re.search(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d WARN \w+: ", text, re.MULTILINE), text[:3000]  # Spark's log4j WARN lines
    assert "Python worker" in text  # the transformWithState driver worker's banner, copied by Spark to the JVM's stderr
    assert "INFO keyshift.processing.outputs.sinks: batch 0: processed" in text  # keyshift's own INFO lines
    assert f"run {demo['run_id']}: all {FLIGHTS} events accounted for" in text


def test_summary_json_holds_the_whole_summary(demo):
    summary = json.loads((demo["run_dir"] / "summary.json").read_text())
    assert summary["run_id"] == demo["run_id"]
    assert summary["events_read"] == FLIGHTS and summary["reconciled"] is True
    assert summary["quality"]["success"] and summary["reference"]["equal"]
    assert len(summary["per_slot_events"]) == PARTITIONS
