"""Run the checkpoints on a finished run and say, one line each, what failed.

`validate_run` is what `keyshift dq run --run RUN_ID` and the pipeline's `data_quality` task
call: it reads `runs/<run_id>/` (windows table, summary, the job record `job.json` that names the
job), and per job what its suites compare with (the flights: the run's records on the alerts
topic; YSB: the generator's `expected_views.parquet`, found through the replay record in
`job.json`), runs the job's checkpoints of the committed GX context (`keyshift.quality.context`,
`keyshift.quality.suites.JOB_SUITES`) with the run's suite parameters, builds the run's Data Docs (`runs/<run_id>/data_docs/index.html`),
writes `runs/<run_id>/quality.json`, and returns a `QualityReport`. `QualityReport.raise_for_failures`
turns failures into a `QualityError` with one line per failed expectation, naming it and showing a
sample of its unexpected rows.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from keyshift.errors import QualityError
from keyshift.eventtime.windows import HOUR_MS
from keyshift.names import ALERTS_TOPIC, RunDir
from keyshift.quality import batches
from keyshift.quality.context import data_docs_dir, open_context
from keyshift.quality.suites import (
    ALERTS_SUITE,
    RECONCILIATION_SUITE,
    WINDOWS_SUITE,
    YSB_WINDOWS_SUITE,
    job_suites,
    run_parameters,
    suite_spec,
)
from keyshift.settings import Settings

log = logging.getLogger(__name__)

SAMPLE_ROWS = 5
"""Unexpected rows quoted per failed expectation in a failure line."""

ALERTS_LOOKBACK_MS = 600_000
"""How far before the run's first batch the alerts topic is read (ms of record time): producer
clocks and batch start times are one host's clock here, 10 minutes is ample."""


@dataclass(frozen=True)
class FailedExpectation:
    """One expectation that failed on a batch.

    Attributes:
        suite: the suite's name. expectation: its type (`expect_column_values_to_be_between`).
        kwargs: its arguments as validated (suite parameters substituted, `batch_id` dropped).
        unexpected_count: rows that failed (None for a table-level expectation).
        element_count: rows in the batch (None when GX did not report it).
        sample: up to `SAMPLE_ROWS` failing rows (index columns and the checked values) or, for
            a table-level expectation, `[{"observed_value": ...}]`.
        description: the expectation's description, if any. exception: GX's error text when
            the expectation could not be evaluated (e.g. a missing column).
    """

    suite: str
    expectation: str
    kwargs: dict[str, Any]
    unexpected_count: int | None
    element_count: int | None
    sample: list[Any]
    description: str | None = None
    exception: str | None = None

    def line(self) -> str:
        """One line: suite, expectation(arguments), how many rows failed, a sample of them."""
        arguments = ", ".join(f"{k}={_short(v)}" for k, v in self.kwargs.items())
        head = f"{self.suite}: {self.expectation}({arguments})"
        if self.exception:
            return f"{head} could not be evaluated: {self.exception}"
        if self.unexpected_count is not None:
            of = f" of {self.element_count}" if self.element_count is not None else ""
            return f"{head} failed on {self.unexpected_count}{of} rows; sample: {_short(self.sample, 400)}"
        observed = [row.get("observed_value") for row in self.sample if isinstance(row, dict) and "observed_value" in row]
        return f"{head} failed; observed {_short(observed[0], 400)}" if observed else f"{head} failed"


@dataclass
class SuiteResult:
    """One checkpoint's outcome.

    Attributes:
        suite: the suite's name. success: every expectation passed. evaluated: expectations run.
        rows: rows of the batch. failed: the failed expectations.
    """

    suite: str
    success: bool
    evaluated: int
    rows: int
    failed: list[FailedExpectation] = field(default_factory=list)


@dataclass
class QualityReport:
    """The data quality outcome of one run.

    Attributes:
        run_id: the run. success: every suite passed. suites: per-suite results, in order.
        data_docs: path of the run's Data Docs `index.html`. parameters: the suite parameters used.
    """

    run_id: str
    success: bool
    suites: list[SuiteResult]
    data_docs: str
    parameters: dict[str, Any]

    @property
    def failed(self) -> list[FailedExpectation]:
        """Every failed expectation, suite by suite."""
        return [failure for suite in self.suites for failure in suite.failed]

    def failure_lines(self) -> list[str]:
        """One line per failed expectation (`FailedExpectation.line`)."""
        return [failure.line() for failure in self.failed]

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe form (for `quality.json` and XCom)."""
        return json.loads(json.dumps(asdict(self), default=str))

    def raise_for_failures(self) -> None:
        """Raise when a suite failed.

        Raises:
            QualityError: "run R failed N data quality expectation(s) (Data Docs: PATH):" then
                one line per failed expectation.
        """
        if self.success:
            return
        lines = self.failure_lines()
        raise QualityError(
            f"run {self.run_id} failed {len(lines)} data quality expectation(s) (Data Docs: {self.data_docs}):\n"
            + "\n".join(lines)
        )


def _plain(value: Any) -> Any:
    """numpy and pandas scalars as Python values (None for NaN/NA), for readable JSON."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, pd.Timestamp):
        return value.isoformat()
    try:
        if pd.isna(value):
            return None
    except (TypeError, ValueError):
        pass
    return value.item() if hasattr(value, "item") else value


