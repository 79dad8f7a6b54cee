"""Run records: what a job run is doing, in Redis (latest) and in `runs/<run_id>/` (history).

- Redis hash `keyshift:run:<run_id>`: the run record, `RunRecord` (its fields, who writes each:
  `keyshift.orchestration.launch`); state is starting | running | restarting | succeeded | failed |
  stopped. Every write encodes through `RunRecord.encode`, every typed read is `run_record`.
- Redis hash `keyshift:run:<run_id>:progress`, field `latest`: the last batch's progress record
  (JSON); every record is also appended to `runs/<run_id>/progress.jsonl`.
- `runs/<run_id>/summary.json`: the run's summary, written once at the end.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable

import redis
from tenacity import before_sleep_log, retry, retry_if_exception_type, stop_after_delay, wait_exponential

from keyshift.errors import StackError
from keyshift.names import RunDir, redis_progress_key, redis_replay_key, redis_run_key
from keyshift.settings import Settings

REDIS_OUTAGE_S = 60.0
"""Seconds a run record's update waits for Redis to come back (a restart) before it fails."""

log = logging.getLogger(__name__)

RUN_STATES = ("starting", "running", "succeeded", "failed", "stopped")


def redis_client(settings: Settings, *, decode_responses: bool = True, timeout_s: float = 10.0) -> redis.Redis:
    """A Redis client for the coordinator at `settings.redis_url` (with its password, when set).

    Args:
        settings: where Redis is, and its password (`KEYSHIFT_REDIS_PASSWORD`).
        decode_responses: return str (True) or bytes (False).
        timeout_s: socket timeout of each command, seconds; connecting gets at most 5 s.

    Raises:
        StackError: if Redis does not answer PING (with the fix: `keyshift stack up`), or refuses
            the login (with the fix: the password setting).
    """
    client = redis.Redis.from_url(
        settings.redis_url,
        decode_responses=decode_responses,
        socket_timeout=timeout_s,
        socket_connect_timeout=min(timeout_s, 5.0),
    )
    try:
        client.ping()
    except redis.RedisError as exc:
        from keyshift.stack.redis import unreachable

        raise unreachable(settings, exc) from exc
    return client


ACTIVE_STATES = frozenset({"starting", "running", "restarting"})
"""Run states in which a live driver is expected, or about to be (`restarting`: the supervisor
waits `restart_delay_s` before it starts the driver again)."""

TERMINAL_STATES = frozenset({"succeeded", "stopped", "failed"})
"""Run states the job writes when it ends (`stopped`: a continuous run ended on SIGTERM/SIGINT)."""

LIVE_STATES = frozenset({"running", "restarting"})
"""Run states of a live job run, the ones the balance monitor evaluates and may switch: its query
runs, or its supervisor restarts its driver from the checkpoint (a `starting` run has no query
yet to measure or cut; a finished run has nothing left to balance)."""


def live_run_records(client: redis.Redis) -> list[RunRecord]:
    """The run records in Redis whose state is in `LIVE_STATES`, oldest start first (then by run id).

    Args:
        client: a Redis client with `decode_responses=True`.

    Raises:
        StackError: Redis is unreachable.
    """
    prefix = redis_run_key("")
    try:
        keys = [k for k in client.scan_iter(match=prefix + "*", count=1000) if not k.endswith(":progress")]
        with client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hgetall(key)
            answers = pipe.execute(raise_on_error=False) if keys else []
    except redis.RedisError as exc:
        raise StackError(f"Redis does not answer for the run records ({exc}); run `keyshift stack up`") from exc
    records = [RunRecord.from_redis({"run_id": key[len(prefix):], **fields})
               for key, fields in zip(keys, answers) if isinstance(fields, dict) and fields.get("state") in LIVE_STATES]
    return sorted(records, key=lambda r: (_number(r.started_at or "", float, 0.0) or 0.0, r.run_id or ""))

