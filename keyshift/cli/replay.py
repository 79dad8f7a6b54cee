"""`keyshift replay`: produce a real data set into Kafka in event-time order, or with sources made late."""

from __future__ import annotations

import click

from keyshift import stack
from keyshift.cli.topics import quiet_kafka_logs
from keyshift.data.disorder import DEFAULT_SOURCE_DELAY_S, DisorderPlan, validate_disorder
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
@click.option(
    "--disorder",
    type=click.FloatRange(min=0, max=1, max_open=True),
    default=0.0,
    metavar="FRACTION",
    help="Fraction of the events to arrive out of event-time order, in [0, 1) (paper 000 Table 10: 0.25, 0.5, "
    "0.75): whole origins are made late, each keeping its own order. 0 = file order.",
)
@click.option(
    "--source-delay",
    type=click.FloatRange(min=0.001, max=1e9),
    default=DEFAULT_SOURCE_DELAY_S,
    metavar="SECONDS",
    help="Arrival delay of a late origin: each draws one in [SECONDS/2, SECONDS] (seconds of event time; "
    "the flights' times are whole minutes, so delays under 60 s disorder nothing).",
)
@click.option(
    "--clock-skew",
    type=click.FloatRange(min=0, max=1e9),
    default=0.0,
    metavar="SECONDS",
    help="Clock error of a late origin: each draws an offset in [-SECONDS, +SECONDS] that shifts the event_time "
    "it writes; at most half of --source-delay.",
)
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=0,
    help="Seed of the disorder: the same seed replays the same late origins, delays and clock offsets.",
)
@click.option("--progress/--no-progress", default=True, help="Show a progress bar.")
def flights(
    topic: str,
    limit: int | None,
    rate: float | None,
    strategy: str,
    partitions: int | None,
    workers: int | None,
    disorder: float,
    source_delay: float,
    clock_skew: float,
    seed: int,
    progress: bool,
) -> None:
    """Produce the flights to --topic in event-time order: key origin, JSON value, one per flight.

    Value: {"event_id", "origin", "destination", "delay_min", "distance_mi", "event_time"
    (epoch ms UTC)}. The count produced and the end offsets are stored in Redis. A key that a
    hot_split assignment spreads over k slots is placed per event: slots[event_id % k].

    With --disorder FRACTION, origins chosen by a seeded search arrive late (--source-delay) and
    stamp times off by their clock offset (--clock-skew), so that FRACTION of the events arrive
    after an event with a later event time; each partition gets its records in that arrival
    order. The late origins and the achieved fraction are printed and stored in Redis.
    """
    validate_disorder(disorder, source_delay, clock_skew, seed)  # before any service is asked
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
        disorder=disorder,
        source_delay=source_delay,
        clock_skew=clock_skew,
        seed=seed,
    )
    click.echo(
        f"produced {result.events_produced:,} events to {result.topic} in {result.seconds:.1f} s "
        f"({result.events_per_s:,.0f} events/s, strategy {result.strategy}, epoch {result.epoch}, "
        f"{result.workers} worker(s))"
    )
    if result.disorder is not None:
        click.echo(describe_disorder(result.disorder))
    for key, slots in result.split_keys.items():
        click.echo(f"  {key} split over slots {', '.join(map(str, slots))}: event_id % {len(slots)} picks the slot")
    for partition, count in result.per_partition.items():
        click.echo(f"  partition {partition}: {count:>10,} produced, end offset {result.end_offsets[partition]:,}")


def describe_disorder(plan: DisorderPlan) -> str:
    """One line on a replay's disorder: target, achieved fraction, late origins, their delays and offsets."""
    text = (
        f"  disorder {plan.fraction:g} (seed {plan.seed}): {plan.out_of_order:.2%} of events out of order "
        f"({plan.out_of_order_events:,} of {plan.events:,}); {len(plan.delay_ms)} late origin(s)"
    )
    if plan.delay_ms:
        delays = [ms / 1000 for ms in plan.delay_ms.values()]
        offsets = [ms / 1000 for ms in plan.offset_ms.values()]
        text += f", delays {min(delays):,.0f}..{max(delays):,.0f} s"
        text += f", clock offsets {min(offsets):+,.0f}..{max(offsets):+,.0f} s"
    return text
