"""Per-slot task time of a query's keyed stages, read from Spark's monitoring REST API.

Load is time as well as events: with one core per slot a micro-batch lasts as long as its slowest
task in each stage. Each micro-batch of the flight delay job runs two stages of P tasks whose
partition index is the slot: the source stage reads Kafka partition s (Ahead KeyBy puts slot s's
keys there), parses and runs Local Merge; the stateful stage runs slot s's state (the slot-token
placement puts slot s on shuffle partition s). This module reads those tasks' `executorRunTime`
from `/api/v1/applications/<app>/stages`.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

import requests

log = logging.getLogger(__name__)

_BATCH = re.compile(r"^batch = (\d+)$", re.MULTILINE)


@dataclass(frozen=True)
class KeyedStageTaskSeconds:
    """Per-task executor run time of the two keyed stages of each micro-batch, in seconds.

    Attributes:
        source: batch id -> one float per ingest task: the stage that reads the topic, parses
            and runs Local Merge. With one task per Kafka partition (index = slot), under Ahead
            KeyBy a task holds its slot's events, so this is where a slot's event load becomes
            time; a coalesced ingest stage has S tasks, each reading a range of Kafka partitions.
        stateful: batch id -> S floats (index = stateful partition, = slot when S = P): the
            stateful operator's stage. It reads Local Merge's partial aggregates, one row per
            (key, window, piece) per source task, so its work follows the keys and windows a
            slot holds more than its events.
    """

    source: dict[int, list[float]]
    stateful: dict[int, list[float]]


def keyed_stage_task_seconds(
    ui_url: str, app_id: str, query_name: str, partitions: int, timeout_s: float = 10.0, skip: frozenset[int] = frozenset(),
    stateful_partitions: int | None = None, source_tasks: int | None = None,
) -> KeyedStageTaskSeconds:
    """Executor run time per task of each micro-batch's source and stateful stages, in seconds.

    A batch's stages are those whose description starts with the query's name and carries
    `batch = N`. The source stage is the batch's first stage of `source_tasks` tasks that reads
    input records; the stateful stage is its last stage of S tasks that writes no shuffle (the
    source stage writes the shuffle to the stateful operator).

    Args:
        ui_url: the Spark UI address (`SparkContext.uiWebUrl`).
        app_id: `SparkContext.applicationId`.
        query_name: the streaming query's name (the first line of its stages' descriptions).
        partitions: P, the slots (Kafka partitions).
        timeout_s: HTTP timeout per request, seconds.
        skip: batch ids already read (their tasks are not asked for again).
        stateful_partitions: S, the stateful stage's tasks (`spark.sql.shuffle.partitions`);
            None: S = P.
        source_tasks: the source stage's tasks (`JobConfig.source_tasks`: S when
            the ingest stage is coalesced); None: P, one per Kafka partition.

    Returns:
        The source stage's batch id -> list of `source_tasks` floats (seconds, index = task; =
        slot with one task per Kafka partition) and the stateful
        stage's batch id -> list of S floats (index = stateful partition, which holds the slots
        of `keyshift.placement.tokens.stateful_partition_of_slot`; = slot when S = P), for the
        batches whose stages the UI still retains (`spark.ui.retainedStages`, 1,000 by default).

    Raises:
        requests.RequestException: when the UI does not answer.
    """
    base = f"{ui_url.rstrip('/')}/api/v1/applications/{app_id}"
    stateful_tasks = partitions if stateful_partitions is None else stateful_partitions
    ingest_tasks = partitions if source_tasks is None else source_tasks
    with requests.Session() as http:
        stages = http.get(f"{base}/stages", params={"status": "complete"}, timeout=timeout_s).json()
        source: dict[int, dict[str, Any]] = {}
        stateful: dict[int, dict[str, Any]] = {}
        for stage in stages:
            description = stage.get("description") or ""
            match = _BATCH.search(description)
            if not match or not description.startswith(query_name + "\n") or stage.get("numTasks") not in (ingest_tasks, stateful_tasks):
                continue
            batch = int(match.group(1))
            if batch in skip:
                continue
            tasks = stage["numTasks"]
            if (tasks == ingest_tasks and stage.get("inputRecords", 0) > 0
                    and (batch not in source or stage["stageId"] < source[batch]["stageId"])):
                source[batch] = stage
            if (tasks == stateful_tasks and stage.get("shuffleWriteRecords", 0) == 0
                    and (batch not in stateful or stage["stageId"] > stateful[batch]["stageId"])):
                stateful[batch] = stage
        return KeyedStageTaskSeconds(
            source={batch: _task_seconds(http, base, stage, ingest_tasks, timeout_s) for batch, stage in sorted(source.items())},
            stateful={batch: _task_seconds(http, base, stage, stateful_tasks, timeout_s) for batch, stage in sorted(stateful.items())},
        )


def _task_seconds(http: requests.Session, base: str, stage: dict[str, Any], partitions: int, timeout_s: float) -> list[float]:
    """The successful tasks' `executorRunTime` of one stage of `partitions` tasks, seconds, index = partition."""
    tasks = http.get(
        f"{base}/stages/{stage['stageId']}/{stage['attemptId']}/taskList",
        params={"length": partitions * 4},
        timeout=timeout_s,
    ).json()
    seconds = [0.0] * partitions
    for task in tasks:
        if task.get("status") == "SUCCESS" and 0 <= task["index"] < partitions:
            seconds[task["index"]] = task["taskMetrics"]["executorRunTime"] / 1000.0
    return seconds


def after_warmup(per_batch: dict[int, list[float]]) -> dict[int, list[float]]:
    """`per_batch` without its first batch, the one that starts Python workers and state stores.

    With fewer cores than slots (`local[2]`, P = 8) only the first wave of tasks pays that
    start-up, so batch 0 alone makes slots 0 and 1 look slow; on one core per slot every slot
    would pay it at once.
    """
    first = min(per_batch, default=None)
    return {batch: seconds for batch, seconds in per_batch.items() if batch != first}


def makespan_ratio(per_batch: dict[int, list[float]]) -> float | None:
    """Σ over batches of the slowest slot's time / Σ of the mean slot time (1.0 is perfect).

    A stage of a batch lasts as long as its slowest task when each slot has its own core, so this
    is the stage's time over the run against what perfectly even slots would have taken.
    `per_batch` maps batch id -> P task times (seconds). None without batches or when no task
    ran for any time.
    """
    total_max = sum(max(seconds) for seconds in per_batch.values())
    total_mean = sum(sum(seconds) / len(seconds) for seconds in per_batch.values())
    return round(total_max / total_mean, 4) if total_mean > 0 else None
