"""`keyshift bench all`'s report: goals from each bench's JSON, the HTML page, `--report-only`.

The result dicts are built with the benches' own summary functions (`check_targets`,
`summarize`, `evaluate_targets`) from rows of the shape each bench writes, so a change of a
bench's report shape shows here.
"""

from __future__ import annotations

import base64
import json
import re
import statistics
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner

from keyshift.bench import placement, report, suite, switch, throughput, watermark
from keyshift.bench.report import BenchOutcome, Goal

PNG = b"\x89PNG\r\n\x1a\n" + b"keyshift-test-plot"


# --- result dicts of the shape each bench writes -------------------------------------------------

def placement_report() -> dict:
    rows = [
        {"dataset": "flights", "key": "origin", "partitions": 8, "strategy": "least_count", "mode": "online",
         "balance_degree": 0.98, "max_over_mean": 1.01},
        {"dataset": "flights", "key": "origin", "partitions": 32, "strategy": "hot_split", "mode": "whole",
         "balance_degree": 0.97, "max_over_mean": 1.00},
        # hot_split online at P=32 missing: not measured
    ]
    return {"rows": rows, "partitioner_throughput_ratio": 0.8, "partitioner_throughput": {"ratio": 0.8, "method": "call path"},
            "targets": placement.check_targets(rows, 0.8), "config": {}, "plot": "placement.png"}


def switch_report(identical: bool = True) -> dict:
    switches = [
        {"pause_seconds": pause, "in_driver": True, "step_seconds": {"stopped": pause / 2, "migrated": pause / 4},
         "pause_unmeasured_seconds": pause / 4, "moved_share_over_min": 1.0}
        for pause in (12.0, 14.0, 16.0)
    ]
    return {"switches": switches, "outputs_identical": identical, "late_events_from_switches": 0,
            **switch.summarize(switches), "windows": {"identical": identical}, "counts": {}, "runs": {}, "plot": "switch.png"}


def throughput_report() -> dict:
    def row(job, partitions, strategy, whole, steady):
        return {"job": job, "partitions": partitions, "strategy": strategy, "events_per_second": whole,
                "steady_events_per_second": steady, "first_batch_seconds": 8.0, "driver_peak_rss_bytes": 2.0e9,
                "reconciled": True, "windows_equal_reference": True}

    rows = [row("plain", 8, "hash", 40_000.0, 50_000.0), row("keyshift", 8, "hash", 24_000.0, 30_000.0)]
    configs = (throughput.Config(8, "hash"),)
    return {"rows": rows, **throughput.summarize(rows, configs), "settings": {}}


def watermark_report() -> dict:
    rows = []
    for mode, late, p95, eps in (("key", 0, 8.0, 4_000.0), ("global", 30, 11.0, 5_000.0), ("dynamic", 0, 9.0, 4_100.0),
                                 ("global_lossless", 0, 20.0, 4_500.0)):
        for disorder in (0.0, 0.5):
            rows.append({"mode": mode, "disorder": disorder, "late_fraction": late * disorder / 1000, "late_events": int(late * disorder),
                         "events_per_second": eps, "latency_p95_s": p95, "bound_ms": 60_000, "backfill_late_events": 0})
    return {"rows": rows, "targets": watermark.evaluate_targets(rows), "settings": {}, "definitions": {}, "wall_seconds": 60.0}


def key_windows_report(updates_per_event: float = 1.45) -> dict:
    rows = [{"events": 1000, "updates": int(1000 * updates_per_event), "updates_per_event": updates_per_event,
             "bound_ms": bound, "incremental_equals_batch": True} for bound in (0, 3_600_000)]
    return {"rows": rows, "window": {"size_ms": 3_600_000, "slide_ms": 60_000}, "flights": 1000, "batch_rows": 250_000,
            "timings": {}, "counting": {}, "plot": "keywindows.png"}


# --- goal extraction ------------------------------------------------------------------------------

