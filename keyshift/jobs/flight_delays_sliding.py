"""The sliding flight delay job: per origin airport, 1-hour windows every minute, with key windows.

The same records, key and topics as the flight delay job (`keyshift.jobs.flight_delays`): a record
is one flight, Kafka key = origin. Per origin and window [w, w + 1 h), w every minute: the number
of flights, the sum and the max of their delays (minutes). Computed with key windows (paper 003):
the job emits an update only where an origin's result changes, at most 2 per flight, instead of
up to 60 window rows per flight; `keyshift.eventtime.key_windows.expand_updates` turns the
key_windows table back into Spark's native `window(ts, "1 hour", "1 minute")` rows.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from keyshift.eventtime.windows import HOUR_MS
from keyshift.jobs.flight_delays import FLIGHT_DELAYS
from keyshift.jobs.spec import Aggregate, JobSpec

MINUTE_MS = 60_000
"""The slide: one minute of event time."""


def no_outputs(counts: np.ndarray, aggregates: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The output rule of a key-window job: nothing derived (updates carry count, sum and max)."""
    return {}


FLIGHT_DELAYS_SLIDING = JobSpec(
    name="flight_delays_sliding",
    fields=FLIGHT_DELAYS.fields,
    key=FLIGHT_DELAYS.key,
    aggregates=(Aggregate("sum_delay_min", "sum", "delay_min"), Aggregate("max_delay_min", "max", "delay_min")),
    outputs={},
    derive=no_outputs,
    table_columns=("count", "sum_delay_min", "max_delay_min"),
    topics=FLIGHT_DELAYS.topics,
    window_ms=HOUR_MS,
    window="key_windows",
    slide_ms=MINUTE_MS,
)
"""The sliding flight delay job's spec: 1 h windows every 1 min per origin, as key windows."""
