"""`keyshift stack`: start, check and stop the local Kafka, Redis and Airflow (and, with `--cluster`, a
Spark standalone cluster, an HDFS and an S3-compatible object store); fetch the jars."""

from __future__ import annotations

import logging

import click

from keyshift import stack
from keyshift.settings import Settings
from keyshift.stack.service import ServiceStatus

_ONLY_HELP = f"Comma-separated services to act on, from: {', '.join(stack.START_ORDER)}."


@click.group(name="stack")
def command() -> None:
    """Start, check and stop the local stack (Kafka, Redis, Airflow; a Spark cluster, HDFS and S3 with --cluster) under the state dir."""
    # kafka-python logs every connection at INFO; health probes would drown the useful lines.
    logging.getLogger("kafka").setLevel(logging.WARNING)


def _print_status(statuses: list[ServiceStatus]) -> None:
    for item in statuses:
        line = f"{item.name:<8} {item.state:<11} {item.address:<26}"
        click.echo(f"{line} {item.detail}".rstrip())
        for proc in item.processes:
            pid = f"pid {proc.pid}" if proc.pid else "not running"
            click.echo(f"  {proc.name:<22} {pid:<12} log {proc.log_file}")


@command.command()
@click.option("--only", default=None, show_default="all", metavar="SERVICES", help=_ONLY_HELP)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1),
    default=stack.DEFAULT_TIMEOUT_S,
    show_default=True,
    metavar="SECONDS",
    help="Seconds each service may take to become healthy, counted from its start.",
)
@click.option("--cluster", is_flag=True, help="Also start a Spark standalone cluster (a master and "
              "KEYSHIFT_SPARK_WORKERS workers on loopback), an HDFS and an S3-compatible store (moto, bucket keyshift); "
              "jobs use them with KEYSHIFT_SPARK_MASTER=spark://127.0.0.1:7077 and KEYSHIFT_CHECKPOINT_LOCATION="
              "hdfs://127.0.0.1:8020/keyshift/checkpoints, or s3a://keyshift/checkpoints with KEYSHIFT_S3_ENDPOINT=http://127.0.0.1:9000.")
def up(only: str | None, timeout_s: float, cluster: bool) -> None:
    """Start what is down and wait until every service is healthy (reuses running ones)."""
    settings = Settings()
    took = stack.up(settings, only or None, timeout_s=timeout_s, cluster=cluster)
    for name, seconds in took.items():
        click.echo(f"{name} healthy after {seconds:.1f} s")
    _print_status(stack.status(settings, only or ",".join(took)))
    if "airflow" in took:
        from keyshift.stack import airflow

        click.echo(f"Airflow UI and API: {airflow.login_hint(settings)}")


@command.command()
@click.option("--only", default=None, show_default="all", metavar="SERVICES", help=_ONLY_HELP)
def down(only: str | None) -> None:
    """Stop the services keyshift started (by pid file); leaves anything else alone."""
    stopped = stack.down(Settings(), only or None)
    click.echo(f"stopped: {', '.join(stopped)}" if stopped else "nothing of keyshift's was running")


@command.command()
@click.option("--only", default=None, show_default="all", metavar="SERVICES", help=_ONLY_HELP)
def status(only: str | None) -> None:
    """Print each service's state, address, processes and log files."""
    _print_status(stack.status(Settings(), only or None))


@command.command()
def fetch() -> None:
    """Fetch the Kafka broker's jars and Spark's Kafka connector jars once; start nothing."""
    fetched = stack.fetch(Settings())
    for name, jars in fetched.items():
        folder = jars[0].parent if jars else "-"
        click.echo(f"{name}: {len(jars)} jars in {folder}")
