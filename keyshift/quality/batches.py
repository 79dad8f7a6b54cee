"""The batches the suites validate: a run's windows table, alert records and summary as pandas
DataFrames, with the derived columns each suite's expectations read (`keyshift.quality.suites`).

Readers (`read_windows`, `read_summary`, `read_alerts`, `read_job`, `read_expected_views`) take a
run's files, the YSB generator's record or the alerts topic; builders (`windows_batch`,
`ysb_windows_batch`, `alerts_batch`, `reconciliation_batch`) are pure functions of frames and
dicts, so a test can hand them a broken table, a wrong alert or an unreconciled summary.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from keyshift.errors import QualityError
from keyshift.jobs.flight_delays import WINDOW_COLUMNS, WINDOW_TABLE_SCHEMA, window_alerts
from keyshift.quality.suites import ALERT_DERIVED_COLUMNS, ALERT_FIELDS, RECONCILIATION_COLUMNS, YSB_WINDOW_COLUMNS
from keyshift.settings import Settings
from keyshift.names import RunDir

log = logging.getLogger(__name__)

_ALERT_DTYPES = {
    "origin": "object", "window_start_ms": "int64", "window_end_ms": "int64", "count": "int64",
    "mean_delay_min": "float64", "max_delay_min": "int64", "run_id": "object", "epoch": "int64",
}


def _epoch_ms(column: pd.Series) -> pd.Series:
    """UTC timestamps -> int64 epoch milliseconds."""
    return (pd.to_datetime(column, utc=True) - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(milliseconds=1)


# ---------------------------------------------------------------- readers


def read_windows(run_dir: Path, job: str | None = None) -> pd.DataFrame:
    """The windows table of a run, `run_dir/windows/*.parquet`, in file order.

    Args:
        run_dir: `runs/<run_id>/`.
        job: the run's job (None: flight_delays); names the columns of an empty table.

    Returns:
        The table's rows (UTC timestamps); no rows, with the job's columns (`WINDOW_COLUMNS`, or
        `YSB_WINDOW_COLUMNS` for ysb), when the run wrote no window (no folder or no file yet).
    """
    folder = RunDir(Path(run_dir)).windows
    files = sorted(folder.glob("*.parquet")) if folder.is_dir() else []
    if not files:
        if job == "ysb":
            return pd.DataFrame({
                "campaign_id": pd.Series(dtype="object"), "window_start": pd.Series(dtype="datetime64[us, UTC]"),
                "window_end": pd.Series(dtype="datetime64[us, UTC]"), "count": pd.Series(dtype="int64"),
                "slot": pd.Series(dtype="int32"), "epoch": pd.Series(dtype="int64"),
            })[list(YSB_WINDOW_COLUMNS)]
        return WINDOW_TABLE_SCHEMA.empty_table().to_pandas()
    return pd.concat((pd.read_parquet(path) for path in files), ignore_index=True)


def read_job(run_dir: Path) -> dict[str, Any]:
    """The run's job record `run_dir/job.json` (config, start offsets, the replay record it read),
    or `{}` for a run folder without one (a run from before job records; treated as flights)."""
    path = RunDir(Path(run_dir)).job_record
    if not path.is_file():
        return {}
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise QualityError(f"{path} is not valid JSON: {exc}") from exc
    return record if isinstance(record, dict) else {}


def expected_views_path(job_record: Mapping[str, Any]) -> Path | None:
    """Where the YSB generator's record of the run's input is: `expected_views.parquet` in the
    folder the topic's replay record names (`record`, `runs/ysb-<id>/`), as the job read it at
    start into `job.json`; None when the replay was not the YSB generator's."""
    replay = job_record.get("replay") or {}
    if replay.get("source") != "ysb" or not replay.get("record"):
        return None
    return Path(replay["record"]) / "expected_views.parquet"


def read_expected_views(path: Path) -> pd.DataFrame:
    """The YSB generator's `expected_views.parquet`: campaign_id, window_start_ms (epoch ms), views.

    Raises:
        QualityError: the file is missing or lacks those columns; the message names the path.
    """
    path = Path(path)
    if not path.is_file():
        raise QualityError(f"the YSB generator's record {path} is missing: the windows cannot be compared with it"
                           " (give it with `keyshift dq run --expected-views PATH`)")
    frame = pd.read_parquet(path)
    missing = {"campaign_id", "window_start_ms", "views"} - set(frame.columns)
    if missing:
        raise QualityError(f"{path} lacks the column(s) {sorted(missing)}: not a YSB generator's record")
    return frame


