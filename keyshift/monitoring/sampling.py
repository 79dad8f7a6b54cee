"""Sampling a stream of keys for online balance monitoring (paper 000 §4.2.2).

The paper's monitor looks at a sample of the stream, not every record: a high rate while little
is known about the key distribution, a lower one once it is (§4.2.2). `Sampler` keeps one of two
rules, fixed at construction:

* `every=n`: keep events n, 2n, 3n, ... (1-based positions in the stream), deterministic.
* `fraction=f`: keep each event independently with probability f, drawn from numpy's
  `default_rng(seed)`, one double per event in stream order, so feeding the stream one event at
  a time (`offer`) or in batches (`offer_batch`) keeps exactly the same events.

What it produces is per-key sample counts (`counts`), in order of each key's first sampled event
(that order is what `least_key`'s `from_counts` sees as arrival order).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from keyshift.errors import ConfigurationError


class Sampler:
    """Per-key sample counts over a stream of keys, every n-th event or a seeded fraction.

    Args:
        every: keep every n-th event (n >= 1; 1 keeps all). Give exactly one of `every`, `fraction`.
        fraction: keep each event with probability f, 0 < f <= 1.
        seed: seed of numpy's `default_rng` for `fraction` (ignored for `every`).

    Attributes:
        seen: events offered so far (events).
        sampled: events kept so far (events).
        counts: key -> events kept, in order of each key's first kept event.

    Raises:
        ConfigurationError: neither or both of `every`/`fraction`, n < 1, or f outside (0, 1].
    """

    def __init__(self, *, every: int | None = None, fraction: float | None = None, seed: int = 0) -> None:
        if (every is None) == (fraction is None):
            raise ConfigurationError("give exactly one of every= (n-th event) or fraction= (probability)")
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
            raise ConfigurationError(f"every must be an int >= 1 (events), got {every!r}")
        if fraction is not None and not 0 < fraction <= 1:
            raise ConfigurationError(f"fraction must be in (0, 1], got {fraction!r}")
        self.every = every
        self.fraction = fraction
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        self.seen = 0
        self.sampled = 0
        self.counts: dict[str, int] = {}

    def _mask(self, size: int) -> np.ndarray:
        if self.every is not None:
            positions = np.arange(self.seen + 1, self.seen + size + 1)  # 1-based stream positions
            return positions % self.every == 0
        return self._rng.random(size) < self.fraction

    def offer(self, key: str) -> bool:
        """Offer one event of `key`; True when it is kept (and counted)."""
        kept = bool(self._mask(1)[0])
        self.seen += 1
        if kept:
            self.sampled += 1
            self.counts[key] = self.counts.get(key, 0) + 1
        return kept

    def offer_batch(self, keys: Sequence[str] | np.ndarray | pd.Series) -> int:
        """Offer a batch of events, one key each, in stream order; returns how many were kept.

        Vectorized (numpy mask + `pd.factorize`); keeps the same events as `offer` one at a time.
        """
        values = np.asarray(keys, dtype=object)
        mask = self._mask(values.size)
        self.seen += int(values.size)
        kept = values[mask]
        if kept.size:
            codes, uniques = pd.factorize(kept, sort=False)
            for key, count in zip(uniques, np.bincount(codes, minlength=len(uniques))):
                name = str(key)
                self.counts[name] = self.counts.get(name, 0) + int(count)
            self.sampled += int(kept.size)
        return int(kept.size)

    @property
    def rate(self) -> float:
        """The sampling rate in force: 1/n for `every`, f for `fraction`."""
        return 1.0 / self.every if self.every is not None else float(self.fraction)

    def __repr__(self) -> str:
        rule = f"every={self.every}" if self.every is not None else f"fraction={self.fraction}, seed={self.seed}"
        return f"Sampler({rule}, seen={self.seen}, sampled={self.sampled}, keys={len(self.counts)})"
