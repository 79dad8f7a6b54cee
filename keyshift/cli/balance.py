"""`keyshift balance`: sampled balance monitoring of every placement strategy, and the switch decision.

`evaluate` samples a keyed stream, scores the strategy in force and every other strategy on the
same sample (paper 000 eq. 1, eq. 2, max/mean), asks a switch trigger (paper 000 Table 6, or our
cost_aware) for a decision, prints a table and stores it. Two sources:

* `--topic NAME`: the real Kafka topic, the records that arrived since the previous evaluation
  (at most `--max-events`), plus the measured per-slot loads (Kafka end-offset deltas, the job's
  processed counts): the same evaluation as the `keyshift_balance_monitor` DAG
  (`keyshift.orchestration.monitor.evaluate_topic`), stored in Redis (latest + recent series)
  and in the Parquet history under `runs/balance/topics/<topic>/`.
* otherwise a Parquet file (the cached flights by default), offline: stored in the Parquet
  history under `runs/balance/` and `runs/balance/latest.json`.

`show` prints the latest stored result (`--topic`: from Redis, else from the Parquet history).
"""

from __future__ import annotations

import logging
from pathlib import Path

import click

from keyshift import names
from keyshift.settings import Settings


@click.group(name="balance")
def command() -> None:
    """Evaluate the balance of every placement strategy on a sample, and decide whether to switch."""


def _balance_dir(settings: Settings) -> Path:
    return settings.runs_dir / "balance"


def _keys_of(path: Path, key: str):
    """One key per event, in file order: `origin`, or the route `origin-destination`."""
    import pandas as pd

    if key == "origin":
        return pd.read_parquet(path, columns=["origin"])["origin"].astype(str)
    frame = pd.read_parquet(path, columns=["origin", "destination"])
    return frame["origin"].astype(str) + "-" + frame["destination"].astype(str)


def _table(partitions: int, in_force: str, results: list[dict]) -> list[str]:
    lines = [f"{'strategy':<15} {'in force':>8} {'balance':>8} {'extra':>8} {'max/mean':>9}  loads (events per slot, P = {partitions})"]
    for row in results:
        loads = list(row["loads"])
        shown = " ".join(str(load) for load in loads[:16]) + (" ..." if len(loads) > 16 else "")
        lines.append(
            f"{row['strategy']:<15} {'*' if row['strategy'] == in_force else '':>8} {row['balance_degree']:>8.3f} "
            f"{row['extra_compute_time']:>8.3f} {row['max_over_mean']:>9.3f}  {shown}"
        )
    return lines


@command.command()
@click.option("--key", type=click.Choice(["origin", "route"]), default="origin", help="Key field of the flights.")
@click.option("--partitions", "-p", type=click.IntRange(min=1), default=None, show_default="settings' partitions", help="P, the number of slots.")
@click.option("--strategy", "in_force", default="hash", help="Label of the strategy in force (hash, modulo, least_key, least_count, weight, weight/random, hot_split).")
@click.option("--sample-fraction", type=click.FloatRange(min=0, min_open=True, max=1), default=0.01, help="Share of events sampled (seeded).")
@click.option("--seed", type=int, default=0, help="Seed of the sampler.")
@click.option("--trigger", type=click.Choice(["periodic", "count", "threshold", "cost_aware"]), default="cost_aware", help="Switch trigger (paper 000 Table 6, or ours).")
@click.option("--theta", type=click.FloatRange(0, 1), default=0.6, help="threshold: balance degree below which to switch.")
@click.option("--period-s", type=click.FloatRange(min=0, min_open=True), default=60.0, help="periodic: seconds between firings.")
@click.option("--every-events", type=click.IntRange(min=1), default=None, show_default="the input's events", help="count: events between firings.")
@click.option("--horizon-s", type=click.FloatRange(min=0, min_open=True), default=None,
              show_default="the monitor's evaluation interval, 600", help="Seconds over which the expected gain is counted.")
@click.option("--cost-s", type=click.FloatRange(min=0), default=None,
              show_default="the median pause of recent measured switches, else 10",
              help="cost_aware: migration cost in seconds until a switch on the topic is measured.")
