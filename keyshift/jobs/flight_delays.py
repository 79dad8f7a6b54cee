"""The flight delay job: hourly delay windows per origin airport, with alerts.

A record is one flight, Kafka key = origin: `{"event_id": 17, "origin": "ORD", "destination":
"LGA", "delay_min": -3, "distance_mi": 733, "event_time": 978307260000}` (event time in epoch ms
UTC). Per origin and hour: the number of flights, the sum and the max of their delays, the mean
delay, and an alert when the mean delay is at least 30 minutes over at least 5 flights.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from keyshift.names import ALERTS_TOPIC, DEAD_LETTER_TOPIC, FLIGHTS_TOPIC, LATE_TOPIC
from keyshift.jobs.spec import Aggregate, JobSpec, JobTopics, RecordField, window_columns, window_table_schema

ALERT_MIN_MEAN_DELAY_MIN = 30.0
"""An origin-hour alerts when its mean delay is at least this many minutes ..."""
ALERT_MIN_COUNT = 5
"""... over at least this many flights."""


def window_alerts(means: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Which windows alert: mean delay >= `ALERT_MIN_MEAN_DELAY_MIN` over >= `ALERT_MIN_COUNT` flights.

    Args:
        means: float array, mean delay of each window (minutes). counts: int array, flights per window.

    Returns:
        A bool array, one per window.
    """
    return (np.asarray(means) >= ALERT_MIN_MEAN_DELAY_MIN) & (np.asarray(counts) >= ALERT_MIN_COUNT)


def delay_outputs(counts: np.ndarray, aggregates: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The output rule: mean delay (minutes, float) and alert (bool) of each window."""
    means = aggregates["sum_delay_min"] / counts
    return {"mean_delay_min": means, "alert": window_alerts(means, counts)}


FLIGHT_DELAYS = JobSpec(
    name="flight_delays",
    fields=(
        RecordField("event_id", "long", non_negative=True),
        RecordField("origin", "string", non_empty=True),
        RecordField("destination", "string", non_empty=True),
        RecordField("delay_min", "long"),
        RecordField("distance_mi", "long", non_negative=True),
        RecordField("event_time", "long", column="event_time_ms", non_negative=True),
    ),
    key="origin",
    aggregates=(Aggregate("sum_delay_min", "sum", "delay_min"), Aggregate("max_delay_min", "max", "delay_min")),
    outputs={"mean_delay_min": "double", "alert": "boolean"},
    derive=delay_outputs,
    table_columns=("count", "sum_delay_min", "mean_delay_min", "max_delay_min", "alert"),
    alert="alert",
    alert_columns=("count", "mean_delay_min", "max_delay_min"),
    topics=JobTopics(input=FLIGHTS_TOPIC, alerts=ALERTS_TOPIC, late=LATE_TOPIC, dead_letter=DEAD_LETTER_TOPIC),
)
"""The flight delay job's spec."""


WINDOW_COLUMNS, WINDOW_TABLE_SCHEMA = window_columns(FLIGHT_DELAYS), window_table_schema(FLIGHT_DELAYS)
"""Columns of the flights' windows table, in order, and its Arrow schema."""
