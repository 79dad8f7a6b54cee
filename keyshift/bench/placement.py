"""Placement benchmark: per-slot balance of every strategy, and the partitioner's throughput.

What it measures (issue 4, "Benchmark"), for each keyed stream, each P in `PARTITIONS`, each
strategy variant in `VARIANTS` and each mode in `MODES`:

* `whole`: the strategy learns from the counts of the whole stream and is scored on the whole
  stream (the paper's "with history" at its best).
* `online`: the strategy learns only from the first `ONLINE_TRAIN_SHARE` (10 %) of the events and
  is scored on the remaining 90 %, as a live system would be: keys first seen in the scored part
  are placed when they first appear (`slot_of`, in order of first appearance), against the loads
  learned so far.

A slot's **load** is the number of scored events it receives. A key-affine strategy sends all of
a key's events to `slot_of(key)`; `hot_split` sends the key's n-th event (n counted over the whole
stream) to `slots_of(key)[n % k]` (`HotSplitStrategy.slot_for_event`). Loads are computed from
per-key counts with numpy (`np.bincount`); only the per-key placement is a Python loop. The metrics
are `keyshift.monitoring.balance`'s: balance degree (paper 000 eq. 1), extra compute time (eq. 2),
max/mean.

Streams: the flights (3,000,000 rows, in event-time order) keyed by `origin` (229 keys) and by
route `origin-destination`; synthetic integer keys (`"0"` .. `"K-1"`, so `modulo` applies) drawn
i.i.d. from a Zipf law p(rank r) proportional to r^-s (r = 1..K, s in `ZIPF_EXPONENTS`), the
ranks shuffled over the key ids by the same seeded numpy generator, plus a uniform control.
`modulo` is skipped for streams whose keys are not integers.

Throughput: kafka-python's producer calls its partitioner once per record sent. The ratio is
records/s with keyshift's `KafkaPartitioner` (over a least_count assignment) against kafka-python's
`DefaultPartitioner`, on the same records, measured one of two ways, named in the JSON's
`partitioner_throughput.method`:

* `producer_throughput` (when a broker is given): real `KafkaProducer` runs to a bench topic,
  send + flush, acks=1; the whole producer path, so the ratio is the one the issue asks for.
* `partitioner_throughput` (always, and the ratio when no broker runs): the path "serialize the
  key, call `partition()`" in this process with stub metadata. It isolates the partitioner, so
  its ratio is far from 1 in either direction; the producer's other costs dilute it.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from kafka.partitioner import DefaultPartitioner

from keyshift.monitoring.balance import balance_degree, extra_compute_time, max_over_mean
from keyshift.placement.kafka_partitioner import KafkaPartitioner
from keyshift.placement.evaluation import (
    MODES,
    ONLINE_TRAIN_SHARE,
    VARIANTS,
    KeyedStream,
    Split,
    Variant,
    build_strategy,
    keyed_stream,
    slot_loads,
    split_stream,
)
from keyshift.placement.strategies import LeastCountStrategy
from keyshift.errors import ConfigurationError
from keyshift.settings import Settings

log = logging.getLogger(__name__)

PARTITIONS: tuple[int, ...] = (4, 8, 16, 32)
"""Slot counts P the benchmark sweeps."""

ZIPF_EXPONENTS: tuple[float, ...] = (0.8, 1.0, 1.2)
"""Zipf exponents s of the synthetic streams (dataset names `zipf-0.8`, `zipf-1.0`, `zipf-1.2`)."""

SYNTHETIC_EVENTS = 3_000_000
"""Default events per synthetic stream."""

SYNTHETIC_KEYS = 10_000
"""Default distinct keys K of a synthetic stream."""



def flights_streams(path: Path) -> list[KeyedStream]:
    """The flights keyed by `origin` and by route `origin-destination`, in the file's (time) order.

    Args:
        path: the verified flights-3m Parquet file (`keyshift.data.flights.flights_path`).

    Raises:
        OSError / pyarrow errors: if the file cannot be read.
    """
    frame = pd.read_parquet(path, columns=["origin", "destination"])
    origin_codes, origins = pd.factorize(frame["origin"], sort=False)
    destination_codes, destinations = pd.factorize(frame["destination"], sort=False)
    pair = origin_codes.astype(np.int64) * len(destinations) + destination_codes
    route_codes, route_pairs = pd.factorize(pair, sort=False)
    route_names = tuple(
        f"{origins[int(p) // len(destinations)]}-{destinations[int(p) % len(destinations)]}" for p in route_pairs
    )
    return [
        KeyedStream("flights", "origin", tuple(origins), origin_codes.astype(np.int32)),
        KeyedStream("flights", "route", route_names, route_codes.astype(np.int32)),
    ]


def synthetic_stream(exponent: float | None, events: int, keys: int, seed: int) -> KeyedStream:
    """Integer keys drawn i.i.d.: Zipf over ranks with exponent s, or uniform (`exponent=None`).

    Zipf: p(rank r) = r^-s / sum_{j=1..K} j^-s for r = 1..K (a truncated Zipf law, so any s > 0
    works, unlike numpy's unbounded `zipf`, which needs s > 1). Rank r is key id `perm[r - 1]`,
    a seeded permutation of 0..K-1, so the hot keys are not the small integers (which would
    flatter `modulo`). Dataset name: `zipf-<s>` or `uniform`; key field `key`.

    Args:
        exponent: s > 0, or None for uniform keys.
        events: events to draw, >= 1. keys: K >= 1. seed: numpy generator seed.

    Raises:
        ConfigurationError: for events < 1, keys < 1 or s <= 0.
    """
    if events < 1 or keys < 1:
        raise ConfigurationError(f"a synthetic stream needs events >= 1 and keys >= 1, got {events}, {keys}")
    rng = np.random.default_rng(seed)
    if exponent is None:
        ids = rng.integers(0, keys, size=events)
        name = "uniform"
    else:
        if exponent <= 0:
            raise ConfigurationError(f"Zipf exponent must be > 0, got {exponent}")
        weights = np.arange(1, keys + 1, dtype=np.float64) ** -exponent
        ranks = rng.choice(keys, size=events, p=weights / weights.sum())
        ids = rng.permutation(keys)[ranks]
        name = f"zipf-{exponent:.1f}"
    return keyed_stream(name, "key", ids)


def synthetic_streams(events: int = SYNTHETIC_EVENTS, keys: int = SYNTHETIC_KEYS, seed: int = 0) -> list[KeyedStream]:
    """The Zipf streams for each s in `ZIPF_EXPONENTS` and the uniform control (seeds seed, seed+1, ...)."""
    exponents: list[float | None] = [*ZIPF_EXPONENTS, None]
    return [synthetic_stream(s, events, keys, seed + index) for index, s in enumerate(exponents)]


def score(stream: KeyedStream, partitions: int, variant: Variant, split: Split) -> dict[str, object] | None:
    """One JSON row for (stream, P, variant, mode), or None when the variant cannot place the keys.

    Row fields: dataset, key, partitions, strategy, options, mode, balance_degree,
    extra_compute_time, max_over_mean, keys (distinct keys scored), events (scored), new_keys,
    split_keys, loads (events per slot), seconds (time to build and place).
    """
    if variant.strategy == "modulo" and not stream.integer_keys:
        return None
    started = time.perf_counter()
    strategy = build_strategy(variant, partitions, stream, split.learn)
    loads, extra = slot_loads(strategy, stream, split)
    values = loads.tolist()
    return {
        "dataset": stream.dataset,
        "key": stream.key,
        "partitions": partitions,
        "strategy": variant.strategy,
        "options": dict(variant.options),
        "mode": split.mode,
        "balance_degree": balance_degree(values),
        "extra_compute_time": extra_compute_time(values),
        "max_over_mean": max_over_mean(values),
        "keys": int(np.count_nonzero(split.scored)),
        "events": int(split.scored.sum()),
        **extra,
        "loads": values,
        "seconds": round(time.perf_counter() - started, 4),
    }


class _Cluster:
    """The part of kafka-python's ClusterMetadata a partitioner reads, for one topic of P partitions."""

    def __init__(self, topic: str, partitions: int) -> None:
        self._partitions = {topic: set(range(partitions))}

    def topics(self) -> set[str]:
        return set(self._partitions)

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return self._partitions.get(topic)

    def available_partitions_for_topic(self, topic: str) -> set[int] | None:
        return self._partitions.get(topic)


def _records_per_second(partitioner, keys: Sequence[str], cluster: _Cluster, topic: str) -> float:
    value = b"{}"
    started = time.perf_counter()
    for key in keys:
        partitioner.partition(topic, key, key.encode("utf-8"), value, value, cluster)
    return len(keys) / (time.perf_counter() - started)


def partitioner_throughput(keys: Sequence[str], partitions: int = 8, repeats: int = 3) -> dict[str, object]:
    """Records/s of keyshift's partitioner (least_count) vs kafka-python's default, same records.

    Each round times both on the same key sequence (serialize the key to UTF-8, call
    `partition(...)` as `KafkaProducer._partition` does), alternating which goes first; the best
    round of each counts. No broker: the metadata is a stub of one topic with P partitions.

    Args:
        keys: one key per record, in send order. partitions: P. repeats: rounds, >= 1.

    Returns:
        {"method", "records", "partitions", "strategy", "keyshift_records_per_s",
        "default_records_per_s", "ratio"} with ratio = keyshift / default.

    Raises:
        ConfigurationError: if `keys` is empty or repeats < 1.
    """
    if not keys or repeats < 1:
        raise ConfigurationError(f"need records and repeats >= 1, got {len(keys)} records, {repeats} repeats")
    topic = "keyshift-bench"
    cluster = _Cluster(topic, partitions)
    counts: dict[str, int] = {}
    for key in keys:
        counts[key] = counts.get(key, 0) + 1
    ours_best = default_best = 0.0
    for round_ in range(repeats):
        # a fresh partitioner per round: its per-key memo is filled during the timed loop, as in a run
        ours = KafkaPartitioner(LeastCountStrategy.from_counts(counts, partitions))
        default = DefaultPartitioner()
        order = [(ours, "ours"), (default, "default")]
        for partitioner, which in order if round_ % 2 == 0 else order[::-1]:
            rate = _records_per_second(partitioner, keys, cluster, topic)
            if which == "ours":
                ours_best = max(ours_best, rate)
            else:
                default_best = max(default_best, rate)
    return {
        "method": "partitioner call path without a broker (key serialization + partition(), stub metadata)",
        "records": len(keys),
        "partitions": partitions,
        "strategy": "least_count",
        "keyshift_records_per_s": round(ours_best),
        "default_records_per_s": round(default_best),
        "ratio": ours_best / default_best,
    }


BENCH_TOPIC = "keyshift-bench-placement"
"""The topic `producer_throughput` writes to (created with P partitions if missing)."""


def broker_reachable(settings: Settings, timeout_s: float = 1.0) -> bool:
    """True when something accepts TCP connections at the settings' Kafka address (no Kafka request)."""
    try:
        with socket.create_connection((settings.kafka_host, settings.kafka_port), timeout=timeout_s):
            return True
    except OSError:
        return False


def producer_throughput(
    settings: Settings,
    keys: Sequence[str],
    partitions: int = 8,
    rounds: int = 2,
    topic: str = BENCH_TOPIC,
) -> dict[str, object]:
    """Records/s of a real KafkaProducer with keyshift's partitioner vs kafka-python's default.

    Each round runs one producer per partitioner (alternating which goes first) over the same
    records: `send(topic, key=..., value=b'{"bench":1}')` for every key, then `flush()`; acks=1,
    linger 10 ms, keys serialized as UTF-8. The best round of each counts. The topic is created
    with P partitions if missing (`keyshift.topics.create_topics`) and its records are left there.

    Returns:
        {"method", "records", "partitions", "strategy", "topic", "keyshift_records_per_s",
        "default_records_per_s", "ratio"}.

    Raises:
        StackError: no broker at `settings.bootstrap_servers`, or the topic has another P.
        ConfigurationError: no keys, rounds < 1.
    """
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    from keyshift.errors import StackError
    from keyshift.topics import create_topics, kafka_config

    if not keys or rounds < 1:
        raise ConfigurationError(f"need records and rounds >= 1, got {len(keys)} records, {rounds} rounds")
    try:
        create_topics(settings, [topic], partitions)
    except ConfigurationError as exc:
        raise StackError(f"bench topic {topic!r}: {exc}") from exc
    counts: dict[str, int] = {}
    for key in keys:
        counts[key] = counts.get(key, 0) + 1
    value = b'{"bench":1}'
    best = {"ours": 0.0, "default": 0.0}
    for round_ in range(rounds):
        order = ["ours", "default"] if round_ % 2 == 0 else ["default", "ours"]
        for which in order:
            partitioner = (
                KafkaPartitioner(LeastCountStrategy.from_counts(counts, partitions))
                if which == "ours"
                else DefaultPartitioner()
            )
            try:
                producer = KafkaProducer(
                    **kafka_config(settings, f"keyshift-bench-{which}"),
                    partitioner=partitioner,
                    key_serializer=str.encode,
                    acks=1,
                    enable_idempotence=False,  # acks=1 excludes it; said here to keep the log quiet
                    linger_ms=10,
                )
            except KafkaError as exc:
                raise StackError(f"cannot start a Kafka producer for {settings.bootstrap_servers}: {exc}") from exc
            try:
                producer.send(topic, key=keys[0], value=value).get(timeout=30)  # metadata fetched, not timed
                send = producer.send
                started = time.perf_counter()
                for key in keys:
                    send(topic, key=key, value=value)
                producer.flush()
                best[which] = max(best[which], len(keys) / (time.perf_counter() - started))
            finally:
                producer.close()
    return {
        "method": f"KafkaProducer send + flush to a running broker at {settings.bootstrap_servers} (acks=1)",
        "records": len(keys),
        "partitions": partitions,
        "strategy": "least_count",
        "topic": topic,
        "keyshift_records_per_s": round(best["ours"]),
        "default_records_per_s": round(best["default"]),
        "ratio": best["ours"] / best["default"],
    }


TARGETS: tuple[tuple[str, dict[str, object], str, str, float], ...] = (
    ("flights/origin P=8 least_count online: balance degree >= 0.95",
     {"dataset": "flights", "key": "origin", "partitions": 8, "strategy": "least_count", "mode": "online"},
     "balance_degree", ">=", 0.95),
    ("flights/origin P=32 hot_split whole: max/mean <= 1.10",
     {"dataset": "flights", "key": "origin", "partitions": 32, "strategy": "hot_split", "mode": "whole"},
     "max_over_mean", "<=", 1.10),
    ("flights/origin P=32 hot_split online: max/mean <= 1.10",
     {"dataset": "flights", "key": "origin", "partitions": 32, "strategy": "hot_split", "mode": "online"},
     "max_over_mean", "<=", 1.10),
)
"""The issue's numbers to reach: (name, row selector, metric, comparison, bound)."""


def check_targets(rows: Iterable[Mapping[str, object]], throughput_ratio: float | None) -> list[dict[str, object]]:
    """Each target of `TARGETS` (plus throughput ratio >= 0.9) with its measured value and `met`.

    A target whose row is missing (e.g. no flights in this run) is reported with value None.
    """
    rows = list(rows)
    results = []
    for name, selector, metric, comparison, bound in TARGETS:
        match = [row for row in rows if all(row.get(k) == v for k, v in selector.items())]
        value = match[0][metric] if match else None
        met = None if value is None else (value >= bound if comparison == ">=" else value <= bound)
        results.append({"target": name, "metric": metric, "value": value, "bound": bound, "met": met})
    met = None if throughput_ratio is None else throughput_ratio >= 0.9
    results.append({"target": "partitioner throughput >= 0.9 x default", "metric": "ratio",
                    "value": throughput_ratio, "bound": 0.9, "met": met})
    return results


def plot_balance(rows: Sequence[Mapping[str, object]], path: Path) -> Path:
    """A PNG of balance degree per strategy: one panel per (mode, dataset/key), one bar per P.

    Uses matplotlib's Agg backend (no display needed). Returns `path`.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frame = pd.DataFrame(rows)
    frame["label"] = [
        Variant(row["strategy"], row["options"]).label for row in frame[["strategy", "options"]].to_dict("records")
    ]
    streams = list(dict.fromkeys(zip(frame["dataset"], frame["key"])))
    modes = [mode for mode in MODES if mode in set(frame["mode"])]
    labels = list(dict.fromkeys(frame["label"]))
    partitions = sorted(set(frame["partitions"]))
    figure, axes = plt.subplots(
        len(modes), len(streams), figsize=(3.6 * len(streams), 3.4 * len(modes)), squeeze=False, sharey=True
    )
    width = 0.8 / len(partitions)
    for row_index, mode in enumerate(modes):
        for column, (dataset, key) in enumerate(streams):
            axis = axes[row_index][column]
            part = frame[(frame["mode"] == mode) & (frame["dataset"] == dataset) & (frame["key"] == key)]
            for index, p in enumerate(partitions):
                values = part[part["partitions"] == p].set_index("label")["balance_degree"].reindex(labels)
                axis.bar(np.arange(len(labels)) + index * width - 0.4 + width / 2, values.fillna(0), width, label=f"P={p}")
            axis.set_title(f"{dataset}/{key} ({mode})", fontsize=9)
            axis.set_xticks(np.arange(len(labels)), labels, rotation=60, ha="right", fontsize=7)
            axis.set_ylim(0, 1.05)
            axis.axhline(0.95, color="grey", linewidth=0.6, linestyle="--")
            if column == 0:
                axis.set_ylabel("balance degree (min/max)")
    axes[0][0].legend(fontsize=7)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def run_placement_bench(
    streams: Sequence[KeyedStream],
    out: Path,
    *,
    partitions: Sequence[int] = PARTITIONS,
    modes: Sequence[str] = MODES,
    variants: Sequence[Variant] = VARIANTS,
    throughput_keys: Sequence[str] | None = None,
    broker: Settings | None = None,
    progress: bool = True,
) -> dict[str, object]:
    """Score every (stream, P, variant, mode), measure the partitioner, write JSON and PNG.

    Args:
        streams: the keyed streams (`flights_streams`, `synthetic_streams`).
        out: the JSON file to write; the plot goes beside it with suffix `.png`.
        partitions: the P values. modes: `whole` and/or `online`. variants: the strategies.
        throughput_keys: record keys for the throughput measurements (default: the first
            stream's first 200,000 events; 100,000 through a broker).
        broker: settings of a running broker: measure the ratio with real producers
            (`producer_throughput`); None: only the call path without a broker.
        progress: show a tqdm bar.

    Returns:
        The report written: {"rows", "partitioner_throughput_ratio", "partitioner_throughput",
        "targets", "config", "plot"}.

    Raises:
        ConfigurationError: bad modes or no streams. PlacementError: a strategy refused its input.
        StackError: `broker` given but no broker answers.
    """
    from tqdm import tqdm

    if not streams:
        raise ConfigurationError("the placement bench needs at least one stream")
    jobs = [(stream, mode, p) for stream in streams for mode in modes for p in partitions]
    rows: list[dict[str, object]] = []
    splits: dict[tuple[int, str], Split] = {}
    for stream, mode, p in tqdm(jobs, desc="placement", unit="case", disable=not progress):
        split = splits.get((id(stream), mode))
        if split is None:
            split = splits[(id(stream), mode)] = split_stream(stream, mode)
        for variant in variants:
            row = score(stream, p, variant, split)
            if row is not None:
                rows.append(row)
    if throughput_keys is None:
        first = streams[0]
        throughput_keys = [first.keys[code] for code in first.codes[:200_000]]
    throughput = partitioner_throughput(throughput_keys)
    if broker is not None:
        throughput = {**producer_throughput(broker, throughput_keys[:100_000]), "without_broker": throughput}
    ratio = float(throughput["ratio"])
    plot = plot_balance(rows, out.with_suffix(".png"))
    report = {
        "rows": rows,
        "partitioner_throughput_ratio": ratio,
        "partitioner_throughput": throughput,
        "targets": check_targets(rows, ratio),
        "config": {
            "partitions": list(partitions),
            "modes": list(modes),
            "online_train_share": ONLINE_TRAIN_SHARE,
            "streams": [{"dataset": s.dataset, "key": s.key, "events": s.events, "keys": len(s.keys)} for s in streams],
            "variants": [{"strategy": v.strategy, "options": dict(v.options)} for v in variants],
        },
        "plot": str(plot),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    return report