@click.option("--margin", type=click.FloatRange(min=0), default=0.2, help="cost_aware: the gain must exceed cost x (1 + margin).")
@click.option("--input", "source", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None, show_default="the cached flights", help="Parquet file with origin/destination columns.")
@click.option("--candidate", "candidates", multiple=True, show_default="every strategy", help="Strategy to evaluate and possibly recommend (repeat); e.g. only those the job accepts.")
@click.option("--topic", default=None, help="Sample this Kafka topic (records since the previous evaluation) instead of a file; stores in Redis too.")
@click.option("--max-events", type=click.IntRange(min=1), default=100_000, help="--topic: read at most this many of the arrived records (the most recent).")
@click.option("--sample-every", type=click.IntRange(min=1), default=None, help="--topic: sample every n-th event instead of --sample-fraction.")
@click.option("--run-id", default=None, show_default="the latest job run on the topic", help="--topic: job run whose per-slot processed counts are read.")
@click.option("--cooldown-s", type=click.FloatRange(min=0), default=300.0, help="cost_aware: seconds after a switch during which switching back is refused.")
@click.option("--save/--no-save", default=True, help="Store the result (Parquet history + latest; with --topic also Redis and the offsets).")
def evaluate(
    key: str, partitions: int | None, in_force: str, sample_fraction: float, seed: int, trigger: str, theta: float, period_s: float,
    every_events: int | None, horizon_s: float | None, cost_s: float | None, margin: float, source: Path | None, candidates: tuple[str, ...],
    topic: str | None, max_events: int, sample_every: int | None, run_id: str | None, cooldown_s: float, save: bool,
) -> None:
    """Sample a topic or the flights, score every strategy on the sample, print the table and the trigger's decision.

    With --topic, the trigger's state (periodic clock, count sum) and the cost_aware switch
    history persist in Redis between invocations, as in the monitor DAG; a switch decision is
    recorded as the last switch but nothing is migrated (see the `keyshift_switch` DAG).
    Offline (a file), one invocation is one evaluation: `periodic` and `count` count it as a
    firing; the cost_aware cool-down has no switch history.
    """
    from keyshift.monitoring.evaluate import evaluate_sample, save_evaluation, variant_by_label
    from keyshift.monitoring.sampling import Sampler
    from keyshift.monitoring.switch_policies import policy_by_name

    settings = Settings()
    if topic is not None:
        from keyshift import stack
        from keyshift.orchestration.monitor import evaluate_topic, monitor_params

        stack.require(settings, "kafka", "redis")

        params = monitor_params({
            "topic": topic, "strategy": in_force, "partitions": partitions, "trigger": trigger, "theta": theta,
            "period_s": period_s, "every_events": every_events, "horizon_s": horizon_s, "cost_s": cost_s, "margin": margin,
            "cooldown_s": cooldown_s, "sample_fraction": sample_fraction, "sample_every": sample_every, "seed": seed,
            "max_events": max_events, "run_id": run_id, "candidates": candidates,
        })
        result = evaluate_topic(settings, params, save=save)
        for line in format_record(result["record"]):
            click.echo(line)
        if save:
            click.echo(f"stored -> Redis {names.redis_balance_latest_key(topic)}" + (f", {result['record']['history_file']}" if result["record"]["history_file"] else ""))
        return
    partitions = partitions or settings.partitions
    variant_by_label(in_force)
    if source is None:
        from keyshift.data.flights import flights_path

        source = flights_path(settings)
    keys = _keys_of(source, key)
    sampler = Sampler(fraction=sample_fraction, seed=seed)
    sampler.offer_batch(keys.to_numpy())
    for label in candidates:
        variant_by_label(label)
    evaluation = evaluate_sample(sampler.counts, partitions, in_force, **({"labels": candidates} if candidates else {}))
    from keyshift.monitoring.switch_policies import DEFAULT_COST_S, horizon_default
    from keyshift.orchestration.monitor import EVALUATION_INTERVAL_S

    options: dict[str, float] = {"horizon_s": horizon_default(horizon_s, EVALUATION_INTERVAL_S).seconds}
    if trigger == "periodic":
        options["period_s"] = period_s
    elif trigger == "count":
        options["every_events"] = every_events or sampler.seen
    elif trigger == "threshold":
        options["theta"] = theta
    else:
        options.update(default_cost_s=DEFAULT_COST_S if cost_s is None else cost_s, margin=margin, cooldown_s=cooldown_s)
    chosen = policy_by_name(trigger, **options)
    if trigger == "periodic":
        chosen.observe(evaluation, 0.0, 0)  # starts the clock; the invocation is the timer firing
        decision = chosen.observe(evaluation, period_s, sampler.seen)
    else:
        decision = chosen.observe(evaluation, 0.0, sampler.seen)
    click.echo(f"{source.name} by {key}: {sampler.seen:,} events, sampled {sampler.sampled:,} ({sample_fraction:g}), {evaluation.keys} keys")
    rows = [vars(result) for result in evaluation.results]
    for line in _table(partitions, in_force, rows):
        click.echo(line)
    verdict = f"switch to {decision.strategy}" if decision.switch else f"stay on {decision.strategy}"
    click.echo(f"decision ({decision.trigger}): {verdict}; expected gain {decision.expected_gain_s:.2f} s. {decision.reason}")
    if save:
        context = {"source": str(source), "key": key, "sample_fraction": sample_fraction, "seed": seed, "events_seen": sampler.seen}
        written = save_evaluation(_balance_dir(settings), evaluation, decision, context=context)
        click.echo(f"stored -> {written}")


def _verdict(decision: dict) -> str:
    verdict = f"switch to {decision['strategy']}" if decision["switch"] else f"stay on {decision['strategy']}"
    return f"decision ({decision['trigger']}): {verdict}; expected gain {decision['expected_gain_s']:.2f} s. {decision['reason']}"


