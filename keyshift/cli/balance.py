"""`keyshift balance`: sampled balance monitoring of every placement strategy, and the switch decision.

`evaluate` samples a keyed stream (the cached flights by default), scores the strategy in force
and every other strategy on the same sample (paper 000 eq. 1, eq. 2, max/mean), asks a switch
trigger (paper 000 Table 6, or our cost_aware) for a decision, prints a table and stores it.
`show` prints the latest stored result.

Storage is local for now: each evaluation is appended as a Parquet file under
`settings.runs_dir / "balance" / "history"` and the latest is `settings.runs_dir / "balance" /
"latest.json"`. The Redis time series (latest in Redis, read by the Airflow monitor DAG) comes later.
"""

from __future__ import annotations

from pathlib import Path

import click

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
@click.option("--horizon-s", type=click.FloatRange(min=0, min_open=True), default=60.0, help="Seconds over which the expected gain is counted.")
@click.option("--cost-s", type=click.FloatRange(min=0), default=5.0, help="cost_aware: migration cost in seconds before one is measured.")
@click.option("--margin", type=click.FloatRange(min=0), default=0.2, help="cost_aware: the gain must exceed cost x (1 + margin).")
@click.option("--input", "source", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None, show_default="the cached flights", help="Parquet file with origin/destination columns.")
@click.option("--candidate", "candidates", multiple=True, show_default="every strategy", help="Strategy to evaluate and possibly recommend (repeat); e.g. only those the job accepts.")
@click.option("--save/--no-save", default=True, help="Store the result (Parquet history + latest JSON).")
def evaluate(
    key: str, partitions: int | None, in_force: str, sample_fraction: float, seed: int, trigger: str, theta: float, period_s: float,
    every_events: int | None, horizon_s: float, cost_s: float, margin: float, source: Path | None, candidates: tuple[str, ...],
    save: bool,
) -> None:
    """Sample the flights, score every strategy on the sample, print the table and the trigger's decision.

    One invocation is one evaluation: `periodic` and `count` count it as a firing (schedule the
    command every T seconds or N events); `threshold` and `cost_aware` decide from the figures.
    The cost_aware cool-down needs the switch history, which a single invocation does not have.
    """
    from keyshift.monitoring.evaluate import evaluate_sample, save_evaluation, variant_by_label
    from keyshift.monitoring.sampling import Sampler
    from keyshift.monitoring.triggers import trigger_by_name

    settings = Settings()
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
    options: dict[str, float] = {"horizon_s": horizon_s}
    if trigger == "periodic":
        options["period_s"] = period_s
    elif trigger == "count":
        options["every_events"] = every_events or sampler.seen
    elif trigger == "threshold":
        options["theta"] = theta
    else:
        options.update(default_cost_s=cost_s, margin=margin)
    chosen = trigger_by_name(trigger, **options)
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


@command.command()
def show() -> None:
    """Print the latest stored evaluation and decision (`keyshift balance evaluate` writes it)."""
    from keyshift.monitoring.evaluate import load_latest

    latest = load_latest(_balance_dir(Settings()))
    evaluation = latest["evaluation"]
    click.echo(
        f"{latest['at']}: {latest.get('source', '?')} by {latest.get('key', '?')}, {evaluation['events']:,} sampled events, "
        f"{evaluation['keys']} keys"
    )
    for line in _table(evaluation["partitions"], evaluation["in_force"], evaluation["results"]):
        click.echo(line)
    decision = latest.get("decision")
    if decision:
        verdict = f"switch to {decision['strategy']}" if decision["switch"] else f"stay on {decision['strategy']}"
        click.echo(f"decision ({decision['trigger']}): {verdict}; expected gain {decision['expected_gain_s']:.2f} s. {decision['reason']}")
