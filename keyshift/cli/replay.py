"""`keyshift replay`: produce a real data set into Kafka in event-time order, or with sources made late;
or generate the Yahoo Streaming Benchmark's ad events (`keyshift replay ysb`)."""

from __future__ import annotations

import click

from keyshift import stack
from keyshift.cli.topics import quiet_kafka_logs
from keyshift.data.disorder import DEFAULT_SOURCE_DELAY_S, DisorderPlan, validate_disorder
from keyshift.data.replay import replay_flights
from keyshift.names import FLIGHTS_TOPIC, YSB_TOPIC
from keyshift.placement.strategies import STRATEGY_NAMES
from keyshift.settings import Settings


@click.group(name="replay")
def command() -> None:
    """Replay real data sets into Kafka, placed by a keyshift strategy."""
    quiet_kafka_logs()


def placement_options(key: str, learned: str):
    """The --strategy and --partitions options of a replay whose records are keyed by `key`;
    `learned` says where its learned strategies' assignment comes from."""
    strategy = click.option(
        "--strategy",
        type=click.Choice(STRATEGY_NAMES),
        default="hash",
        show_default=True,
        help=f"Placement strategy: record key ({key}) -> partition. least_key, least_count and hot_split {learned}; "
        "round_robin sends event n to partition n mod P whatever its key.",
    )
    partitions = click.option(
        "--partitions",
        type=click.IntRange(min=1),
        default=None,
        show_default="the topic's",
        help="Expected partition count P; the replay refuses a topic with another count.",
    )
    return lambda function: strategy(partitions(function))


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
@placement_options("origin", "use the assignment published under --topic (`keyshift topics create --strategy NAME`)")
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


@command.command()
@click.option("--topic", default=YSB_TOPIC, show_default=True, help="Topic to produce to; it must exist (`keyshift topics create ysb-ad-events`).")
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
    required=True,
    metavar="EVENTS_PER_S",
    help="Events per second: the send rate (token bucket) and the spacing of event times (1000/rate ms).",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=0, min_open=True),
    required=True,
    metavar="SECONDS",
    help="Seconds of generation (of event time); floor(rate x duration) events in all.",
)
@click.option("--campaigns", type=click.IntRange(min=1), default=100, show_default=True, help="Campaigns (the job's keys).")
@click.option("--ads-per-campaign", type=click.IntRange(min=1), default=10, show_default=True, help="Ads per campaign.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed: same seed, same ids and events.")
@click.option(
    "--zipf",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="S",
    show_default="uniform",
    help="Skew ads' popularity: the ad of rank r is drawn with probability proportional to r^-S.",
)
@placement_options(
    "campaign_id", "are learned from the campaign counts of the run's first 10 % of events and published under --topic"
)
@click.option(
    "--start-ms",
    type=click.IntRange(min=0),
    default=None,
    metavar="EPOCH_MS",
    show_default="now, paced in real time",
    help="Backfill: event times from this epoch millisecond, sent as fast as possible (no wall-clock pacing).",
)
@click.option("--run-id", default=None, show_default="ysb-<UTC time>-<hex>", help="Names the record folder runs/ysb-<run_id>/.")
@click.option("--progress/--no-progress", default=True, help="Show a progress bar.")
def ysb(
    topic: str,
    rate: float,
    duration: float,
    campaigns: int,
    ads_per_campaign: int,
    seed: int,
    zipf: float | None,
    strategy: str,
    partitions: int | None,
    start_ms: int | None,
    run_id: str | None,
    progress: bool,
) -> None:
    """Yahoo Streaming Benchmark generator: JSON ad events to --topic, the ad -> campaign map to Redis.

    Value: {"event_id", "user_id", "page_id", "ad_id", "ad_type", "event_type" (view, click,
    purchase, uniform), "event_time" (epoch ms), "ip_address"}; key: the ad's campaign_id. Writes
    runs/ysb-<run_id>/expected_views.parquet (views per campaign and 10-second window) and
    ysb.json (parameters and totals per event type).
    """
    from keyshift.runtime.job_options import new_run_id
    from keyshift.data.ysb import generate_ysb

    settings = Settings()
    stack.require(settings, "kafka", "redis")
    result = generate_ysb(
        settings,
        topic,
        rate=rate,
        duration=duration,
        campaigns=campaigns,
        ads_per_campaign=ads_per_campaign,
        seed=seed,
        zipf=zipf,
        strategy=strategy,
        partitions=partitions,
        start_ms=start_ms,
        run_id=run_id or new_run_id("ysb").removeprefix("ysb-"),
        progress=progress,
    )
    replay = result.replay
    click.echo(
        f"produced {replay.events_produced:,} YSB events to {replay.topic} in {replay.seconds:.1f} s "
        f"({replay.events_per_s:,.0f} events/s, strategy {replay.strategy}, epoch {replay.epoch}); "
        + ", ".join(f"{count:,} {name}" for name, count in result.events_by_type.items())
    )
    click.echo(f"  {result.views:,} views in {result.windows:,} campaign windows; record in {result.run_dir}")
    if result.wall_clock:
        click.echo(f"  at worst {result.behind_schedule_ms:,} ms behind the events' times")
    for partition, count in replay.per_partition.items():
        click.echo(f"  partition {partition}: {count:>10,} produced, end offset {replay.end_offsets[partition]:,}")


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
