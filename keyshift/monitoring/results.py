"""Time series of monitor results: Redis for the latest and the recent, Parquet for the history.

Per monitored topic (key names in `keyshift.names`):

| Redis key | type | holds |
| --- | --- | --- |
| `keyshift:balance:<topic>:latest` | string | the latest record (JSON, `evaluate.evaluation_record`) |
| `keyshift:balance:<topic>:series` | sorted set | the last `keep` records (JSON members, score = epoch seconds) |
| `keyshift:balance:<topic>:cursor[:<run_id>]` | hash | where the next evaluation of the topic (of one job run on it, when the store names one) starts: `end_offsets`, `job_run_id`, `job_per_slot_events`, `trigger`, `trigger_state` (JSON values) |
| `keyshift:balance:<topic>:last_switch` | hash | `at_s`, `strategy_from`, `strategy_to`, `migration_s` (the cost_aware trigger's switch history) |

`ResultStore.save` writes the record, the series entry, the trimmed series, the cursor and (on a
switch) the last switch in one MULTI/EXEC, so a reader never sees a record without its cursor.
The Parquet history (`evaluate.save_evaluation`, one file per evaluation under
`<directory>/history/`) is the long record; `history_records` reads it back when Redis is down
or empty.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from keyshift.errors import ConfigurationError, StackError
from keyshift.names import redis_balance_cursor_key, redis_balance_latest_key, redis_balance_series_key, redis_balance_switch_key
from keyshift.settings import Settings

log = logging.getLogger(__name__)

DEFAULT_KEEP = 288
"""Records kept in the Redis series: two days at one evaluation every 10 minutes."""


def balance_dir(settings: Settings, topic: str | None = None) -> Path:
    """The Parquet history's directory: `runs/balance` offline, `runs/balance/topics/<topic>` for a topic."""
    base = settings.runs_dir / "balance"
    return base if topic is None else base / "topics" / topic


@dataclass(frozen=True)
class LastSwitch:
    """The last switch decided for a topic, as the cost_aware trigger needs it (`record_switch`).

    Attributes:
        at_s: when, epoch seconds. strategy_from: the strategy left. strategy_to: the one chosen.
        migration_s: the measured seconds of that migration, None until a migration measures it.
    """

    at_s: float
    strategy_from: str
    strategy_to: str
    migration_s: float | None = None


