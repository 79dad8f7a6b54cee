"""Evaluate every placement strategy on one sample: the figures a switch decision is made from.

Given a sample (key -> sampled events, e.g. `Sampler.counts`) and P, each strategy variant of
`keyshift.placement.evaluation.VARIANTS` (hash, modulo, least_key, least_count, weight with the hash
and the random landing, hot_split) is built on the sample (learned ones through `from_counts`,
the paper's "with history") and scored on the same sample: per-slot loads (events), balance
degree (paper 000 eq. 1), extra compute time (eq. 2) and max/mean, all from
`keyshift.monitoring.balance`. The loads are computed with the benchmark's own vectorized
helpers (`build_strategy`, `slot_loads`), so the monitor and the benchmark count alike.

The strategy in force can be given as its built `Strategy` (its live assignment); then its loads
are those of that assignment on the sample, not of a fresh build (a key new to it is placed by
its own rule, as a live producer would, and so is recorded in that strategy's history map).

Caveat: the other learned strategies (least_key, least_count, hot_split) are built from the very
sample they are scored on, so their figures are the best they could do on it (the benchmark's
`whole` mode); the benchmark's `online` mode shows what they keep on events they did not learn
from. Compare the strategy in force with its live `assignment` to see what it really does.

Storage here is local: each evaluation is appended as one Parquet file under
`<directory>/history/` (the long record) and the latest is kept as `<directory>/latest.json`.
The offline CLI uses `settings.runs_dir / "balance"`; a monitored topic uses
`settings.runs_dir / "balance" / "topics" / <topic>` and also keeps its latest record and a
bounded recent series in Redis (`keyshift.monitoring.results`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from keyshift.placement.evaluation import VARIANTS, KeyedStream, Split, Variant, build_strategy, slot_loads
from keyshift.errors import ConfigurationError, PlacementError
from keyshift.monitoring.balance import balance_degree, extra_compute_time, max_over_mean
from keyshift.placement.strategies import Strategy, check_partitions, integer_key


@dataclass(frozen=True)
class StrategyEvaluation:
    """One strategy's figures on a sample.

    Attributes:
        strategy: the variant's label (`hash`, `least_count`, `weight/random`, ...).
        in_force: True for the strategy currently placing records.
        partitions: P.
        loads: sampled events per slot, P entries.
        balance_degree: min/max of `loads`, paper 000 eq. 1 (1.0 is even).
        extra_compute_time: (max - mean)/mean of `loads`, paper 000 eq. 2 (0.0 is even).
        max_over_mean: max/mean of `loads`, makespan over the ideal (1.0 is even).
        split_keys: keys spread over more than one slot (hot_split only, else 0).
    """

    strategy: str
    in_force: bool
    partitions: int
    loads: tuple[int, ...]
    balance_degree: float
    extra_compute_time: float
    max_over_mean: float
    split_keys: int = 0


@dataclass(frozen=True)
class Evaluation:
    """Every strategy's figures on one sample; `results` in `VARIANTS` order.

    Attributes:
        partitions: P. in_force: label of the strategy in force. events: sampled events.
        keys: distinct sampled keys. results: one `StrategyEvaluation` per strategy that can
        place the sample's keys (modulo is left out unless every key is an integer).
    """

    partitions: int
    in_force: str
    events: int
    keys: int
    results: tuple[StrategyEvaluation, ...]

    def of(self, strategy: str) -> StrategyEvaluation:
        """The figures of `strategy` (a label). Raises KeyError if it was not evaluated."""
        for result in self.results:
            if result.strategy == strategy:
                return result
        raise KeyError(strategy)

    @property
    def current(self) -> StrategyEvaluation:
        """The figures of the strategy in force."""
        return self.of(self.in_force)

    @property
    def best(self) -> StrategyEvaluation:
        """Highest balance degree (eq. 1), the paper's choice; ties keep the one in force, then `results` order."""
        return max(self.results, key=lambda result: (result.balance_degree, result.in_force))