def format_record(record: dict) -> list[str]:
    """Lines describing one stored record: sample, strategy table, measured loads, decision."""
    evaluation = record.get("evaluation")
    where = record.get("source", "?")
    lines = []
    if record.get("events_arrived") is not None:
        lines.append(
            f"{record['at']}: {where}: {record['events_arrived']:,} events arrived, {record.get('events_read', 0):,} read, "
            f"{record.get('events_sampled', 0):,} sampled ({record.get('sample_rule')} {record.get('sample_rate', 0):g})"
        )
    else:
        lines.append(f"{record['at']}: {where} by {record.get('key', '?')}")
    lag = record.get("consumer_lag")
    if lag:
        per = " ".join(f"{p}:{n}" for p, n in lag["per_partition"].items())
        lines.append(f"consumer lag of job run {record.get('job_run_id')}: {lag['total']:,} records ({per})")
    if evaluation:
        lines.append(f"sample: {evaluation['events']:,} events, {evaluation['keys']} keys")
        lines.extend(_table(evaluation["partitions"], evaluation["in_force"], evaluation["results"]))
    for name, figures in (record.get("measured") or {}).items():
        loads = list(figures["loads"])
        shown = " ".join(str(load) for load in loads[:16]) + (" ..." if len(loads) > 16 else "")
        lines.append(
            f"measured {name}: {figures['events']:,} events, balance {figures['balance_degree']:.3f}, extra {figures['extra_compute_time']:.3f}, "
            f"max/mean {figures['max_over_mean']:.3f}, max {figures['max_load']:,}, mean {figures['mean_load']:,.1f}; loads {shown}"
        )
        if figures.get("detail"):
            lines.append(f"  ({figures['detail']})")
    if record.get("decision"):
        lines.append(_verdict(record["decision"]))
    lines.extend(_rescale_line(record))
    return lines


def _rescale_line(record: dict) -> list[str]:
    """The "rescale: …" line: the parallelism the monitor recommends (paper 001), or why it has none; none for older records."""
    rescale = record.get("rescale")
    if rescale:
        move = f"P {rescale['current']} -> {rescale['recommended']}" if rescale["recommended"] != rescale["current"] else f"stay at P {rescale['current']}"
        flow = f"{rescale['flow']:,.0f} events/s of max flow {rescale['max_flow']:,.0f}" if rescale.get("max_flow") else "no flow"
        return [f"rescale: {move} (bottleneck {rescale['bottleneck']}, lag {rescale['lag_trend']:+.1f} records/s, {flow}): {rescale['why']}"
                + (f"; {rescale['switch']}" if rescale.get("switch") else "")]
    return [f"rescale: no recommendation: {record['rescale_reason']}"] if record.get("rescale_reason") else []


def _brief(record: dict) -> str:
    evaluation, measured, decision = record.get("evaluation"), record.get("measured") or {}, record.get("decision") or {}
    sampled = f"{evaluation['in_force']} sampled {next(r['balance_degree'] for r in evaluation['results'] if r['in_force']):.3f}" if evaluation else "no sample"
    real = ", ".join(f"{name} {figures['balance_degree']:.3f}" for name, figures in measured.items())
    verdict = ("switch to " if decision.get("switch") else "stay on ") + str(decision.get("strategy"))
    return f"{record['at']}  {sampled}  {real or '-'}  {verdict}  gain {decision.get('expected_gain_s', 0.0):.2f} s"


@command.command()
@click.option("--topic", default=None, help="A monitored topic's series (Redis, else its Parquet history); default: the offline (file) series.")
@click.option("--recent", type=click.IntRange(min=1), default=1, help="Show the last N records of the series, one line each (N > 1).")
def show(topic: str | None, recent: int) -> None:
    """Print the latest stored evaluation and decision (`keyshift balance evaluate` or the monitor DAG writes it)."""
    from keyshift.errors import ConfigurationError, StackError
    from keyshift.monitoring.results import load_records

    settings = Settings()
    redis_down: StackError | None = None
    if topic is not None:
        from keyshift import stack

        try:
            stack.require(settings, "redis")
        except StackError as exc:
            redis_down = exc  # the Parquet history may still answer
    if not logging.getLogger().isEnabledFor(logging.DEBUG):  # where it read from is printed below
        logging.getLogger("keyshift.monitoring.results").setLevel(logging.ERROR)
    try:
        records, where = load_records(settings, topic, recent)
    except ConfigurationError as exc:
        if redis_down is not None:
            raise StackError(f"{redis_down}; the Parquet history holds nothing either") from exc
        raise
    if redis_down is not None:
        where += " (Redis does not answer)"
    if recent > 1:
        click.echo(f"last {len(records)} records of {topic or 'the offline series'} (from {where}); balance degree (eq. 1) sampled and measured")
        for record in records:
            click.echo(_brief(record))
        return
    for line in format_record(records[-1]):
        click.echo(line)
    click.echo(f"(read from {where})")