class ResultStore:
    """The Redis side of one topic's monitor results (see the module docstring for the keys).

    Args:
        client: a Redis client with `decode_responses=True`.
        topic: the monitored topic (names the keys).
        keep: records kept in the recent series, >= 1.
        run_id: the job run whose cursor this store reads and writes (`...:cursor:<run_id>`); None:
            the topic's own cursor. The latest record, the series and the last switch are the topic's either way.

    Raises:
        ConfigurationError: keep < 1.
    """

    def __init__(self, client: redis.Redis, topic: str, keep: int = DEFAULT_KEEP, run_id: str | None = None) -> None:
        if keep < 1:
            raise ConfigurationError(f"keep must be >= 1 records, got {keep!r}")
        self.client = client
        self.topic = topic
        self.keep = keep
        self.run_id = run_id

    @classmethod
    def from_settings(cls, settings: Settings, topic: str, keep: int = DEFAULT_KEEP, run_id: str | None = None) -> ResultStore:
        """A store on the coordinator at `settings.redis_url` (arguments as the constructor's).

        Raises:
            StackError: Redis does not answer (run `keyshift stack up`).
        """
        from keyshift.runs import redis_client

        return cls(redis_client(settings), topic, keep, run_id)

    def _unreachable(self, exc: redis.RedisError) -> StackError:
        return StackError(f"Redis does not answer for the balance series of {self.topic!r} ({exc}); run `keyshift stack up`")

    def save(self, record: Mapping[str, Any], *, cursor: Mapping[str, Any] | None = None, switch: LastSwitch | None = None) -> None:
        """Store `record` as the latest and in the series (trimmed to `keep`), with cursor and switch, atomically.

        Args:
            record: a JSON-able record with `at_s` (epoch seconds), e.g. `evaluate.evaluation_record`.
            cursor: fields of the cursor hash to set (values JSON-encoded), or None.
            switch: the switch just decided, or None. Its `migration_s` is written only when not
                None, so a cost measured earlier stays until a migration measures a new one.

        Raises:
            StackError: Redis is unreachable.
        """
        text = json.dumps(record, sort_keys=True)
        series = redis_balance_series_key(self.topic)
        try:
            with self.client.pipeline(transaction=True) as pipe:
                pipe.set(redis_balance_latest_key(self.topic), text)
                pipe.zadd(series, {text: float(record["at_s"])})
                pipe.zremrangebyrank(series, 0, -self.keep - 1)
                if cursor:
                    pipe.hset(redis_balance_cursor_key(self.topic, self.run_id), mapping={k: json.dumps(v) for k, v in cursor.items()})
                if switch is not None:
                    pipe.hset(redis_balance_switch_key(self.topic), mapping=_switch_fields(switch))
                pipe.execute()
        except redis.RedisError as exc:
            raise self._unreachable(exc) from exc

    def record_switch(self, switch: LastSwitch) -> None:
        """Store `switch` as the topic's last switch (as `save` does with its `switch`), on its own:
        the balance monitor's DAG records a decision as a switch once it requests it.

        Raises:
            StackError: Redis is unreachable.
        """
        try:
            self.client.hset(redis_balance_switch_key(self.topic), mapping=_switch_fields(switch))
        except redis.RedisError as exc:
            raise self._unreachable(exc) from exc

    def latest(self) -> dict[str, Any] | None:
        """The latest record, or None when none is stored. Raises StackError when Redis is unreachable."""
        try:
            text = self.client.get(redis_balance_latest_key(self.topic))
        except redis.RedisError as exc:
            raise self._unreachable(exc) from exc
        return json.loads(text) if text else None

    def recent(self, count: int) -> list[dict[str, Any]]:
        """The last `count` records of the series, oldest first. Raises StackError when Redis is unreachable."""
        try:
            members = self.client.zrange(redis_balance_series_key(self.topic), -count, -1) if count > 0 else []
        except redis.RedisError as exc:
            raise self._unreachable(exc) from exc
        return [json.loads(member) for member in members]

    def cursor(self) -> dict[str, Any]:
        """The cursor hash, JSON-decoded (empty before the first evaluation). Raises StackError when unreachable."""
        try:
            raw = self.client.hgetall(redis_balance_cursor_key(self.topic, self.run_id))
        except redis.RedisError as exc:
            raise self._unreachable(exc) from exc
        return {k: json.loads(v) for k, v in raw.items()}

    def last_switch(self) -> LastSwitch | None:
        """The last switch recorded for the topic, or None. Raises StackError when Redis is unreachable."""
        try:
            raw = self.client.hgetall(redis_balance_switch_key(self.topic))
        except redis.RedisError as exc:
            raise self._unreachable(exc) from exc
        if not raw:
            return None
        cost = raw.get("migration_s")
        return LastSwitch(float(raw["at_s"]), raw["strategy_from"], raw["strategy_to"], float(cost) if cost else None)

    def record_migration(self, migration_s: float) -> None:
        """Set the measured seconds of the last switch's migration (the cost_aware trigger's new cost).

        Raises:
            ConfigurationError: a negative time. StackError: Redis is unreachable.
        """
        if not migration_s >= 0:
            raise ConfigurationError(f"migration_s must be >= 0 seconds, got {migration_s!r}")
        try:
            self.client.hset(redis_balance_switch_key(self.topic), "migration_s", float(migration_s))
        except redis.RedisError as exc:
            raise self._unreachable(exc) from exc

    def annotate(self, at_s: float, job_run_id: str | None, fields: Mapping[str, Any]) -> bool:
        """Add `fields` to the stored record of the evaluation at `at_s` about `job_run_id`, in the
        series and (when it is that record) as the latest, atomically (WATCH/MULTI, retried on a race).

        What happened to a decision after the evaluation (its switch request skipped, with the
        reason) is written this way into the monitor's own record.

        Args:
            at_s: the record's `at_s` (epoch seconds; matched within a millisecond).
            job_run_id: the record's `job_run_id` (None matches a record that names none).
            fields: JSON-able fields to set (they replace the record's fields of those names).

        Returns:
            True when the record was found and updated; False when the series no longer holds it.

        Raises:
            StackError: Redis is unreachable.
        """
        series, latest = redis_balance_series_key(self.topic), redis_balance_latest_key(self.topic)
        try:
            with self.client.pipeline(transaction=True) as pipe:
                while True:
                    try:
                        pipe.watch(series, latest)
                        members = pipe.zrangebyscore(series, at_s - 1e-3, at_s + 1e-3)
                        found = next((m for m in members if json.loads(m).get("job_run_id") == job_run_id), None)
                        if found is None:
                            pipe.unwatch()
                            return False
                        record = json.loads(found)
                        text = json.dumps({**record, **fields}, sort_keys=True)
                        latest_text = pipe.get(latest)
                        pipe.multi()
                        pipe.zrem(series, found)
                        pipe.zadd(series, {text: float(record["at_s"])})
                        if latest_text == found:
                            pipe.set(latest, text)
                        pipe.execute()
                        return True
                    except redis.WatchError:
                        continue
        except redis.RedisError as exc:
            raise self._unreachable(exc) from exc

    def delete(self) -> None:
        """Remove the topic's keys (latest, series, the topic's cursor and every run's cursor on it, last switch)."""
        cursors = list(self.client.scan_iter(match=redis_balance_cursor_key(self.topic, "*"), count=1000))
        self.client.delete(
            redis_balance_latest_key(self.topic), redis_balance_series_key(self.topic),
            redis_balance_cursor_key(self.topic), redis_balance_switch_key(self.topic), *cursors,
        )