def variant_by_label(label: str) -> Variant:
    """The `VARIANTS` entry whose label is `label` (e.g. `hash`, `weight/random`).

    Raises:
        ConfigurationError: for an unknown label; the message lists the known ones.
    """
    for variant in VARIANTS:
        if variant.label == label:
            return variant
    raise ConfigurationError(f"unknown strategy {label!r}; known: {', '.join(LABELS)}")


LABELS: tuple[str, ...] = tuple(variant.label for variant in VARIANTS)
"""Strategy labels the monitor evaluates: hash, modulo, least_key, least_count, weight, weight/random, hot_split."""


def _integer_keys(keys: Sequence[str]) -> bool:
    try:
        for key in keys:
            integer_key(key)
    except PlacementError:
        return False
    return True


def evaluate_sample(
    sample: Mapping[str, int],
    partitions: int,
    in_force: str,
    *,
    assignment: Strategy | None = None,
    labels: Sequence[str] = LABELS,
) -> Evaluation:
    """Figures of the strategy in force and of every other strategy on the same sample.

    Args:
        sample: key -> sampled events (>= 0), in order of first sampled event (least_key's
            arrival order); keys with 0 events are ignored.
        partitions: P >= 1.
        in_force: label of the strategy in force (one of `labels`).
        assignment: the in-force strategy as built (its live assignment); None to build it
            from the sample like the others.
        labels: the strategies to evaluate (default: all of `LABELS`); `in_force` is always
            evaluated. modulo is skipped when some key is not an integer (unless in force).

    Returns:
        An `Evaluation`.

    Raises:
        ConfigurationError: an empty sample, a negative count, an unknown label.
        PlacementError: bad P; modulo in force over non-integer keys.
    """
    check_partitions(partitions)
    keys = tuple(key for key, count in sample.items() if count != 0)
    counts = np.fromiter((sample[key] for key in keys), dtype=np.int64, count=len(keys))
    if (counts < 0).any():
        raise ConfigurationError("sample counts must be >= 0 (events)")
    if not keys:
        raise ConfigurationError("the sample holds no events; sample more of the stream")
    variant_by_label(in_force)
    stream = KeyedStream("sample", "key", keys, np.repeat(np.arange(len(keys), dtype=np.int32), counts))
    split = Split("whole", counts, counts, np.zeros(len(keys), dtype=np.int64))
    integers = _integer_keys(keys)
    wanted = list(dict.fromkeys([*labels, in_force]))
    results = []
    for variant in VARIANTS:
        label = variant.label
        if label not in wanted or (variant.strategy == "modulo" and not integers and label != in_force):
            continue
        if label == in_force and assignment is not None:
            strategy = assignment
        else:
            strategy = build_strategy(variant, partitions, stream, split.learn)
        loads, extra = slot_loads(strategy, stream, split)
        values = [int(load) for load in loads]
        results.append(
            StrategyEvaluation(
                strategy=label,
                in_force=label == in_force,
                partitions=partitions,
                loads=tuple(values),
                balance_degree=balance_degree(values),
                extra_compute_time=extra_compute_time(values),
                max_over_mean=max_over_mean(values),
                split_keys=int(extra["split_keys"]),
            )
        )
    for label in wanted:
        variant_by_label(label)
    return Evaluation(partitions, in_force, int(counts.sum()), len(keys), tuple(results))


HISTORY = "history"
"""Folder (under the balance directory) of the Parquet history, one file per evaluation."""

LATEST = "latest.json"
"""File (in the balance directory) holding the latest evaluation and decision."""

MEASURED_FIELDS = ("loads", "events", "balance_degree", "extra_compute_time", "max_over_mean", "max_load", "mean_load", "detail")
"""Fields of a `keyshift.monitoring.loads.MeasuredLoads` stored as Parquet columns `<source>_<field>`."""


