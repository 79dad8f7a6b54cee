"""`JobProgressTrigger`: watches a detached job's run record and progress from the triggerer.

The triggerer runs `run()` in its event loop, so nothing here may block: Redis is read with
`redis.asyncio`, and the one blocking call (Kafka end offsets through kafka-python) goes through
`asgiref.sync.sync_to_async`. `serialize()` returns exactly the constructor's arguments, so the
triggerer can rebuild the trigger from the database (Airflow's rule for every trigger).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from keyshift import names
from keyshift.orchestration.supervisor import describe_restart, restart_history

CLASSPATH = "keyshift.orchestration.triggers.JobProgressTrigger"


class JobProgressTrigger(BaseTrigger):
    """Fire one event when a detached job ends: `succeeded`, `failed` or `error`.

    Every `poll_interval` seconds it reads the run record (`names.redis_run_key`) and the latest
    progress (`names.redis_progress_key`, field `latest`); on each new batch, and at least every
    `REPORT_EVERY_S` seconds, it logs the batch, the watermark and the consumer lag (input topic
    end offsets − the job's offsets, per partition and in total). Whether the run's supervisor or
    driver process still runs is read from their pid files (`launch.record_alive`, off the event
    loop).

    Restarts: a supervised run's driver that dies is restarted from its checkpoint by its
    supervisor (`supervisor.py`, Flink's fixed-delay restart strategy), which counts it in the
    record (`restarts`, `restart_history`). Each new restart is logged here, once, as
    "driver died (signal 9), restart 1 of 3 in 10 s from its checkpoint", and a `failed` state
    written by a dying job does not end the watch while its supervisor lives: the supervisor
    either restarts the driver or, past `max_restarts`, records the final `failed` and exits.

    Outcomes (the event payload's `status`; the payload also carries `restarts` and
    `restart_history`):
      - `succeeded`: the job recorded `state=succeeded` (a bounded run drained) or `stopped` (a
        continuous run ended on SIGTERM), or its driver ended after a requested stop
        (`stop_requested_at`).
      - `failed`: the run recorded `state=failed` and no supervisor is left to restart it (the
        supervisor's `error` names the restart limit and the driver log); or every process of the
        run is gone while the record still says starting/running/restarting (a crash with no
        supervisor); or no run record appeared within `start_grace_s`.
      - `error`: Redis could not be read for `redis_error_limit` polls in a row.

    Args:
        run_id: the keyshift run id.
        settings: `Settings.without_secrets()` of the launching task (Redis address, broker); the
            passwords come from the triggerer's own `KEYSHIFT_*` environment.
        topic: the job's input topic, for the lag.
        poll_interval: seconds between polls (> 0).
        start_grace_s: seconds to wait for the run record to appear.
        redis_error_limit: consecutive Redis failures tolerated before giving up.
    """

    REPORT_EVERY_S = 60.0
    """Seconds between progress lines while no new batch completes."""

    def __init__(
        self,
        run_id: str,
        settings: dict[str, Any],
        topic: str = names.FLIGHTS_TOPIC,
        poll_interval: float = 10.0,
        start_grace_s: float = 120.0,
        redis_error_limit: int = 30,
    ) -> None:
        super().__init__()
        if poll_interval <= 0:
            raise ValueError(f"poll_interval must be > 0 seconds; got {poll_interval}")
        self.run_id = run_id
        self.settings = settings
        self.topic = topic
        self.poll_interval = poll_interval
        self.start_grace_s = start_grace_s
        self.redis_error_limit = redis_error_limit
        self._client = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Class path and the constructor's keyword arguments, one for one."""
        return (
            CLASSPATH,
            {
                "run_id": self.run_id,
                "settings": self.settings,
                "topic": self.topic,
                "poll_interval": self.poll_interval,
                "start_grace_s": self.start_grace_s,
                "redis_error_limit": self.redis_error_limit,
            },
        )

    def _settings(self):
        from keyshift.settings import Settings

        return Settings(**self.settings)

    def _event(self, status: str, record: dict[str, str], message: str, **extra: Any) -> TriggerEvent:
        payload = {
            "status": status,
            "run_id": self.run_id,
            "state": record.get("state"),
            "pid": int(record["pid"]) if record.get("pid") else None,
            "log_path": record.get("log_path"),
            "summary_path": record.get("summary_path"),
            "restarts": int(record.get("restarts") or 0),
            "restart_history": restart_history(record),
            "message": message,
            **extra,
        }
        return TriggerEvent(payload)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Poll until the job ends, logging progress and lag; yield one event, then return."""
        import redis.asyncio as aioredis
        from asgiref.sync import sync_to_async
        from redis.exceptions import RedisError

        from keyshift.orchestration.launch import record_alive

        settings = self._settings()
        self._client = aioredis.from_url(settings.redis_url, decode_responses=True, socket_timeout=10)
        run_key, progress_key = names.redis_run_key(self.run_id), names.redis_progress_key(self.run_id)
        started = time.monotonic()
        redis_errors = 0
        last_batch: dict[str, Any] = {}
        last_latest, last_report = None, 0.0
        restarts_logged = 0
        self.log.info("Watching run %s (record %s) every %.1f s", self.run_id, run_key, self.poll_interval)
        try:
            while True:
                try:
                    record = await self._client.hgetall(run_key)
                    latest = await self._client.hget(progress_key, "latest")
                    redis_errors = 0
                except RedisError as exc:
                    redis_errors += 1
                    self.log.warning("Redis read %d/%d failed: %s", redis_errors, self.redis_error_limit, exc)
                    if redis_errors >= self.redis_error_limit:
                        yield self._event("error", {}, f"Redis at {settings.redis_address} unreachable: {exc}")
                        return
                    await asyncio.sleep(self.poll_interval)
                    continue

                if not record:
                    waited = time.monotonic() - started
                    if waited > self.start_grace_s:
                        yield self._event("failed", {}, f"no run record {run_key} after {waited:.0f} s")
                        return
                    self.log.info("No run record for %s yet (%.0f s)", self.run_id, waited)
                else:
                    restarts_logged = self._report_restarts(record, restarts_logged)
                    if latest and (latest != last_latest or time.monotonic() - last_report >= self.REPORT_EVERY_S):
                        last_batch = await self._report(settings, latest)
                        last_latest, last_report = latest, time.monotonic()
                    outcome = self._outcome(record, await sync_to_async(record_alive)(settings, record))
                    if outcome is not None and outcome[0] == "failed" and record.get("state") != "failed":
                        # The driver is gone: the job may have written its final state as it exited.
                        record = await self._client.hgetall(run_key)
                        outcome = self._outcome(record, False)
                    if outcome is not None:
                        yield self._event(outcome[0], record, outcome[1], last_batch=last_batch)
                        return
                await asyncio.sleep(self.poll_interval)
        finally:
            await self.cleanup()

    def _outcome(self, record: dict[str, str], alive: bool | None) -> tuple[str, str] | None:
        """(status, message) if the run has ended, else None.

        `alive`: whether the run's supervisor or driver still runs (`launch.record_alive`).
        """
        state, log_path = record.get("state"), record.get("log_path")
        if state == "stopped" and record.get("stop_requested_at"):
            return "succeeded", f"run {self.run_id} stopped on request at {record['stop_requested_at']}"
        if state in ("succeeded", "stopped"):
            return "succeeded", f"run {self.run_id} {state}"
        if state == "failed" and alive and record.get("supervisor_pid"):
            return None  # its supervisor decides: a restart, or the final failure once it exits
        if state == "failed":
            error = f": {record['error']}" if record.get("error") else ""
            return "failed", f"run {self.run_id} recorded state failed{error}; see {log_path}"
        if alive is False:
            if record.get("stop_requested_at"):
                return "succeeded", f"run {self.run_id} stopped on request at {record['stop_requested_at']}"
            return "failed", (
                f"driver process {record.get('pid')} of run {self.run_id} is gone while its state is "
                f"{state!r}; see {log_path}"
            )
        return None

    def _report_restarts(self, record: dict[str, str], logged: int) -> int:
        """Log each restart recorded since the `logged` first ones; return how many are logged now."""
        history = restart_history(record)
        count = max(int(record.get("restarts") or 0), len(history))
        for number in range(logged + 1, count + 1):
            entry = next((e for e in history if e.get("restart") == number), {})
            self.log.warning("Run %s: %s; driver log %s", self.run_id,
                             describe_restart(entry, number, record), entry.get("log_path") or record.get("log_path"))
        return max(count, logged)

    async def _report(self, settings, latest: str) -> dict[str, Any]:
        """Log the latest batch and the consumer lag; return the batch's summary for the event."""
        from asgiref.sync import sync_to_async

        from keyshift.orchestration.pipeline import consumer_lag

        try:
            progress = json.loads(latest)
        except json.JSONDecodeError:
            self.log.warning("Unreadable progress record for %s: %.200s", self.run_id, latest)
            return {}
        batch = {
            "batch_id": progress.get("batch_id"),
            "input_rows": progress.get("input_rows"),
            "watermark_ms": progress.get("watermark_ms"),
        }
        lag_text = "unknown"
        try:
            from keyshift.topics import end_offsets

            ends = await sync_to_async(end_offsets)(settings, self.topic)
            lag = consumer_lag(ends, progress.get("offsets") or {})
            batch["lag"] = sum(lag.values())
            lag_text = f"{batch['lag']} {dict(lag)}"
        except Exception as exc:  # a broker hiccup must not end the watch
            self.log.warning("Cannot read end offsets of %r: %s", self.topic, exc)
        self.log.info(
            "Run %s batch %s: %s input rows, watermark_ms %s, consumer lag %s",
            self.run_id, batch["batch_id"], batch["input_rows"], batch["watermark_ms"], lag_text,
        )
        return batch

    async def cleanup(self) -> None:
        """Close the Redis client (idempotent; also called by the triggerer on removal)."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
