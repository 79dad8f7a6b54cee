"""`keyshift topics`: create and describe the Kafka topics."""

from __future__ import annotations

import logging

import click

from keyshift import stack, topics
from keyshift.errors import ConfigurationError
from keyshift.names import FLIGHT_TOPICS
from keyshift.data.flights import flights_path
from keyshift.placement.learning import LEARN_FRACTION, LEARNED_STRATEGIES, learn_and_publish
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

With a learned --strategy ({", ".join(LEARNED_STRATEGIES)}) the assignment is then learned from
the origin counts of the first --learn-fraction of the flights (of --learn-limit flights when
given) and published in Redis under the input topic's name with a new epoch, where
`keyshift replay flights --strategy NAME` and the job read it. hot_split also publishes its
split keys (a key above 1/P of the events on two slots or more, its records placed per event).
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
    help="Placement strategy the topics will be written with; checked against P; a learned one is learned and published.",
)
@click.option("--replication", type=click.IntRange(min=1), default=None, show_default="the stack's: min(3, KEYSHIFT_KAFKA_BROKERS)",
              help="Replicas per partition.")
@click.option("--recreate", is_flag=True, help="Delete existing topics and create them again (their records are lost).")
@click.option(
    "--input-topic",
    default=None,
    show_default="the first of NAMES",
    help="Learned strategies: the topic whose assignment is published (its name names it in Redis).",
)
@click.option(
    "--learn-fraction",
    type=click.FloatRange(min=0, max=1, min_open=True),
    default=LEARN_FRACTION,
    help="Learned strategies: share of the flights to learn the origin counts from.",
)
@click.option(
    "--learn-limit",
    type=click.IntRange(min=1),
    default=None,
    show_default="all 3,000,000",
    help="Learned strategies: flights the replay will produce (events); the fraction is taken of these.",
)
def create(
    names: tuple[str, ...],
    partitions: int | None,
    strategy: str,
    replication: int | None,
    recreate: bool,
    input_topic: str | None,
    learn_fraction: float,
    learn_limit: int | None,
) -> None:
    """Create topics NAMES (help text: `_CREATE_HELP`, built from `keyshift.names`)."""
    settings = Settings()
    count = partitions or settings.partitions
    strategy_by_name(strategy, count)
    names = names or FLIGHT_TOPICS
    if input_topic is not None and input_topic not in names:
        raise click.BadParameter(f"{input_topic!r} is not among the topics {', '.join(names)}", param_hint="--input-topic")
    topics.check_topic_names(names)
    # a learned strategy is published in Redis: check it before any topic is touched
    stack.require(settings, "kafka", *(["redis"] if strategy in LEARNED_STRATEGIES else []))
    outcome = topics.create_topics(settings, names, count, replication=replication, recreate=recreate)
    for name, what in outcome.items():
        click.echo(f"{name:<28} {what:<10} {count} partitions")
    if strategy in LEARNED_STRATEGIES:
        learned = learn_and_publish(settings, input_topic or names[0], strategy, count, learn_limit, learn_fraction,
                                    flights=flights_path(settings))
        click.echo(
            f"{learned.strategy} assignment for {learned.name}: epoch {learned.epoch}, {learned.keys} keys over "
            f"{learned.partitions} slots, learned from the first {learned.events:,} flights; "
            f"{len(learned.split)} split key(s)"
        )
        for key, slots in sorted(learned.split.items(), key=lambda item: str(item[0])):
            click.echo(f"  {key:<10} split over slots {', '.join(map(str, slots))}")


@command.command()
@click.argument("names", nargs=-1)
def describe(names: tuple[str, ...]) -> None:
    """Show partitions, replication and records of topics NAMES (default: all but internal).

    A named topic that does not exist is listed as missing and makes the command fail (exit 1).
    """
    settings = Settings()
    found = topics.describe_topics(settings, names or None)
    missing = [n for n in names if n not in found]
    click.echo(f"{'topic':<28} {'partitions':>10} {'replicas':>8} {'records':>12}")
    for name, info in found.items():
        records = sum(topics.end_offsets(settings, name).values())
        click.echo(f"{name:<28} {info.partitions:>10} {info.replication:>8} {records:>12,}")
    for name in missing:
        click.echo(f"{name:<28} {'(missing)':>10}")
    if missing:
        listed = " ".join(missing)
        raise ConfigurationError(
            f"topic(s) {', '.join(map(repr, missing))} do not exist; create them with `keyshift topics create {listed}`"
        )
