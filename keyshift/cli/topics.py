"""`keyshift topics`: create and describe the Kafka topics."""

from __future__ import annotations

import logging

import click

from keyshift import topics
from keyshift.names import FLIGHT_TOPICS
from keyshift.placement.strategies import STRATEGY_NAMES, strategy_by_name
from keyshift.settings import Settings


def quiet_kafka_logs() -> None:
    """Silence kafka-python's own log lines unless -v: every failure surfaces as a keyshift error."""
    if not logging.getLogger().isEnabledFor(logging.DEBUG):
        logging.getLogger("kafka").setLevel(logging.CRITICAL)


@click.group(name="topics")
def command() -> None:
    """Create and describe Kafka topics on the local broker."""
    quiet_kafka_logs()


_CREATE_HELP = f"""Create topics NAMES with P partitions; idempotent.

An existing topic with P partitions is kept; one with another count is an error unless
--recreate. Default NAMES: {", ".join(FLIGHT_TOPICS)}.
"""


@command.command(help=_CREATE_HELP)
@click.argument("names", nargs=-1)
@click.option(
    "--partitions",
    type=click.IntRange(min=1),
    default=None,
    show_default="settings.partitions (8; env KEYSHIFT_PARTITIONS)",
    help="Partitions per topic: P, the number of slots.",
)
@click.option(
    "--strategy",
    type=click.Choice(STRATEGY_NAMES),
    default="hash",
    help="Placement strategy the topics will be written with; checked against P.",
)
@click.option("--replication", type=click.IntRange(min=1), default=1, help="Replicas per partition.")
@click.option("--recreate", is_flag=True, help="Delete existing topics and create them again (their records are lost).")
def create(names: tuple[str, ...], partitions: int | None, strategy: str, replication: int, recreate: bool) -> None:
    """Create topics NAMES (help text: `_CREATE_HELP`, built from `keyshift.names`)."""
    settings = Settings()
    count = partitions or settings.partitions
    strategy_by_name(strategy, count)
    outcome = topics.create_topics(settings, names or FLIGHT_TOPICS, count, replication=replication, recreate=recreate)
    for name, what in outcome.items():
        click.echo(f"{name:<28} {what:<10} {count} partitions")


@command.command()
@click.argument("names", nargs=-1)
def describe(names: tuple[str, ...]) -> None:
    """Show partitions, replication and records of topics NAMES (default: all but internal)."""
    settings = Settings()
    found = topics.describe_topics(settings, names or None)
    missing = [n for n in names if n not in found]
    click.echo(f"{'topic':<28} {'partitions':>10} {'replicas':>8} {'records':>12}")
    for name, info in found.items():
        records = sum(topics.end_offsets(settings, name).values())
        click.echo(f"{name:<28} {info.partitions:>10} {info.replication:>8} {records:>12,}")
    for name in missing:
        click.echo(f"{name:<28} {'(missing)':>10}")