@dataclass(frozen=True)
class RunRecord:
    """A job run's record in Redis (`names.redis_run_key(run_id)`), typed.

    Three processes write it, each its own fields (`keyshift.orchestration.launch` documents who
    writes what): the launcher, the supervisor and the job's driver (`RunRecorder`). Every write
    goes through `RunRecord.encode`, which refuses a field not declared here; typed reads go
    through `RunRecord.from_redis` (`run_record`). The Airflow trigger and the keyshift page still
    pass the stored text on (`read_run_record`): they forward or display it. Absent fields are
    None (or 0 / empty for the counters and the history).

    Attributes:
        run_id, job, topic, strategy, watermark: what was asked (text).
        partitions: P; epoch: the placement's epoch; segment: the index of the run's current
            query (set once its query started); bound_ms: ms of event time; limit: events, None
            for a continuous run.
        state: one of `RUN_STATES` or `restarting`; error: why it failed.
        pid, pid_create_time, host: the driver process (the job's Python driver once it runs).
        attempt: the supervisor's current attempt (1 = the first); restarts: restarts so far;
            restart_history: the restarts (list of dicts); last_exit: how the last driver ended;
            resumes: times the job resumed from its checkpoint.
        max_restarts, restart_delay_s: the restart policy (restarts; seconds).
        supervisor_pid, supervisor_pid_create_time, supervisor_log_path: the supervisor.
        log_path: the driver log; summary_path: `summary.json` once the run ended.
        started_at, finished_at, driver_started_at, stop_requested_at: as written: ISO 8601 UTC
            (launcher, supervisor) or epoch seconds (the job).
        stop_timeout_s: seconds a requested stop waits for the driver.
    """

    run_id: str | None = None
    job: str | None = None
    topic: str | None = None
    strategy: str | None = None
    watermark: str | None = None
    partitions: int | None = None
    epoch: int | None = None
    segment: int | None = None
    bound_ms: int | None = None
    limit: int | None = None
    state: str | None = None
    error: str | None = None
    pid: int | None = None
    pid_create_time: str | None = None
    host: str | None = None
    attempt: int | None = None
    restarts: int = 0
    restart_history: tuple[dict[str, Any], ...] = ()
    last_exit: str | None = None
    resumes: int = 0
    max_restarts: int | None = None
    restart_delay_s: float | None = None
    supervisor_pid: int | None = None
    supervisor_pid_create_time: str | None = None
    supervisor_log_path: str | None = None
    log_path: str | None = None
    summary_path: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    driver_started_at: str | None = None
    stop_requested_at: str | None = None
    stop_timeout_s: float | None = None

    @classmethod
    def field_names(cls) -> frozenset[str]:
        """The names a run record may hold."""
        return frozenset(f.name for f in fields(cls))

    @classmethod
    def encode(cls, **values: Any) -> dict[str, str]:
        """Redis hash fields for `values` (None skipped; lists and dicts as JSON; the rest as text).

        Raises:
            ValueError: a name that is not a field of the run record.
        """
        unknown = set(values) - cls.field_names()
        if unknown:
            raise ValueError(f"not fields of a run record: {sorted(unknown)}")
        return {k: (json.dumps(v) if isinstance(v, (dict, list, tuple)) else str(v)) for k, v in values.items() if v is not None}

    @classmethod
    def from_redis(cls, raw: Mapping[str, str]) -> "RunRecord":
        """The record from its Redis hash (`HGETALL`, decoded); unknown fields are ignored, and an
        empty or malformed number is None (a counter 0)."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            text = raw.get(f.name)
            if text is None:
                continue
            kind = f.type if isinstance(f.type, str) else str(f.type)
            if f.name == "restart_history":
                try:
                    values[f.name] = tuple(json.loads(text or "[]"))
                except ValueError:
                    values[f.name] = ()
            elif kind.startswith("int"):
                values[f.name] = _number(text, int, 0 if f.name in ("restarts", "resumes") else None)
            elif kind.startswith("float"):
                values[f.name] = _number(text, float, None)
            else:
                values[f.name] = text
        return cls(**values)

    @property
    def active(self) -> bool:
        """Whether a live driver is expected (`ACTIVE_STATES`)."""
        return self.state in ACTIVE_STATES


def _number(text: str, kind: type, empty: Any) -> Any:
    """`text` as `kind` (an int also from "5.0"), or `empty` when it is not a number."""
    try:
        return kind(text)
    except (TypeError, ValueError):
        try:
            return int(float(text)) if kind is int else empty
        except (TypeError, ValueError):
            return empty


def read_run_record(settings: Settings, run_id: str) -> dict[str, str]:
    """The Redis run record of `run_id` as stored, text fields (empty dict if there is none);
    `run_record` gives it typed.

    Raises:
        StackError: Redis cannot be reached (start it with `keyshift stack up`).
    """
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True, socket_timeout=10)
    try:
        return client.hgetall(redis_run_key(run_id))
    except redis.RedisError as exc:
        where = getattr(settings, "redis_address", None) or f"redis://{settings.redis_host}:{settings.redis_port}/0"
        raise StackError(f"cannot read run {run_id} from Redis at {where}: {exc}") from exc
    finally:
        client.close()


def run_record(settings: Settings, run_id: str) -> RunRecord | None:
    """The Redis run record of `run_id`, typed (`RunRecord.from_redis`); None if there is none.

    Raises:
        StackError: Redis cannot be reached (start it with `keyshift stack up`).
    """
    raw = read_run_record(settings, run_id)
    return RunRecord.from_redis(raw) if raw else None


class RunRecorder:
    """Writes one run's record, progress and summary (see the module docstring for the keys).

    Args:
        settings: where Redis and `runs/` are.
        run_id: the run's id; its folder is `settings.runs_dir / run_id`.
    """

    def __init__(self, settings: Settings, run_id: str) -> None:
        self.run_id = run_id
        self.folder = RunDir.of(settings.runs_dir, run_id)
        self.run_dir = self.folder.path
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.summary_path = self.folder.summary
        self.progress_path = self.folder.progress
        self.attempts_path = self.folder.attempts
        self.attempt = 0
        """This process's attempt at the run: 0, then one more per `--resume` (progress records carry it)."""
        self.attempt_started_at: float | None = None
        """When this attempt began processing (epoch seconds, Spark up); set by the driver."""
        self.redis = redis_client(settings)
        self.on_progress: Callable[[dict[str, Any]], None] | None = None
        """Called with each progress record after it is written (e.g. a progress bar); its errors
        are logged, never raised."""

    def update(self, **fields: Any) -> None:
        """Set fields of the run record (values stored as strings; None values skipped).

        Waits up to `REDIS_OUTAGE_S` seconds for Redis to come back (a restart).

        Raises:
            StackError: Redis stayed unreachable that long.
        """
        mapping = RunRecord.encode(**fields)
        if mapping:
            self._call(self.redis.hset, redis_run_key(self.run_id), mapping=mapping)

    @staticmethod
    def _call(function, *args: Any, **kwargs: Any) -> Any:
        """`function(*args, **kwargs)`, retried while Redis is unreachable, for `REDIS_OUTAGE_S` seconds."""
        @retry(retry=retry_if_exception_type(redis.ConnectionError), stop=stop_after_delay(REDIS_OUTAGE_S),
               wait=wait_exponential(0.2, max=2.0), before_sleep=before_sleep_log(log, logging.WARNING), reraise=True)
        def call() -> Any:
            return function(*args, **kwargs)

        try:
            return call()
        except redis.RedisError as exc:
            raise StackError(f"Redis did not answer for {REDIS_OUTAGE_S:.0f} s ({exc}); run `keyshift stack up`") from exc

    def start(self, **fields: Any) -> None:
        """Mark the run `running` with this process's pid and the start time (epoch seconds); an
        `error` a previous attempt recorded is removed (a resumed run that fails records its own)."""
        self._call(self.redis.hdel, redis_run_key(self.run_id), "error")
        self.update(run_id=self.run_id, state="running", pid=os.getpid(), started_at=time.time(),
                    summary_path=self.summary_path, **fields)

    def progress(self, record: dict[str, Any]) -> None:
        """Publish one batch's progress record: a line of progress.jsonl, then Redis `latest`.

        The file is the durable record; `on_progress`, when set, is called next; Redis holds the
        latest one for watchers. While Redis is unreachable (a restart) the record is not
        published there and the run goes on: the next batch's record replaces it anyway.
        """
        line = json.dumps(record, sort_keys=True)
        with self.progress_path.open("a") as out:
            out.write(line + "\n")
        if self.on_progress is not None:
            try:
                self.on_progress(record)
            except Exception as exc:  # a display must not stop the run
                log.debug("run %s: progress listener failed: %s", self.run_id, exc)
        try:
            self.redis.hset(redis_progress_key(self.run_id), mapping={"latest": line, "batch_id": record.get("batch_id", -1)})
        except redis.ConnectionError as exc:
            log.warning("run %s: batch %s's progress not published in Redis (%s); it is in %s",
                        self.run_id, record.get("batch_id"), exc, self.progress_path)

    def finish(self, summary: dict[str, Any], state: str = "succeeded") -> Path:
        """Write summary.json (atomically) and mark the run `state`; returns the summary's path."""
        partial = self.summary_path.with_suffix(".tmp")
        partial.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        partial.replace(self.summary_path)
        self.update(state=state, finished_at=time.time(), summary_path=self.summary_path)
        log.info("run %s %s; summary at %s", self.run_id, state, self.summary_path)
        return self.summary_path

    def fail(self, error: str) -> None:
        """Mark the run `failed` with the error text."""
        self.update(state="failed", finished_at=time.time(), error=error[:2000])

    def count_resume(self) -> int:
        """Add one to the run record's `resumes` (a `--resume` after the driver died); the new count."""
        return int(self._call(self.redis.hincrby, redis_run_key(self.run_id), "resumes", 1))

    def resumes(self) -> int:
        """How many times the run was resumed (0 if never)."""
        return int(self._call(self.redis.hget, redis_run_key(self.run_id), "resumes") or 0)

    def replay_record(self, topic: str) -> dict[str, str]:
        """The last replay's record for `topic` (empty when none was recorded)."""
        return self.redis.hgetall(redis_replay_key(topic))

    def start_attempt(self, started_at: float, events_at_start: int) -> None:
        """Append this attempt's line to `attempts.jsonl` (`RunDir.attempts`).

        Args:
            started_at: when the attempt began processing (epoch seconds, Spark up).
            events_at_start: events the run had read before it (its ledger's count).
        """
        with self.attempts_path.open("a") as out:
            out.write(json.dumps({"attempt": self.attempt, "started_at": round(float(started_at), 3),
                                  "events_at_start": int(events_at_start)}) + "\n")