def _jsonable(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


def evaluation_record(
    evaluation: Evaluation,
    decision: object | None = None,
    *,
    at: datetime,
    context: Mapping[str, object] | None = None,
    measured: Sequence[object] = (),
    history_file: str | None = None,
) -> dict[str, object]:
    """One evaluation as a JSON-able record: what latest.json and the Redis series hold.

    Args:
        evaluation: the sampled figures. decision: a frozen dataclass (`switch_policies.Decision`) or None.
        at: when it was made (UTC). context: extra JSON-able fields put at the top level
            (series, source, key, sampling, ...). measured: `loads.MeasuredLoads` values (real
            per-slot loads), stored under `measured[<source>]`. history_file: the Parquet file.

    Returns:
        `{"at": ISO 8601, "at_s": epoch seconds, **context, "evaluation": {...}, "decision": {...} | None,
        "measured": {source: {...}}, "history_file": str | None}`.
    """
    return {
        "at": at.isoformat(),
        "at_s": at.timestamp(),
        **dict(context or {}),
        "evaluation": asdict(evaluation),
        "decision": asdict(decision) if decision is not None else None,
        "measured": {m.source: {k: _jsonable(v) for k, v in asdict(m).items()} for m in measured},
        "history_file": history_file,
    }


def save_evaluation(
    directory: Path,
    evaluation: Evaluation,
    decision: object | None = None,
    *,
    at: datetime | None = None,
    context: Mapping[str, object] | None = None,
    measured: Sequence[object] = (),
) -> Path:
    """Append `evaluation` to the Parquet history (the long record) and make it the latest (JSON).

    Writes `<directory>/history/<UTC timestamp>.parquet`, one row per strategy (columns: at,
    partitions, in_force, events, keys, the `StrategyEvaluation` fields, `is_in_force`, the
    decision's fields prefixed `decision_`, the context's scalar fields prefixed `context_`, and
    each measured load's `MEASURED_FIELDS` prefixed `<source>_`, e.g. `arrivals_balance_degree`),
    and `<directory>/latest.json` (`evaluation_record`; temporary file, then rename).
    `keyshift.monitoring.results.history_records` reads the rows back. The Redis side (latest
    and recent series) is `keyshift.monitoring.results.ResultStore`.

    Args:
        directory: the balance directory, e.g. `settings.runs_dir / "balance"`.
        evaluation: what to store. decision: a frozen dataclass (e.g. `switch_policies.Decision`) or None.
        at: timestamp (UTC; default now). context: extra JSON-able fields (source, key, ...).
        measured: `loads.MeasuredLoads` values (arrivals, processed), if measured.

    Returns:
        The Parquet file written.

    Raises:
        OSError: if the directory cannot be written.
    """
    import pandas as pd

    at = at or datetime.now(timezone.utc)
    stamp = at.strftime("%Y%m%dT%H%M%S%fZ")
    decided = asdict(decision) if decision is not None else {}
    shared = {
        **{f"decision_{name}": value for name, value in decided.items()},
        **{f"context_{name}": value for name, value in (context or {}).items() if isinstance(value, (str, int, float, bool))},
        **{f"{m.source}_{name}": _jsonable(getattr(m, name)) for m in measured for name in MEASURED_FIELDS},
    }
    rows = [
        {
            "at": at.isoformat(),
            "partitions": evaluation.partitions,
            "in_force": evaluation.in_force,
            "events": evaluation.events,
            "keys": evaluation.keys,
            **{name: (list(value) if name == "loads" else value) for name, value in asdict(result).items() if name not in ("partitions", "in_force")},
            "is_in_force": result.in_force,
            **shared,
        }
        for result in evaluation.results
    ]
    history = directory / HISTORY
    history.mkdir(parents=True, exist_ok=True)
    parquet = history / f"{stamp}.parquet"
    pd.DataFrame(rows).to_parquet(parquet, index=False)
    latest = evaluation_record(evaluation, decision, at=at, context=context, measured=measured, history_file=str(parquet))
    temporary = directory / (LATEST + ".tmp")
    temporary.write_text(json.dumps(latest, indent=2) + "\n", encoding="utf-8")
    temporary.replace(directory / LATEST)
    return parquet


def load_latest(directory: Path) -> dict[str, object]:
    """The latest stored evaluation (`<directory>/latest.json`) as a dict.

    Raises:
        ConfigurationError: if nothing was stored yet (names the file and `keyshift balance evaluate`).
    """
    path = directory / LATEST
    if not path.is_file():
        raise ConfigurationError(f"no balance results at {path}; run `keyshift balance evaluate` first")
    return json.loads(path.read_text(encoding="utf-8"))
