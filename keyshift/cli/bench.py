"""`keyshift bench`: benchmarks that write a JSON report (and a plot) for the issue's numbers."""

from __future__ import annotations

from pathlib import Path

import click

from keyshift.bench import switch as switch_bench
from keyshift.bench.throughput import COLD_START_RECORDS
from keyshift.cli.topics import quiet_kafka_logs
from keyshift.settings import DEFAULT_PARTITIONS, Settings


def master_option(function):
    """`--master URL`: the Spark master the bench's jobs run on (default: the settings',
    `KEYSHIFT_SPARK_MASTER`, `local[*]` unless set)."""
    return click.option("--master", default=None, metavar="URL",
                        help="Spark master of the benchmarked jobs, e.g. spark://127.0.0.1:7077 (`keyshift stack up --only spark`)."
                             "  [default: KEYSHIFT_SPARK_MASTER, local[*]]")(function)


def _settings(master: str | None) -> Settings:
    return Settings(spark_master=master) if master else Settings()


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


@command.command(name="switch")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="JSON report to write; the PNG goes beside it.")
@click.option("--flights", type=click.IntRange(min=1), default=switch_bench.FLIGHTS, show_default=True, help="Flights (events) each run reads.")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=switch_bench.RATE, show_default=True,
              help="Events/s the switching run is fed at.")
@click.option("--max-offsets-per-trigger", "per_trigger", type=click.IntRange(min=1), default=switch_bench.PER_TRIGGER, show_default=True,
              help="Records per micro-batch at most.")
@click.option("--bound-ms", type=click.IntRange(min=0), default=switch_bench.BOUND_MS, show_default=True,
              help="Watermark bound, ms of event time (one day: no late events in either run).")
@click.option("--sequence", default=switch_bench.SEQUENCE, show_default=True,
              help="STRATEGY[:P],...: the job's start placement, then one switch per entry (P kept when not given).")
@click.option("--sample-events", type=click.IntRange(min=1), default=switch_bench.SAMPLE_EVENTS, show_default=True, help="Records each switch's plan samples.")
@click.option("--switch-timeout", "switch_timeout_s", type=click.FloatRange(min=1), default=600.0, show_default=True,
              help="Seconds one switch may take.")
@master_option
@click.option("--progress/--no-progress", default=True, help="Show a progress bar.")
def switch(out: Path, flights: int, rate: float, per_trigger: int, bound_ms: int, sequence: str, sample_events: int,
           switch_timeout_s: float, master: str | None, progress: bool) -> None:
    """Switches of a running job fed at a steady rate: pause, steps, state moved, outputs identical.

    Runs an oracle (the same flights, backfilled, no switch), then the flight delay job on a topic
    fed at RATE events/s, switched through the sequence at evenly spaced points; compares the two
    windows tables. Prints the median pause, the step that dominates it and the issue's goals.
    """
    placements = switch_bench.parse_sequence(sequence)  # a bad sequence fails before anything runs
    report = switch_bench.run_switch_bench(_settings(master), out, flights=flights, rate=rate, per_trigger=per_trigger, bound_ms=bound_ms,
                                    sequence=placements, sample_events=sample_events, switch_timeout_s=switch_timeout_s,
                                    progress=progress)
    click.echo(f"{len(report['switches'])} switches -> {out} (plot {report['plot']})")
    for s in report["switches"]:
        click.echo(f"  {s['from']} -> {s['to']}: pause {s['pause_seconds']:.2f} s (longest step {s['dominant_step']}; "
                   f"{s['request_to_first_commit_seconds']:.2f} s from the request, state from the {s['state_source']}), "
                   f"{s['state_rows_moved']:,} state rows, {s['state_bytes_moved']:,} bytes moved, moved share "
                   f"{s['moved_share']:.3f} (min {s['min_moved_share']:.3f}), in driver: {s['in_driver']}")
        window = s.get("throughput_window") or {}
        if window.get("after_over_before") is not None:
            click.echo(f"    throughput {window['before_events_per_s']:,.0f} ev/s in the {window['window_seconds']:.0f} s before, "
                       f"{window['after_events_per_s']:,.0f} after (x {window['after_over_before']:.3f})")
    click.echo(f"  median pause {report['median_pause_seconds']} s ({report['median_request_to_first_commit_seconds']} s from "
               f"the request), dominated by {report['dominant_step']} "
               f"(median seconds per step {report['median_step_seconds']})")
    click.echo(f"  outputs identical: {report['outputs_identical']}, late events from switches: {report['late_events_from_switches']}")
    for name, target in report["goals"].items():
        verdict = {True: "met", False: "NOT met", None: "not measured"}[target["met"]]
        click.echo(f"  {name}: {target['value']} (goal {'>=' if target.get('at_least') else '<='} {target['goal']}, {verdict})")


