"""Great Expectations check of a flight delay windows table alone (great-expectations 1.x).

`validate_windows` runs the `flight_delay_windows` checkpoint of the committed file context
(`keyshift/quality/gx/`, suite defined in `keyshift.quality.suites.windows_expectations`) on
one table: exactly the table's columns in order, no nulls, each (origin, window_start) once, a
positive count, windows of exactly `window_ms` aligned on multiples of it, max delay >= mean
delay, mean = sum / count, alert = mean >= 30 and count >= 5, slots within [0, P), epoch >= 0.
The demo calls it; `keyshift dq run` validates the alerts and the reconciliation as well
(`keyshift.quality.checkpoints.validate_run`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from keyshift.eventtime.windows import HOUR_MS
from keyshift.quality.context import quiet_great_expectations

_quiet_great_expectations = quiet_great_expectations
"""Kept under its old name: lowers GX's loggers (Airflow prints its INFO lines otherwise)."""


def validate_windows(
    windows: pd.DataFrame,
    partitions: int,
    window_ms: int = HOUR_MS,
    run_dir: Path | None = None,
    run_id: str = "windows",
) -> dict[str, Any]:
    """Validate a windows table with the `flight_delay_windows` suite.

    Args:
        windows: the windows table (`pd.read_parquet("runs/<run_id>/windows")`).
        partitions: P; `slot` must lie in [0, P).
        window_ms: window size in ms of event time.
        run_dir: `runs/<run_id>/`: the validation result and Data Docs go there (`data_docs/`);
            None validates in a temporary folder that is removed afterwards.
        run_id: names the validation in the results store and Data Docs.

    Returns:
        {"success": bool, "evaluated": n expectations, "failed": [{"type", "kwargs", "line"}, ...],
         "rows": rows checked, "data_docs": path of index.html or None}.
    """
    from keyshift.quality.checkpoints import run_checkpoint
    from keyshift.quality.context import data_docs_dir, open_context
    from keyshift.quality.batches import windows_batch
    from keyshift.quality.suites import WINDOWS_SUITE, run_parameters

    parameters = run_parameters(run_id=run_id, partitions=partitions, window_ms=window_ms,
                                alerting_windows=0, complete=True)
    with tempfile.TemporaryDirectory(prefix="keyshift-gx-") as scratch:
        folder = Path(run_dir) if run_dir is not None else Path(scratch)
        result = run_checkpoint(open_context(folder), WINDOWS_SUITE, windows_batch(windows, window_ms), parameters, run_id)
    return {
        "success": result.success,
        "evaluated": result.evaluated,
        "failed": [{"type": f.expectation, "kwargs": f.kwargs, "line": f.line()} for f in result.failed],
        "rows": result.rows,
        "data_docs": str(data_docs_dir(folder) / "index.html") if run_dir is not None else None,
    }
