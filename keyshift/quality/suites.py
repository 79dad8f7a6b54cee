"""The Expectation Suites of a run, as code: what each checks and how its batch is named.

Which suites a run gets depends on its job (`JOB_SUITES`): the flight delay job's windows table,
alert records and reconciliation; the YSB job's windows table (checked against the generator's
record of views per campaign and window) and the same reconciliation.

The Great Expectations file Data Context in `keyshift/quality/gx/` holds these suites as JSON
(`gx/expectations/<suite>.json`), one Validation Definition and one Checkpoint per suite. This
module is where they are written down and reviewed; `keyshift.quality.context.build_context`
writes the JSON from it, and `tests/unit/test_quality_suites.py` fails when the committed JSON
and this module differ.

Each suite validates one pandas DataFrame batch (a `dataframe` asset of the pandas data source
`keyshift`, batch definition `whole_table`) prepared by `keyshift.quality.batches`: the run's
own data plus derived columns that turn a cross-row or cross-table rule into a column rule (GX
1.x has no row-level SQL expectation for pandas), e.g. `accounted_events` or `window_found`.

Values that depend on the run are suite parameters (`{"$PARAMETER": name}`), given at
validation time by `run_parameters`:

| parameter | meaning |
| --- | --- |
| `run_ids` | `[run_id]`: every alert record must carry the run's id |
| `window_ms` | the job's window size, ms of event time |
| `max_slot` | P - 1, the highest slot |
| `alerting_windows` | windows of the run's table with `alert = true`: one alert record each |
| `max_unread_events` | events produced but not read: 0 for a complete (bounded) run, None (no bound) for a stopped continuous run |
| `max_pending_events` | events still in open windows: 0 for a complete run, None for a stopped continuous run |
| `min_windows`, `max_windows` | YSB: rows the windows table may have: the generator's recorded windows for a complete run; 0 to that for a stopped continuous run |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from keyshift.errors import QualityError
from keyshift.jobs.flight_delays import ALERT_MIN_COUNT, ALERT_MIN_MEAN_DELAY_MIN, WINDOW_COLUMNS

DATASOURCE = "keyshift"
"""The pandas data source of the context; each suite's batch is one of its dataframe assets."""
BATCH_DEFINITION = "whole_table"
"""Each asset's one batch definition: the whole DataFrame passed in `batch_parameters`."""
DATA_DOCS_SITE = "run_site"
"""The Data Docs site every checkpoint updates; its folder is `runs/<run_id>/data_docs/`."""

WINDOWS_SUITE = "flight_delay_windows"
ALERTS_SUITE = "flight_delay_alerts"
RECONCILIATION_SUITE = "run_reconciliation"
YSB_WINDOWS_SUITE = "ysb_windows"

JOB_SUITES: dict[str, tuple[str, ...]] = {
    "flight_delays": (WINDOWS_SUITE, ALERTS_SUITE, RECONCILIATION_SUITE),
    "ysb": (YSB_WINDOWS_SUITE, RECONCILIATION_SUITE),
}
"""The suites of a run of each job, in the order they are validated (the job from the run's
`job.json`, `keyshift.quality.checkpoints.validate_run`)."""


def job_suites(job: str | None) -> tuple[str, ...]:
    """The suites of a run of `job` (None: flight_delays, a run from before jobs were recorded).

    Raises:
        QualityError: a job without suites (e.g. flight_delays_sliding); the message names the
            jobs that have some.
    """
    job = job or "flight_delays"
    if job not in JOB_SUITES:
        raise QualityError(f"job {job!r} has no data quality suites yet; suites exist for {', '.join(JOB_SUITES)}")
    return JOB_SUITES[job]

MEAN_TOLERANCE_MIN = 1e-6
"""Largest accepted |mean_delay_min - sum_delay_min / count| (minutes): float rounding only."""

WINDOW_DERIVED_COLUMNS = ("window_ms", "window_offset_ms", "alert_rule", "mean_error_min")
"""Columns `keyshift.quality.batches.windows_batch` adds to the windows table."""

ALERT_FIELDS = ("origin", "window_start_ms", "window_end_ms", "count", "mean_delay_min", "max_delay_min", "run_id", "epoch")
"""Fields of an alert record (JSON value on `flight-delay-alerts`, written by the job's sink)."""

ALERT_DERIVED_COLUMNS = ("window_found", "window_alert", "window_count", "mean_error_min")
"""Columns `keyshift.quality.batches.alerts_batch` adds: the run's window with the alert's
origin, window_start_ms and window_end_ms (found or not, its alert flag and count) and
|alert mean - window mean| in minutes (null when no window matches)."""

