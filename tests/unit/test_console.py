"""The readable output of a run: the summary table (a pure function of the summary), the notes
shown once, `--json`, the terminal's log filter, the events bar and the driver log's handler.

The CLI cases run `keyshift job run` and `keyshift run demo` in-process (click's runner) with the
run itself replaced by a function returning a fixed summary: what is tested is the printing.
"""

from __future__ import annotations

import io
import json
import logging
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from keyshift import runlog
from keyshift.console import (
    STEP,
    EventsBar,
    TerminalFilter,
    TerminalFormatter,
    print_summary,
    render_summary,
    summary_notes,
    summary_rows,
)

RUN_DIR = Path("/data/runs/fd-1")


def job_summary(**changes) -> dict:
    """A bounded flight_delays run's summary, as `build_summary` makes it (fields the table reads)."""
    summary = {
        "run_id": "fd-1", "job": "flight_delays", "strategy": "hash", "partitions": 4, "epoch": 0, "topic": "flights",
        "watermark": "key", "bound_ms": 60_000, "events_produced": 20_000, "records_read": 20_000, "events_read": 20_000,
        "batches": 4, "events_per_second": 2345.6, "wall_seconds": 8.53, "per_slot_events": [4000, 6000, 5000, 5000],
        "balance_degree": 4000 / 6000, "windows_emitted": 3049, "alerts": 143, "merged_window_pieces": 0,
        "late_events": 0, "dead_letters": 0, "dead_letters_by_reason": {}, "sum_window_counts": 20_000,
        "pending_events": 0, "reconciled": True, "switches": [], "windows_path": str(RUN_DIR / "windows"),
    }
    summary.update(changes)
    return summary


def demo_summary(**changes) -> dict:
    """The demo's summary: a job summary with the checks the demo adds."""
    checks = dict(
        quality={"success": True, "evaluated": 20, "failed": [], "rows": 3049, "data_docs": str(RUN_DIR / "data_docs" / "index.html")},
        reference={"equal": True, "windows": 3049, "reference_windows": 3049, "only_ours": 0, "only_reference": 0,
                   "field_mismatches": 0},
        global_mode={"run_id": "fd-1-global", "late_events": 1234, "events_read": 20_000, "reconciled": True},
        builtin={"events_per_second": 1172.8, "throughput_ratio": 2.0, "keyshift_events_per_second": 2345.6,
                 "basis": "both warm: same driver JVM, after the demo's first run; keyshift: run fd-1-global",
                 "comparison": {"equal": True, "ours": 3049, "only_ours": 0, "only_builtin": 0, "field_mismatches": 0}},
    )
    return job_summary(**{**checks, **changes})


def rows(summary: dict) -> dict[str, str]:
    return dict(summary_rows(summary, cwd=Path("/data")))


def test_job_summary_rows_say_what_a_run_measured():
    table = rows(job_summary())
    assert list(table) == ["job", "events", "throughput", "balance degree", "windows", "late events", "dead letters",
                           "reconciled", "outputs"]
    assert table["job"] == "flight_delays, strategy hash, P = 4, epoch 0, key watermark, bound 1 min"
    assert table["events"] == "20,000 read of 20,000 replayed from flights, 4 micro-batches"
    assert table["throughput"] == "2,346 events/s (8.5 s)"
    assert table["balance degree"] == "0.67 (min/max events per slot: 4,000 / 6,000, 4 slots)"
    assert table["windows"] == "3,049 windows, 143 alerts"
    assert table["late events"] == "0" and table["dead letters"] == "0"
    assert table["reconciled"] == "yes: 20,000 read = 20,000 in windows + 0 late + 0 dead letters + 0 pending"
    assert table["outputs"] == "runs/fd-1/: summary.json, driver.log, windows/"


def test_demo_summary_rows_add_the_checks():
    table = rows(demo_summary())
    assert table["quality"] == "passed: 20 expectations on 3,049 rows"
    assert table["vs pandas"] == "equal: 3,049 windows"
    assert table["global mode"] == "1,234 late events with the same bound (against 0 with key watermarks; run fd-1-global)"
    assert table["Spark built-in"] == ("equal windows (3,049); built-in 1,173 events/s vs keyshift 2,346 events/s (keyshift 2.00x; "
                                       "both warm: same driver JVM, after the demo's first run; keyshift: run fd-1-global)")
    assert table["outputs"] == "runs/fd-1/: summary.json, driver.log, windows/, data_docs/index.html"