@command.command(name="keywindows")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="JSON report to write; the PNG goes beside it.")
@click.option("--flights", type=click.IntRange(min=1), default=3_000_000, show_default=True, help="First N flights (events) of the file.")
@click.option("--size-ms", type=click.IntRange(min=1), default=3_600_000, show_default=True, help="Window size p, ms of event time.")
@click.option("--slide-ms", type=click.IntRange(min=1), default=60_000, show_default=True, help="Window slide s, ms (p a multiple of s).")
@click.option("--bound-ms", "bounds_ms", type=click.IntRange(min=0), multiple=True,
              help="Watermark bounds, ms (repeat; one row each).  [default: 0 600000 3600000 86400000]")
@click.option("--batch-rows", type=click.IntRange(min=1), default=250_000, show_default=True,
              help="Events per micro-batch of the incremental run.")
@click.option("--progress/--no-progress", default=True, help="Show a progress bar of the bounds.")
def keywindows(out: Path, flights: int, size_ms: int, slide_ms: int, bounds_ms: tuple[int, ...], batch_rows: int, progress: bool) -> None:
    """Key windows (paper 003) against Spark's native sliding windows, per origin on the real flights.

    Reports events, updates emitted (at most 2n), native windows (p·n/s bound and actual), the
    peak state of both ways under watermark = max event time − bound, in windows/events and bytes.
    """
    from keyshift.bench import key_windows as bench
    from keyshift.data.flights import flights_path

    report = bench.run_key_windows_bench(flights_path(Settings()), out, flights=flights, size_ms=size_ms, slide_ms=slide_ms,
                                         bounds_ms=bounds_ms or bench.BOUNDS_MS, batch_rows=batch_rows, progress=progress)
    click.echo(f"{len(report['rows'])} rows -> {out} (plot {report['plot']})")
    for row in report["rows"]:
        click.echo(f"  bound {row['bound_ms']:,} ms: {row['events']:,} events, {row['updates']:,} updates, native windows "
                   f"{row['native_windows']:,} (bound {row['native_windows_bound']:,}); peak state: native "
                   f"{row['peak_native_state_windows']:,} windows / {row['peak_native_state_bytes']:,} B, key windows "
                   f"{row['peak_key_window_state_events']:,} events / {row['peak_key_window_row_bytes']:,} B; "
                   f"incremental == batch: {row['incremental_equals_batch']}")


@command.command(name="watermark")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="JSON report to write; the PNG goes beside it.")
@click.option("--flights", type=click.IntRange(min=1), default=200_000, show_default=True, help="First N flights (events) each run reads.")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=5_000.0, show_default=True,
              help="Events/s of the paced replay the latencies are measured on.")
@click.option("--disorder", "disorders", type=click.FloatRange(min=0, max=1, max_open=True), multiple=True,
              help="Fraction of events out of order, whole sources late (repeat).  [default: 0 0.25 0.5 0.75]")
