"""The `keyshift_pipeline` DAG's `data_quality` task, as a plain function.

After `verify_summary`, on both the bounded and the continuous path, the pipeline runs the Great
Expectations checkpoints of `keyshift/quality/gx/` on the run (`keyshift.quality.checkpoints.
validate_run`, the suites of the run's job as its `job.json` names it: for the flights the
windows table, the run's alert records and the reconciliation; for YSB the windows table against
the generator's record and the reconciliation), builds the
run's Data Docs in `runs/<run_id>/data_docs/`, and fails with one line per failed expectation.
Nothing here runs at import.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from keyshift.orchestration.pipeline import is_bounded, summary_path, write_pipeline_record
from keyshift.settings import Settings
from keyshift.names import RunDir

log = logging.getLogger(__name__)


def check_run_quality(settings: Settings, run_id: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """Validate a pipeline run's outputs with the GX checkpoints; fail on any failed expectation.

    A bounded run (`limit` > 0) is complete: it must have read every event produced and left no
    pending event. A continuous run stopped on request may stop short (`--partial`); one that
    wrote no summary has nothing to validate and is reported as skipped.

    Args:
        settings: where runs live and the broker is.
        run_id: the keyshift run id (`pipeline.job_run_id` of the DAG run).
        params: the DAG run's params (`limit` decides bounded or continuous).

    Returns:
        `{"run_id", "skipped": False, "success": True, "data_docs", "suites": [{suite, rows,
        evaluated}]}`, or `{"run_id", "skipped": True, "reason"}`. The outcome is also added to
        `runs/<run_id>/pipeline.json` under `quality`.

    Raises:
        QualityError: a suite failed (one line per failed expectation, with a sample of its
            rows and the Data Docs path), the summary is missing for a bounded run, or the alerts
            topic cannot be read.
    """
    from keyshift.errors import QualityError
    from keyshift.quality.checkpoints import validate_run

    bounded = is_bounded(params.get("limit"))
    if not bounded and not summary_path(settings, run_id).is_file():
        reason = f"continuous run {run_id} wrote no summary at {summary_path(settings, run_id)}: nothing to validate"
        log.info(reason)
        _record(settings, run_id, {"skipped": True, "reason": reason})
        return {"run_id": run_id, "skipped": True, "reason": reason}
    try:
        report = validate_run(settings, run_id, complete=bounded)
    except QualityError as exc:
        _record(settings, run_id, {"success": False, "error": str(exc)})
        raise
    outcome = {
        "run_id": run_id, "skipped": False, "success": report.success, "data_docs": report.data_docs,
        "suites": [{"suite": s.suite, "rows": s.rows, "evaluated": s.evaluated, "failed": len(s.failed)} for s in report.suites],
    }
    _record(settings, run_id, {**outcome, "failures": report.failure_lines()})
    for suite in report.suites:
        log.info("%s: %d rows, %d expectations, %s", suite.suite, suite.rows, suite.evaluated,
                 "passed" if suite.success else f"{len(suite.failed)} FAILED")
    log.info("Data Docs of run %s: %s", run_id, report.data_docs)
    report.raise_for_failures()
    return outcome


def _record(settings: Settings, run_id: str, quality: Mapping[str, Any]) -> None:
    """Add `quality` to `runs/<run_id>/pipeline.json` (written by `verify_summary`)."""
    path = RunDir.of(settings.runs_dir, run_id).pipeline
    try:
        record = json.loads(path.read_text()) if path.is_file() else {"run_id": run_id}
    except json.JSONDecodeError:
        record = {"run_id": run_id}
    record["quality"] = dict(quality)
    write_pipeline_record(settings, run_id, record)
