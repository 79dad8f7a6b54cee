"""The committed Great Expectations context and its three suites, on hand-made runs.

Real GX (great-expectations 1.24.1), no services: each suite passes a clean run and fails, naming
the expectation and showing the failing rows, on a run broken on purpose (a duplicated window, a
wrong alert, an unreconciled count). Also: the committed JSON equals what
`keyshift.quality.suites` defines, outputs go to the run's folder and never into the repository,
the context works from a clean copy, and two runs validated one after the other keep their own
results and Data Docs.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from keyshift.errors import QualityError
from keyshift.quality import suites
from keyshift.quality.checkpoints import validate_frames
from keyshift.quality.context import CONTEXT_DIR, build_context, open_context

H = pd.Timedelta(hours=1)
T0 = pd.Timestamp("2001-01-01", tz="UTC")
RUN = "r-unit"


def _ms(t: pd.Timestamp) -> int:
    return int(t.timestamp() * 1000)


def windows_table() -> pd.DataFrame:
    """Four windows of two origins; ORD 00:00 and DFW 01:00 alert (mean >= 30, count >= 5)."""
    return pd.DataFrame({
        "origin": ["ORD", "ORD", "LGA", "DFW"],
        "window_start": [T0, T0 + H, T0, T0 + H],
        "window_end": [T0 + H, T0 + 2 * H, T0 + H, T0 + 2 * H],
        "count": [5, 2, 1, 6],
        "sum_delay_min": [150, 10, -3, 300],
        "mean_delay_min": [30.0, 5.0, -3.0, 50.0],
        "max_delay_min": [60, 9, -3, 120],
        "alert": [True, False, False, True],
        "slot": [1, 1, 6, 3],
        "epoch": [0, 0, 0, 0],
    })


def alert_records() -> list[dict]:
    """The alert records the job sends for `windows_table()`'s alerting windows."""
    return [
        {"origin": "ORD", "window_start_ms": _ms(T0), "window_end_ms": _ms(T0 + H), "count": 5,
         "mean_delay_min": 30.0, "max_delay_min": 60, "run_id": RUN, "epoch": 0},
        {"origin": "DFW", "window_start_ms": _ms(T0 + H), "window_end_ms": _ms(T0 + 2 * H), "count": 6,
         "mean_delay_min": 50.0, "max_delay_min": 120, "run_id": RUN, "epoch": 0},
    ]


def summary() -> dict:
    """A summary that reconciles with `windows_table()`: 20 events = 14 in windows + 4 late + 2 dead letters."""
    return {"run_id": RUN, "partitions": 8, "events_produced": 20, "events_read": 20, "sum_window_counts": 14,
            "late_events": 4, "dead_letters": 2, "pending_events": 0, "windows_emitted": 4, "alerts": 2,
            "end_offsets": {"0": 20}}


def validate(tmp_path: Path, windows=None, alerts=None, run_summary=None, complete=True):
    return validate_frames(tmp_path / RUN, RUN, windows=windows if windows is not None else windows_table(),
                           summary=run_summary if run_summary is not None else summary(),
                           alerts=alerts if alerts is not None else alert_records(), partitions=8, complete=complete)


def _tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------- the committed context


def _configs(context, name: str) -> list[tuple[str, dict]]:
    suite = context.suites.get(name)
    return [(e.expectation_type, {k: v for k, v in e.configuration.kwargs.items() if k != "batch_id"}, e.description)
            for e in suite.expectations]


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory):
    """A context written from keyshift.quality.suites now, beside the committed one."""
    return build_context(tmp_path_factory.mktemp("rebuilt") / "gx")


@pytest.mark.parametrize("name", [spec.name for spec in suites.SUITES])
def test_committed_suites_match_the_code(tmp_path, rebuilt, name):
    committed, fresh = open_context(tmp_path / "a"), open_context(tmp_path / "b", context_dir=rebuilt)
    assert _configs(committed, name) == _configs(fresh, name), (
        f"keyshift/quality/gx/expectations/{name}.json differs from keyshift.quality.suites; "
        "rebuild with `python -m keyshift.quality.context`")
    checkpoint = committed.checkpoints.get(name)
    assert [vd.name for vd in checkpoint.validation_definitions] == [name]
    assert checkpoint.result_format == suites.suite_spec(name).result_format()
    assert [(a.type, a.site_names) for a in checkpoint.actions] == [("update_data_docs", [suites.DATA_DOCS_SITE])]
    definition = committed.validation_definitions.get(name)
    assert (definition.data.data_asset.name, definition.suite.name) == (suites.suite_spec(name).asset, name)


