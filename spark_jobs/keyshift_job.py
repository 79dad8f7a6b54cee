"""Run a keyshift job (`--job NAME`, default flight_delays) under spark-submit; Airflow launches this file.

Usage (the job sets its own Kafka connector jars; the master comes from spark-submit):

    spark-submit --master 'local[*]' spark_jobs/keyshift_job.py --run-id demo1 --strategy hash \
        --partitions 8 --bound-ms 3600000 --limit 20000

Source -> parse & validate (bad -> the job's dead-letter topic) -> watermark -> slot token ->
the keyed window processor -> windows (runs/<run_id>/windows/), alerts, late events, per-slot
loads (`keyshift.processing.job_query`). `--help` lists options.
"""

import json
import logging

import click

from keyshift.runtime.job_options import job_options, run_from_options


@click.command(context_settings={"show_default": True})
@job_options
def main(**options) -> None:
    """Run the job and print its summary as JSON."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    click.echo(json.dumps(run_from_options(**options), indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
