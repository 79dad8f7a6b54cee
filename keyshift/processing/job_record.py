"""A run's job record, `runs/<run_id>/job.json`: its config, start offsets, replay record and segments.

Written before the run's query starts and whenever a switch appends a segment; `--resume` and the
switch read it. `JobRecord` is the record and the one place it is read and written; `Segment`
is one query of the run. (`keyshift.quality.batches.read_job` and the keyshift page read the
file's JSON directly: they sit below the engine, or only display it.)
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any


from keyshift.checkpoint_files import is_uri, join
from keyshift.errors import ConfigurationError
from keyshift.names import RunDir
from keyshift.processing.job_config import JobConfig, PlacementConfig


log = logging.getLogger(__name__)

# `runs/<run_id>/job.json` (`RunDir.job_record`): what a run was started with (its config, concrete
# start offsets and the replay record it read), written before its query starts; `--resume` runs from it.


@dataclass(frozen=True)
class Segment:
    """One streaming query of a run: its checkpoint and what it places with.

    A switch (`keyshift.migration.in_driver`) ends a segment at a batch boundary and appends the
    next; the run's ledger, windows table and reconciliation span them all. Stored in the run's
    job record (`RunDir.job_record`, key `segments`) by `as_json`, read back by `from_json`; the
    JSON keys are the attribute names.

    Attributes:
        index: 0 for the run's first query, then one more per switch.
        checkpoint: the query's checkpoint: a folder name under the run (`RunDir.checkpoint_name(index)`),
            or its full location (a Hadoop URI) when the run keeps its checkpoints elsewhere
            (`JobConfig.checkpoint_location`); `RunDir.checkpoint` resolves either.
        strategy: the placement strategy's name. partitions: P, the slots. epoch: the strategy's
            epoch. assignment: a learned strategy's key -> slot (None for hash, modulo).
        stateful_partitions: S, the query's `spark.sql.shuffle.partitions`; None in records from
            before it (S = P).
        split: hot_split's key -> slots, or None.
        topic: the input topic.
        start_offsets: partition -> Kafka offset where the query starts reading.
        batch_base: the run-wide id of the query's batch 0.
        watermark_floor_ms: ms of event time below which the query's watermark never goes (the
            old query's watermark at the cut; 0 for the first).
        initial_state: the migrated state's file, relative to the run folder
            (`RunDir.migrated_state_name`), or None.
        switch_id: the switch that started the query, or None.
        marker_floor: after a switch, partition -> the topic's end offset when the segment was
            made: the run's end-of-input markers below it are ignored by its query; None (not
            stored) for a first segment.
    """

    index: int
    checkpoint: str
    strategy: str
    partitions: int
    stateful_partitions: int | None
    epoch: int
    assignment: dict[str, int] | None
    split: dict[str, list[int]] | None
    topic: str
    start_offsets: dict[int, int]
    batch_base: int
    watermark_floor_ms: int = 0
    initial_state: str | None = None
    switch_id: str | None = None
    marker_floor: dict[int, int] | None = None

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "Segment":
        """A segment from its job-record JSON (offsets' partition keys as text; `stateful_partitions`
        and `marker_floor` may be absent).

        Raises:
            ConfigurationError: a required key is missing or malformed.
        """
        try:
            floor = raw.get("marker_floor")
            stateful = raw.get("stateful_partitions")
            return cls(
                index=int(raw["index"]), checkpoint=str(raw["checkpoint"]), strategy=str(raw["strategy"]),
                partitions=int(raw["partitions"]), stateful_partitions=int(stateful) if stateful is not None else None,
                epoch=int(raw["epoch"]), assignment=raw.get("assignment"),
                split={k: list(v) for k, v in raw["split"].items()} if raw.get("split") else None, topic=str(raw["topic"]),
                start_offsets={int(p): int(o) for p, o in raw["start_offsets"].items()}, batch_base=int(raw["batch_base"]),
                watermark_floor_ms=int(raw.get("watermark_floor_ms") or 0), initial_state=raw.get("initial_state"),
                switch_id=raw.get("switch_id"),
                marker_floor={int(p): int(o) for p, o in floor.items()} if floor is not None else None,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigurationError(f"a segment of the job record is malformed ({type(exc).__name__}: {exc}): {dict(raw)}") from exc

    def as_json(self) -> dict[str, Any]:
        """The segment as stored in the job record (offsets' partitions as text keys, sorted)."""
        raw: dict[str, Any] = {
            "index": self.index, "checkpoint": self.checkpoint, "strategy": self.strategy, "partitions": self.partitions,
            "stateful_partitions": self.stateful_partitions, "epoch": self.epoch, "assignment": self.assignment,
            "split": self.split, "topic": self.topic,
            "start_offsets": {str(p): o for p, o in sorted(self.start_offsets.items())}, "batch_base": self.batch_base,
            "watermark_floor_ms": self.watermark_floor_ms, "initial_state": self.initial_state, "switch_id": self.switch_id,
        }
        if self.marker_floor is not None:
            raw["marker_floor"] = {str(p): int(o) for p, o in sorted(self.marker_floor.items())}
        return raw

    @property
    def split_slots(self) -> dict[str, tuple[int, ...]] | None:
        """hot_split's key -> slots as tuples (the form `PlacementConfig.split` takes), or None."""
        return {k: tuple(v) for k, v in (self.split or {}).items()} or None

    def config(self, config: JobConfig) -> JobConfig:
        """The run's `config` with this segment's placement (strategy, P, S, epoch, assignment, split)."""
        return replace(config, placement=PlacementConfig(
            strategy=self.strategy, partitions=self.partitions, max_stateful_partitions=self.stateful_partitions, epoch=self.epoch,
            assignment=self.assignment, split=self.split_slots))


@dataclass(frozen=True)
class JobRecord:
    """A run's job record, `runs/<run_id>/job.json` (`RunDir.job_record`), typed.

    Read (`read`) and written (`write`) here only; `--resume`, a switch and the spark-submit
    entry's job check go through this class.

    Attributes:
        config: the run's `JobConfig` (a bounded run's `end_offsets` once its input end is fixed).
        start_offsets: partition -> Kafka offset where the run's first query started.
        replay: the replay record the run read from Redis (text fields; empty when none).
        segments: the run's queries, oldest first (`Segment`).
    """

    config: JobConfig
    start_offsets: dict[int, int]
    replay: dict[str, str]
    segments: tuple[Segment, ...]

    @classmethod
    def read(cls, run_dir: Path | str) -> "JobRecord":
        """The job record of the run in `run_dir` (a record from before switches gets one segment
        made from its config and start offsets; config fields this version does not know are
        ignored).

        Raises:
            ConfigurationError: the run has no job record (it never started its query, or is not
                a run of this keyshift version), or the record is malformed.
        """
        raw = cls._raw(run_dir)
        if raw is None:
            raise ConfigurationError(f"run folder {run_dir} has no {RunDir.JOB_RECORD}: there is no started run there")
        try:
            config = JobConfig.from_json(raw["config"])
            start = {int(p): int(o) for p, o in raw["start_offsets"].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigurationError(f"the job record of {run_dir} is malformed ({type(exc).__name__}: {exc})") from exc
        segments = tuple(Segment.from_json(s) for s in raw.get("segments") or ()) or (first_segment(config, start),)
        return cls(config, start, raw.get("replay") or {}, segments)

    @staticmethod
    def _raw(run_dir: Path | str) -> dict[str, Any] | None:
        path = RunDir(Path(run_dir)).job_record
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except ValueError as exc:
            raise ConfigurationError(f"{path} is not valid JSON ({exc})") from exc

    @classmethod
    def job_name(cls, run_dir: Path | str) -> str | None:
        """The job (spec name) the run in `run_dir` was started with, or None when it has no job
        record yet (`flight_delays` for a record from before the field).

        Raises:
            ConfigurationError: the record is not valid JSON.
        """
        raw = cls._raw(run_dir)
        return None if raw is None else str((raw.get("config") or {}).get("job") or "flight_delays")

    def as_json(self) -> dict[str, Any]:
        """The record as stored: `config` (`JobConfig.as_json`, grouped), `start_offsets` (partitions
        as text keys), `replay`, `segments` (`Segment.as_json`)."""
        return {"config": self.config.as_json(), "start_offsets": {str(p): o for p, o in sorted(self.start_offsets.items())},
                "replay": self.replay, "segments": [segment.as_json() for segment in self.segments]}

    def write(self, run_dir: Path | str) -> Path:
        """Write the record atomically (a temporary file renamed over it); returns its path."""
        path = RunDir(Path(run_dir)).job_record
        partial = path.with_suffix(".tmp")
        partial.write_text(json.dumps(self.as_json(), indent=1, sort_keys=True))
        partial.replace(path)
        return path


def save_job_record(
    run_dir: Path, config: JobConfig, start: dict[int, int], replay: dict[str, str], segments: list[Segment] | None = None
) -> Path:
    """Write the run's job record (`JobRecord.write`); returns its path.

    `segments` are the run's queries in order (`first_segment`; a switch appends one); None
    keeps the record's current segments (or makes the first one for a new record). A bounded
    run's input end (`config.input.end_offsets`), once in the record, is kept when `config` has none
    (`InputEnd` fixes it while the query runs).

    Raises:
        ConfigurationError: the existing record is malformed.
    """
    current = JobRecord.read(run_dir) if RunDir(Path(run_dir)).job_record.exists() else None
    if segments is None:
        segments = list(current.segments) if current is not None else [first_segment(config, start)]
    if config.input.end_offsets is None and current is not None and current.config.input.end_offsets is not None:
        config = replace(config, input=replace(config.input, end_offsets=current.config.input.end_offsets))  # a bounded run's end, once fixed, stays
    return JobRecord(config, dict(start), replay, tuple(segments)).write(run_dir)


def first_segment(config: JobConfig, start: dict[int, int]) -> Segment:
    """The run's first segment (`Segment`): its first query, checkpoint `checkpoint` (under
    `config.checkpoint_location` when set), batch base 0."""
    name = RunDir.checkpoint_name(0)
    return Segment(
        index=0, checkpoint=str(join(config.checkpoint_location, config.run_id, name)) if config.checkpoint_location else name, strategy=config.placement.strategy, partitions=config.placement.partitions,
        stateful_partitions=config.placement.stateful_partitions, epoch=config.placement.epoch, assignment=config.placement.assignment,
        split={k: list(v) for k, v in (config.placement.split or {}).items()} or None, topic=config.input.topic,
        start_offsets=dict(start), batch_base=0,
    )


def has_checkpoint(run_dir: Path) -> bool:
    """Whether run `run_dir` has a checkpoint to resume from (its first query started): the
    offset log of its first checkpoint exists, in the run folder or at the local path its job
    record names; for a run whose checkpoints are on a Hadoop FileSystem (read only by a driver
    with a SparkSession), its job record names that location (the driver writes it just before it
    starts Spark and the query)."""
    run = RunDir(run_dir)
    first = RunDir.checkpoint_name(0)
    try:
        segments = json.loads(run.job_record.read_text()).get("segments") or []
        first = str(segments[0]["checkpoint"]) if segments else first
    except (OSError, ValueError, KeyError, TypeError):
        pass
    location = run.checkpoint(first)
    return is_uri(location) or (Path(location) / "offsets").exists()


def load_segments(run_dir: Path) -> list[Segment]:
    """The segments of a started run, oldest first (`JobRecord.segments`).

    Raises:
        ConfigurationError: the run has no job record, or it is malformed.
    """
    return list(JobRecord.read(run_dir).segments)


def load_job_record(run_dir: Path) -> tuple[JobConfig, dict[int, int], dict[str, str]]:
    """(config, start offsets partition -> offset, replay record) of a started run (`JobRecord.read`).

    Raises:
        ConfigurationError: the run has no job record (it never started, or is not a run of
            this keyshift version), or it is malformed.
    """
    record = JobRecord.read(run_dir)
    return record.config, record.start_offsets, record.replay
