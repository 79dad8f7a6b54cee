"""Placement evaluation: how a strategy spreads a keyed stream's events over P slots.

The measurement behind the balance monitor's strategy scores (`keyshift.monitoring.evaluate`) and
the placement benchmark (`keyshift.bench.placement`): a keyed stream kept as key codes
(`KeyedStream`), the strategies as they are evaluated (`Variant`, `VARIANTS`), what a strategy
learns from and is scored on (`Split`, `split_stream`: `whole`, or `online` with the first
`ONLINE_TRAIN_SHARE` learned), and the scored events per slot (`slot_loads`).

A slot's **load** is the number of scored events it receives. A key-affine strategy sends all of
a key's events to `slot_of(key)`; `hot_split` sends the key's n-th event (n counted over the whole
stream) to `slots_of(key)[n % k]` (`HotSplitStrategy.slot_for_event`). Loads are computed from
per-key counts with numpy (`np.bincount`); only the per-key placement is a Python loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from keyshift.errors import ConfigurationError, PlacementError
from keyshift.placement.strategies import HotSplitStrategy, Strategy, integer_key, strategy_by_name

MODES: tuple[str, ...] = ("whole", "online")
"""`whole`: learn from and score on the whole stream; `online`: learn on the first 10 %, score the rest."""

ONLINE_TRAIN_SHARE = 0.10
"""Share of the events (the first ones) an `online` strategy learns from."""

LEARNED = frozenset({"least_key", "least_count", "hot_split"})
"""Strategies built from counts (`from_counts`), i.e. with a history assignment map."""


@dataclass(frozen=True)
class Variant:
    """A strategy as the benchmark runs it: registry name plus options (JSON-able).

    Attributes:
        strategy: a name from `keyshift.placement.strategies.STRATEGY_NAMES`.
        options: keyword options for `strategy_by_name` (not `counts`, which the bench supplies).
    """

    strategy: str
    options: Mapping[str, object] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """Short name for plots: the strategy, plus `/random` for the random weight landing."""
        return f"{self.strategy}/{self.options['landing']}" if self.options.get("landing") == "random" else self.strategy


VARIANTS: tuple[Variant, ...] = (
    Variant("hash"),
    Variant("modulo"),
    Variant("least_key"),
    Variant("least_count"),
    Variant("weight", {"landing": "hash"}),
    Variant("weight", {"landing": "random", "seed": 0}),
    Variant("hot_split", {"d": 2}),
)
"""Every strategy the benchmark scores; weight with even weights (`WeightTable.even(P)`)."""


@dataclass(frozen=True)
class KeyedStream:
    """A stream of keyed events, kept as key codes: event i has key `keys[codes[i]]`.

    Codes number the keys in order of first appearance (0 is the first key seen), so the keys of
    any prefix of the stream are exactly codes 0 .. m-1, in the order they arrived.

    Attributes:
        dataset: `flights`, `zipf-0.8`, `zipf-1.0`, `zipf-1.2` or `uniform` (or a test's name).
        key: the key field: `origin`, `route` or `key`.
        keys: distinct key strings, by code.
        codes: int32 array, one code per event, in event order.
    """

    dataset: str
    key: str
    keys: tuple[str, ...]
    codes: np.ndarray = field(repr=False)

    @property
    def events(self) -> int:
        """Number of events."""
        return int(self.codes.size)

    @property
    def integer_keys(self) -> bool:
        """True when every key is an integer string (so `modulo` can place it)."""
        try:
            for key in self.keys:
                integer_key(key)
        except PlacementError:
            return False
        return True


def keyed_stream(dataset: str, key: str, values: Sequence | np.ndarray | pd.Series) -> KeyedStream:
    """Build a `KeyedStream` from one key value per event (codes by first appearance).

    Values that are not strings are turned into strings (`str(value)`) once per distinct value.

    Raises:
        ConfigurationError: if `values` is empty or holds a missing value.
    """
    codes, uniques = pd.factorize(np.asarray(values), sort=False)
    if codes.size == 0:
        raise ConfigurationError(f"stream {dataset}/{key} has no events")
    if (codes < 0).any():
        raise ConfigurationError(f"stream {dataset}/{key} has events without a key")
    return KeyedStream(dataset, key, tuple(str(value) for value in uniques), codes.astype(np.int32))


@dataclass(frozen=True)
class Split:
    """What a strategy learns from and what it is scored on, as per-key counts (index = key code).

    Attributes:
        mode: `whole` or `online`.
        learn: events per key the strategy learns from.
        scored: events per key it is scored on.
        before: events per key that precede the scored part (hot_split's round-robin offset).
    """

    mode: str
    learn: np.ndarray
    scored: np.ndarray
    before: np.ndarray


def split_stream(stream: KeyedStream, mode: str, train_share: float = ONLINE_TRAIN_SHARE) -> Split:
    """Counts per key for `mode` (`whole`, or `online` with the first `train_share` learned).

    Raises:
        ConfigurationError: for an unknown mode or a share outside (0, 1).
    """
    size = len(stream.keys)
    everything = np.bincount(stream.codes, minlength=size)
    if mode == "whole":
        return Split(mode, everything, everything, np.zeros(size, dtype=np.int64))
    if mode != "online":
        raise ConfigurationError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    if not 0 < train_share < 1:
        raise ConfigurationError(f"train share must be in (0, 1), got {train_share}")
    cut = int(stream.events * train_share)
    learn = np.bincount(stream.codes[:cut], minlength=size)
    return Split(mode, learn, everything - learn, learn)


def build_strategy(variant: Variant, partitions: int, stream: KeyedStream, learn: np.ndarray) -> Strategy:
    """The variant's strategy for P slots; learned ones from `learn` (keys in order of first appearance).

    Raises:
        PlacementError: as `strategy_by_name`.
    """
    options = dict(variant.options)
    if variant.strategy in LEARNED:
        seen = np.flatnonzero(learn)  # codes are in order of first appearance
        options["counts"] = {stream.keys[code]: int(learn[code]) for code in seen}
    return strategy_by_name(variant.strategy, partitions, **options)


def slot_loads(strategy: Strategy, stream: KeyedStream, split: Split) -> tuple[np.ndarray, dict[str, int]]:
    """Scored events per slot under `strategy`, and counts of keys placed online / split.

    Keys are placed in order of first appearance, so keys new to the strategy meet it in the
    order a live system would see them.

    Returns:
        (loads: int64 array of P, {"new_keys": keys placed while scoring, "split_keys": keys on
        more than one slot}).
    """
    partitions = strategy.partitions
    present = np.flatnonzero(split.scored)
    new_keys = int(np.count_nonzero(split.learn[present] == 0))
    if isinstance(strategy, HotSplitStrategy):
        loads = np.zeros(partitions, dtype=np.int64)
        split_keys = 0
        for code in present:
            slots = strategy.slots_of(stream.keys[code])
            k = len(slots)
            split_keys += k > 1
            base, extra = divmod(int(split.scored[code]), k)
            start = int(split.before[code]) % k  # the first scored event's sequence number mod k
            for offset, slot in enumerate(slots):
                loads[slot] += base + (1 if (offset - start) % k < extra else 0)
        return loads, {"new_keys": new_keys, "split_keys": split_keys}
    slot_by_code = np.fromiter((strategy.slot_of(stream.keys[code]) for code in present), dtype=np.int64, count=present.size)
    loads = np.bincount(slot_by_code, weights=split.scored[present], minlength=partitions).astype(np.int64)
    return loads, {"new_keys": new_keys, "split_keys": 0}