@click.option("--modes", default="global,key,nkey,dynamic,global_lossless", show_default=True,
              help="Configurations: global, key, nkey, dynamic (bound --bound-ms) and global_lossless (global with the bound it needs).")
@click.option("--bound-ms", type=click.IntRange(min=0), default=60_000, show_default=True,
              help="Watermark bound B, ms of event time (dynamic mode's maximum).")
@click.option("--partitions", type=click.IntRange(min=1), default=DEFAULT_PARTITIONS, show_default=True, help="P: topic partitions = slots.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed of the disorder.")
@click.option("--source-delay", type=click.FloatRange(min=0.001), default=86_400.0, show_default=True,
              help="Late sources arrive d in [D/2, D] seconds of event time late (default: 12 to 24 hours).")
@click.option("--progress/--no-progress", default=True, help="Print a line per run.")
def watermark(out: Path, flights: int, rate: float, disorders: tuple[float, ...], modes: str, bound_ms: int, partitions: int, seed: int,
              source_delay: float, progress: bool) -> None:
    """Watermark modes on real flights made out of order by whole sources (each source in order).

    Per disorder level and configuration: events per second (backfill), late fraction, output
    latency p50/p95 (paced replay), state bytes, paper 004's E; checks the issue's targets.
    """
    import json

    from keyshift.bench import watermark as bench

    config = bench.BenchSettings(flights=flights, rate=rate, partitions=partitions, disorders=disorders or bench.DISORDERS,
                                 modes=bench.parse_modes(modes), bound_ms=bound_ms, seed=seed, source_delay_s=source_delay)
    config.check()  # a bad value fails before anything runs
    report = bench.run_watermark_bench(Settings(), out, config, progress=progress)
    click.echo(f"{len(report['rows'])} rows -> {out} (plot {report['plot']}), {report['wall_seconds']:.0f} s")
    for row in report["rows"]:
        click.echo(f"  {row['mode']:>15} disorder {row['disorder']:<4g} bound {row['bound_ms']:>11,} ms: {row['events_per_second']} events/s ({row.get('events_per_cpu_second')} per CPU s), "
                   f"late {row['late_fraction']}, latency p50 {row['latency_p50_s']} s p95 {row['latency_p95_s']} s, "
                   f"state {row['state_bytes']} B, E {row['performance_ratio_E']}, equal to pandas {row['windows_equal_reference']}")
    for target in report["targets"]:
        verdict = {True: "met", False: "NOT met", None: "not measured"}[target["met"]]
        click.echo(f"  {target['target']}: {verdict} ({json.dumps(target['value'])})")


@command.command(name="drift")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="JSON report to write; the PNG goes beside it.")
@click.option("--flights", type=click.IntRange(min=1), default=None, help="First N flights of the file.  [default: all 3,000,000]")
@click.option("--every", type=click.IntRange(min=1), default=1, show_default=True,
              help="Keep one flight in EVERY (thinner data keeps the six months of drift at a smaller size).")
@click.option("--per-trigger", type=click.IntRange(min=1), default=250_000, show_default=True, help="Records per micro-batch.")
@click.option("--partitions", type=click.IntRange(min=1), default=DEFAULT_PARTITIONS, show_default=True, help="P: topic partitions = slots.")
@click.option("--bound-ms", type=click.IntRange(min=0), default=60_000, show_default=True, help="Watermark bound, ms of event time.")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Runs of key mode on each topic (alternating); the throughput goal compares the medians.")
@click.option("--baseline", type=click.Choice(["plain", "replay"]), default="plain", show_default=True,
              help="How the undrifted topic is written: plain (write_plain, as the drifted one) or replay (keyshift's replay, hash; needs --every 1).")
@click.option("--max-ahead-ms", type=click.IntRange(min=1), default=None,
              help="The job's --max-ahead-ms for every keyshift run.  [default: EVERY x 7 days when --every > 1, else the job's default]")