def test_config_sends_outputs_to_the_run_and_keeps_analytics_off():
    yml = (CONTEXT_DIR / "great_expectations.yml").read_text()
    assert "base_directory: ${keyshift_run_dir}/gx/validations/" in yml
    assert "base_directory: ${keyshift_run_dir}/data_docs/" in yml
    assert "analytics_enabled: false" in yml
    assert "uncommitted" not in yml  # nothing GX would write into the repository tree


def test_outputs_go_to_the_run_folder_not_the_repository(tmp_path):
    before = _tree_digest(CONTEXT_DIR)
    report = validate(tmp_path)
    assert report.success, report.failure_lines()
    assert _tree_digest(CONTEXT_DIR) == before  # the context was read, never written
    assert not (CONTEXT_DIR / "uncommitted").exists()
    assert Path(report.data_docs) == tmp_path / RUN / "data_docs" / "index.html" and Path(report.data_docs).is_file()
    results = list((tmp_path / RUN / "gx" / "validations").rglob("*.json"))
    assert len(results) == 3  # one validation result per suite
    saved = json.loads((tmp_path / RUN / "quality.json").read_text())
    assert saved["success"] is True and [s["suite"] for s in saved["suites"]] == list(suites.JOB_SUITES["flight_delays"])


def test_context_works_from_a_clean_copy(tmp_path):
    clean = tmp_path / "clone" / "gx"
    shutil.copytree(CONTEXT_DIR, clean)
    before = _tree_digest(clean)
    context = open_context(tmp_path / "run", context_dir=clean)
    assert sorted(s.name for s in context.suites.all()) == sorted(s.name for s in suites.SUITES)
    assert sorted(c.name for c in context.checkpoints.all()) == sorted(s.name for s in suites.SUITES)
    assert _tree_digest(clean) == before


def test_runs_validated_one_after_another_keep_their_own_docs(tmp_path):
    first = validate_frames(tmp_path / "run-a", "run-a", windows=windows_table(), summary=None, alerts=None, partitions=8)
    second = validate_frames(tmp_path / "run-b", "run-b", windows=windows_table(), summary=None, alerts=None, partitions=8)
    assert first.success and second.success
    for run_id in ("run-a", "run-b"):
        pages = [p.relative_to(tmp_path / run_id / "data_docs") for p in (tmp_path / run_id / "data_docs" / "validations").rglob("*.html")]
        assert pages and all(run_id in str(page) for page in pages), pages  # only its own validation


# ---------------------------------------------------------------- clean runs pass


def test_a_clean_run_passes_every_suite(tmp_path):
    report = validate(tmp_path)
    assert report.success, report.failure_lines()
    assert [(s.suite, s.rows) for s in report.suites] == [
        ("flight_delay_windows", 4), ("flight_delay_alerts", 2), ("run_reconciliation", 1)]
    assert all(s.evaluated >= 15 for s in report.suites)
    report.raise_for_failures()  # does not raise


def test_a_stopped_continuous_run_may_read_less_than_produced(tmp_path):
    partial = {**summary(), "events_produced": 500, "end_offsets": None}
    assert validate(tmp_path, run_summary=partial, complete=False).success
    assert not validate(tmp_path, run_summary=partial, complete=True).success  # a bounded run may not


def test_no_alerts_when_no_window_alerts(tmp_path):
    quiet = windows_table().assign(alert=False, mean_delay_min=[1.0, 5.0, -3.0, 1.0], sum_delay_min=[5, 10, -3, 6])
    assert validate(tmp_path, windows=quiet, alerts=[], run_summary={**summary(), "alerts": 0}).success


# ---------------------------------------------------------------- broken on purpose


def _failure(report, suite: str, expectation: str, column: str | None = None):
    found = [f for f in report.failed if f.suite == suite and f.expectation == expectation
             and (column is None or column in (f.kwargs.get("column"), f.kwargs.get("column_A"), f.kwargs.get("column_B")))]
    assert found, f"{suite}.{expectation}({column}) did not fail; failures: {report.failure_lines()}"
    return found[0]


