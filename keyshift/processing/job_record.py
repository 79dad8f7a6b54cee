"""A run's job record, `runs/<run_id>/job.json`: its config, start offsets, replay record and segments.

Written before the run's query starts and whenever a switch appends a segment; `--resume` and the
switch read it (`load_job_record`, `load_segments`). Split out of `keyshift.runtime.driver`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any


from keyshift.errors import ConfigurationError
from keyshift.processing.job_query import JobConfig


log = logging.getLogger(__name__)

JOB_RECORD_FILE = "job.json"
"""`runs/<run_id>/job.json`: what a run was started with (its config, concrete start offsets and
the replay record it read), written before its query starts; `--resume` runs from it."""


def save_job_record(
    run_dir: Path, config: JobConfig, start: dict[int, int], replay: dict[str, str], segments: list[dict[str, Any]] | None = None
) -> Path:
    """Write the run's job record atomically (see `JOB_RECORD_FILE`); returns its path.

    `segments` are the run's queries in order (`first_segment`; a switch appends one); None
    keeps the record's current segments (or makes the first one for a new record). A bounded
    run's input end (`config.end_offsets`), once in the record, is kept when `config` has none
    (`InputEnd` fixes it while the query runs).
    """
    path = run_dir / JOB_RECORD_FILE
    if segments is None:
        segments = load_segments(run_dir) if path.exists() else [first_segment(config, start)]
    if config.end_offsets is None and path.exists():  # a bounded run's end, once fixed (`InputEnd`), stays
        known = json.loads(path.read_text())["config"].get("end_offsets")
        if known is not None:
            config = replace(config, end_offsets={int(p): int(o) for p, o in known.items()})
    record = {"config": asdict(config), "start_offsets": {str(p): o for p, o in sorted(start.items())}, "replay": replay,
              "segments": segments}
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(record, indent=1, sort_keys=True))
    partial.replace(path)
    return path


def first_segment(config: JobConfig, start: dict[int, int]) -> dict[str, Any]:
    """The run's first segment: one streaming query, its checkpoint and what it places with.

    A segment is what one query of the run does: `checkpoint` (folder name under the run),
    `strategy`, `partitions`, `stateful_partitions` (S, the query's `spark.sql.shuffle.partitions`;
    absent in runs from before it: S = P), `epoch`, `assignment`, `split`, `topic`,
    `start_offsets` (partition -> offset, as text keys), `batch_base` (the run-wide id of its batch 0),
    `watermark_floor_ms`, `initial_state` (the migrated state's file under the run, or None) and
    `switch_id` (the switch that started it). A switch (`keyshift.migration.switch`) ends a
    segment at a batch boundary and appends the next; the run's ledger, windows table and
    reconciliation span them all.
    """
    return {
        "index": 0, "checkpoint": "checkpoint", "strategy": config.strategy, "partitions": config.partitions,
        "stateful_partitions": config.stateful_partitions, "epoch": config.epoch, "assignment": config.assignment,
        "split": {k: list(v) for k, v in (config.split or {}).items()} or None, "topic": config.topic,
        "start_offsets": {str(p): o for p, o in sorted(start.items())}, "batch_base": 0, "watermark_floor_ms": 0,
        "initial_state": None, "switch_id": None,
    }


def load_segments(run_dir: Path) -> list[dict[str, Any]]:
    """The segments of a started run, oldest first (a record from before switches: one segment
    made from its config and start offsets).

    Raises:
        ConfigurationError: the run has no job record.
    """
    path = run_dir / JOB_RECORD_FILE
    if not path.exists():
        raise ConfigurationError(f"run folder {run_dir} has no {JOB_RECORD_FILE}: there is no started run there")
    record = json.loads(path.read_text())
    if record.get("segments"):
        return record["segments"]
    config, start, _ = load_job_record(run_dir)
    return [first_segment(config, start)]


def segment_config(config: JobConfig, segment: dict[str, Any]) -> JobConfig:
    """The run's config with the placement of `segment` (strategy, P, S, epoch, assignment, split)."""
    split = {k: tuple(v) for k, v in (segment.get("split") or {}).items()} or None
    stateful = segment.get("stateful_partitions")
    return replace(config, strategy=segment["strategy"], partitions=int(segment["partitions"]),
                   max_stateful_partitions=int(stateful) if stateful is not None else None, epoch=int(segment["epoch"]),
                   assignment=segment.get("assignment"), split=split)


def segment_start(segment: dict[str, Any]) -> dict[int, int]:
    """Where `segment`'s query starts reading, partition -> offset."""
    return {int(p): int(o) for p, o in segment["start_offsets"].items()}


def marker_floor(segment: dict[str, Any]) -> dict[int, int]:
    """`segment`'s marker floor, partition -> offset (empty for a run's first segment): the
    run's end-of-input markers below it are ignored by its query."""
    return {int(p): int(o) for p, o in (segment.get("marker_floor") or {}).items()}


def load_job_record(run_dir: Path) -> tuple[JobConfig, dict[int, int], dict[str, str]]:
    """(config, start offsets partition -> offset, replay record) of a started run.

    Raises:
        ConfigurationError: the run has no job record (it never started, or is not a run of
            this keyshift version).
    """
    path = run_dir / JOB_RECORD_FILE
    if not path.exists():
        raise ConfigurationError(f"run folder {run_dir} has no {JOB_RECORD_FILE}: there is no started run to resume there")
    record = json.loads(path.read_text())
    known = {f.name for f in fields(JobConfig)}
    raw = {k: v for k, v in record["config"].items() if k in known}
    if raw.get("end_offsets") is not None:
        raw["end_offsets"] = {int(p): int(o) for p, o in raw["end_offsets"].items()}
    if raw.get("split") is not None:
        raw["split"] = {key: tuple(slots) for key, slots in raw["split"].items()}
    start = {int(p): int(o) for p, o in record["start_offsets"].items()}
    return JobConfig(**raw), start, record.get("replay") or {}