@click.option("--drift-bound-ms", type=click.IntRange(min=0), default=3_600_000, show_default=True,
              help="The --max-partition-drift-ms of the bounded runs (partition and key mode with watermark alignment).")
@click.option("--progress/--no-progress", default=True, help="Print a line per run.")
def drift(out: Path, flights: int | None, every: int, per_trigger: int, partitions: int, bound_ms: int, repeats: int, baseline: str,
          max_ahead_ms: int | None, drift_bound_ms: int, progress: bool) -> None:
    """Event time when Kafka partitions drift apart: flights whose busy and quiet origins swap
    half-way, written by a plain producer, read from earliest (keyshift.bench.drift).

    Runs, each a fresh process: the plain Spark job, then global, partition, key and dynamic
    mode on the drifted topic, partition and key mode with the drift bound on it (keyshift's
    aligned Kafka source), and key and partition mode on the undrifted one (key mode REPEATS
    times on each topic).
    Per run: events/s, late, dead letters, peak state, largest partition drift, windows equal
    to pandas; checks the issue's goals. Exits 1 with the reason when a run fails.
    """
    from keyshift.bench import drift as bench

    config = bench.DriftBenchSettings(flights=flights, every=every, per_trigger=per_trigger, partitions=partitions, bound_ms=bound_ms,
                                      repeats=repeats, baseline=baseline, max_ahead_ms=max_ahead_ms,
                                      drift_bound_ms=drift_bound_ms)
    config.check()
    report = bench.run_drift_bench(Settings(), out, config, progress=progress)
    click.echo(f"{len(report['rows'])} rows -> {out} (plot {report['plot']}), {report['wall_seconds']:.0f} s")
    for target in report["targets"]:
        verdict = {True: "met", False: "NOT met", None: "not measured"}[target["met"]]
        click.echo(f"  {target['target']}: {verdict} ({target['value']})")


@command.command(name="throughput")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="JSON report to write; the PNG goes beside it.")
@click.option("--config", "configs", multiple=True, help="P:strategy to run (repeat); the first gives ratio_whole/ratio_steady.  [default: 8:hash 32:hot_split]")
@click.option("--runs", type=click.IntRange(min=1), default=3, show_default=True, help="Runs of each job per configuration, alternating.")
@click.option("--flights", type=click.IntRange(min=1), default=None, help="Flights to replay; default all 3,000,000.")
@click.option("--max-offsets-per-trigger", "per_trigger", type=click.IntRange(min=1), default=250_000, show_default=True, help="Records per micro-batch at most, both jobs.")
@click.option("--cold-start-records", type=click.IntRange(min=0), default=COLD_START_RECORDS, show_default=True,
              help="Flights of the cold-start runs (batch 0 of a small batch, both jobs, --runs each); 0: none.")
@master_option
@click.option("--progress/--no-progress", default=True, help="Show a progress bar.")
def throughput(out: Path, configs: tuple[str, ...], runs: int, flights: int | None, per_trigger: int, cold_start_records: int,
               master: str | None, progress: bool) -> None:
    """keyshift's flight delay job against the plain Spark job a user would write instead.

    Same topic and records, alternating, each run a process of its own: whole-run and steady
    events/s, batch 0 seconds, driver and Python worker peak memory, the ratios and the issue's
    goals; keyshift's windows are checked against pandas in every run. The cold-start runs read
    a small topic in 10,000-record batches: batch 0 there is what a query pays before its first
    output whatever the batch size.
    """
    from keyshift.bench import throughput as bench

    chosen = bench.parse_configs(configs or ("8:hash", "32:hot_split"))
    report = bench.run_throughput_bench(_settings(master), out, chosen, runs=runs, flights=flights, per_trigger=per_trigger, progress=progress,
                                        cold_start_records=cold_start_records)
    for entry in report["ratio_by_config"]:
        click.echo(f"  P={entry['partitions']} {entry['strategy']}: keyshift {entry['keyshift_events_per_second']} ev/s "
                   f"(steady {entry['keyshift_steady_events_per_second']}, batch 0 {entry['keyshift_first_batch_seconds']} s), "
                   f"plain {entry['plain_events_per_second']} ev/s (steady {entry['plain_steady_events_per_second']}, "
                   f"batch 0 {entry['plain_first_batch_seconds']} s): ratio {entry['ratio_whole']} whole, {entry['ratio_steady']} steady")
    cold = report["cold_start"]
    if cold:
        click.echo(f"  cold start ({cold['records']:,} flights, {cold['per_trigger']:,} per batch): batch 0 keyshift "
                   f"{cold['keyshift_first_batch_seconds']} s, plain {cold['plain_first_batch_seconds']} s; later batches keyshift "
                   f"{cold['keyshift_steady_batch_seconds']} s, plain {cold['plain_steady_batch_seconds']} s")
    for goal in report["goals"]:
        verdict = {True: "met", False: "NOT met", None: "not measured"}[goal["met"]]
        click.echo(f"  {goal['goal']}: {verdict} ({goal['measured']})")
    click.echo(f"-> {out} (plot {out.with_suffix('.png')})")