def read_summary(run_dir: Path) -> dict[str, Any]:
    """`run_dir/summary.json` as a dict.

    Raises:
        QualityError: the file is missing (the run has not finished) or is not a JSON object;
            the message names the path.
    """
    path = RunDir(Path(run_dir)).summary
    if not path.is_file():
        raise QualityError(f"run folder {run_dir} has no summary.json: the run has not finished, or the run id is wrong")
    try:
        summary = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise QualityError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(summary, dict):
        raise QualityError(f"{path} holds a {type(summary).__name__}, expected a JSON object")
    return summary


def first_batch_time_ms(run_dir: Path) -> int | None:
    """The `timestamp_ms` of the run's first progress record (`progress.jsonl`), if any: a time
    before any of the run's side-output records was produced."""
    path = RunDir(Path(run_dir)).progress
    if not path.is_file():
        return None
    with path.open() as lines:
        for line in lines:
            try:
                stamp = json.loads(line).get("timestamp_ms")
            except json.JSONDecodeError:
                continue
            if isinstance(stamp, int | float):
                return int(stamp)
    return None


def _client_options(settings: Settings) -> dict[str, Any]:
    try:  # the broker's security options, where the stack has them
        from keyshift.kafka_clients import client_options
    except ImportError:
        return {}
    return client_options(settings)


def read_alerts(settings: Settings, run_id: str, topic: str, since_ms: int | None = None,
                timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """Every committed alert record of one run on the alerts topic.

    Reads each partition from the first offset at or after `since_ms` (record timestamps; from
    the beginning when None) up to its end offset at the call, with `read_committed` isolation
    (records of aborted transactions are not alerts), and keeps the JSON values whose `run_id`
    is `run_id`. A value that is not a JSON object is kept as `{"run_id": run_id, "raw": ...}`
    only if it names the run, so it fails the suite's column checks instead of vanishing.

    Args:
        settings: where the broker is. run_id: the run. topic: the alerts topic.
        since_ms: epoch ms; records older than this are skipped (use the run's first batch time
            minus a margin). timeout_s: give up when the end offsets are not reached in time.

    Returns:
        The alert records (dicts), partition by partition in offset order.

    Raises:
        QualityError: the broker does not answer, or the end offsets are not reached in time.
    """
    import time

    from kafka import KafkaConsumer, TopicPartition
    from kafka.errors import KafkaError

    try:
        consumer = KafkaConsumer(bootstrap_servers=settings.bootstrap_servers, enable_auto_commit=False, group_id=None,
                                 isolation_level="read_committed", consumer_timeout_ms=2_000,
                                 client_id=f"keyshift-dq-{run_id}", **_client_options(settings))
    except KafkaError as exc:
        raise QualityError(f"cannot read topic {topic!r} at {settings.bootstrap_servers}: {exc}; start Kafka with `keyshift stack up`") from exc
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        if not partitions:
            log.info("alerts topic %r does not exist or has no partitions: no alert records", topic)
            return []
        consumer.assign(partitions)
        ends = consumer.end_offsets(partitions)
        starts = {tp: 0 for tp in partitions}
        if since_ms is not None:
            found = consumer.offsets_for_times({tp: max(0, int(since_ms)) for tp in partitions})
            starts = {tp: (found[tp].offset if found.get(tp) is not None else ends[tp]) for tp in partitions}
        for tp in partitions:
            consumer.seek(tp, starts[tp])
        records: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < ends[tp] for tp in partitions):
            if time.monotonic() > deadline:
                behind = {tp.partition: ends[tp] - consumer.position(tp) for tp in partitions if consumer.position(tp) < ends[tp]}
                raise QualityError(f"reading {topic!r} timed out after {timeout_s:g} s; records left per partition: {behind}")
            for tp, messages in consumer.poll(timeout_ms=1_000).items():
                for message in messages:
                    if message.offset >= ends[tp]:
                        continue
                    record = _alert_value(message.value, run_id)
                    if record is not None:
                        records.append(record)
        log.info("read %d alert records of run %s from %r (%d records scanned)", len(records), run_id, topic,
                 sum(ends[tp] - starts[tp] for tp in partitions))
        return records
    except KafkaError as exc:
        raise QualityError(f"cannot read topic {topic!r} at {settings.bootstrap_servers}: {exc}") from exc
    finally:
        consumer.close()