def test_a_duplicated_window_fails_the_windows_suite(tmp_path):
    doubled = pd.concat([windows_table(), windows_table().iloc[[3]]], ignore_index=True)
    report = validate(tmp_path, windows=doubled, run_summary={**summary(), "windows_emitted": 5, "sum_window_counts": 20})
    failure = _failure(report, "flight_delay_windows", "expect_compound_columns_to_be_unique")
    assert failure.unexpected_count == 2 and failure.element_count == 5
    assert failure.sample[0] == {"origin": "DFW", "window_start": (T0 + H).isoformat()}
    with pytest.raises(QualityError) as error:
        report.raise_for_failures()
    message = str(error.value)
    assert "flight_delay_windows: expect_compound_columns_to_be_unique" in message and '"DFW"' in message
    assert report.data_docs in message


@pytest.mark.parametrize(
    ("change", "table", "expectation", "column"),
    [
        ({"alert": [True, False, False, False]}, None, "expect_column_pair_values_to_be_equal", "alert"),  # rule broken
        ({"slot": [1, 1, 8, 3]}, None, "expect_column_values_to_be_between", "slot"),  # slot outside [0, P)
        ({"max_delay_min": [20, 9, -3, 120]}, None, "expect_column_pair_values_a_to_be_greater_than_b", "max_delay_min"),
        ({"sum_delay_min": [151, 10, -3, 300]}, None, "expect_column_values_to_be_between", "mean_error_min"),
        ({"window_end": [T0 + 2 * H, T0 + 2 * H, T0 + H, T0 + 2 * H]}, None, "expect_column_values_to_be_between", "window_ms"),
        ({"origin": ["ORD", None, "LGA", "DFW"]}, None, "expect_column_values_to_not_be_null", "origin"),
        (None, lambda t: t.drop(columns=["epoch"]), "expect_table_columns_to_match_ordered_list", None),
    ],
)
def test_broken_windows_tables_fail(tmp_path, change, table, expectation, column):
    windows = windows_table().assign(**change) if change else table(windows_table())
    report = validate_frames(tmp_path / RUN, RUN, windows=windows, summary=None, alerts=None, partitions=8)
    assert not report.success
    _failure(report, "flight_delay_windows", expectation, column)


@pytest.mark.parametrize(
    ("alert", "expectation", "column"),
    [
        # ORD 01:00 exists but does not alert (mean 5 over 2 flights): the record breaks the rule
        ({"origin": "ORD", "window_start_ms": _ms(T0 + H), "window_end_ms": _ms(T0 + 2 * H), "count": 2,
          "mean_delay_min": 5.0}, "expect_column_values_to_be_in_set", "window_alert"),
        # an alert for a window the run never had
        ({"origin": "SEA", "window_start_ms": _ms(T0), "window_end_ms": _ms(T0 + H)}, "expect_column_values_to_be_in_set", "window_found"),
        # the right window, the wrong count / mean
        ({"count": 7}, "expect_column_pair_values_to_be_equal", "count"),
        ({"mean_delay_min": 31.5}, "expect_column_values_to_be_between", "mean_error_min"),
        # another run's id
        ({"run_id": "someone-else"}, "expect_column_values_to_be_in_set", "run_id"),
    ],
)
def test_a_wrong_alert_fails_the_alerts_suite(tmp_path, alert, expectation, column):
    records = alert_records()
    records[0] = {**records[0], **alert}
    report = validate(tmp_path, alerts=records)
    failure = _failure(report, "flight_delay_alerts", expectation, column)
    assert failure.unexpected_count == 1
    assert failure.sample[0]["origin"] == records[0]["origin"]  # the failing alert is shown
    assert all(s.success for s in report.suites if s.suite != "flight_delay_alerts")


def test_a_missing_or_duplicated_alert_fails_the_alerts_suite(tmp_path):
    missing = validate(tmp_path, alerts=alert_records()[:1])
    failure = _failure(missing, "flight_delay_alerts", "expect_table_row_count_to_equal")
    assert failure.sample == [{"observed_value": 1}] and failure.line().endswith("failed; observed 1")
    twice = validate(tmp_path, alerts=alert_records() + alert_records()[:1])
    _failure(twice, "flight_delay_alerts", "expect_compound_columns_to_be_unique")


