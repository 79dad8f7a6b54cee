"""`keyshift dq`: data quality of a finished run with Great Expectations.

`run --run RUN_ID` runs the run's job's checkpoints of the committed GX context
(`keyshift/quality/gx/`; flights: the windows table, the run's alert records, the run's
reconciliation; YSB: the windows table against the generator's record, the reconciliation) on
`runs/<run_id>/`, builds the run's Data Docs in `runs/<run_id>/data_docs/index.html`, writes
`runs/<run_id>/quality.json`, prints one line per suite, and exits 1 with one line per failed
expectation (`error: ...`) when a suite fails.
"""

from __future__ import annotations

import click

from pathlib import Path

from keyshift.names import ALERTS_TOPIC


@click.group(name="dq")
def command() -> None:
    """Data quality: Great Expectations checkpoints on a run's outputs."""


@command.command(name="run")
@click.option("--run", "run_id", required=True, help="Run id: validates runs/<run_id>/ (summary.json must exist).")
@click.option("--window-ms", type=click.IntRange(min=1), default=None,
              help="The job's window size, ms of event time. Default: the summary's window_ms, else 3600000.")
@click.option("--complete/--partial", default=None,
              help="Whether the run had to read every event produced (a bounded run) or may stop short "
                   "(a stopped continuous run). Default: bounded when the summary has end offsets.")
@click.option("--alerts-topic", default=ALERTS_TOPIC, help="Topic the flight job sent its alerts to.")
@click.option("--expected-views", type=click.Path(dir_okay=False, path_type=Path), default=None,
              show_default="the record of the replay the run read (runs/ysb-<id>/expected_views.parquet)",
              help="YSB: the generator's views per campaign and window to compare the windows with.")
def run(run_id: str, window_ms: int | None, complete: bool | None, alerts_topic: str, expected_views: Path | None) -> None:
    """Run the checkpoints of the run's job on finished run RUN_ID and write its Data Docs.

    Suites of a flight delay run: flight_delay_windows (the windows table), flight_delay_alerts
    (the run's records on the alerts topic, each matched to an alerting window of the run),
    run_reconciliation (events produced = events read = Σ window counts + late + dead letters +
    filtered + pending). Of a YSB run: ysb_windows (the windows table; each count equal to the
    generator's recorded views) and run_reconciliation. The job comes from runs/RUN_ID/job.json.
    """
    from keyshift.quality.checkpoints import validate_run
    from keyshift.settings import Settings

    report = validate_run(Settings(), run_id, window_ms=window_ms, complete=complete, alerts_topic=alerts_topic,
                          expected_views=expected_views)
    for suite in report.suites:
        state = "passed" if suite.success else f"FAILED {len(suite.failed)}"
        click.echo(f"{suite.suite:<22} {suite.rows:>8} rows  {suite.evaluated:>3} expectations  {state}")
    click.echo(f"Data Docs: {report.data_docs}")
    report.raise_for_failures()