def test_placement_goals_are_its_targets_with_the_bound():
    goals = report.placement_goals(placement_report())
    assert [g.met for g in goals] == [True, True, None, False]
    assert goals[0] == Goal("placement", "flights/origin P=8 least_count online: balance degree >= 0.95", 0.95, 0.98, True)
    assert goals[3].goal == "partitioner throughput >= 0.9 x default" and goals[3].measured == 0.8


def test_switch_goals_name_the_bound_and_add_identity_and_late_events():
    goals = {g.goal: g for g in report.switch_goals(switch_report())}
    pause = goals["median pause in driver (s) <= 3.0"]
    assert (pause.target, pause.measured, pause.met) == (3.0, 14.0, False)
    assert goals["median pause driver restart (s) <= 10.0"].met is None  # no switch restarted its driver
    assert goals["worst moved share over min <= 1.2"].met is True
    assert (goals["worst pause over median <= 2.0"].measured, goals["worst pause over median <= 2.0"].met) == (round(16 / 14, 3), True)
    assert goals["lowest throughput after over before >= 0.9"].met is None  # no throughput in these switches
    assert goals["windows identical to the oracle run without switches"].met is True
    assert goals["no late event from the switches"].met is True
    differing = {g.goal: g for g in report.switch_goals(switch_report(identical=False))}
    assert differing["windows identical to the oracle run without switches"].met is False


def test_switch_goals_on_a_cluster_and_the_throughput_ratio():
    switches = [{"pause_seconds": pause, "in_driver": True, "step_seconds": {}, "pause_unmeasured_seconds": 0.0, "moved_share_over_min": 1.0,
                 "throughput_window": {"after_over_before": round(after / 3000, 3), "window_seconds": window}}
                for pause, after, window in ((4.0, 3300.0, 60.0), (4.5, 2600.0, 60.0), (9.5, 3000.0, 60.0), (4.2, 1500.0, 12.0))]
    local, cluster = switch.summarize(switches)["goals"], switch.summarize(switches, cluster=True)["goals"]
    assert (local["median_pause_in_driver_s"]["goal"], local["median_pause_in_driver_s"]["met"]) == (3.0, False)
    assert (cluster["median_pause_in_driver_s"]["goal"], cluster["median_pause_in_driver_s"]["met"]) == (5.0, True)
    assert (cluster["worst_pause_over_median"]["value"], cluster["worst_pause_over_median"]["met"]) == (round(9.5 / statistics.median([4.0, 4.5, 9.5, 4.2]), 3), False)
    lowest = cluster["lowest_throughput_after_over_before"]
    assert (lowest["value"], lowest["met"]) == (round(2600 / 3000, 3), False)  # the lowest ratio over a whole minute
    goals = {g.goal: g for g in report.switch_goals({"goals": cluster})}
    assert goals["lowest throughput after over before >= 0.9"].measured == round(2600 / 3000, 3)
    assert goals["median pause in driver (s) <= 5.0"].met is True


def test_throughput_goals_are_its_goals():
    goals = report.throughput_goals(throughput_report())
    assert len(goals) == 6
    first = goals[0]
    assert first.goal == "whole-run ratio >= 1.0 (floor 0.9) at P=8" and first.target == 1.0
    assert first.measured == pytest.approx(0.6) and first.met is False
    assert goals[3].met is None  # P=32 not run: not measured


def test_watermark_goals_carry_the_values_per_level():
    goals = report.watermark_goals(watermark_report())
    assert [g.goal for g in goals] == [t["target"] for t in watermark_report()["targets"]]
    late = goals[0]
    assert late.measured == {"0": 0.0, "0.5": 0.0} and late.met is True
    assert report.watermark_goals({"rows": [], "partial": True})[0].met is None


def test_key_window_goals_follow_paper_003s_bound():
    met, equal = report.key_windows_goals(key_windows_report())
    assert (met.target, met.measured, met.met) == (2.0, 1.45, True)
    assert equal.met is True
    assert report.key_windows_goals(key_windows_report(2.5))[0].met is False
    assert report.key_windows_goals({"rows": []})[0].met is None


