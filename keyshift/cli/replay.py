"""`keyshift replay`: produce a real data set into Kafka in event-time order."""

from __future__ import annotations

import click

from keyshift import stack
from keyshift.cli.topics import quiet_kafka_logs
from keyshift.data.replay import replay_flights
from keyshift.names import FLIGHTS_TOPIC
from keyshift.placement.strategies import STRATEGY_NAMES
from keyshift.settings import Settings


@click.group(name="replay")
def command() -> None:
    """Replay real data sets into Kafka, placed by a keyshift strategy."""
    quiet_kafka_logs()


@command.command()
@click.option("--topic", default=FLIGHTS_TOPIC, help="Topic to produce to; it must exist (`keyshift topics create`).")
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=None,
    show_default="all 3,000,000",
    help="Replay only the first N flights (events).",
)
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    show_default="unlimited",
    metavar="EVENTS_PER_S",
    help="Average produce rate in events/s (token bucket).",
)
@click.option(
    "--strategy",
    type=click.Choice(STRATEGY_NAMES),
    default="hash",
    help="Placement strategy: key -> partition. least_key, least_count and hot_split use the assignment "
    "published under --topic (`keyshift topics create --strategy NAME`).",
)
@click.option(
    "--partitions",
    type=click.IntRange(min=1),
    default=None,
    show_default="the topic's",
    help="Expected partition count P; the replay refuses a topic with another count.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    show_default="1 with --rate, else min(CPUs, P, 4)",
    help="Producer processes; each owns whole partitions, so order within a partition is kept.",
)
@click.option("--progress/--no-progress", default=True, help="Show a progress bar.")
def flights(
    topic: str,
    limit: int | None,
    rate: float | None,
    strategy: str,
    partitions: int | None,
    workers: int | None,
    progress: bool,
) -> None:
    """Produce the flights to --topic in event-time order: key origin, JSON value, one per flight.

    Value: {"event_id", "origin", "destination", "delay_min", "distance_mi", "event_time"
    (epoch ms UTC)}. The count produced and the end offsets are stored in Redis. A key that a
    hot_split assignment spreads over k slots is placed per event: slots[event_id % k].
    """
    settings = Settings()
    stack.require(settings, "kafka", "redis")
    result = replay_flights(
        settings,
        topic,
        limit=limit,
        rate=rate,
        strategy=strategy,
        partitions=partitions,
        progress=progress,
        workers=workers,
    )
    click.echo(
        f"produced {result.events_produced:,} events to {result.topic} in {result.seconds:.1f} s "
        f"({result.events_per_s:,.0f} events/s, strategy {result.strategy}, epoch {result.epoch}, "
        f"{result.workers} worker(s))"
    )
    for key, slots in result.split_keys.items():
        click.echo(f"  {key} split over slots {', '.join(map(str, slots))}: event_id % {len(slots)} picks the slot")
    for partition, count in result.per_partition.items():
        click.echo(f"  partition {partition}: {count:>10,} produced, end offset {result.end_offsets[partition]:,}")
