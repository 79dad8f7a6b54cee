"""Reading a run's Spark checkpoint from the driver: committed and planned batches, offsets, state.

The offset and commit logs (`offsets/<b>`, `commits/<b>`) and the state store, read the way Spark
writes them, through `keyshift.checkpoint_files.CheckpointFiles` (a local folder or a Hadoop URI;
the state with Spark's state data source). A checkpoint is a `Path` or a URI string.
Split out of `keyshift.runtime.driver`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pyspark.sql import SparkSession

from keyshift.checkpoint_files import CheckpointFiles

from keyshift.processing.operators.processor import PENDING_STATE_NAME, unpack_pending


log = logging.getLogger(__name__)


def pending_events(spark: SparkSession, checkpoint: Path | str, batch_id: int | None = None, aggregates: int = 2) -> int:
    """Events held in open windows in the run's state at its last committed batch (or `batch_id`).

    Read with Spark's state data source (`statestore`, state variable `pending_windows`), so
    it is an independent count: a stopped continuous run reconciles as events read =
    Σ window counts + late + dead letters + pending; a drained bounded run has none pending.
    Returns 0 when the query committed no batch. `aggregates`: the job spec's number of
    aggregates (the pending windows' packed layout; 2 for the flights).
    """
    state = read_state_variable(spark, checkpoint, PENDING_STATE_NAME, batch_id)
    if state is None:
        return 0
    partials = state.select("user_map_value.partials").toPandas()["partials"]
    return int(sum(unpack_pending(blob, aggregates)[1].sum() for blob in partials))


def read_state_variable(spark: SparkSession, checkpoint: Path | str, name: str, batch_id: int | None = None):
    """One state variable of a query's checkpoint, read with Spark's state data source at its last
    committed batch (or `batch_id`): a DataFrame (MapState flattened to `key`/`user_map_key`/
    `user_map_value` rows), or None when the query committed no batch."""
    if not CheckpointFiles(checkpoint, spark).names("commits"):
        return None
    spark.streams.active  # noqa: B018 - creates the state store coordinator the reader's tasks ask for
    reader = spark.read.format("statestore").option("path", str(checkpoint)).option("stateVarName", name)
    if batch_id is not None:
        reader = reader.option("batchId", int(batch_id))
    return reader.load()


def committed_batches(checkpoint: Path | str, topic: str) -> tuple[list[int], dict[int, int]]:
    """The batch ids Spark committed in `checkpoint`, and the Kafka offsets of `topic` after the
    last of them (partition -> next offset to read); ([], {}) for a checkpoint without commits.

    Read from Spark's checkpoint files: `commits/<id>` exists once batch id is committed, and
    `offsets/<id>` holds, after a version line and the batch metadata, one JSON line per source.
    """
    files = CheckpointFiles(checkpoint)
    ids = sorted(int(name) for name in files.names("commits") if name.isdigit())
    if not ids:
        return [], {}
    for line in files.read_text(f"offsets/{ids[-1]}").splitlines()[2:]:
        offsets = json.loads(line) if line.startswith("{") else {}
        if topic in offsets:
            return ids, {int(p): int(o) for p, o in offsets[topic].items()}
    return ids, {}


def planned_offsets(checkpoint: Path | str, topic: str) -> dict[int, int]:
    """The Kafka offsets of `topic` at the end of the newest micro-batch Spark has planned in
    `checkpoint` (partition -> first offset past it), committed or not; {} before the first.

    Spark writes `offsets/<id>` when it plans batch id, before running it, and never reads past
    those offsets in that batch; so a record written at or past them is read by a later batch.
    """
    files = CheckpointFiles(checkpoint)
    ids = sorted((int(name) for name in files.names("offsets") if name.isdigit()), reverse=True)
    for batch_id in ids[:1]:
        try:
            lines = files.read_text(f"offsets/{batch_id}").splitlines()[2:]
        except OSError:  # being written: the next look finds it
            return {}
        for line in lines:
            offsets = json.loads(line) if line.startswith("{") else {}
            if topic in offsets:
                return {int(p): int(o) for p, o in offsets[topic].items()}
    return {}