def test_rows_show_what_went_wrong():
    summary = demo_summary(
        late_events=12, dead_letters=3, dead_letters_by_reason={"empty value": 1, "malformed JSON": 2}, reconciled=False,
        sum_window_counts=19_980, quality={"success": False, "evaluated": 20, "rows": 10, "failed": [{"type": "expect_x"}]},
        reference={"equal": False, "only_ours": 1, "only_reference": 2, "field_mismatches": 3},
    )
    table = rows(summary)
    assert table["late events"] == "12 (in flights-late, not in the windows)"
    assert table["dead letters"] == "3 (malformed JSON: 2, empty value: 1)"
    assert table["reconciled"].startswith("NO: 20,000 read = 19,980 in windows + 12 late + 3 dead letters")
    assert table["quality"] == "FAILED: 1 of 20 expectations (expect_x)"
    assert table["vs pandas"] == "DIFFERENT: 1 only ours, 2 only pandas', 3 with other values"


def test_key_window_run_rows():
    summary = job_summary(job="flight_delays_sliding", key_window_updates=30_173, native_window_rows=183_216,
                          key_windows_path=str(RUN_DIR / "key_windows"), windows_path=str(RUN_DIR / "key_windows"))
    table = rows(summary)
    assert "windows" not in table
    assert table["key windows"] == "30,173 updates for 183,216 rows of Spark's sliding windows"
    assert "retired from key windows" in table["reconciled"]
    assert table["outputs"] == "runs/fd-1/: summary.json, driver.log, key_windows/"


def test_missing_fields_show_as_question_marks():
    table = rows({"run_id": "x", "reconciled": True})
    assert table["events"].startswith("? read") and table["throughput"] == "?" and table["balance degree"] == "?"
    assert "outputs" not in table


def test_render_summary_is_plain_text_of_the_width():
    text = render_summary(demo_summary(), width=80, cwd=Path("/data"))
    assert text == render_summary(demo_summary(), width=80, cwd=Path("/data"))  # pure
    lines = text.splitlines()
    assert lines[0] == "keyshift run fd-1: reconciled"
    assert all(len(line) <= 80 and line == line.rstrip() for line in lines)
    assert "\x1b" not in text  # no colour or cursor codes
    for label in ("events", "throughput", "balance degree", "late events", "dead letters", "reconciled", "quality", "outputs"):
        assert re.search(rf"^ {label} +\S", text, re.MULTILINE), label
    wide = render_summary(demo_summary(), width=160, cwd=Path("/data"))
    assert len(wide.splitlines()) < len(lines)  # narrower tables wrap the long rows
    assert "does NOT reconcile" in render_summary(job_summary(reconciled=False)).splitlines()[0]


def test_notes_are_the_warnings_that_matter():
    assert summary_notes(job_summary()) == []
    notes = summary_notes(job_summary(late_events=12, dead_letters=3, dead_letters_by_reason={"malformed JSON": 3},
                                      reconciled=False, watermark="global"))
    assert len(notes) == 3
    assert notes[0].startswith("run fd-1 does not reconcile: events read 20,000 != windows 20,000 + late 12")
    assert "12 events were late (behind their global watermark with bound 1 min)" in notes[1]
    assert "--watermark key" in notes[1]
    assert notes[2].startswith("3 input records were dead letters (malformed JSON: 3)") and "flights-dead-letter" in notes[2]


def test_print_summary_table_or_json_and_notes_once():
    out, err = io.StringIO(), io.StringIO()
    summary = job_summary(late_events=5)
    print_summary(summary, out=out, err=err)
    assert out.getvalue().startswith("keyshift run fd-1: reconciled\n")
    assert err.getvalue().count("warning: ") == 1 and "5 events were late" in err.getvalue()
    out, err = io.StringIO(), io.StringIO()
    print_summary(summary, as_json=True, out=out, err=err)
    assert json.loads(out.getvalue()) == summary
    assert err.getvalue().count("warning: ") == 1


@pytest.fixture
def fake_job_run(monkeypatch):
    """`keyshift job run` with the run replaced: returns the summary, records the call's options."""
    import keyshift.cli.job as job

    calls = []

    def run(**options):
        calls.append(options)
        return job_summary()

    monkeypatch.setattr(job, "run_from_options", run)
    return calls


