"""Read what the keyshift page shows: Redis (run records, assignments, monitor and switch records)
and the run folders (`runs/<run_id>/`), assembled into `RunView`, `TopicView` and `RunRow` values.

Every read goes through keyshift's own stores (`keyshift.monitoring.results.ResultStore`,
`keyshift.placement.assignment_store.AssignmentStore`, `keyshift.migration.switch.SwitchControl`)
or the key names of `keyshift.names`; the run folder is read with `keyshift.ui.data`. When Redis
does not answer, the views are built from the run folders (and the monitor's Parquet history)
alone and say so (`redis_error`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from keyshift import names
from keyshift.errors import ConfigurationError, KeyshiftError
from keyshift.settings import Settings
from keyshift.ui import data
from keyshift.names import RunDir

log = logging.getLogger(__name__)

MONITOR_RECORDS = 288
"""Monitor records read per topic: the whole Redis series (`results.DEFAULT_KEEP`)."""
SWITCHES = 50
"""Finished switches read per run."""
RUN_KEY_PREFIX = f"{names.REDIS_PREFIX}:run:"


@dataclass(frozen=True)
class RunRow:
    """One run in a list.

    Attributes:
        run_id: the run's id (its folder under `runs/`).
        topic: its input topic ("" when not recorded).
        state: `starting`, `running`, `restarting`, `succeeded`, `failed`, `stopped` ("" unknown).
        strategy, epoch, partitions: the placement in force (`data.in_force` of the record).
        started_at_s: start, epoch seconds (None unknown).
        events_read: events the run read (summary, else the latest progress record; None unknown).
        balance_degree: the whole run's per-slot balance degree (summary; None before it ends).
        quality_ok: the last data-quality result passed (None: none recorded).
        figures: events read, late events, dead letters (top reasons), pending, windows (`data.run_figures`).
        switches: its switches, oldest first (with the pause each achieved).
        attention: what to mark (`data.attention`: late events or dead letters above zero, quality failed).
    """

    run_id: str
    topic: str
    state: str
    strategy: str | None
    epoch: int | None
    partitions: int | None
    started_at_s: float | None
    events_read: int | None
    balance_degree: float | None
    quality_ok: bool | None
    figures: data.RunFigures = data.RunFigures(None, None, None, (), None, None, "nothing recorded")
    switches: tuple[data.SwitchRow, ...] = ()
    attention: tuple[str, ...] = ()


@dataclass(frozen=True)
class TopicView:
    """What keyshift knows about one input topic.

    Attributes:
        topic: the topic.
        assignment: the published assignment's meta (strategy, P, epoch, published_at), None when
            nothing is published (a rule strategy such as `hash` needs none).
        monitor: the balance monitor's records, oldest first (`evaluate.evaluation_record` + `consumer_lag`).
        monitor_source: `redis`, `parquet` or "" (none).
        runs: the topic's runs, newest first.
    """

    topic: str
    assignment: Any
    monitor: tuple[Mapping[str, Any], ...]
    monitor_source: str
    runs: tuple[RunRow, ...] = ()


@dataclass(frozen=True)
class RunView:
    """Everything the run page shows.

    Attributes:
        run_id: the run. run_dir: its folder. record: the Redis run record (strings; {} if none).
        summary: `summary.json` (None while running). in_force: the placement in force.
        batches: per-batch per-slot loads. task_seconds: per stage, per-batch per-slot seconds.
        switches: its switches, oldest first. quality: the last data-quality result (None: none).
        topic: the topic's view (assignment, monitor records), None when the topic is unknown.
        redis_error: why Redis could not be read ("" when it was).
        figures: events read, late events, dead letters (top reasons), pending, windows (`data.run_figures`).
    """

    run_id: str
    run_dir: Path
    record: Mapping[str, str]
    summary: Mapping[str, Any] | None
    in_force: data.InForce
    batches: tuple[data.BatchLoad, ...]
    task_seconds: Mapping[str, Sequence[tuple[int, tuple[float, ...]]]]
    switches: tuple[data.SwitchRow, ...]
    quality: data.QualityResult | None
    topic: TopicView | None
    redis_error: str = ""
    figures: data.RunFigures = data.RunFigures(None, None, None, (), None, None, "nothing recorded")

    @property
    def attention(self) -> tuple[str, ...]:
        """What to mark on the run (`data.attention`)."""
        return data.attention(self.figures, self.quality)

    @property
    def monitor(self) -> list[Mapping[str, Any]]:
        """The topic's monitor records about this run (`data.records_of_run`)."""
        if self.topic is None:
            return []
        started = data.as_float(self.record.get("started_at"))
        finished = data.as_float(self.record.get("finished_at"))
        return data.records_of_run(self.topic.monitor, self.run_id, started, finished)