def _alert_value(value: bytes | None, run_id: str) -> dict[str, Any] | None:
    try:
        record = json.loads(value or b"")
    except (json.JSONDecodeError, UnicodeDecodeError):
        text = (value or b"").decode("utf-8", "replace")
        return {"run_id": run_id, "raw": text} if run_id in text else None
    if not isinstance(record, dict):
        return {"run_id": run_id, "raw": json.dumps(record)} if run_id in json.dumps(record) else None
    return record if record.get("run_id") == run_id else None


# ---------------------------------------------------------------- builders


def windows_batch(windows: pd.DataFrame, window_ms: int) -> pd.DataFrame:
    """The windows suite's batch: the table plus `window_ms`, `window_offset_ms`, `alert_rule`,
    `mean_error_min`.

    Args:
        windows: the windows table (`read_windows`), columns `WINDOW_COLUMNS`.
        window_ms: the job's window size, ms of event time (> 0).

    Returns:
        A copy of `windows` with: `window_ms` = window_end - window_start in ms;
        `window_offset_ms` = window_start (epoch ms) mod `window_ms`; `alert_rule` = the job's
        alert rule on mean and count; `mean_error_min` = |mean_delay_min - sum_delay_min / count|
        (minutes). Rows with a null in an input get a null there (the not-null checks report them).
    """
    frame = windows.copy()
    try:
        start_ms, end_ms = _epoch_ms(frame["window_start"]), _epoch_ms(frame["window_end"])
        frame["window_ms"] = end_ms - start_ms
        frame["window_offset_ms"] = start_ms % int(window_ms)
        frame["alert_rule"] = window_alerts(frame["mean_delay_min"].to_numpy(dtype=float), frame["count"].to_numpy(dtype=float))
        with np.errstate(divide="ignore", invalid="ignore"):
            frame["mean_error_min"] = (frame["mean_delay_min"] - frame["sum_delay_min"] / frame["count"]).abs()
    except (KeyError, TypeError, ValueError) as exc:  # a table without the columns: the column check says which
        log.warning("windows table lacks what the derived columns need (%s); the column checks will fail", exc)
    return frame


def ysb_windows_batch(windows: pd.DataFrame, window_ms: int, expected: pd.DataFrame) -> pd.DataFrame:
    """The YSB windows suite's batch: the table plus `window_ms`, `window_offset_ms` and
    `expected_views`.

    Args:
        windows: a YSB windows table (`read_windows`), columns `YSB_WINDOW_COLUMNS`.
        window_ms: the job's window size, ms of event time (> 0).
        expected: the generator's record (`read_expected_views`): campaign_id, window_start_ms,
            views, one row per (campaign, window) holding a view.

    Returns:
        A copy of `windows` with `window_ms` = window_end - window_start (ms), `window_offset_ms`
        = window_start (epoch ms) mod `window_ms`, and `expected_views` = the record's views for
        the row's campaign_id and window_start (null, Int64, where the record has none). A table
        without the needed columns gets nulls there (the column check names what is missing).
    """
    frame = windows.copy().reset_index(drop=True)
    try:
        start_ms, end_ms = _epoch_ms(frame["window_start"]), _epoch_ms(frame["window_end"])
        frame["window_ms"] = end_ms - start_ms
        frame["window_offset_ms"] = start_ms % int(window_ms)
        record = expected.assign(campaign_id=expected["campaign_id"].astype(str),
                                 window_start_ms=expected["window_start_ms"].astype("int64"))
        record = record.drop_duplicates(["campaign_id", "window_start_ms"])[["campaign_id", "window_start_ms", "views"]]
        probe = pd.DataFrame({"campaign_id": frame["campaign_id"].astype(str), "window_start_ms": start_ms.astype("Int64")})
        record["window_start_ms"] = record["window_start_ms"].astype("Int64")
        matched = probe.merge(record, on=["campaign_id", "window_start_ms"], how="left")
        frame["expected_views"] = matched["views"].astype("Int64").to_numpy()
    except (KeyError, TypeError, ValueError) as exc:
        log.warning("YSB windows table lacks what the derived columns need (%s); the column checks will fail", exc)
    return frame