YSB_WINDOW_COLUMNS = ("campaign_id", "window_start", "window_end", "count", "slot", "epoch")
"""The YSB job's windows table (`keyshift.jobs.ysb`)."""

YSB_WINDOW_DERIVED_COLUMNS = ("window_ms", "window_offset_ms", "expected_views")
"""Columns `keyshift.quality.batches.ysb_windows_batch` adds: window_end - window_start and
window_start mod window_ms (ms), and the views the generator recorded for the row's campaign and
window (`expected_views.parquet`; null when it recorded none there)."""

RECONCILIATION_COLUMNS = (
    "run_id", "events_produced", "events_read", "sum_window_counts", "late_events", "dead_letters",
    "filtered_events", "pending_events", "windows_emitted", "alerts",
)
"""Fields of `summary.json` the reconciliation batch carries (one row)."""

RECONCILIATION_DERIVED_COLUMNS = ("accounted_events", "unread_events", "table_windows", "table_sum_counts", "table_alerts")
"""Columns `keyshift.quality.batches.reconciliation_batch` adds: Σ window counts + late + dead
letters + filtered + pending; events produced - read; and the windows table's own row count, Σ
count and rows with alert = true (0 for a table without an alert column)."""


def _parameter(name: str) -> dict[str, str]:
    return {"$PARAMETER": name}


@dataclass(frozen=True)
class SuiteSpec:
    """One suite, its batch's asset and how failing rows are identified.

    Attributes:
        name: the suite's name; also its validation definition's and checkpoint's name.
        asset: the dataframe asset of data source `keyshift` whose batch it validates.
        index_columns: columns shown for each unexpected row (`unexpected_index_column_names`).
        description: one sentence for the README and Data Docs.
    """

    name: str
    asset: str
    index_columns: tuple[str, ...]
    description: str

    def result_format(self) -> dict[str, Any]:
        """The checkpoint's result format: COMPLETE, failing rows identified by `index_columns`,
        at most 20 of them in `partial_unexpected_list`."""
        return {
            "result_format": "COMPLETE",
            "unexpected_index_column_names": list(self.index_columns),
            "partial_unexpected_count": 20,
            "include_unexpected_rows": False,
        }


SUITES: tuple[SuiteSpec, ...] = (
    SuiteSpec(WINDOWS_SUITE, "windows", ("origin", "window_start"),
              "the windows table runs/<run_id>/windows/*.parquet"),
    SuiteSpec(ALERTS_SUITE, "alerts", ("origin", "window_start_ms"),
              "the run's records on the alerts topic, each matched to its window"),
    SuiteSpec(RECONCILIATION_SUITE, "summary", ("run_id",),
              "the run's event accounting in runs/<run_id>/summary.json against the windows table"),
    SuiteSpec(YSB_WINDOWS_SUITE, "ysb_windows", ("campaign_id", "window_start"),
              "a YSB run's windows table runs/<run_id>/windows/*.parquet against the generator's expected_views.parquet"),
)
"""The suites in the order a run is validated."""


def suite_spec(name: str) -> SuiteSpec:
    """The `SuiteSpec` named `name`.

    Raises:
        KeyError: no such suite (the message lists the suites).
    """
    for spec in SUITES:
        if spec.name == name:
            return spec
    raise KeyError(f"no suite {name!r}; suites: {[s.name for s in SUITES]}")


def _tumbling_window_expectations(table: str, columns: tuple[str, ...], derived: tuple[str, ...], key: str, event: str) -> list:
    """What every tumbling windows table must meet: exactly `columns` then `derived`, in order; no
    nulls in `columns`; each (`key`, window_start) once; count >= 1; windows of `window_ms`
    aligned on multiples of it. `table` and `event` name the table and its events in the
    descriptions ("windows table", "flight")."""
    import great_expectations.expectations as gxe

    name = key.removesuffix("_id")
    return [
        gxe.ExpectTableColumnsToMatchOrderedList(
            column_list=[*columns, *derived],
            description=f"Exactly the {table}'s columns, in order (then the derived ones).",
        ),
        *(gxe.ExpectColumnValuesToNotBeNull(column=column) for column in columns),
        gxe.ExpectCompoundColumnsToBeUnique(
            column_list=[key, "window_start"],
            description=f"Each {name}'s window is emitted once: no duplicate, no double count.",
        ),
        gxe.ExpectColumnValuesToBeBetween(column="count", min_value=1, description=f"A window holds at least one {event}."),
        gxe.ExpectColumnValuesToBeBetween(
            column="window_ms", min_value=_parameter("window_ms"), max_value=_parameter("window_ms"),
            description="window_end - window_start is the job's window size.",
        ),
        gxe.ExpectColumnValuesToBeBetween(
            column="window_offset_ms", min_value=0, max_value=0,
            description="Tumbling windows start on multiples of the window size (epoch ms, UTC).",
        ),
    ]