def invoke(args: list[str]):
    from keyshift.cli import _register, cli

    _register()
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def test_job_run_prints_the_table(fake_job_run):
    result = invoke(["job", "run", "flight_delays", "--limit", "10"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("keyshift run fd-1: reconciled")
    assert "reconciled       yes: 20,000 read" in result.stdout
    assert fake_job_run[0]["driver_log"] is True and fake_job_run[0]["progress"] is True


def test_job_run_json_prints_the_summary_as_json(fake_job_run):
    result = invoke(["job", "run", "flight_delays", "--limit", "10", "--json", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == job_summary()
    assert fake_job_run[0]["progress"] is False


@pytest.fixture
def fake_demo(monkeypatch):
    """`keyshift run demo` with the stack check, the data check and the demo replaced."""
    import keyshift.data.flights
    import keyshift.demo
    import keyshift.stack

    calls = []

    def run_demo(settings, run_id, **options):
        calls.append(options)
        return demo_summary()

    monkeypatch.setattr(keyshift.stack, "require", lambda *args, **kwargs: None)
    monkeypatch.setattr(keyshift.data.flights, "flights_path", lambda settings: Path("flights.parquet"))
    monkeypatch.setattr(keyshift.demo, "run_demo", run_demo)
    return calls


def test_run_demo_prints_the_table_or_json(fake_demo):
    result = invoke(["run", "demo", "--limit", "10"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("keyshift run fd-1: reconciled") and " Spark built-in " in result.stdout
    assert fake_demo[0]["driver_log"] is True
    result = invoke(["run", "demo", "--limit", "10", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == demo_summary()


def record(level: int, step: bool = False, name: str = "keyshift.x") -> logging.LogRecord:
    made = logging.LogRecord(name, level, __file__, 1, "message %d", (7,), None)
    if step:
        made.__dict__.update(STEP)
    return made


def test_terminal_shows_steps_and_warnings_only():
    keep = TerminalFilter()
    assert keep.filter(record(logging.INFO, step=True))
    assert keep.filter(record(logging.WARNING)) and keep.filter(record(logging.ERROR))
    assert not keep.filter(record(logging.INFO)) and not keep.filter(record(logging.DEBUG))
    assert not keep.filter(record(logging.WARNING, name="py.warnings"))
    shown = TerminalFormatter()
    assert re.fullmatch(r"\d\d:\d\d:\d\d message 7", shown.format(record(logging.INFO, step=True)))
    assert re.fullmatch(r"\d\d:\d\d:\d\d WARNING keyshift\.x: message 7", shown.format(record(logging.WARNING)))


def test_events_bar_follows_the_records(monkeypatch):
    monkeypatch.setattr("sys.stderr", io.StringIO())
    bar = EventsBar("job fd-1")
    bar({"events_accounted": 0, "events_target": 20_008, "batch_id": 0})
    bar({"events_accounted": 12_000, "events_target": 20_008, "batch_id": 1, "late_events": 0, "dead_letters": 2})
    assert (bar._bar.n, bar._bar.total) == (12_000, 20_008)
    bar({"events_accounted": 20_000, "events_target": 20_008, "batch_id": 2})
    bar.finish()  # drained: 8 of the records were another run's end-of-input markers
    assert (bar._bar.n, bar._bar.total) == (20_000, 20_000)
    bar.close()
    off = EventsBar("job fd-2", enabled=False)
    off({"events_accounted": 5})
    off.finish()
    off.close()
    assert off._bar is None


def test_driver_log_takes_this_process_log_lines_and_failures(tmp_path):
    path = tmp_path / "run" / "driver.log"
    logger = logging.getLogger("keyshift.test_console")
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.INFO)
    try:
        assert runlog.active() is None and runlog.record_failure(ValueError("x")) is None
        assert runlog.attach(path) == path and runlog.attach(path) == path  # twice: one handler
        assert runlog.active() == path
        logger.info("a step of the run")
        try:
            raise RuntimeError("the query failed")
        except RuntimeError as exc:
            assert runlog.record_failure(exc) == path
    finally:
        runlog.detach()
        root.setLevel(level)
    assert runlog.active() is None
    text = path.read_text()
    assert text.count("a step of the run") == 1
    assert "ERROR keyshift: the run failed: RuntimeError: the query failed" in text
    assert "Traceback (most recent call last)" in text


def test_log4j_configuration_sends_errors_to_the_terminal_only_as_one_line():
    text = runlog.LOG4J2_CONFIG.read_text()
    assert "rootLogger.level = warn" in text
    assert "appender.driverlog.target = SYSTEM_ERR" in text and "appender.terminal.target = SYSTEM_OUT" in text
    assert "appender.terminal.filter.threshold.level = error" in text
    assert runlog.jvm_options() == f"-Dlog4j2.configurationFile={runlog.LOG4J2_CONFIG.as_uri()}"