@pytest.mark.parametrize(
    ("change", "column"),
    [
        ({"late_events": 5}, "events_read"),  # 14 + 5 + 2 != 20 read: one event counted twice
        ({"events_produced": 21}, "unread_events"),  # one event produced but never read
        ({"pending_events": 1, "events_read": 21, "events_produced": 21}, "pending_events"),  # left in an open window
        ({"sum_window_counts": 13, "late_events": 5}, "sum_window_counts"),  # the summary and the table disagree
        ({"windows_emitted": 3}, "windows_emitted"),
        ({"alerts": 1}, "alerts"),
        ({"dead_letters": None}, "dead_letters"),  # missing count
    ],
)
def test_an_unreconciled_summary_fails_the_reconciliation_suite(tmp_path, change, column):
    report = validate(tmp_path, run_summary={**summary(), **change})
    failure = _failure(report, "run_reconciliation", next(f.expectation for f in report.failed
                                                          if column in (f.kwargs.get("column"), f.kwargs.get("column_A"))), column)
    assert failure.sample and failure.sample[0]["run_id"] == RUN
    with pytest.raises(QualityError, match=f"run_reconciliation: expect_.*{column}"):
        report.raise_for_failures()


# ---------------------------------------------------------------- YSB: the generator's record

S10 = pd.Timedelta(seconds=10)
C1, C2 = "7f3c0000-0000-4000-8000-000000000001", "7f3c0000-0000-4000-8000-000000000002"


def ysb_windows() -> pd.DataFrame:
    """Three YSB windows of two campaigns (10 s each), as the YSB job writes them."""
    return pd.DataFrame({
        "campaign_id": [C1, C1, C2],
        "window_start": [T0, T0 + S10, T0],
        "window_end": [T0 + S10, T0 + 2 * S10, T0 + S10],
        "count": [3, 1, 2],
        "slot": [0, 0, 3],
        "epoch": [0, 0, 0],
    })


def expected_views() -> pd.DataFrame:
    """The generator's record matching `ysb_windows()`."""
    return pd.DataFrame({"campaign_id": [C1, C1, C2], "window_start_ms": [_ms(T0), _ms(T0 + S10), _ms(T0)], "views": [3, 1, 2]})


def ysb_summary() -> dict:
    """30 events read = 6 views in windows + 1 late + 2 dead letters + 21 filtered (clicks, purchases)."""
    return {"run_id": RUN, "partitions": 4, "events_produced": 30, "events_read": 30, "sum_window_counts": 6, "late_events": 1,
            "dead_letters": 2, "filtered_events": 21, "pending_events": 0, "windows_emitted": 3, "alerts": 0, "job": "ysb"}


def validate_ysb(tmp_path: Path, windows=None, expected=None, run_summary=None, complete=True):
    return validate_frames(tmp_path / RUN, RUN, windows=windows if windows is not None else ysb_windows(),
                           summary=run_summary if run_summary is not None else ysb_summary(), alerts=None, partitions=4,
                           window_ms=10_000, complete=complete, job="ysb",
                           expected_views=expected if expected is not None else expected_views())


def test_a_clean_ysb_run_passes_its_suites(tmp_path):
    report = validate_ysb(tmp_path)
    assert report.success, report.failure_lines()
    assert [(s.suite, s.rows) for s in report.suites] == [("ysb_windows", 3), ("run_reconciliation", 1)]
    assert report.parameters["min_windows"] == report.parameters["max_windows"] == 3


