"""Great Expectations checks of the flight delay windows table (great-expectations 1.x).

The suite states what every windows table must satisfy, whatever the data: exactly the table's
columns in order, no nulls, each (origin, window_start) once, a positive count, windows of
exactly `window_ms`, max delay >= mean delay, alert = mean >= 30 and count >= 5 (checked as
two implications), and slots within [0, P).
"""

from __future__ import annotations

import logging
from typing import Any

import pandas as pd

from keyshift.eventtime.windows import HOUR_MS
from keyshift.processing.processor import ALERT_MIN_COUNT, ALERT_MIN_MEAN_DELAY_MIN
from keyshift.processing.sinks import WINDOW_COLUMNS

log = logging.getLogger(__name__)


def _quiet_great_expectations() -> None:
    # importing great_expectations under Airflow's logging prints hundreds of INFO lines
    for name in ("great_expectations", "great_expectations.core", "great_expectations.data_context"):
        logging.getLogger(name).setLevel(logging.WARNING)


def validate_windows(windows: pd.DataFrame, partitions: int, window_ms: int = HOUR_MS) -> dict[str, Any]:
    """Validate a windows table with a Great Expectations suite.

    Args:
        windows: the windows table (`pd.read_parquet("runs/<run_id>/windows")`).
        partitions: P; `slot` must lie in [0, P).
        window_ms: window size in ms of event time.

    Returns:
        {"success": bool, "evaluated": n, "failed": [expectation type and kwargs, ...],
         "rows": rows checked}.
    """
    _quiet_great_expectations()
    import great_expectations as gx
    import great_expectations.expectations as gxe

    frame = windows.copy()
    frame["window_ms"] = (frame["window_end"] - frame["window_start"]).dt.total_seconds().mul(1000).astype("int64")
    frame["alert_rule"] = (frame["mean_delay_min"] >= ALERT_MIN_MEAN_DELAY_MIN) & (frame["count"] >= ALERT_MIN_COUNT)

    context = gx.get_context(mode="ephemeral")
    batch = (
        context.data_sources.add_pandas("keyshift")
        .add_dataframe_asset("flight_delay_windows")
        .add_batch_definition_whole_dataframe("whole_table")
        .get_batch(batch_parameters={"dataframe": frame})
    )
    suite = context.suites.add(gx.ExpectationSuite(name="flight_delay_windows"))
    expectations = [
        gxe.ExpectTableColumnsToMatchOrderedList(column_list=[*WINDOW_COLUMNS, "window_ms", "alert_rule"]),
        *(gxe.ExpectColumnValuesToNotBeNull(column=column) for column in WINDOW_COLUMNS),
        gxe.ExpectCompoundColumnsToBeUnique(column_list=["origin", "window_start"]),
        gxe.ExpectColumnValuesToBeBetween(column="count", min_value=1),
        gxe.ExpectColumnValuesToBeBetween(column="window_ms", min_value=window_ms, max_value=window_ms),
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(column_A="max_delay_min", column_B="mean_delay_min", or_equal=True),
        gxe.ExpectColumnPairValuesToBeEqual(column_A="alert", column_B="alert_rule"),
        gxe.ExpectColumnValuesToBeBetween(column="slot", min_value=0, max_value=partitions - 1),
    ]
    for expectation in expectations:
        suite.add_expectation(expectation)
    result = batch.validate(suite)
    failed = [
        {"type": r.expectation_config.type, "kwargs": {k: v for k, v in r.expectation_config.kwargs.items() if k != "batch_id"}}
        for r in result.results
        if not r.success
    ]
    log.info("windows table: %d rows, %d expectations, %d failed", len(frame), len(result.results), len(failed))
    return {"success": bool(result.success), "evaluated": len(result.results), "failed": failed, "rows": len(frame)}
