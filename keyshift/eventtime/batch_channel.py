"""What a micro-batch's tasks need from the driver, and what they tell it back, through Redis.

The ingest tasks of run batch b need two things the driver knows before b runs: the partition
clocks in force (`keyshift.eventtime.partition_clocks.PartitionClocks`) and the batch reference
of the plausibility rule (Spark's watermark and batch timestamp from the query's offset log,
`keyshift.eventtime.plausibility.BatchReference`). After reading, each task reports per Kafka
partition what it read (`SliceReport`), which the driver folds into the clocks after b.

On one machine the run folder and the checkpoint could be read by every task as local files; on
a cluster they cannot (the run folder is the driver's, the checkpoint may be on HDFS or S3). So
the driver, which reads both, publishes each batch's context here before it triggers the batch's
jobs, and the tasks read it from Redis, the coordinator every executor already reaches for the
assignment map (`keyshift.placement.assignment_store`). This is Spark's broadcast pattern (state
computed on the driver, read once per executor process), done through Redis because the context
of a streaming batch exists only once the batch is planned, after the query's plan (and its
broadcasts) are fixed.

Keys (`keyshift.names`): `<prefix>:batch:<run_id>:<b>:context`, a JSON string written before the
batch's jobs; `<prefix>:batch:<run_id>:<b>:reports:<query>`, a hash task id -> JSON.
Both expire after `TTL_S`; the driver deletes a batch's keys once the batch after it is sealed.

**Replay.** The context is derived from files the driver never rewrites (`in-force-<b>.json` and
Spark's `offsets/<b>`), so a batch that Spark replays after a crash is published with the same
context, and its tasks write the same reports (same offsets, same records) over the old ones.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from keyshift.errors import JobError, StackError
from keyshift.eventtime.partition_clocks import PartitionClocks, SliceReport
from keyshift.eventtime.plausibility import BATCH_ID_PROPERTY, BatchReference
from keyshift.names import redis_batch_context_key, redis_batch_reports_key

TTL_S = 7 * 24 * 3600
"""Seconds a batch's keys live in Redis if the driver never deletes them (a run that died)."""