def _placement_expectations() -> list:
    """slot in [0, P) (`max_slot` = P - 1) and epoch >= 0, for every windows table."""
    import great_expectations.expectations as gxe

    return [
        gxe.ExpectColumnValuesToBeBetween(
            column="slot", min_value=0, max_value=_parameter("max_slot"), description="slot lies in [0, P).",
        ),
        gxe.ExpectColumnValuesToBeBetween(column="epoch", min_value=0, description="An assignment epoch is >= 0."),
    ]


def windows_expectations() -> list:
    """The windows table's expectations (a list of GX expectation objects).

    Every windows table must have exactly the table's columns (plus the derived ones), in order;
    no nulls; each (origin, window_start) once; a positive count; windows of exactly `window_ms`
    aligned on multiples of it (epoch ms, UTC); max delay >= mean delay; mean = sum / count;
    alert = (mean >= 30 and count >= 5); slot in [0, P); epoch >= 0.
    """
    import great_expectations.expectations as gxe

    return [
        *_tumbling_window_expectations("windows table", WINDOW_COLUMNS, WINDOW_DERIVED_COLUMNS, "origin", "flight"),
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(
            column_A="max_delay_min", column_B="mean_delay_min", or_equal=True,
            description="The largest delay is at least the mean delay.",
        ),
        gxe.ExpectColumnValuesToBeBetween(
            column="mean_error_min", min_value=0, max_value=MEAN_TOLERANCE_MIN,
            description="mean_delay_min = sum_delay_min / count.",
        ),
        gxe.ExpectColumnPairValuesToBeEqual(
            column_A="alert", column_B="alert_rule",
            description=f"alert = (mean_delay_min >= {ALERT_MIN_MEAN_DELAY_MIN:g} and count >= {ALERT_MIN_COUNT}).",
        ),
        *_placement_expectations(),
    ]


def ysb_windows_expectations() -> list:
    """The YSB windows table's expectations (a list of GX expectation objects).

    Exactly the table's columns in order (then the derived ones); no nulls; each (campaign_id,
    window_start) once; a positive count; windows of exactly `window_ms` (10 s) aligned on
    multiples of it; slot in [0, P); epoch >= 0; and the generator's record: every window's count
    equals the views the generator wrote for that campaign and window, and the table has as many
    windows as the record (`min_windows`..`max_windows`), so no window is missing or invented.
    """
    import great_expectations.expectations as gxe

    return [
        *_tumbling_window_expectations("YSB windows table", YSB_WINDOW_COLUMNS, YSB_WINDOW_DERIVED_COLUMNS, "campaign_id", "view"),
        *_placement_expectations(),
        gxe.ExpectColumnPairValuesToBeEqual(
            column_A="count", column_B="expected_views",
            description="Each window's count equals the views the generator recorded for its campaign and window.",
        ),
        gxe.ExpectTableRowCountToBeBetween(
            min_value=_parameter("min_windows"), max_value=_parameter("max_windows"),
            description="As many windows as the generator recorded (a stopped continuous run: at most that many).",
        ),
    ]


def alerts_expectations() -> list:
    """The alert records' expectations (a list of GX expectation objects).

    Every alert record of the run carries the alert fields and the run's id; it is sent once per
    (origin, window); it meets the alert rule itself; it matches a window of the run's table
    (same origin, window start and end) that has alert = true, the same count and the same mean;
    and there are as many alert records as alerting windows.
    """
    import great_expectations.expectations as gxe

    return [
        *(gxe.ExpectColumnToExist(column=column) for column in ALERT_FIELDS),
        *(gxe.ExpectColumnValuesToNotBeNull(column=column)
          for column in ("origin", "window_start_ms", "window_end_ms", "count", "mean_delay_min", "run_id")),
        gxe.ExpectColumnValuesToBeInSet(
            column="run_id", value_set=_parameter("run_ids"), description="Every record carries the run's id.",
        ),
        gxe.ExpectCompoundColumnsToBeUnique(
            column_list=["origin", "window_start_ms"],
            description="One alert per alerting window: exactly once on the topic.",
        ),
        gxe.ExpectColumnValuesToBeBetween(
            column="count", min_value=ALERT_MIN_COUNT, description=f"An alert covers at least {ALERT_MIN_COUNT} flights.",
        ),
        gxe.ExpectColumnValuesToBeBetween(
            column="mean_delay_min", min_value=ALERT_MIN_MEAN_DELAY_MIN,
            description=f"An alert's mean delay is at least {ALERT_MIN_MEAN_DELAY_MIN:g} minutes.",
        ),
        gxe.ExpectColumnValuesToBeInSet(
            column="window_found", value_set=[True],
            description="The alert's origin, window_start_ms and window_end_ms name a window of the run's table.",
        ),
        gxe.ExpectColumnValuesToBeInSet(
            column="window_alert", value_set=[True], description="That window has alert = true.",
        ),
        gxe.ExpectColumnPairValuesToBeEqual(
            column_A="count", column_B="window_count", description="The alert's count is the window's count.",
        ),
        gxe.ExpectColumnValuesToBeBetween(
            column="mean_error_min", min_value=0, max_value=MEAN_TOLERANCE_MIN,
            description="The alert's mean delay is the window's mean delay.",
        ),
        gxe.ExpectTableRowCountToEqual(
            value=_parameter("alerting_windows"),
            description="As many alert records as windows with alert = true in the run's table.",
        ),
    ]