@pytest.mark.parametrize(("build", "name"), [
    (placement_report, "placement"), (switch_report, "switch"), (throughput_report, "throughput"),
    (watermark_report, "watermark"), (key_windows_report, "keywindows"),
])
def test_each_report_shape_is_recognized(build, name):
    assert report.identify_bench(build()) == name


def test_an_unknown_shape_is_not_a_bench():
    assert report.identify_bench({"benches": []}) is None


@pytest.mark.parametrize(("value", "text"), [
    (None, "n/a"), (True, "yes"), (0.123456, "0.1235"), (28_300.0, "28,300"), (3_000_000, "3,000,000"),
    ({"0": 0, "0.5": 0.25}, '{"0": 0, "0.5": 0.25}'), ("hash", "hash"),
])
def test_values_display_compactly(value, text):
    assert report.display(value) == text


# --- the HTML page --------------------------------------------------------------------------------

class _Page(HTMLParser):
    """The goal rows (cell texts), the bench rows and the image sources of a report page."""

    def __init__(self) -> None:
        super().__init__()
        self.goal_rows: list[list[str]] = []
        self.bench_rows: dict[str, list[str]] = {}
        self.images: list[str] = []
        self._row: list[str] | None = None
        self._bench: str | None = None
        self._cell = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "tr" and ("goal" in (attrs.get("class") or "").split() or "data-bench" in attrs):
            self._row, self._bench = [], attrs.get("data-bench")
        elif tag == "td" and self._row is not None:
            self._row.append("")
            self._cell = True
        elif tag == "img":
            self.images.append(attrs["src"])

    def handle_endtag(self, tag):
        if tag == "td":
            self._cell = False
        elif tag == "tr" and self._row is not None:
            if self._bench is None:
                self.goal_rows.append([cell.strip() for cell in self._row])
            else:
                self.bench_rows[self._bench] = [cell.strip() for cell in self._row]
            self._row = None

    def handle_data(self, data):
        if self._cell and self._row is not None:
            self._row[-1] += data


def _write(folder: Path, name: str, content: dict, plot: bool = True) -> Path:
    path = folder / f"{name}.json"
    path.write_text(json.dumps(content))
    if plot:
        path.with_suffix(".png").write_bytes(PNG)
    return path


def test_the_page_has_a_row_per_goal_the_plots_embedded_and_a_failed_benchs_error(tmp_path):
    outcomes = [
        BenchOutcome("placement", "ok", _write(tmp_path, "placement", placement_report()), "2026-11-23T10:00:00Z", 31.0),
        BenchOutcome("keywindows", "ok", _write(tmp_path, "keywindows", key_windows_report()), "2026-11-23T10:01:00Z", 95.0),
        BenchOutcome("throughput", "failed", None, "2026-11-23T10:03:00Z", 12.0,
                     "exit status 1\nerror: Kafka is not reachable at 127.0.0.1:9092; start it with `keyshift stack up`",
                     tmp_path / "throughput.log"),
        BenchOutcome("switch", "skipped"),
    ]
    page_path = report.render_report(outcomes, tmp_path / "report.html")
    html = page_path.read_text()
    page = _Page()
    page.feed(html)

    assert len(page.goal_rows) == 4 + 2  # placement's 4 targets, keywindows' 2 goals
    first = page.goal_rows[0]
    assert first == ["placement", "flights/origin P=8 least_count online: balance degree >= 0.95", "0.95", "0.98", "met",
                     "placement.json", "2026-11-23T10:00:00Z"]
    assert [row[4] for row in page.goal_rows].count("not measured") == 1
    assert page.images == ["data:image/png;base64," + base64.b64encode(PNG).decode()] * 2
    assert "Kafka is not reachable at 127.0.0.1:9092" in page.bench_rows["throughput"][6]
    assert page.bench_rows["throughput"][1] == "failed" and page.bench_rows["switch"][1] == "skipped"
    assert not re.search(r"""(src|href)=["']https?://""", html)  # nothing fetched at view time