class BatchChannel:
    """One run's batch contexts and task reports in Redis (module docstring).

    Args:
        redis_url: the coordinator's URL (with its password, when set), reachable from the
            driver and every executor.
        run_id: the run.

    Every method raises StackError when Redis fails (the batch fails, and Spark replays it when
    the query restarts; nothing is committed without its reports).
    """

    def __init__(self, redis_url: str, run_id: str) -> None:
        import redis

        self.redis_url, self.run_id = redis_url, run_id
        self.client = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=30, socket_connect_timeout=10)

    def publish(self, batch_id: int, clocks: PartitionClocks, reference: BatchReference) -> None:
        """Driver: publish run batch `batch_id`'s context before its jobs run."""
        body = {"clocks": clocks.as_json(), "watermark_ms": int(reference.watermark_ms),
                "timestamp_ms": None if reference.timestamp_ms is None else int(reference.timestamp_ms)}
        self._call("publish the context of", batch_id,
                   lambda: self.client.set(redis_batch_context_key(self.run_id, batch_id), json.dumps(body), ex=TTL_S))

    def context(self, batch_id: int) -> tuple[PartitionClocks, BatchReference]:
        """Task: run batch `batch_id`'s (clocks in force, batch reference).

        Raises:
            JobError: nothing published for the batch (the driver publishes before the batch's
                jobs, so a task that finds nothing reads another Redis than the driver's, or the
                context expired), or the JSON is not a context.
        """
        key = redis_batch_context_key(self.run_id, batch_id)
        raw = self._call("read the context of", batch_id, lambda: self.client.get(key))
        if raw is None:
            raise JobError(f"run batch {batch_id} has no context in Redis at {key!r}; the driver publishes it before the "
                           f"batch runs, so every executor must reach the driver's Redis ({_address(self.redis_url)})")
        try:
            body = json.loads(raw)
            timestamp = body["timestamp_ms"]
            return (PartitionClocks.from_json(body["clocks"]),
                    BatchReference(int(body["watermark_ms"]), None if timestamp is None else int(timestamp)))
        except (ValueError, KeyError, TypeError) as error:
            raise JobError(f"the context of run batch {batch_id} in Redis ({key!r}) is not valid: {error}") from error

    def report(self, batch_id: int, query: str, task: int, report: Mapping[int, SliceReport]) -> None:
        """Task: write what this task read per partition (replacing an earlier attempt's, the same)."""
        body = {str(p): {"records": r.records, "max_event_time_ms": r.max_event_time_ms, "marker": r.marker} for p, r in report.items()}
        key = redis_batch_reports_key(self.run_id, batch_id, query)

        def write() -> None:
            pipe = self.client.pipeline()
            pipe.hset(key, str(int(task)), json.dumps(body, sort_keys=True))
            pipe.expire(key, TTL_S)
            pipe.execute()

        self._call("write a task report of", batch_id, write)

    def reports(self, batch_id: int, query: str) -> list[dict[int, SliceReport]]:
        """Driver: the reports the tasks of query `query` wrote for run batch `batch_id`, by task id.

        Raises:
            JobError: a report is not valid JSON of the expected shape.
        """
        key = redis_batch_reports_key(self.run_id, batch_id, query)
        raw = self._call("read the task reports of", batch_id, lambda: self.client.hgetall(key))
        found = []
        for task in sorted(raw, key=int):
            try:
                found.append({int(p): SliceReport(int(r["records"]), None if r["max_event_time_ms"] is None else int(r["max_event_time_ms"]),
                                                  bool(r["marker"])) for p, r in json.loads(raw[task]).items()})
            except (ValueError, KeyError, TypeError) as error:
                raise JobError(f"task {task}'s report of run batch {batch_id} in Redis ({key!r}) is not valid: {error}") from error
        return found

    def forget(self, batch_id: int, query: str) -> None:
        """Driver: delete run batch `batch_id`'s context and query `query`'s reports of it."""
        self._call("delete the keys of", batch_id, lambda: self.client.delete(
            redis_batch_context_key(self.run_id, batch_id), redis_batch_reports_key(self.run_id, batch_id, query)))

    def _call(self, what: str, batch_id: int, action):
        import redis

        try:
            return action()
        except redis.RedisError as exc:
            raise StackError(f"Redis at {_address(self.redis_url)} failed to {what} run {self.run_id}'s batch {batch_id}: {exc}; "
                             "is Redis up (keyshift stack up)?") from exc


def _address(url: str) -> str:
    """`url` without its password (for messages)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}:{parts.port or 6379}"


_channels: dict[tuple[str, str], BatchChannel] = {}
_contexts: dict[tuple[str, str, int], tuple[PartitionClocks, BatchReference]] = {}


def task_batch(redis_url: str, run_id: str, batch_base: int) -> tuple[BatchChannel, int, PartitionClocks, BatchReference] | None:
    """In a task: (the run's channel, run batch id, clocks in force, batch reference) of the
    running micro-batch, read from Redis once per batch and Python worker; None outside a
    streaming query.

    Args:
        redis_url, run_id: the run's channel.
        batch_base: the run-wide id of the query's batch 0 (Spark's local property
            `streaming.sql.batchId` is the query's own id).

    Raises:
        JobError, StackError: as `BatchChannel.context`.
    """
    from pyspark import TaskContext

    context = TaskContext.get()
    batch = context.getLocalProperty(BATCH_ID_PROPERTY) if context is not None else None
    if batch is None:
        return None
    batch_id = int(batch_base) + int(batch)
    channel = _channels.get((redis_url, run_id))
    if channel is None:
        channel = _channels[(redis_url, run_id)] = BatchChannel(redis_url, run_id)
    key = (redis_url, run_id, batch_id)
    if key not in _contexts:
        if len(_contexts) > 64:
            _contexts.clear()
        _contexts[key] = channel.context(batch_id)
    return (channel, batch_id, *_contexts[key])
