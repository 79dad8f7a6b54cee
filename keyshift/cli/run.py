"""`keyshift run demo`: the whole pipeline on the real flights, end to end."""

from __future__ import annotations

import click

from keyshift.cli.output import run_output_options, run_terminal
from keyshift.eventtime.watermarks import BACKFILL_IDLE_LAG_MS, WATERMARK_MODES
from keyshift.names import FLIGHTS_TOPIC
from keyshift.processing.job_config import JOB_STRATEGIES
from keyshift.settings import DEFAULT_PARTITIONS


@click.group(name="run")
def command() -> None:
    """Run end-to-end scenarios on the local stack."""


@command.command(name="demo")
@click.option("--run-id", default=None, help="Run id; default demo-<UTC time>-<hex>.")
@click.option("--partitions", type=click.IntRange(min=1), default=DEFAULT_PARTITIONS, help="P slots.")
@click.option("--strategy", type=click.Choice(JOB_STRATEGIES), default="hash", help="Placement strategy; least_key, least_count and hot_split are learned from the first 10 % of the flights and published in Redis.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Flights to replay; default all 3,000,000.")
@click.option("--rate", type=click.FloatRange(min=1), default=None, help="Replay rate, events/s; default as fast as possible.")
@click.option("--bound-ms", type=click.IntRange(min=0), default=60_000, show_default=True, help="Watermark bound, ms of event time. With key-level watermarks one minute loses no flight; in global mode a backfill needs two days (partitions drift apart by up to 21.5 h (hash) and 37 h (least_count) at P=8), and a smaller bound makes events late (counted, sent to flights-late).")
@click.option("--watermark", type=click.Choice(WATERMARK_MODES), default="key", show_default=True, help="Watermark mode of the job.")
@click.option("--compare-global/--no-compare-global", default=True, help="Also run the job in global watermark mode with the same bound and report its late events.")
@click.option("--builtin-bound-ms", type=click.IntRange(min=0), default=172_800_000, show_default=True, help="Watermark delay of Spark's built-in job (it drops late rows silently, so it needs the bound that loses nothing).")
@click.option("--max-offsets-per-trigger", type=click.IntRange(min=1), default=250_000, help="Records per micro-batch at most.")
@click.option("--topic", default=FLIGHTS_TOPIC, show_default=True, help="Input topic; another name than flights is recreated alone (the side-output topics are shared and kept), so the demo can run beside other runs.")
@click.option("--idle-lag-ms", type=click.IntRange(min=0), default=BACKFILL_IDLE_LAG_MS, show_default=True, help="Per-key watermark modes: the fallback watermark's lag behind the query's max event time (8 days); it must exceed how far the partitions drift apart in the backfill (up to 37 h at P=8, about a week with hot_split at P=32). Only silent keys wait for it: every other key closes its windows one bound after its own events.")
@click.option("--builtin/--no-builtin", default=True, help="Also run Spark's built-in aggregation and compare.")
@run_output_options
def demo(run_id, partitions, strategy, limit, rate, bound_ms, watermark, compare_global, builtin_bound_ms, max_offsets_per_trigger,
         topic, idle_lag_ms, builtin, as_json, progress) -> None:
    """Recreate the flight topics, replay the flights, run the job to the end, compare with
    Spark's built-in aggregation, and print a summary table (--json: the summary as JSON; it is
    in runs/<run_id>/summary.json either way). Log lines of Spark, its Python workers and
    keyshift go to runs/<run_id>/driver.log; the terminal shows the steps, progress and warnings.

    Needs the stack (`keyshift stack up`) and the data (`keyshift data fetch flights`).
    """
    from keyshift import stack
    from keyshift.runtime.job_options import new_run_id
    from keyshift.console import print_summary
    from keyshift.data.flights import flights_path
    from keyshift.demo import run_demo
    from keyshift.settings import Settings

    settings = Settings()
    stack.require(settings, "kafka", "redis")
    flights_path(settings)  # fetched and verified, or the fix: `keyshift data fetch flights`
    with run_terminal():
        summary = run_demo(
            settings,
            run_id or new_run_id("demo"),
            partitions=partitions,
            strategy=strategy,
            limit=limit,
            rate=rate,
            bound_ms=bound_ms,
            max_offsets_per_trigger=max_offsets_per_trigger,
            builtin=builtin,
            watermark=watermark,
            compare_global=compare_global,
            builtin_bound_ms=builtin_bound_ms,
            topic=topic,
            idle_lag_ms=idle_lag_ms,
            driver_log=True,
            progress=progress,
        )
    print_summary(summary, as_json=as_json)
    problems = []
    if not summary["quality"]["success"]:
        problems.append(f"the windows table failed {len(summary['quality']['failed'])} Great Expectations check(s)")
    if not summary["reference"]["equal"]:
        problems.append("the windows differ from the pandas computation of the same windows (see reference in summary.json)")
    if builtin and not summary["builtin"]["comparison"]["equal"]:
        problems.append("the windows differ from Spark's built-in aggregation (see builtin.comparison in summary.json)")
    if problems:
        raise click.ClickException("; ".join(problems))