@pytest.mark.parametrize(
    ("windows", "expected", "expectation", "column"),
    [
        # a window counted one view short of the generator's record
        (lambda t: t.assign(count=[3, 1, 1]), None, "expect_column_pair_values_to_be_equal", "count"),
        # a window the generator never recorded views in
        (lambda t: t.assign(window_start=[T0, T0 + 2 * S10, T0], window_end=[T0 + S10, T0 + 3 * S10, T0 + S10]), None,
         "expect_column_pair_values_to_be_equal", "count"),
        # a window of the record missing from the table
        (lambda t: t.iloc[:2], None, "expect_table_row_count_to_be_between", None),
        # a window twice
        (lambda t: pd.concat([t, t.iloc[[2]]], ignore_index=True), None, "expect_compound_columns_to_be_unique", None),
        # not 10 s aligned
        (lambda t: t.assign(window_start=t["window_start"] + pd.Timedelta(seconds=1),
                            window_end=t["window_end"] + pd.Timedelta(seconds=1)), None,
         "expect_column_values_to_be_between", "window_offset_ms"),
        (lambda t: t.assign(slot=[0, 0, 4]), None, "expect_column_values_to_be_between", "slot"),  # P = 4
        (lambda t: t.drop(columns=["epoch"]), None, "expect_table_columns_to_match_ordered_list", None),
    ],
)
def test_a_ysb_table_that_differs_from_the_generators_record_fails(tmp_path, windows, expected, expectation, column):
    table = windows(ysb_windows())
    report = validate_ysb(tmp_path, windows=table, expected=expected, run_summary={
        **ysb_summary(), "windows_emitted": len(table), "sum_window_counts": int(table["count"].sum()),
        "filtered_events": 30 - 3 - int(table["count"].sum())})
    assert not report.success
    failure = _failure(report, "ysb_windows", expectation, column)
    if failure.unexpected_count is not None and "campaign_id" in table:
        assert set(failure.sample[0]) >= {"campaign_id", "window_start"}  # the failing window is named


def test_a_stopped_continuous_ysb_run_may_have_fewer_windows(tmp_path):
    partial = {**ysb_summary(), "events_produced": 40, "windows_emitted": 2, "sum_window_counts": 4, "filtered_events": 23}
    assert validate_ysb(tmp_path, windows=ysb_windows().iloc[:2], run_summary=partial, complete=False).success


@pytest.mark.parametrize(
    ("change", "column"),
    [
        ({"filtered_events": 20}, "events_read"),  # one event neither in a window nor filtered
        ({"filtered_events": None}, "filtered_events"),  # a YSB summary must count its filtered events
    ],
)
def test_the_reconciliation_counts_filtered_events(tmp_path, change, column):
    report = validate_ysb(tmp_path, run_summary={**ysb_summary(), **change})
    _failure(report, "run_reconciliation", next(f.expectation for f in report.failed
                                                 if column in (f.kwargs.get("column"), f.kwargs.get("column_A"))), column)


def test_a_ysb_run_needs_the_generators_record(tmp_path):
    with pytest.raises(QualityError, match="expected_views"):
        validate_frames(tmp_path / RUN, RUN, windows=ysb_windows(), summary=ysb_summary(), alerts=None, partitions=4,
                        window_ms=10_000, job="ysb")
    with pytest.raises(QualityError, match="no data quality suites"):
        validate_frames(tmp_path / RUN, RUN, windows=ysb_windows(), summary=None, alerts=None, partitions=4,
                        job="flight_delays_sliding")


def test_validate_run_takes_the_job_and_the_record_from_job_json(tmp_path):
    from keyshift.quality.checkpoints import validate_run
    from keyshift.settings import Settings

    record_dir, run_dir = tmp_path / "ysb-gen", tmp_path / RUN
    record_dir.mkdir()
    expected_views().to_parquet(record_dir / "expected_views.parquet", index=False)
    (run_dir / "windows").mkdir(parents=True)
    ysb_windows().to_parquet(run_dir / "windows" / "batch-0.parquet", index=False)
    (run_dir / "summary.json").write_text(json.dumps({**ysb_summary(), "end_offsets": {"0": 30}, "window_ms": 10_000}))
    (run_dir / "job.json").write_text(json.dumps({"config": {"run_id": RUN, "job": "ysb"},
                                                  "replay": {"source": "ysb", "record": str(record_dir)}}))
    report = validate_run(Settings(runs_dir=tmp_path), RUN)  # no alerts topic is read for YSB
    assert report.success, report.failure_lines()
    assert [s.suite for s in report.suites] == ["ysb_windows", "run_reconciliation"]
    (record_dir / "expected_views.parquet").unlink()
    with pytest.raises(QualityError, match="expected_views.parquet is missing"):
        validate_run(Settings(runs_dir=tmp_path), RUN)