def alerts_batch(alerts: Iterable[Mapping[str, Any]], windows: pd.DataFrame) -> pd.DataFrame:
    """The alerts suite's batch: one row per alert record, joined with the run's windows table.

    Args:
        alerts: the run's alert records (`read_alerts`): dicts with `ALERT_FIELDS`.
        windows: the run's windows table (`read_windows`).

    Returns:
        The records' fields (missing ones absent, so `expect_column_to_exist` names them), plus
        `window_found` (a window of the table has the alert's origin, window_start_ms and
        window_end_ms), `window_alert`, `window_count` (that window's alert flag and count; null
        without a window) and `mean_error_min` = |alert mean - window mean| (null without one).
    """
    frame = pd.DataFrame.from_records(list(alerts))
    if frame.empty:
        frame = pd.DataFrame({column: pd.Series(dtype=dtype) for column, dtype in _ALERT_DTYPES.items()})
    keys = ["origin", "window_start_ms", "window_end_ms"]
    if not set(keys) <= set(frame.columns):
        for column in ALERT_DERIVED_COLUMNS:
            frame[column] = pd.Series([None] * len(frame), dtype="object")
        return frame
    table = pd.DataFrame({
        "origin": windows["origin"].astype(str),
        "window_start_ms": _epoch_ms(windows["window_start"]).astype("int64"),
        "window_end_ms": _epoch_ms(windows["window_end"]).astype("int64"),
        "window_alert": windows["alert"].astype(bool),
        "window_count": windows["count"].astype("int64"),
        "window_mean_delay_min": windows["mean_delay_min"].astype(float),
    }).drop_duplicates(keys)  # a duplicated window is the windows suite's finding, not a second match
    probe = frame[keys].copy()
    probe["origin"] = probe["origin"].astype(str)
    for column in keys[1:]:
        probe[column] = pd.to_numeric(probe[column], errors="coerce").astype("Int64")
    table[keys[1:]] = table[keys[1:]].astype("Int64")
    matched = probe.merge(table, on=keys, how="left", indicator=True)
    frame = frame.reset_index(drop=True)
    frame["window_found"] = (matched["_merge"] == "both").to_numpy()
    frame["window_alert"] = matched["window_alert"].astype("boolean").to_numpy()
    frame["window_count"] = matched["window_count"].astype("Int64").to_numpy()
    mean = pd.to_numeric(frame["mean_delay_min"], errors="coerce") if "mean_delay_min" in frame else np.nan
    frame["mean_error_min"] = (mean - matched["window_mean_delay_min"]).abs().to_numpy()
    return frame


def reconciliation_batch(summary: Mapping[str, Any], windows: pd.DataFrame) -> pd.DataFrame:
    """The reconciliation suite's batch: one row of the summary's counts and the table's.

    Args:
        summary: the run's `summary.json`.
        windows: the run's windows table.

    Returns:
        One row: `RECONCILIATION_COLUMNS` from the summary (null where absent), `accounted_events`
        = sum_window_counts + late_events + dead_letters + filtered_events + pending_events
        (pending absent or null = 0; filtered absent = 0: a summary from before it was counted),
        `unread_events` = events_produced - events_read (null when either is unknown), and the
        table's `table_windows` (rows), `table_sum_counts` (Σ count), `table_alerts` (alert rows;
        0 for a table without an `alert` column, such as YSB's).
    """
    row: dict[str, Any] = {column: summary.get(column) for column in RECONCILIATION_COLUMNS}
    if row["pending_events"] is None:
        row["pending_events"] = 0
    if "filtered_events" not in summary:  # a summary from before filtering existed: none filtered
        row["filtered_events"] = 0
    parts = [row[c] for c in ("sum_window_counts", "late_events", "dead_letters", "filtered_events", "pending_events")]
    row["accounted_events"] = sum(parts) if all(isinstance(p, int) for p in parts) else None
    produced, read = row["events_produced"], row["events_read"]
    row["unread_events"] = produced - read if isinstance(produced, int) and isinstance(read, int) else None
    row["table_windows"] = len(windows)
    row["table_sum_counts"] = int(windows["count"].sum()) if len(windows) else 0
    row["table_alerts"] = int(windows["alert"].astype(bool).sum()) if len(windows) and "alert" in windows else 0
    return pd.DataFrame([row])


def window_columns_present(windows: pd.DataFrame) -> bool:
    """Whether `windows` has every column of the windows table (`WINDOW_COLUMNS`)."""
    return set(WINDOW_COLUMNS) <= set(windows.columns)


__all__ = [
    "ALERT_FIELDS", "alerts_batch", "expected_views_path", "first_batch_time_ms", "read_alerts", "read_expected_views",
    "read_job", "read_summary", "read_windows", "reconciliation_batch", "window_columns_present", "windows_batch",
    "ysb_windows_batch",
]