def reconciliation_expectations() -> list:
    """The run reconciliation's expectations (a list of GX expectation objects).

    On the one-row batch built from `summary.json` and the windows table: every count present
    and >= 0; events read = Σ window counts + late events + dead letters + filtered events (a
    job's `keep` rule: YSB's non-views; 0 for the flights) + pending events; events
    produced = events read (at most `max_unread_events` unread); no pending events after a
    complete run; and the summary's windows, Σ counts and alerts equal the windows table's.
    """
    import great_expectations.expectations as gxe

    counts = ("events_read", "sum_window_counts", "late_events", "dead_letters", "filtered_events", "pending_events",
              "windows_emitted", "alerts")
    return [
        gxe.ExpectTableRowCountToEqual(value=1, description="One summary per run."),
        *(gxe.ExpectColumnValuesToNotBeNull(column=column) for column in counts),
        *(gxe.ExpectColumnValuesToBeBetween(column=column, min_value=0) for column in counts),
        gxe.ExpectColumnPairValuesToBeEqual(
            column_A="events_read", column_B="accounted_events",
            description="events read = Σ window counts + late events + dead letters + filtered events + pending events.",
        ),
        gxe.ExpectColumnValuesToBeBetween(
            column="unread_events", min_value=0, max_value=_parameter("max_unread_events"),
            description="events produced = events read (a stopped continuous run may read fewer).",
        ),
        gxe.ExpectColumnValuesToBeBetween(
            column="pending_events", min_value=0, max_value=_parameter("max_pending_events"),
            description="No event left in an open window after a complete run.",
        ),
        gxe.ExpectColumnPairValuesToBeEqual(
            column_A="sum_window_counts", column_B="table_sum_counts",
            description="The summary's Σ window counts is the windows table's Σ count.",
        ),
        gxe.ExpectColumnPairValuesToBeEqual(
            column_A="windows_emitted", column_B="table_windows",
            description="The summary's windows_emitted is the windows table's row count.",
        ),
        gxe.ExpectColumnPairValuesToBeEqual(
            column_A="alerts", column_B="table_alerts",
            description="The summary's alerts is the number of windows with alert = true.",
        ),
    ]


EXPECTATIONS = {
    WINDOWS_SUITE: windows_expectations,
    ALERTS_SUITE: alerts_expectations,
    RECONCILIATION_SUITE: reconciliation_expectations,
    YSB_WINDOWS_SUITE: ysb_windows_expectations,
}
"""Suite name -> the function building its expectations."""


def run_parameters(
    *,
    run_id: str,
    partitions: int,
    window_ms: int,
    alerting_windows: int,
    complete: bool,
    expected_windows: int | None = None,
) -> dict[str, Any]:
    """The suite parameters of one run (see the module docstring's table).

    Args:
        run_id: the run. partitions: P (>= 1). window_ms: window size, ms of event time.
        alerting_windows: rows of the run's windows table with alert = true.
        complete: a bounded run that had to read everything produced (True), or a stopped
            continuous run (False: unread and pending events are allowed, and fewer windows).
        expected_windows: YSB: the windows the generator recorded (rows of
            `expected_views.parquet`); None for a job without such a record.

    Returns:
        `{"run_ids", "window_ms", "max_slot", "alerting_windows", "max_unread_events",
        "max_pending_events"}`, plus `"min_windows", "max_windows"` with `expected_windows`.
    """
    windows = {} if expected_windows is None else {
        "min_windows": int(expected_windows) if complete else 0, "max_windows": int(expected_windows)}
    return {
        **windows,
        "run_ids": [run_id],
        "window_ms": int(window_ms),
        "max_slot": int(partitions) - 1,
        "alerting_windows": int(alerting_windows),
        "max_unread_events": 0 if complete else None,
        "max_pending_events": 0 if complete else None,
    }