def _short(value: Any, limit: int = 120) -> str:
    text = json.dumps(_plain(value), default=str) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _failure(suite: str, result) -> FailedExpectation:
    config = result.expectation_config
    kwargs = _plain({k: v for k, v in config.kwargs.items() if k not in ("batch_id", "result_format")})
    details = result.result or {}
    exception = None
    info = result.exception_info or {}
    if isinstance(info, dict) and info.get("raised_exception"):
        exception = str(info.get("exception_message") or "exception").splitlines()[0]
    else:
        for value in (info.values() if isinstance(info, dict) else []):
            if isinstance(value, dict) and value.get("raised_exception"):
                exception = str(value.get("exception_message") or "exception").splitlines()[0]
                break
    if "unexpected_count" in details:
        sample = details.get("unexpected_index_list") or details.get("partial_unexpected_list") or []
        return FailedExpectation(
            suite=suite, expectation=config.type, kwargs=kwargs,
            unexpected_count=int(details["unexpected_count"]), element_count=details.get("element_count"),
            sample=_plain(list(sample)[:SAMPLE_ROWS]), description=getattr(config, "description", None), exception=exception,
        )
    observed = _plain({k: details[k] for k in ("observed_value", "details") if k in details})
    return FailedExpectation(
        suite=suite, expectation=config.type, kwargs=kwargs, unexpected_count=None, element_count=None,
        sample=[observed] if observed else [], description=getattr(config, "description", None), exception=exception,
    )


def run_checkpoint(context, suite: str, frame: pd.DataFrame, parameters: Mapping[str, Any],
                   run_name: str | None = None) -> SuiteResult:
    """Run one suite's checkpoint on a DataFrame batch.

    Args:
        context: an open context (`keyshift.quality.context.open_context`).
        suite: the suite's (and checkpoint's) name.
        frame: the batch (`keyshift.quality.batches`).
        parameters: suite parameters (`keyshift.quality.suites.run_parameters`).
        run_name: names the validation in the results store and Data Docs (the run id).

    Returns:
        The `SuiteResult`; the checkpoint's actions have stored the result and updated Data Docs.
    """
    from great_expectations.core.run_identifier import RunIdentifier

    checkpoint = context.checkpoints.get(suite)
    outcome = checkpoint.run(batch_parameters={"dataframe": frame}, expectation_parameters=dict(parameters),
                             run_id=RunIdentifier(run_name=run_name) if run_name else None)
    results = [r for validation in outcome.run_results.values() for r in validation.results]
    failed = [_failure(suite, r) for r in results if not r.success]
    log.info("%s: %d rows, %d expectations, %d failed", suite, len(frame), len(results), len(failed))
    return SuiteResult(suite=suite, success=bool(outcome.success), evaluated=len(results), rows=len(frame), failed=failed)


def validate_frames(
    run_dir: Path,
    run_id: str,
    *,
    windows: pd.DataFrame,
    summary: Mapping[str, Any] | None,
    alerts: Iterable[Mapping[str, Any]] | None,
    partitions: int,
    window_ms: int = HOUR_MS,
    complete: bool = True,
    job: str | None = None,
    expected_views: pd.DataFrame | None = None,
) -> QualityReport:
    """Validate a run's data, given as frames and records, and write its Data Docs to `run_dir`.

    Args:
        run_dir: where validation results, Data Docs and `quality.json` go (`runs/<run_id>/`).
        run_id: the run (alert records must carry it; names the validation).
        windows: the windows table. summary: the run's summary (None: skip the reconciliation
            suite). alerts: the run's alert records (None: skip the alerts suite; a YSB run
            has none).
        partitions: P. window_ms: the window size, ms of event time.
        complete: a bounded run that read everything (see `run_parameters`).
        job: the run's job, `flight_delays` (None) or `ysb`: which suites run (`JOB_SUITES`).
        expected_views: YSB: the generator's record (`batches.read_expected_views`); required.

    Returns:
        The `QualityReport` (also written to `run_dir/quality.json`).

    Raises:
        QualityError: a job without suites, or a YSB run without the generator's record.
    """
    suites = job_suites(job)
    if YSB_WINDOWS_SUITE in suites and expected_views is None:
        raise QualityError(f"run {run_id} is a YSB run: its windows are checked against the generator's expected_views.parquet;"
                           " none was given")
    alerting = int(windows["alert"].astype(bool).sum()) if "alert" in windows and len(windows) else 0
    parameters = run_parameters(run_id=run_id, partitions=partitions, window_ms=window_ms, alerting_windows=alerting,
                                complete=complete, expected_windows=None if expected_views is None else len(expected_views))
    context = open_context(run_dir)
    if WINDOWS_SUITE in suites:
        windows_batch = (WINDOWS_SUITE, batches.windows_batch(windows, window_ms))
    else:
        windows_batch = (YSB_WINDOWS_SUITE, batches.ysb_windows_batch(windows, window_ms, expected_views))
    results = [run_checkpoint(context, *windows_batch, parameters, run_id)]
    if alerts is not None and ALERTS_SUITE in suites:
        results.append(run_checkpoint(context, ALERTS_SUITE, batches.alerts_batch(alerts, windows), parameters, run_id))
    if summary is not None:
        results.append(run_checkpoint(context, RECONCILIATION_SUITE, batches.reconciliation_batch(summary, windows), parameters, run_id))
    report = QualityReport(
        run_id=run_id, success=all(r.success for r in results), suites=results,
        data_docs=str(data_docs_dir(run_dir) / "index.html"), parameters=parameters,
    )
    path = RunDir(Path(run_dir)).quality
    path.write_text(json.dumps(report.as_dict(), indent=2, sort_keys=True) + "\n")
    log.info("run %s: data quality %s (%d failed expectations); Data Docs %s", run_id,
             "passed" if report.success else "FAILED", len(report.failed), report.data_docs)
    return report


