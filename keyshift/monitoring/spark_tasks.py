"""Per-slot task time of the stateful stage, read from Spark's monitoring REST API.

Load is time as well as events: with one core per slot a micro-batch lasts as long as its slowest
stateful task. Each micro-batch of a query runs its stateful operator in one stage of P tasks
whose partition index is the slot (the slot-token placement puts slot s on partition s); this
module reads those tasks' `executorRunTime` from `/api/v1/applications/<app>/stages`.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import requests

log = logging.getLogger(__name__)

_BATCH = re.compile(r"^batch = (\d+)$", re.MULTILINE)


def stateful_task_seconds(ui_url: str, app_id: str, query_name: str, partitions: int, timeout_s: float = 10.0) -> dict[int, list[float]]:
    """Executor run time per slot of each micro-batch's stateful stage, in seconds.

    Args:
        ui_url: the Spark UI address (`SparkContext.uiWebUrl`).
        app_id: `SparkContext.applicationId`.
        query_name: the streaming query's name (the first line of its stages' descriptions).
        partitions: P; only stages of exactly P tasks are stateful stages of the query.
        timeout_s: HTTP timeout per request, seconds.

    Returns:
        batch id -> list of P floats (seconds, index = slot), for the batches whose stages the UI
        still retains (`spark.ui.retainedStages`, 1,000 by default).

    Raises:
        requests.RequestException: when the UI does not answer.
    """
    base = f"{ui_url.rstrip('/')}/api/v1/applications/{app_id}"
    with requests.Session() as http:
        stages = http.get(f"{base}/stages", params={"status": "complete"}, timeout=timeout_s).json()
        by_batch: dict[int, dict[str, Any]] = {}
        for stage in stages:
            description = stage.get("description") or ""
            match = _BATCH.search(description)
            if not match or not description.startswith(query_name + "\n") or stage.get("numTasks") != partitions:
                continue
            if stage.get("shuffleWriteRecords", 0) > 0:
                continue  # the map side (source, parse, Local Merge) writes the shuffle
            batch = int(match.group(1))
            # the stateful stage is the batch's last stage that writes no shuffle
            if batch not in by_batch or stage["stageId"] > by_batch[batch]["stageId"]:
                by_batch[batch] = stage
        result: dict[int, list[float]] = {}
        for batch, stage in sorted(by_batch.items()):
            tasks = http.get(
                f"{base}/stages/{stage['stageId']}/{stage['attemptId']}/taskList",
                params={"length": partitions * 4},
                timeout=timeout_s,
            ).json()
            seconds = [0.0] * partitions
            for task in tasks:
                if task.get("status") == "SUCCESS" and 0 <= task["index"] < partitions:
                    seconds[task["index"]] = task["taskMetrics"]["executorRunTime"] / 1000.0
            result[batch] = seconds
    return result


def makespan_ratio(per_batch: dict[int, list[float]]) -> float | None:
    """Σ over batches of the slowest slot's time / Σ of the mean slot time (1.0 is perfect).

    A batch lasts as long as its slowest stateful task when each slot has its own core, so this
    is the run's stateful time over what perfectly even slots would have taken. None without
    batches or when no task ran for any time.
    """
    total_max = sum(max(seconds) for seconds in per_batch.values())
    total_mean = sum(sum(seconds) / len(seconds) for seconds in per_batch.values())
    return round(total_max / total_mean, 4) if total_mean > 0 else None
