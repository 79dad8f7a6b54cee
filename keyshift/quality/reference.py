"""The flights' windows computed by pandas straight from the data file, to check a run against.

An independent computation: no Kafka, no Spark, no keyshift code on the path of the numbers
but the window rule itself (tumbling windows aligned to the epoch, `keyshift.eventtime.windows`).
A run whose windows equal it lost no event and counted none twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from keyshift.errors import ConfigurationError, DataError
from keyshift.eventtime.windows import HOUR_MS

KEY_COLUMNS = ["origin", "window_start"]
VALUE_COLUMNS = ["count", "sum_delay_min", "max_delay_min"]


def reference_windows(flights_file: Path, limit: int | None = None, window_ms: int = HOUR_MS,
                      drop_event_ids: set[int] | None = None) -> pd.DataFrame:
    """Count, sum and max of `delay` per (origin, tumbling window) over the first `limit` flights.

    Args:
        flights_file: the flights Parquet file (`keyshift.data.flights.flights_path`); event id =
            row number, as the replay assigns it.
        limit: flights to include (None: all 3,000,000).
        window_ms: window size, ms of event time.
        drop_event_ids: events to leave out (e.g. the late events of a run, to compare what the
            run counted).

    Returns:
        A frame of origin, window_start (UTC timestamp), count, sum_delay_min, max_delay_min,
        sorted by origin and window_start.
    """
    flights = pq.read_table(flights_file, columns=["date", "delay", "origin"]).to_pandas()
    if limit is not None:
        flights = flights.iloc[:limit]
    if drop_event_ids:
        flights = flights.drop(index=list(drop_event_ids))
    times_ms = flights["date"].astype("datetime64[ms]").astype("int64")
    starts = times_ms - times_ms % window_ms
    grouped = (
        flights.assign(window_start=pd.to_datetime(starts, unit="ms", utc=True))
        .groupby(KEY_COLUMNS)["delay"]
        .agg(count="count", sum_delay_min="sum", max_delay_min="max")
        .reset_index()
    )
    return grouped.sort_values(KEY_COLUMNS).reset_index(drop=True)


def reference_of(frame: pd.DataFrame, window_ms: int = HOUR_MS) -> pd.DataFrame:
    """Count, sum and max of delay_min per (origin, tumbling event-time window) of a drift frame.

    The table `reference_windows` computes from the file, computed from `frame` instead (pandas only, no Spark, no Kafka), with the same columns, dtypes and
    order, so `compare_to_reference(windows_dir, reference_of(frame))` checks a run over the
    topic `keyshift.data.drift.write_plain(..., frame, ...)` wrote. Windows are aligned to the epoch:
    window_start = event_time - event_time % window_ms.

    Args:
        frame: rows with columns origin (str), delay_min (int, minutes), event_time (int, epoch
            ms UTC), e.g. from `keyshift.data.drift.shifted_flights`; other columns are ignored.
        window_ms: window size, ms of event time, int >= 1.

    Returns:
        A frame with columns origin (object), window_start (datetime64[ns, UTC]),
        count, sum_delay_min, max_delay_min (int64 each), one row per non-empty window, sorted by
        origin and window_start, index 0..n-1.

    Raises:
        ConfigurationError: `window_ms` is not an int >= 1.
        DataError: a column is missing or holds nulls.
    """
    if isinstance(window_ms, bool) or not isinstance(window_ms, (int, np.integer)) or window_ms < 1:
        raise ConfigurationError(f"window_ms must be an int >= 1, got {window_ms!r}")
    missing = [n for n in ("origin", "delay_min", "event_time") if n not in frame.columns]
    if missing:
        raise DataError(f"frame lacks columns {missing} (has {list(frame.columns)})")
    for name in ("origin", "delay_min", "event_time"):
        if nulls := int(frame[name].isna().sum()):
            raise DataError(f"frame column {name!r} holds {nulls} nulls")
    times_ms = frame["event_time"].astype("int64")
    starts = times_ms - times_ms % window_ms
    grouped = (
        pd.DataFrame({
            "origin": frame["origin"].astype(object),
            "window_start": pd.to_datetime(starts, unit="ms", utc=True),
            "delay": frame["delay_min"].astype("int64"),
        })
        .groupby(KEY_COLUMNS)["delay"]
        .agg(count="count", sum_delay_min="sum", max_delay_min="max")
        .reset_index()
    )
    grouped = grouped.astype({"origin": object, "window_start": "datetime64[ns, UTC]",
                              **{c: "int64" for c in VALUE_COLUMNS}})
    return grouped.sort_values(KEY_COLUMNS).reset_index(drop=True)


def compare_to_reference(windows_dir: Path, reference: pd.DataFrame) -> dict[str, Any]:
    """Compare a run's windows table with `reference_windows`, window by window.

    Returns:
        {"equal": bool, "windows": n ours, "reference_windows": n, "only_ours", "only_reference",
         "field_mismatches", "duplicated": windows written twice, "events": Σ count ours,
         "reference_events": Σ count reference}.
    """
    ours = pd.read_parquet(windows_dir, columns=KEY_COLUMNS + VALUE_COLUMNS)
    ours["window_start"] = pd.to_datetime(ours["window_start"], utc=True)
    duplicated = int(ours.duplicated(KEY_COLUMNS).sum())
    merged = ours.merge(reference, on=KEY_COLUMNS, how="outer", suffixes=("", "_ref"), indicator=True)
    both = merged[merged["_merge"] == "both"]
    mismatches = int(sum((both[c] != both[f"{c}_ref"]) for c in VALUE_COLUMNS).astype(bool).sum()) if len(both) else 0
    only_ours = int((merged["_merge"] == "left_only").sum())
    only_reference = int((merged["_merge"] == "right_only").sum())
    return {
        "equal": not (mismatches or only_ours or only_reference or duplicated),
        "windows": len(ours),
        "reference_windows": len(reference),
        "only_ours": only_ours,
        "only_reference": only_reference,
        "field_mismatches": mismatches,
        "duplicated": duplicated,
        "events": int(ours["count"].sum()),
        "reference_events": int(reference["count"].sum()),
    }