def is_complete_run(summary: Mapping[str, Any]) -> bool:
    """Whether a summary is a bounded run's, which must have read everything produced: it has
    end offsets (`--limit` fixes them at start); a continuous run has none."""
    return bool(summary.get("end_offsets"))


def validate_run(
    settings: Settings,
    run_id: str,
    *,
    window_ms: int | None = None,
    complete: bool | None = None,
    alerts_topic: str = ALERTS_TOPIC,
    alerts: Iterable[Mapping[str, Any]] | None = None,
    expected_views: Path | None = None,
) -> QualityReport:
    """Run the job's checkpoints on a finished run `runs/<run_id>/` and build its Data Docs.

    The job comes from the run's job record (`job.json`, config `job`), else the summary's
    `job`, else flight_delays; its suites from `keyshift.quality.suites.JOB_SUITES`.

    Args:
        settings: where runs live (`runs_dir`) and the broker is.
        run_id: the run to validate; `runs/<run_id>/summary.json` must exist.
        window_ms: the job's window size (default: the summary's `window_ms`, else one hour).
        complete: whether the run had to read everything produced (default: `is_complete_run`).
        alerts_topic: the topic the flight job sent alerts to.
        alerts: the run's alert records; None reads them from `alerts_topic` (committed records
            with this run id, from 10 minutes before the run's first batch). Not read for YSB.
        expected_views: YSB: the generator's `expected_views.parquet`; None: the one in the
            folder the run's replay record names (`runs/ysb-<id>/`).

    Returns:
        The `QualityReport`; check `success`, or call `raise_for_failures()`.

    Raises:
        QualityError: no summary for the run, a job without suites, the alerts topic cannot be
            read, or a YSB run whose generator record cannot be found.
    """
    run_dir = Path(settings.runs_dir) / run_id
    summary = batches.read_summary(run_dir)
    record = batches.read_job(run_dir)
    job = (record.get("config") or {}).get("job") or summary.get("job") or "flight_delays"
    suites = job_suites(job)
    windows = batches.read_windows(run_dir, job)
    expected = None
    if YSB_WINDOWS_SUITE in suites:
        path = expected_views or batches.expected_views_path(record)
        if path is None:
            raise QualityError(f"run {run_id} (job {job}) did not read a YSB generator's replay (no `record` in its job.json replay);"
                               " give the generator's record with `keyshift dq run --expected-views PATH`")
        expected = batches.read_expected_views(path)
    if ALERTS_SUITE not in suites:
        alerts = None
    elif alerts is None:
        first = batches.first_batch_time_ms(run_dir)
        alerts = batches.read_alerts(settings, run_id, alerts_topic, since_ms=None if first is None else first - ALERTS_LOOKBACK_MS)
    partitions = int(summary.get("partitions") or settings.partitions)
    return validate_frames(
        run_dir, run_id, windows=windows, summary=summary, alerts=None if alerts is None else list(alerts), partitions=partitions,
        window_ms=int(window_ms or summary.get("window_ms") or HOUR_MS),
        complete=is_complete_run(summary) if complete is None else complete, job=job, expected_views=expected,
    )


__all__ = ["FailedExpectation", "QualityReport", "SuiteResult", "is_complete_run", "run_checkpoint",
           "suite_spec", "validate_frames", "validate_run"]