def attempt_figures(attempts: list[dict[str, Any]], progress: list[dict[str, Any]], current: dict[str, Any]) -> list[dict[str, Any]]:
    """Each attempt's own events, seconds and events/s, for a run's summary.

    A resumed run's counters cover the whole run, while each attempt processed only what came
    after the last attempt's committed batches; so each attempt is measured by itself: its events
    are the run's events at its end minus those at its start, its seconds run from its start to
    its last batch. An attempt that ended without a summary (a crash, a second Ctrl-C) ends at its
    last progress record (time after it is not known); one without any ends at its start (0 events,
    0 s).

    Args:
        attempts: `attempts.jsonl`'s lines (`RunDir.attempts`).
        progress: `progress.jsonl`'s records; each has `events_read` (the run's events so far) and,
            since attempts were recorded, `attempt` and `written_at` (epoch seconds).
        current: this attempt's `attempt`, `events` (the run's events at its end) and `seconds`.

    Returns:
        One dict per attempt in order: `attempt`, `events`, `seconds`, `events_per_second`
        (None for 0 s).
    """
    out = []
    for line in sorted(attempts, key=lambda a: int(a["attempt"])):
        number, start = int(line["attempt"]), int(line["events_at_start"])
        if number == int(current["attempt"]):
            events, seconds = int(current["events"]) - start, float(current["seconds"])
        else:
            own = [r for r in progress if int(r.get("attempt", 0)) == number and r.get("written_at") is not None]
            last = own[-1] if own else None
            events = int(last["events_read"]) - start if last else 0
            seconds = float(last["written_at"]) - float(line["started_at"]) if last else 0.0
        out.append({"attempt": number, "events": events, "seconds": round(seconds, 3),
                    "events_per_second": round(events / seconds, 1) if seconds > 0 else None})
    return out


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file, in file order; [] when it is missing.

    A line that is not valid JSON (a record being written, or torn by a crash) is skipped.
    """
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    records = []
    for line in lines:
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            records.append(value)
    return records