@command.command(name="compare-masters")
@click.argument("first", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("second", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="JSON comparison to write; the PNG goes beside it.")
def compare_masters(first: Path, second: Path, out: Path) -> None:
    """Two reports of `bench throughput` (or of `bench switch`) on two Spark masters, side by side.

    FIRST and SECOND are the JSON reports, usually `--master local[*]` and `--master
    spark://...`. Prints, per job, the medians of both and their difference, and where task
    time went by Spark's event log (scheduler delay, deserialization, run, shuffle, executor
    start-up).
    """
    import json

    from keyshift.bench import masters

    comparison = masters.compare_reports(json.loads(first.read_text()), json.loads(second.read_text()))
    comparison["reports"] = [str(first), str(second)]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(comparison, indent=1) + "\n")
    masters.plot_comparison(comparison, out.with_suffix(".png"))
    first_master, second_master = comparison["masters"]
    click.echo(f"{comparison['bench']}: {first_master} vs {second_master} -> {out} (plot {out.with_suffix('.png')})")
    for job, table in comparison["jobs"].items():
        click.echo(f"  {job}:")
        for figure, values in table.items():
            if values["first"] is not None or values["second"] is not None:
                click.echo(f"    {figure:<38} {values['first']!s:>12} {values['second']!s:>12}  ({values['difference']:+})"
                           if values["difference"] is not None else f"    {figure:<38} {values['first']!s:>12} {values['second']!s:>12}")


@command.command(name="exchange")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="JSON report to write; the PNG goes beside it.")
@click.option("--job", "jobs", multiple=True, type=click.Choice(["flights", "ysb"]), help="Job to bench (repeat).  [default: flights ysb]")
@click.option("--flights", type=click.IntRange(min=1), default=1_000_000, show_default=True, help="Flights to replay.")
@click.option("--ysb-events", type=click.IntRange(min=1), default=1_000_000, show_default=True, help="YSB ad events to generate (all types).")
@click.option("--partitions", type=click.IntRange(min=1), default=DEFAULT_PARTITIONS, show_default=True, help="P partitions = slots.")
@click.option("--runs", type=click.IntRange(min=1), default=1, show_default=True, help="Runs of each strategy.")
@click.option("--max-offsets-per-trigger", "per_trigger", type=click.IntRange(min=1), default=250_000, show_default=True,
              help="Records per micro-batch at most, every run.")
