"""`keyshift run demo`'s comparison with Spark's built-in aggregation compares like with like.

All of the demo's runs share one driver JVM: the first keyshift run pays its cold start, the
global-mode run (second) and the built-in (third) run warm. The printed comparison must name its
basis and put the built-in's events/s against the warm keyshift run's, not the first run's
(issue 33, point 5), and the windows-equal check must stay.

One small demo (10,000 real flights, a fresh 4-partition topic, global-mode and built-in runs on)
in a fresh interpreter, stdout and stderr captured apart; its summary.json holds the figures.
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

FLIGHTS = 10_000
PARTITIONS = 4
KEYSHIFT = str(Path(sys.executable).parent / "keyshift")


@pytest.fixture(scope="module")
def demo(stack_settings):
    """Run the demo once in a subprocess (built-in and global-mode runs on); yields its run id,
    run folder, the process (return code, stdout, stderr) and its summary.json."""
    from keyshift.topics import delete_topics

    settings = stack_settings
    token = uuid.uuid4().hex[:8]
    topic, run_id = f"it-demo-cmp-{token}", f"it-demo-cmp-{token}"
    proc = subprocess.run(
        [KEYSHIFT, "run", "demo", "--run-id", run_id, "--topic", topic, "--limit", str(FLIGHTS), "--partitions", str(PARTITIONS),
         "--max-offsets-per-trigger", "5000"],
        capture_output=True, text=True, timeout=1500,
    )
    run_dir = Path(settings.runs_dir) / run_id
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
    yield {"run_id": run_id, "run_dir": run_dir, "proc": proc, "summary": summary}
    delete_topics(settings, [topic])


def test_builtin_is_compared_with_the_warm_keyshift_run(demo):
    proc, summary, run_id = demo["proc"], demo["summary"], demo["run_id"]
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]  # exit 1 if the built-in's windows differ
    builtin, warm = summary["builtin"], summary["global_mode"]
    assert builtin["comparison"]["equal"], builtin["comparison"]  # the windows-equal check is kept
    assert builtin["events"] == FLIGHTS and summary["events_read"] == FLIGHTS == warm["events_read"]
    # the keyshift figure in the ratio is the warm (second) run's, not the first run's with its cold start
    assert builtin["keyshift_run_id"] == warm["run_id"] == f"{run_id}-global"
    assert builtin["keyshift_events_per_second"] == warm["events_per_second"]
    assert builtin["throughput_ratio"] == round(warm["events_per_second"] / builtin["events_per_second"], 3)
    assert builtin["basis"].startswith("both warm: same driver JVM"), builtin["basis"]
    assert warm["run_id"] in builtin["basis"]


def test_printed_comparison_names_its_basis(demo):
    proc, summary, run_id = demo["proc"], demo["summary"], demo["run_id"]
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    builtin = summary["builtin"]
    ratio, theirs, ours = builtin["throughput_ratio"], builtin["events_per_second"], summary["global_mode"]["events_per_second"]
    # the step line on the terminal: windows equal, both figures, the ratio and its basis together
    steps = [line for line in re.split(r"[\r\n]+", proc.stderr) if f"demo {run_id}: Spark built-in: " in line]
    assert len(steps) == 1, proc.stderr[-4000:]
    line = steps[0]
    assert f"Spark built-in: equal windows ({builtin['comparison']['ours']:,})" in line, line
    assert (f"built-in {theirs:,.0f} events/s vs keyshift {ours:,.0f} events/s "
            f"(keyshift {ratio:.2f}x; both warm: same driver JVM, after the demo's first run; keyshift: run {run_id}-global)") in line, line
    # the table's row (with its wrapped continuation lines) carries the same (warm) ratio and the windows check
    row = table_row(proc.stdout, "Spark built-in")
    assert "equal windows" in row and f"keyshift {ratio:.2f}x" in row, proc.stdout


def table_row(table: str, label: str) -> str:
    """The text of the summary table's row `label`, its wrapped lines joined by single spaces."""
    lines = table.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f" {label} "))
    text = [lines[start][len(label) + 1:].strip()]
    for line in lines[start + 1:]:
        if not line.startswith(" " * (len(label) + 2)) or not line.strip():
            break  # the next row starts in the label column
        text.append(line.strip())
    return " ".join(text)


def test_no_ratio_without_a_warm_keyshift_run():
    from keyshift.console import comparison_text
    from keyshift.demo import builtin_comparison

    alone = builtin_comparison(80_000.0, None)  # --no-compare-global: only the cold first run
    assert alone["throughput_ratio"] is None and alone["keyshift_events_per_second"] is None
    assert alone["basis"].startswith("no ratio")
    text = comparison_text({"events_per_second": 80_000.0, "comparison": {"equal": True, "ours": 12}, **alone})
    assert text.startswith("equal windows (12); built-in 80,000 events/s (no ratio: ") and "x;" not in text
    warm = builtin_comparison(80_000.0, {"run_id": "d-global", "events_per_second": 100_000.0})
    assert warm["throughput_ratio"] == 1.25 and warm["keyshift_run_id"] == "d-global"
    assert comparison_text({"events_per_second": 80_000.0, "comparison": {"equal": True, "ours": 12}, **warm}) == (
        "equal windows (12); built-in 80,000 events/s vs keyshift 100,000 events/s "
        "(keyshift 1.25x; both warm: same driver JVM, after the demo's first run; keyshift: run d-global)")
