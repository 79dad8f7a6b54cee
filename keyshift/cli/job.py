"""`keyshift job run [--job NAME]`: run a registered keyed window job in this process (local Spark).

Jobs (`keyshift.jobs.job_specs`): `flight_delays` (hourly tumbling windows per origin, with
alerts; the default), `flight_delays_sliding` (1 h windows every minute per origin, computed
with key windows) and `ysb` (views per campaign per 10 s window, the Yahoo Streaming Benchmark;
`--topic` and `--window-ms` default to the job's own: ysb-ad-events, 10,000 ms). `keyshift job run flight_delays` (the job as an argument) still works."""

from __future__ import annotations

import click

from keyshift.cli.output import run_output_options, run_terminal
from keyshift.console import print_summary
from keyshift.jobs import job_names
from keyshift.runtime.job_options import job_options, run_from_options


@click.group(name="job")
def command() -> None:
    """Run streaming jobs."""


@command.command(name="run")
@click.argument("job", type=click.Choice(job_names()), required=False)
@job_options
@run_output_options
def run(job: str | None, as_json: bool, progress: bool, **options) -> None:
    """Run a job in this process on local Spark and print a summary table (--json: the summary as
    JSON; it is in runs/<run_id>/summary.json either way).

    The job is --job NAME (or the JOB argument; default flight_delays). flight_delays: hourly
    delay windows per origin from the flights topic, with alerts, late events and dead letters.
    flight_delays_sliding: 1 h windows every minute per origin as key window updates (paper 003),
    with late events and dead letters. With --limit it reads the records as they arrive, drains and
    stops; without, it runs until Ctrl-C or SIGTERM, which stop it at the next batch boundary with
    its summary (a second Ctrl-C stops at once; --resume RUN_ID continues either). Log lines of Spark, its Python workers and keyshift go to runs/<run_id>/driver.log;
    the terminal shows the steps, a progress bar and warnings.
    """
    if job and options.get("job_name") and job != options["job_name"]:
        raise click.UsageError(f"the argument names job {job} but --job names {options['job_name']}; give one")
    options["job_name"] = options.get("job_name") or job
    with run_terminal():
        summary = run_from_options(driver_log=True, progress=progress, **options)
    print_summary(summary, as_json=as_json)