@click.option("--progress/--no-progress", default=True, help="Show a progress bar.")
def exchange(out: Path, jobs: tuple[str, ...], flights: int, ysb_events: int, partitions: int, runs: int, per_trigger: int,
             progress: bool) -> None:
    """The exchange strategies (plain, local_merge, global_merge, ahead_keyby) for the flights and YSB.

    Shuffle bytes, events/s, batch latency p95 and whether the results are identical (flights:
    pandas; YSB: the generator's record) per job and strategy, and YSB through keyshift against
    plain Spark Structured Streaming running the published YSB job on the same topic.
    """
    from keyshift.bench import exchange as bench

    report = bench.run_exchange_bench(Settings(), out, jobs or ("flights", "ysb"), flights=flights, ysb_events=ysb_events,
                                      partitions=partitions, runs=runs, per_trigger=per_trigger, progress=progress)
    for row in report["rows"]:
        click.echo(f"  {row['job']:8} {bench.row_label(row):18} shuffle {row['shuffle_bytes']} B, {row['events_per_second']} ev/s, "
                   f"batch latency p95 {row['latency_p95_s']} s, identical {row['results_identical']}")
    click.echo(f"  shuffle bytes over plain: {report['shuffle_fraction_of_plain']}")
    click.echo(f"  YSB keyshift (global_merge on the key-placed topic) / plain Spark: {report['ysb_vs_plain_throughput_ratio']} "
               f"(every run: {report['ysb_ratio_by_run']})")
    click.echo(f"-> {out} (plot {out.with_suffix('.png')})")


def _suite_names() -> list[str]:
    from keyshift.bench.suite import BENCH_NAMES

    return list(BENCH_NAMES)


@command.command(name="all")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              show_default="runs/bench-<UTC time>/", help="Folder for every bench's JSON, PNG and log, and report.html.")
@click.option("--only", multiple=True, type=click.Choice(_suite_names()), help="Run only this bench (repeat).")
@click.option("--skip", multiple=True, type=click.Choice(_suite_names()), help="Leave this bench out (repeat).")
@click.option("--report-only", "report_dir", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None, metavar="DIR",
              help="Run nothing: rebuild DIR/report.html from the bench reports (JSON) already in DIR.")
@click.option("--timeout", "timeout_min", type=click.FloatRange(min=1), default=45.0, show_default=True,
              help="Minutes one bench may take before it is stopped and counted as failed.")
def all_benches(out_dir: Path | None, only: tuple[str, ...], skip: tuple[str, ...], report_dir: Path | None, timeout_min: float) -> None:
    """Every benchmark in turn, at sizes for a 2-core machine, and one HTML report of every goal.

    Runs placement, keywindows, throughput, switch and watermark (about half an hour on 2 cores;
    the sizes are in `keyshift.bench.suite.SUITE`), each in its own process, keeping on when one
    fails. Writes OUT/report.html: each bench's status and error, a row per goal with its target,
    measured value and verdict, and the plots embedded. Kafka and Redis must be up
    (`keyshift stack up`) for throughput, switch and watermark.
    """
    import time

    from keyshift.bench import report, suite

    if report_dir is not None:
        if out_dir is not None or only or skip:
            raise click.UsageError("--report-only runs nothing: give it without --out, --only or --skip")
        outcomes = suite.outcomes_from_folder(report_dir)
        if not outcomes:
            raise click.UsageError(f"{report_dir} holds no bench report (JSON) and no {suite.MANIFEST}")
        out_dir = report_dir
    else:
        plans = suite.select(only, skip)
        if not plans:
            raise click.UsageError("--only and --skip leave no bench to run")
        out_dir = out_dir or Settings().runs_dir / time.strftime("bench-%Y%m%dT%H%M%SZ", time.gmtime())
        click.echo(f"{len(plans)} bench(es) -> {out_dir}")
        outcomes = suite.run_suite(plans, out_dir, timeout_s=timeout_min * 60, say=lambda line: click.echo(line, err=True))
    page = report.render_report(outcomes, out_dir / "report.html")
    for outcome in outcomes:
        click.echo(f"  {outcome.name}: {outcome.status}" + (f" ({outcome.error.splitlines()[0]})" if outcome.error else ""))
    click.echo(f"report -> {page}")