def _switch_fields(switch: LastSwitch) -> dict[str, Any]:
    """The last-switch hash's fields of `switch` (`migration_s` only when measured, so a cost measured earlier stays)."""
    fields: dict[str, Any] = {"at_s": switch.at_s, "strategy_from": switch.strategy_from, "strategy_to": switch.strategy_to}
    if switch.migration_s is not None:
        fields["migration_s"] = switch.migration_s
    return fields


def _plain(value: Any) -> Any:
    """A value read from Parquet as plain Python (numpy scalars and arrays to int/float/list; NaN to None)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, float) and value != value:
        return None
    return value


def _record_of(frame) -> dict[str, Any]:
    """Rebuild one `evaluation_record` from the rows `save_evaluation` wrote (one per strategy)."""
    from keyshift.monitoring.evaluate import MEASURED_FIELDS

    rows = [{k: _plain(v) for k, v in row.items()} for row in frame.to_dict(orient="records")]
    first = rows[0]
    results = [
        {
            "strategy": row["strategy"], "in_force": bool(row["is_in_force"]), "partitions": first["partitions"],
            "loads": list(row["loads"]), "balance_degree": row["balance_degree"],
            "extra_compute_time": row["extra_compute_time"], "max_over_mean": row["max_over_mean"],
            "split_keys": row.get("split_keys", 0),
        }
        for row in rows
    ]
    decision = {k[len("decision_"):]: v for k, v in first.items() if k.startswith("decision_")} or None
    context = {k[len("context_"):]: v for k, v in first.items() if k.startswith("context_")}
    measured: dict[str, dict[str, Any]] = {}
    for source in ("arrivals", "processed"):
        if f"{source}_loads" in first and first[f"{source}_loads"] is not None:
            measured[source] = {"source": source, **{name: first.get(f"{source}_{name}") for name in MEASURED_FIELDS}}
    from datetime import datetime

    return {
        "at": first["at"],
        "at_s": datetime.fromisoformat(first["at"]).timestamp(),
        **context,
        "evaluation": {"partitions": first["partitions"], "in_force": first["in_force"], "events": first["events"], "keys": first["keys"], "results": results},
        "decision": decision,
        "measured": measured,
        "history_file": None,
    }


def history_records(directory: Path, last: int = 1) -> list[dict[str, Any]]:
    """The last `last` records of the Parquet history under `<directory>/history/`, oldest first.

    Each is rebuilt into the `evaluate.evaluation_record` shape from the rows `save_evaluation`
    wrote (context fields that were not scalars are not in the Parquet file).

    Raises:
        ConfigurationError: no history under `directory` (names it and the command that writes it).
    """
    import pandas as pd

    from keyshift.monitoring.evaluate import HISTORY

    files = sorted((directory / HISTORY).glob("*.parquet"))[-last:] if last > 0 else []
    if not files:
        raise ConfigurationError(f"no balance history under {directory / HISTORY}; run `keyshift balance evaluate` first")
    records = []
    for path in files:
        record = _record_of(pd.read_parquet(path))
        record["history_file"] = str(path)
        records.append(record)
    return records


def load_records(settings: Settings, topic: str | None, last: int = 1) -> tuple[list[dict[str, Any]], str]:
    """The last `last` records of a series (oldest first) and where they were read.

    A topic's series is read from Redis; when Redis does not answer, or holds nothing for the
    topic, from the Parquet history (`history_records`), logging why. The offline series
    (`topic` None, the file source) lives only in the Parquet history.

    Returns:
        (records, "redis" | "parquet").

    Raises:
        ConfigurationError: nothing stored in either place (the message names both and the fix).
    """
    from keyshift.monitoring.evaluate import HISTORY

    directory = balance_dir(settings, topic)
    if topic is not None:
        try:
            store = ResultStore.from_settings(settings, topic)
            records = store.recent(last) if last > 1 else [r for r in [store.latest()] if r is not None]
            if records:
                return records, "redis"
            log.info("Redis holds no balance records for %r; reading the Parquet history", topic)
        except StackError as exc:
            log.warning("%s; reading the Parquet history instead", exc)
    try:
        return history_records(directory, last), "parquet"
    except ConfigurationError:
        where = f"Redis ({redis_balance_latest_key(topic)}) nor " if topic is not None else ""
        raise ConfigurationError(
            f"no balance results in {where}{directory / HISTORY}; run `keyshift balance evaluate"
            + (f" --topic {topic}`" if topic else "`")
        ) from None