@dataclass(frozen=True)
class Overview:
    """The overview page: every topic and the most recent runs.

    Attributes:
        topics: one view per topic (without monitor records), the topic whose last run started
            last first (topics without runs after them, by name).
        runs: the most recent runs over all topics, newest first.
        activity: topic -> (runs recorded in Redis, start of the newest, epoch seconds or None).
        redis_error: why Redis could not be read ("" when it was).
    """

    topics: tuple[TopicView, ...]
    runs: tuple[RunRow, ...]
    activity: Mapping[str, tuple[int, float | None]] = field(default_factory=dict)
    redis_error: str = ""


@dataclass
class Reader:
    """Reads keyshift's records for the page.

    Args:
        settings: where the runs folder is (`settings.runs_dir`).
        client: a Redis client with `decode_responses=True`, or None when Redis is not reachable.
        redis_error: why there is no client ("" when there is one).
    """

    settings: Settings
    client: redis.Redis | None
    redis_error: str = ""
    _records: dict[str, dict[str, str]] | None = field(default=None, repr=False)

    @classmethod
    def from_settings(cls, settings: Settings) -> Reader:
        """A reader of the stack's Redis and runs folder; without Redis when it does not answer."""
        from keyshift.runs import redis_client

        try:
            return cls(settings, redis_client(settings, timeout_s=5.0))
        except KeyshiftError as exc:
            log.warning("keyshift page without Redis: %s", exc)
            return cls(settings, None, str(exc))

    @property
    def runs_dir(self) -> Path:
        """The runs folder: one folder per run."""
        return self.settings.runs_dir

    # ---- runs ------------------------------------------------------------------------------

    def run_records(self) -> dict[str, dict[str, str]]:
        """Every run record in Redis (`keyshift:run:<run_id>` hashes): run id -> fields (read once)."""
        if self._records is not None:
            return self._records
        records: dict[str, dict[str, str]] = {}
        if self.client is not None:
            try:
                keys = [k for k in self.client.scan_iter(match=RUN_KEY_PREFIX + "*", count=1000) if not k.endswith(":progress")]
                with self.client.pipeline(transaction=False) as pipe:
                    for key in keys:
                        pipe.hgetall(key)
                    for key, fields in zip(keys, pipe.execute(raise_on_error=False)):
                        if isinstance(fields, dict) and fields:  # another type under the prefix answers an error
                            records[key[len(RUN_KEY_PREFIX):]] = fields
            except redis.RedisError as exc:
                self.redis_error = f"Redis did not answer ({exc})"
        self._records = records
        return records

    def run_ids(self) -> list[str]:
        """Run ids known from Redis or from a run folder holding `job.json`, `summary.json` or `progress.jsonl`."""
        ids = set(self.run_records())
        if self.runs_dir.is_dir():
            for folder in self.runs_dir.iterdir():
                if folder.is_dir() and any((folder / f).is_file() for f in (RunDir.JOB_RECORD, RunDir.SUMMARY, RunDir.PROGRESS)):
                    ids.add(folder.name)
        return sorted(ids)

    def run_row(self, run_id: str) -> RunRow:
        """The list row of one run (reads its summary, job record, last progress line, quality result and switches)."""
        run_dir = self.runs_dir / run_id
        record = self.run_records().get(run_id, {})
        summary = data.read_json(RunDir(run_dir).summary)
        summary = summary if isinstance(summary, dict) else None
        job = data.read_json(RunDir(run_dir).job_record)
        placement = data.in_force(job if isinstance(job, dict) else None, record or None, (), summary)
        started = data.as_float(record.get("started_at"))
        if started is None and run_dir.is_dir():
            started = run_dir.stat().st_mtime
        figures = data.run_figures(summary, None if summary else self._latest_progress(run_id),
                                   None if summary else data.ledger_totals(run_dir))
        quality = data.quality_result(run_dir)
        topic = record.get("topic") or (summary or {}).get("topic") or data.recorded_config(job).get("topic") or ""
        state = record.get("state") or ("succeeded" if summary else "")
        return RunRow(run_id, topic, state, placement.strategy, placement.epoch, placement.partitions, started,
                      figures.events_read, data.as_float((summary or {}).get("balance_degree")),
                      None if quality is None else quality.success, figures, tuple(self.switches(run_id)),
                      data.attention(figures, quality))

    def _latest_progress(self, run_id: str) -> dict[str, Any]:
        """The run's last progress record: Redis `latest`, else the last line of `progress.jsonl`; {} when none."""
        if self.client is not None:
            try:
                text = self.client.hget(names.redis_progress_key(run_id), "latest")
                if text:
                    return json.loads(text)
            except (redis.RedisError, ValueError):
                pass
        records = data.read_jsonl(RunDir(self.runs_dir / run_id).progress)
        return records[-1] if records else {}

    def runs(self, topic: str | None = None, limit: int = 50) -> list[RunRow]:
        """The newest `limit` runs (of `topic` when given), newest first.

        Raises:
            ConfigurationError: limit < 1.
        """
        if limit < 1:
            raise ConfigurationError(f"limit must be >= 1 runs, got {limit}")
        records = self.run_records()

        def started(run_id: str) -> float:
            value = data.as_float(records.get(run_id, {}).get("started_at"))
            if value is None:
                folder = self.runs_dir / run_id
                value = folder.stat().st_mtime if folder.is_dir() else 0.0
            return value

        rows = []
        for run_id in sorted(self.run_ids(), key=started, reverse=True):
            recorded = records.get(run_id, {}).get("topic")
            if topic is not None and recorded and recorded != topic:
                continue  # the cheap test first: most runs have a record naming their topic
            row = self.run_row(run_id)
            if topic is None or row.topic == topic:
                rows.append(row)
            if len(rows) == limit:
                break
        return rows

    # ---- topics ----------------------------------------------------------------------------

    def topic_names(self) -> list[str]:
        """Topics named by a run record, a published assignment or monitor records."""
        topics = {r.get("topic") for r in self.run_records().values() if r.get("topic")}
        if self.client is not None:
            try:
                for pattern, suffix in ((f"{names.REDIS_PREFIX}:assignment:*:meta", ":meta"),
                                        (f"{names.REDIS_PREFIX}:balance:*:latest", ":latest")):
                    head = pattern.split("*")[0]
                    topics.update(k[len(head):-len(suffix)] for k in self.client.scan_iter(match=pattern, count=1000))
            except redis.RedisError as exc:
                self.redis_error = f"Redis did not answer ({exc})"
        return sorted(t for t in topics if t)

    def assignment(self, topic: str) -> Any:
        """The published assignment's meta of `topic` (`AssignmentMeta`), None when none is published or Redis is down."""
        if self.client is None:
            return None
        from keyshift.placement.assignment_store import AssignmentStore

        try:
            return AssignmentStore(self.client, topic).meta()
        except KeyshiftError:
            return None

    def monitor(self, topic: str, count: int = MONITOR_RECORDS) -> tuple[list[dict[str, Any]], str]:
        """The monitor's records of `topic`, oldest first, and where they were read (`redis`, `parquet`, "")."""
        from keyshift.monitoring.results import ResultStore, balance_dir, history_records

        if self.client is not None:
            try:
                records = ResultStore(self.client, topic).recent(count)
                if records:
                    return records, "redis"
            except KeyshiftError as exc:
                self.redis_error = str(exc)
        try:
            return history_records(balance_dir(self.settings, topic), count), "parquet"
        except (KeyshiftError, OSError, ValueError):
            return [], ""

    def topic(self, topic: str, *, with_monitor: bool = True, runs: int = 0) -> TopicView:
        """The view of `topic`: its assignment, monitor records (when `with_monitor`), its newest `runs` runs."""
        records, source = self.monitor(topic) if with_monitor else ([], "")
        rows = tuple(self.runs(topic, runs)) if runs > 0 else ()
        return TopicView(topic, self.assignment(topic), tuple(records), source, rows)

    def overview(self, limit: int = 30) -> Overview:
        """Every topic (assignment only) and the newest `limit` runs."""
        runs = self.runs(limit=limit)
        activity: dict[str, tuple[int, float | None]] = {}
        for record in self.run_records().values():
            topic = record.get("topic")
            if topic:
                count, last = activity.get(topic, (0, None))
                started = data.as_float(record.get("started_at"))
                activity[topic] = (count + 1, max((t for t in (last, started) if t is not None), default=None))
        names_ = sorted(self.topic_names(), key=lambda t: (-(activity.get(t, (0, None))[1] or 0.0), t))
        topics = tuple(self.topic(t, with_monitor=False) for t in names_)
        return Overview(topics, tuple(runs), activity, self.redis_error)

    # ---- one run ---------------------------------------------------------------------------

    def switches(self, run_id: str) -> list[data.SwitchRow]:
        """The run's switches, oldest first ([] when Redis is down or holds none)."""
        if self.client is None:
            return []
        from keyshift.migration.switch import SwitchControl

        try:
            control = SwitchControl(self.client, run_id)
            current = control.current()
            return data.switch_rows([r.as_json() for r in control.history(SWITCHES)], current.as_json() if current else None)
        except (redis.RedisError, ValueError, ConfigurationError) as exc:
            self.redis_error = f"Redis did not answer ({exc})"
            return []

    def run(self, run_id: str) -> RunView:
        """Everything the run page shows about `run_id`.

        Raises:
            ConfigurationError: no run of that id in Redis nor under the runs folder (or an id
                that is not a plain folder name).
        """
        if not run_id or "/" in run_id or run_id in (".", ".."):
            raise ConfigurationError(f"not a run id: {run_id!r}")
        run_dir = self.runs_dir / run_id
        record = self.run_records().get(run_id, {})
        if not record and not run_dir.is_dir():
            raise ConfigurationError(f"no run {run_id!r} in Redis nor in {self.runs_dir}")
        summary = data.read_json(RunDir(run_dir).summary)
        summary = summary if isinstance(summary, dict) else None
        job = data.read_json(RunDir(run_dir).job_record)
        job = job if isinstance(job, dict) else None
        batches = data.batch_loads(data.read_jsonl(RunDir(run_dir).progress), data.read_ledger(run_dir))
        topic = record.get("topic") or (summary or {}).get("topic") or data.recorded_config(job).get("topic")
        return RunView(
            run_id=run_id, run_dir=run_dir, record=record, summary=summary,
            in_force=data.in_force(job, record or None, batches, summary), batches=tuple(batches),
            task_seconds=data.task_seconds(data.read_json(RunDir(run_dir).task_seconds)),
            switches=tuple(self.switches(run_id)), quality=data.quality_result(run_dir),
            topic=self.topic(topic) if topic else None, redis_error=self.redis_error,
            figures=data.run_figures(summary, None if summary else self._latest_progress(run_id),
                                     None if summary else data.ledger_totals(run_dir)),
        )
