"""Dynamic watermark bound from the local event-time disorder of a key (paper 004, Lyu et al.).

Paper 004 (§4, "the stream micro-cluster model" and Algorithm 1) keeps, per operator, the
micro-cluster T_k = {t_{i+1}, ..., t_{i+k}} (eq. 2): the event times of the last k events **in
arrival order**, the oldest dropped as a new one arrives (Fig. 5). From T_k it computes a disorder
degree P in [0, 1] (eq. 4) and inserts the watermark W_i = N - M * P (eq. 3 = eq. 5), N the maximum
event time seen (eq. 1), M the maximum wait (the dynamic range of the watermark). Step (7) of the
strategy keeps the inserted watermark non-decreasing.

Where we depart from the paper, and why:

* Eq. (4) is an image missing from our copy of the text. The prose says P is determined by the
  arrival order and the timestamps of T_k, that 1 means "completely in order" and 0 "completely
  reversed". The fraction of in-order pairs (1 - normalised Kendall tau distance) fits that exactly;
  we use its complement (below), the normalised inversion count.
* Sign. Read literally, W = N - M * P with P = 1 for an in-order cluster makes an ordered stream
  wait M and a reversed one wait 0, the opposite of the paper's stated aim (wait longer when the
  disorder is severe, §4 and Fig. 4). DESIGN.md asks for more disorder -> longer wait, so our P is
  0 for an in-order cluster and 1 for a reversed one (P_ours = 1 - P_paper), and the wait grows
  with it.
* Floor and magnitude. The paper's wait M * P ignores how far behind the late events were. Ours is
  at least ``min_bound_ms`` and at least the largest lateness seen in the cluster, capped at M.
* Scope. The paper keeps one micro-cluster per operator (subtask). We keep one per key (or per
  slot: the caller decides what a "key" is), and measure lateness against the running maximum
  *inside* the cluster, so the state is just the k times and the wait relaxes to the floor once
  the last k events are in order. The key's maximum event time N and the monotone watermark
  (step 7: ``wm = max(wm_prev, N - bound)``) stay with the caller.

All times are int64 milliseconds of event time (epoch, UTC); latencies are seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_DTYPE = np.dtype("<i8")
"""Wire format of a packed micro-cluster: little-endian int64, 8 bytes per event time."""


def _times(times_ms: np.ndarray, name: str = "times_ms") -> np.ndarray:
    """`times_ms` as a 1-D int64 array; TypeError unless integer, ValueError unless 1-D."""
    times = np.asarray(times_ms)
    if times.ndim != 1:
        raise ValueError(f"{name} must be 1-D (times in arrival order), got shape {times.shape}")
    if times.size and not np.issubdtype(times.dtype, np.integer):
        raise TypeError(f"{name} must hold integer ms of event time, got dtype {times.dtype}")
    return times.astype(np.int64, copy=False)


def _inversions(times: np.ndarray) -> tuple[int, int]:
    """(inversions, pairs) of a 1-D int64 array: pairs i < j with t_i > t_j, and n(n-1)/2."""
    n = times.size
    pairs = n * (n - 1) // 2
    if pairs == 0:
        return 0, 0
    later_is_earlier = times[:, None] > times[None, :]  # [i, j]: t_i > t_j
    return int(np.triu(later_is_earlier, k=1).sum()), pairs


def _check_bounds(max_bound_ms: int, min_bound_ms: int) -> None:
    if min_bound_ms < 0:
        raise ValueError(f"min_bound_ms must be >= 0 ms, got {min_bound_ms}")
    if max_bound_ms < min_bound_ms:
        raise ValueError(f"max_bound_ms ({max_bound_ms}) must be >= min_bound_ms ({min_bound_ms})")


def disorder_degree(times_ms: np.ndarray) -> float:
    """Disorder degree P of a micro-cluster: the normalised inversion count (Kendall tau distance).

    ``P = #{(i, j) : i < j, t_i > t_j} / (n (n - 1) / 2)``, over the n event times in arrival order;
    ``P = 0`` when n < 2. Equal times are in order (not inversions).

    P = 0 for a non-decreasing (in-order) sequence, 1 for a strictly decreasing one, and it grows
    with the number of event pairs that arrived out of order. Paper 004 eq. (4) / Algorithm 1 step 3
    with the sign flipped: ``P = 1 - P_paper`` (see the module docstring).

    Args:
        times_ms: shape (n,), integer dtype (converted to int64): ms of event time, arrival order.
            Meant for a micro-cluster (n <= k, e.g. 32): time and memory are O(n^2).

    Returns:
        P, a float in [0, 1].

    Raises:
        TypeError: if the times are not integers.
        ValueError: if the array is not 1-D.
    """
    inversions, pairs = _inversions(_times(times_ms))
    return inversions / pairs if pairs else 0.0


def max_lateness_ms(times_ms: np.ndarray) -> int:
    """Largest lateness in a micro-cluster: ``D = max_i (max_{j <= i} t_j - t_i)`` ms (0 if empty).

    How far behind the running maximum of the cluster (in arrival order) its latest event was; 0
    exactly when the sequence is in order (when ``disorder_degree`` is 0). Shapes, dtypes and errors
    as ``disorder_degree``; O(n).
    """
    times = _times(times_ms)
    if times.size == 0:
        return 0
    return int((np.maximum.accumulate(times) - times).max())


def dynamic_bound_ms(times_ms: np.ndarray, max_bound_ms: int, min_bound_ms: int = 0) -> int:
    """Bound (allowed lateness, ms of event time) of a key's watermark from its micro-cluster.

    With P = I / C (``disorder_degree``: I inversions among C = n(n-1)/2 pairs), D
    (``max_lateness_ms``), M = ``max_bound_ms`` and m = ``min_bound_ms``::

        bound = min(M, max(m + ceil((M - m) * I / C), D))        (m when C = 0)

    The first term is paper 004 eq. (5) with the sign fixed and a floor: the wait spans the dynamic
    range [m, M] in proportion to the disorder degree. The second makes the wait at least as long
    as the lateness just observed, so an event as late as the latest one of the last k events is
    on time (unless later than M). Hence: in order -> m; non-decreasing in P and in D;
    m <= bound <= M; back to m once the last k times are in order. The ceiling is exact integer arithmetic.
    The key's watermark is then ``max(previous watermark, max event time - bound)`` (paper step 7).

    Args:
        times_ms: shape (n,), integer dtype: the micro-cluster, ms of event time, arrival order.
        max_bound_ms: M, the longest wait, ms of event time, >= ``min_bound_ms``.
        min_bound_ms: m, the shortest wait, ms of event time, >= 0.

    Returns:
        The bound in ms, a Python int in [min_bound_ms, max_bound_ms].

    Raises:
        TypeError: if the times are not integers.
        ValueError: if the array is not 1-D, min_bound_ms < 0 or max_bound_ms < min_bound_ms.
    """
    _check_bounds(max_bound_ms, min_bound_ms)
    times = _times(times_ms)
    inversions, pairs = _inversions(times)
    if inversions == 0:
        return int(min_bound_ms)
    span = int(max_bound_ms) - int(min_bound_ms)
    follows_p = int(min_bound_ms) + -(-span * inversions // pairs)  # ceil, exact
    return min(int(max_bound_ms), max(follows_p, max_lateness_ms(times)))


@dataclass(frozen=True, kw_only=True)
class DynamicBound:
    """Per-key state of the dynamic bound: the micro-cluster, last k event times in arrival order.

    The state of a key is its micro-cluster only (an int64 array of at most k times); the bound is
    recomputed from it. Stored with ``pack``, it costs 8 bytes per time: at most 8k bytes per key
    (256 bytes for k = 32) plus the container's overhead (one binary field of a MapState value).

    Attributes:
        k: micro-cluster size (paper 004 eq. 2), >= 2.
        max_bound_ms: M, longest wait, ms of event time, >= min_bound_ms.
        min_bound_ms: m, shortest wait, ms of event time, >= 0.

    Raises:
        ValueError: on construction, if k < 2 or the bounds are inconsistent.
    """

    k: int = 32
    max_bound_ms: int
    min_bound_ms: int = 0

    def __post_init__(self) -> None:
        if self.k < 2:
            raise ValueError(f"micro-cluster size k must be >= 2, got {self.k}")
        _check_bounds(self.max_bound_ms, self.min_bound_ms)

    def update(self, recent: np.ndarray, new_times: np.ndarray) -> tuple[np.ndarray, int]:
        """Feed one micro-batch of a key's events; return (new micro-cluster, bound after them).

        The new micro-cluster is the last k of ``recent`` followed by ``new_times``
        (``concatenate([recent, new_times])[-k:]``), as if the events arrived one by one
        (Fig. 5); vectorized, O(k + k^2) whatever the batch size. The bound is
        ``dynamic_bound_ms`` of the new micro-cluster. With no new times it is a no-op (same
        times, and the bound they give).

        Args:
            recent: shape (r,), integer dtype: the key's micro-cluster (empty for a new key), ms of
                event time, arrival order, as returned by ``update`` or ``unpack``.
            new_times: shape (n,), integer dtype: the key's events of this batch, ms of event time,
                arrival order (Kafka offset order).

        Returns:
            (times, bound): int64 array of shape (min(k, r + n),) and an int in [m, M].

        Raises:
            TypeError, ValueError: as ``dynamic_bound_ms``.
        """
        old, new = _times(recent, "recent"), _times(new_times, "new_times")
        if new.size >= self.k:
            cluster = new[-self.k :].copy()
        else:
            cluster = np.concatenate([old[max(old.size - (self.k - new.size), 0) :], new])
        return cluster, dynamic_bound_ms(cluster, self.max_bound_ms, self.min_bound_ms)

    def pack(self, recent: np.ndarray) -> bytes:
        """A micro-cluster as bytes: little-endian int64, 8 bytes per time (b"" when empty).

        Raises:
            TypeError, ValueError: if ``recent`` is not a 1-D integer array or holds more than
                k times.
        """
        times = _times(recent, "recent")
        if times.size > self.k:
            raise ValueError(f"a micro-cluster holds at most k={self.k} times, got {times.size}")
        return times.astype(_DTYPE).tobytes()

    def unpack(self, blob: bytes | None) -> np.ndarray:
        """The micro-cluster packed by ``pack``: a writable int64 array (empty for None or b"").

        Raises:
            ValueError: if the length of ``blob`` is not a multiple of 8 bytes.
        """
        if not blob:
            return np.empty(0, dtype=np.int64)
        if len(blob) % _DTYPE.itemsize:
            raise ValueError(f"a packed micro-cluster is a multiple of 8 bytes, got {len(blob)}")
        return np.frombuffer(blob, dtype=_DTYPE).astype(np.int64)


def performance_ratio(events_per_window: np.ndarray, latencies_s: np.ndarray) -> float:
    """Paper 004's performance ratio E, eq. (6): mean events per window / mean window latency.

    ``E = ((1/m) sum_i N_i) / ((1/m) sum_i D_i) = sum_i N_i / sum_i D_i``, over m windows: N_i the
    events counted in window i (on time), D_i its latency in seconds, from its opening to the end
    of its computation. A ratio of means, not the mean of the per-window ratios. Higher is better
    (more complete and sooner). Eq. (6) is an image missing from our copy; this is the paper's
    prose ("the mean amount of data computed over the mean window computation time", §5).

    Args:
        events_per_window: shape (m,), numeric, >= 0: N_i, events.
        latencies_s: shape (m,), numeric, >= 0, not all 0: D_i, seconds.

    Returns:
        E in events per second, a float.

    Raises:
        ValueError: if there are no windows, the shapes differ or are not 1-D, a value is
            negative or not finite, or every latency is 0 (E undefined).
    """
    counts = np.asarray(events_per_window, dtype=np.float64)
    latencies = np.asarray(latencies_s, dtype=np.float64)
    if counts.ndim != 1 or counts.shape != latencies.shape:
        raise ValueError(
            f"events_per_window and latencies_s must be 1-D of one length, "
            f"got shapes {counts.shape} and {latencies.shape}"
        )
    if counts.size == 0:
        raise ValueError("performance ratio of no windows is undefined (empty input)")
    both = np.concatenate([counts, latencies])
    if not np.isfinite(both).all() or (both < 0).any():
        raise ValueError("events per window and latencies must be finite and >= 0")
    total_latency = latencies.sum()
    if total_latency == 0:
        raise ValueError("performance ratio is undefined when every window latency is 0 s")
    return float(counts.sum() / total_latency)