def test_text_from_a_report_is_escaped(tmp_path):
    outcome = BenchOutcome("watermark", "failed", None, None, None, "error: <script>alert(1)</script>")
    html = report.render_report([outcome], tmp_path / "report.html").read_text()
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_an_unreadable_report_counts_as_a_failure(tmp_path):
    broken = tmp_path / "switch.json"
    broken.write_text("{not json")
    page = _Page()
    page.feed(report.render_report([BenchOutcome("switch", "ok", broken)], tmp_path / "report.html").read_text())
    assert page.bench_rows["switch"][1] == "failed" and "could not be read" in page.bench_rows["switch"][6]


# --- the suite's bookkeeping and --report-only ----------------------------------------------------

def test_select_keeps_suite_order_and_refuses_unknown_names():
    assert [p.name for p in suite.select()] == list(suite.BENCH_NAMES)
    assert [p.name for p in suite.select(only=("watermark", "placement"))] == ["placement", "watermark"]
    assert [p.name for p in suite.select(skip=("switch",))] == [n for n in suite.BENCH_NAMES if n != "switch"]
    with pytest.raises(ValueError, match="unknown bench nope"):
        suite.select(skip=("nope",))


def test_a_failing_bench_is_recorded_and_the_next_one_runs(tmp_path):
    # a stand-in interpreter: fails for `placement`, writes a report for the others
    fake = tmp_path / "fake-python"
    fake.write_text("#!/bin/sh\n"
                    "if [ \"$4\" = placement ]; then echo 'error: the flights are not cached' >&2; exit 1; fi\n"
                    "echo '{\"rows\": [], \"window\": {}, \"counting\": {}}' > \"$6\"\n")
    fake.chmod(0o755)
    lines: list[str] = []
    out = tmp_path / "run"
    outcomes = suite.run_suite(suite.select(only=("placement", "keywindows")), out, timeout_s=60, say=lines.append, python=str(fake))
    by_name = {o.name: o for o in outcomes}
    assert by_name["placement"].status == "failed" and "the flights are not cached" in by_name["placement"].error
    assert by_name["keywindows"].status == "ok" and by_name["keywindows"].json_path == out / "keywindows.json"
    assert by_name["switch"].status == "skipped"
    assert lines[0].startswith("[1/2] placement:") and any(line.startswith("keywindows: ok in") for line in lines)
    assert suite.outcomes_from_folder(out) == outcomes  # the manifest keeps every outcome, skipped ones too


def test_report_only_rebuilds_the_page_from_the_json_in_a_folder(tmp_path):
    _write(tmp_path, "placement-run", placement_report())
    _write(tmp_path, "tp", throughput_report(), plot=False)
    (tmp_path / "notes.json").write_text('{"hello": 1}')
    from keyshift.cli.bench import command

    result = CliRunner().invoke(command, ["all", "--report-only", str(tmp_path)])
    assert result.exit_code == 0, result.output
    page = _Page()
    page.feed((tmp_path / "report.html").read_text())
    assert {row[0] for row in page.goal_rows} == {"placement", "throughput"}
    assert len(page.goal_rows) == 4 + 6
    assert len(page.images) == 1
    assert "report -> " in result.output


def test_report_only_with_a_manifest_shows_the_failure(tmp_path):
    _write(tmp_path, "placement", placement_report())
    suite.write_manifest(tmp_path, [
        BenchOutcome("placement", "ok", tmp_path / "placement.json", "2026-11-23T10:00:00Z", 30.0, None, tmp_path / "placement.log"),
        BenchOutcome("switch", "failed", None, "2026-11-23T10:01:00Z", 5.0, "exit status 1\nerror: Redis is down", tmp_path / "switch.log"),
    ])
    from keyshift.cli.bench import command

    result = CliRunner().invoke(command, ["all", "--report-only", str(tmp_path)])
    assert result.exit_code == 0, result.output
    page = _Page()
    page.feed((tmp_path / "report.html").read_text())
    assert page.bench_rows["switch"][1] == "failed" and "Redis is down" in page.bench_rows["switch"][6]
    assert page.bench_rows["placement"][2] == "2026-11-23T10:00:00Z"
