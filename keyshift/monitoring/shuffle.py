"""Shuffle bytes of a Spark application, read from Spark's monitoring REST API.

How many bytes a job's map stages write for the shuffle is the figure Local Merge is meant to cut
(paper 000: Local Merge sent 1.49 % of the bytes a KeyBy sends), so the benches report it beside
events/s. Spark's UI serves every stage it retains at

    <SparkContext.uiWebUrl>/api/v1/applications/<applicationId>/stages

with, per stage attempt, `shuffleWriteBytes` (bytes its tasks wrote to shuffle files, summed over
successful tasks), `shuffleReadBytes`, `inputRecords` and the job `description`. A streaming
micro-batch's jobs carry the description Spark's stream execution sets
(`<query name>\\nid = <query id>\\nrunId = <run id>\\nbatch = <batch id>`, the convention
`keyshift.monitoring.spark_tasks` relies on too), so the stages of one query run can be picked out
of an application that ran other work before (the test suite's shared SparkSession).

Caveats, each handled here:

* **Retention.** The UI keeps at most `spark.ui.retainedStages` finished stages (1,000 by
  default) and drops the oldest beyond that, so in a long-lived application early stages vanish
  from the API and a sum over them comes out too low. Stage ids are dense from 0, so a smallest
  retained id above 0 says stages were dropped. `shuffle_bytes_by_stage` raises `JobError` when
  the stages asked for may be among the dropped ones (all of the application's; or, for one
  query run, when its own stage is the oldest retained one). A session that runs a bench should
  keep enough: `RETAINED_STAGES_CONF` (`keyshift.bench.plain_ysb` sets it).
* **The listener bus is asynchronous.** The REST API reads the UI's status store, which Spark's
  listener bus fills after the fact; a read right after `awaitTermination()` may miss the last
  stages. The reader first waits (up to `settle_s`) for the driver's listener bus to drain
  (`LiveListenerBus.waitUntilEmpty`, a JVM method public in bytecode though `private[spark]` in
  Scala, reached through py4j; on failure it logs and reads anyway).
* **The UI must be on** (`spark.ui.enabled`, true by default; `keyshift.runtime.session`
  does not turn it off): without it `uiWebUrl` is None and nothing can be read
  (`ConfigurationError`).

Only stages with status COMPLETE count (what `?status=complete` returns): a skipped stage reused
an earlier stage's shuffle output and wrote nothing; a failed attempt's partial writes are
superseded by its retry's.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

import requests
from pyspark.sql import SparkSession

from keyshift.errors import ConfigurationError, JobError

log = logging.getLogger(__name__)

RETAINED_STAGES_CONF = {"spark.ui.enabled": "true", "spark.ui.retainedStages": "10000", "spark.ui.retainedJobs": "10000"}
"""Session settings that keep the UI on and enough finished stages and jobs for a bench's reading
(a micro-batch of the plain YSB job runs 2 to 3 stages; 10,000 stages is some 3,000 batches)."""

_BATCH = re.compile(r"^batch = (\d+)$", re.MULTILINE)


@dataclass(frozen=True)
class StageShuffle:
    """One finished stage attempt's shuffle figures, as the REST API reports them.

    Attributes:
        stage_id, attempt_id: Spark's ids of the stage attempt.
        name: the stage's name (the call site, e.g. `toPandas at ...`).
        description: the job description (a streaming batch's: name, id, runId, batch lines;
            empty when the job had none).
        batch_id: the micro-batch id parsed from the description, None for other jobs.
        shuffle_write_bytes, shuffle_write_records: bytes and records written to shuffle files.
        shuffle_read_bytes: bytes read from shuffle files (local and remote).
        input_records: records read from a source (e.g. Kafka).
    """

    stage_id: int
    attempt_id: int
    name: str
    description: str
    batch_id: int | None
    shuffle_write_bytes: int
    shuffle_write_records: int
    shuffle_read_bytes: int
    input_records: int


def spark_ui_url(spark: SparkSession) -> str:
    """The session's Spark UI address (`SparkContext.uiWebUrl`, e.g. `http://127.0.0.1:4040`).

    Raises:
        ConfigurationError: the UI is off (`spark.ui.enabled=false`), so the REST API is absent.
    """
    url = spark.sparkContext.uiWebUrl
    if not url:
        raise ConfigurationError(
            "the Spark UI is off (spark.ui.enabled=false), so its REST API cannot report shuffle bytes; "
            "start the session with spark.ui.enabled=true (keyshift.monitoring.shuffle.RETAINED_STAGES_CONF)"
        )
    return url.rstrip("/")


def wait_for_listener_bus(spark: SparkSession, settle_s: float = 10.0) -> bool:
    """Wait up to `settle_s` seconds until the driver's listener bus has delivered every event
    posted so far, so the UI's status store (and its REST API) holds every finished stage.

    Returns:
        True when the bus drained; False when it did not in time or could not be asked (logged;
        a read may then miss the newest stages).
    """
    try:
        spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(int(settle_s * 1000))
        return True
    except Exception as exc:  # py4j errors (TimeoutException inside), or a Spark without the method
        log.warning("the listener bus did not drain in %.0f s (%s); the stages read may miss the newest", settle_s, exc)
        return False


def shuffle_bytes_by_stage(
    spark: SparkSession, *, query_run_id: str | None = None, timeout_s: float = 10.0, settle_s: float = 10.0
) -> list[StageShuffle]:
    """Every finished (COMPLETE) stage attempt of the session's application, or of one streaming
    query run, with its shuffle figures, in stage id order.

    Args:
        spark: the session; its UI must be on.
        query_run_id: only the stages of this streaming query run (`StreamingQuery.runId`, as a
            string): those whose job description carries `runId = <it>`. None: every stage.
        timeout_s: HTTP timeout of the request, seconds.
        settle_s: how long to wait first for the listener bus to drain (`wait_for_listener_bus`).

    Returns:
        A list of `StageShuffle` (bytes and records as ints), possibly empty.

    Raises:
        ConfigurationError: the Spark UI is off.
        JobError: the REST API did not answer or answered something else than a list of stages;
            or stages that should be counted may have been dropped by the UI's retention
            (`spark.ui.retainedStages`; module docstring).
    """
    base = spark_ui_url(spark)
    app_id = spark.sparkContext.applicationId
    wait_for_listener_bus(spark, settle_s)
    url = f"{base}/api/v1/applications/{app_id}/stages"
    try:
        response = requests.get(url, timeout=timeout_s)  # every status: the retention check needs the oldest id
        response.raise_for_status()
        stages: Any = response.json()
    except (requests.RequestException, ValueError) as exc:
        raise JobError(f"Spark's REST API at {url} did not list the stages: {exc}") from exc
    if not isinstance(stages, list):
        raise JobError(f"Spark's REST API at {url} answered {str(stages)[:200]!r}, not a list of stages")
    if not stages:
        return []
    oldest_retained = min(int(s["stageId"]) for s in stages)
    marker = None if query_run_id is None else f"\nrunId = {query_run_id}\n"
    picked = []
    for stage in stages:
        description = stage.get("description") or ""
        if stage.get("status") != "COMPLETE" or (marker is not None and marker not in description):
            continue
        batch = _BATCH.search(description)
        picked.append(StageShuffle(
            stage_id=int(stage["stageId"]), attempt_id=int(stage.get("attemptId", 0)), name=stage.get("name", ""),
            description=description, batch_id=int(batch.group(1)) if batch else None,
            shuffle_write_bytes=int(stage.get("shuffleWriteBytes", 0)),
            shuffle_write_records=int(stage.get("shuffleWriteRecords", 0)),
            shuffle_read_bytes=int(stage.get("shuffleReadBytes", 0)),
            input_records=int(stage.get("inputRecords", 0)),
        ))
    picked.sort(key=lambda s: (s.stage_id, s.attempt_id))
    if oldest_retained > 0 and (query_run_id is None or not picked or picked[0].stage_id <= oldest_retained):
        retained = spark.conf.get("spark.ui.retainedStages", "1000")
        raise JobError(
            f"the Spark UI no longer retains stages 0 to {oldest_retained - 1} (spark.ui.retainedStages = {retained})"
            + ("" if query_run_id is None else f", and query run {query_run_id}'s first retained stage is the oldest one")
            + ", so a sum would be too low; start the session with a larger spark.ui.retainedStages"
        )
    return picked


def shuffle_write_bytes(
    spark: SparkSession, *, query_run_id: str | None = None, timeout_s: float = 10.0, settle_s: float = 10.0
) -> int:
    """Bytes written to shuffle files by the finished stages of the session's application (or of
    one streaming query run): the sum of `shuffleWriteBytes` over the COMPLETE stage attempts the
    REST API lists (`shuffle_bytes_by_stage`, same arguments).

    Returns:
        Bytes (int, >= 0); 0 when nothing shuffled.

    Raises:
        ConfigurationError: the Spark UI is off.
        JobError: the REST API failed, or stages to count were dropped by `spark.ui.retainedStages`.
    """
    stages = shuffle_bytes_by_stage(spark, query_run_id=query_run_id, timeout_s=timeout_s, settle_s=settle_s)
    return sum(s.shuffle_write_bytes for s in stages)
