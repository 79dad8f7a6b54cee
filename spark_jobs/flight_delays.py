"""Flight delay alerts: hourly delay windows per origin airport from the `flights` Kafka topic.

Usage (the job sets its own Kafka connector jars; the master comes from spark-submit):

    spark-submit --master 'local[*]' spark_jobs/flight_delays.py --run-id demo1 --strategy hash \
        --partitions 8 --bound-ms 3600000 --limit 20000

Source -> parse & validate (bad -> flights-dead-letter) -> watermark -> slot token ->
transformWithStateInPandas(KeyedWindowProcessor, the flights spec) -> windows (runs/<run_id>/windows/),
alerts (flight-delay-alerts), late events (flights-late), per-slot loads. `--help` lists options.
"""

import json
import logging

import click

from keyshift.cli.job import flight_delay_options, run_from_options


@click.command(context_settings={"show_default": True})
@flight_delay_options
def main(**options) -> None:
    """Run the flight delay job and print its summary as JSON."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    click.echo(json.dumps(run_from_options(**options), indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
