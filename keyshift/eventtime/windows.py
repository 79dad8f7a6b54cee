"""Tumbling event-time windows over integer milliseconds.

A tumbling window of size `size_ms` covers [start, start + size_ms), with starts aligned to
multiples of `size_ms` from the epoch (UTC), as Spark's `window(event_time, "1 hour")` aligns them
when no start offset is given. Event time is always epoch milliseconds (UTC) in a plain integer.
"""

from __future__ import annotations

import numpy as np

HOUR_MS = 3_600_000
"""One hour of event time, in milliseconds."""

YSB_WINDOW_MS = 10_000
"""The Yahoo Streaming Benchmark's window: 10 seconds of event time, tumbling, aligned to the
epoch (the benchmark's published time divisor). Here, not in the generator (`keyshift.data.ysb`),
because the job's spec (`keyshift.jobs.ysb`), which executors unpickle, needs it too."""


def window_start_ms(event_time_ms: int, size_ms: int = HOUR_MS) -> int:
    """Start of the tumbling window holding `event_time_ms`.

    Args:
        event_time_ms: event time, epoch milliseconds UTC (may be negative: before 1970).
        size_ms: window size in milliseconds, > 0.

    Returns:
        The largest multiple of `size_ms` that is <= `event_time_ms` (floor, also for negatives).

    Raises:
        ValueError: if `size_ms` <= 0.
    """
    if size_ms <= 0:
        raise ValueError(f"window size must be > 0 ms, got {size_ms}")
    return event_time_ms - event_time_ms % size_ms


def window_starts_ms(event_times_ms: np.ndarray, size_ms: int = HOUR_MS) -> np.ndarray:
    """Vectorized `window_start_ms` over an int64 array; returns an int64 array of the same shape."""
    if size_ms <= 0:
        raise ValueError(f"window size must be > 0 ms, got {size_ms}")
    times = np.asarray(event_times_ms, dtype=np.int64)
    return times - np.mod(times, size_ms)


def window_closed(window_end_ms: int, watermark_ms: int) -> bool:
    """Whether a window [start, end) is final under a watermark.

    A window is closed once the watermark has reached its end (`end <= watermark`): no event it
    can still hold is on time. Spark fires an event-time timer when `expiry < watermark`, so the
    processor registers `end - 1` to close a window in exactly this batch.
    """
    return window_end_ms <= watermark_ms
