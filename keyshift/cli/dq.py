"""`keyshift dq`: data quality of a finished run with Great Expectations.

`run --run RUN_ID` runs the three checkpoints of the committed GX context
(`keyshift/quality/gx/`: the windows table, the run's alert records, the run's reconciliation)
on `runs/<run_id>/`, builds the run's Data Docs in `runs/<run_id>/data_docs/index.html`, writes
`runs/<run_id>/quality.json`, prints one line per suite, and exits 1 with one line per failed
expectation (`error: ...`) when a suite fails.
"""

from __future__ import annotations

import click

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
@click.option("--alerts-topic", default=ALERTS_TOPIC, help="Topic the job sent its alerts to.")
def run(run_id: str, window_ms: int | None, complete: bool | None, alerts_topic: str) -> None:
    """Run the checkpoints on finished run RUN_ID and write its Data Docs.

    Suites: flight_delay_windows (the windows table), flight_delay_alerts (the run's records on
    the alerts topic, each matched to an alerting window of the run), run_reconciliation
    (events produced = events read = Σ window counts + late + dead letters + pending).
    """
    from keyshift.quality.checkpoints import validate_run
    from keyshift.settings import Settings

    report = validate_run(Settings(), run_id, window_ms=window_ms, complete=complete, alerts_topic=alerts_topic)
    for suite in report.suites:
        state = "passed" if suite.success else f"FAILED {len(suite.failed)}"
        click.echo(f"{suite.suite:<22} {suite.rows:>8} rows  {suite.evaluated:>3} expectations  {state}")
    click.echo(f"Data Docs: {report.data_docs}")
    report.raise_for_failures()
