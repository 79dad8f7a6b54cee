"""`keyshift bench`: benchmarks that write a JSON report (and a plot) for the issue's numbers."""

from __future__ import annotations

from pathlib import Path

import click

from keyshift.cli.topics import quiet_kafka_logs
from keyshift.settings import Settings


@click.group(name="bench")
def command() -> None:
    """Benchmark keyshift's parts on the real flights and on synthetic keys."""
    quiet_kafka_logs()


@command.command()
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="JSON report to write; the PNG goes beside it.")
@click.option("--events", type=click.IntRange(min=1), default=3_000_000, help="Events per synthetic stream.")
@click.option("--keys", type=click.IntRange(min=1), default=10_000, help="Distinct keys per synthetic stream.")
@click.option("--seed", type=int, default=0, help="Seed of the synthetic streams (numpy).")
@click.option("--partitions", "-p", type=click.IntRange(min=1), multiple=True, help="P values (repeat).  [default: 4 8 16 32]")
@click.option("--flights/--no-flights", default=True, help="Include the cached flights (needs `keyshift data fetch flights`).")
@click.option(
    "--broker/--no-broker",
    default=None,
    show_default="use the broker if one answers at the settings' address",
    help="Measure the partitioner ratio with real producers on the running broker (never started here).",
)
@click.option("--progress/--no-progress", default=True, help="Show a progress bar.")
def placement(
    out: Path, events: int, keys: int, seed: int, partitions: tuple[int, ...], flights: bool, broker: bool | None, progress: bool
) -> None:
    """Balance of every placement strategy (whole / online) and the partitioner's throughput ratio.

    Streams: flights by origin and by route, Zipf keys (s = 0.8, 1.0, 1.2) and uniform keys;
    one row per (dataset, key, P, strategy, mode). Prints the issue's targets with their values.
    """
    from keyshift.bench import placement as bench
    from keyshift.data.flights import flights_path

    settings = Settings()
    if broker:  # asked for: fail now, not after minutes of balance benchmarks
        from keyshift import stack

        stack.require(settings, "kafka")
    streams = bench.flights_streams(flights_path(settings)) if flights else []
    streams += bench.synthetic_streams(events, keys, seed)
    if broker is None:
        broker = bench.broker_reachable(settings)
    report = bench.run_placement_bench(
        streams,
        out,
        partitions=partitions or bench.PARTITIONS,
        broker=settings if broker else None,
        progress=progress,
    )
    click.echo(f"{len(report['rows'])} rows -> {out} (plot {report['plot']})")
    for target in report["targets"]:
        value = target["value"]
        shown = "n/a" if value is None else f"{value:.4f}"
        verdict = {True: "met", False: "NOT met", None: "not measured"}[target["met"]]
        click.echo(f"  {target['target']}: {shown} ({verdict})")
    throughput = report["partitioner_throughput"]
    click.echo(
        f"  partitioner: keyshift {throughput['keyshift_records_per_s']:,} records/s, default "
        f"{throughput['default_records_per_s']:,} records/s ({throughput['method']})"
    )
    if "without_broker" in throughput:
        offline = throughput["without_broker"]
        click.echo(f"  partitioner call path without a broker: ratio {offline['ratio']:.2f}")
