"""What one run of a keyed window job does: `JobConfig`, grouped as the engine is.

- `PlacementConfig`: which slot a key's events go to (strategy, P, S, epoch, a learned
  assignment, hot_split's split keys); `keyshift.placement`, paper 000.
- `EventTimeConfig`: the watermark mode and bound, idleness, the plausibility limits and
  watermark alignment; `keyshift.eventtime`, after Flink's `WatermarkStrategy` (bounded
  out-of-orderness, `withIdleness`, `withWatermarkAlignment`).
- `ExchangeConfig`: how events reach a key's windows (Local Merge, plain shuffle, Global Merge);
  `keyshift.processing.operators.exchange`.
- `InputConfig`: the Kafka input (topic, records per micro-batch, a bounded run's limit and end).

The job's outputs are its spec's (`keyshift.jobs.spec.JobSpec`: windows table, alert rule,
topics), named by `JobConfig.job`, not configured per run.

The CLI's options are flat (`keyshift job run --strategy … --watermark …`); `JobConfig.from_options`
maps each to its group (`OPTION_GROUPS`). A run's job record stores the grouped form
(`JobConfig.as_json`); `JobConfig.from_json` also reads a record written with flat fields.
Nothing here checks values: a bad mode or limit raises ConfigurationError where it is used
(`EventTimeConfig.policy`, `EventTimeConfig.plausibility`, `JobConfig.check_exchange`,
`check_job_strategy`), as the engine reads them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from keyshift.errors import ConfigurationError
from keyshift.eventtime.partition_clocks import DEFAULT_IDLE_TIMEOUT_S
from keyshift.eventtime.plausibility import PlausibilityLimits
from keyshift.eventtime.watermarks import WatermarkPolicy
from keyshift.eventtime.windows import HOUR_MS
from keyshift.jobs.spec import JobSpec
from keyshift.names import FLIGHTS_TOPIC
from keyshift.placement.learning import LEARNED_STRATEGIES
from keyshift.processing.operators.exchange import check_exchange, parse_emit

RULE_STRATEGIES = ("hash", "modulo")
"""Strategies each executor can compute itself: a pure function of the key."""
JOB_STRATEGIES = RULE_STRATEGIES + LEARNED_STRATEGIES
"""Strategies the job places with. The learned ones (`LEARNED_STRATEGIES`: least_key, least_count
of paper 000 Algorithm 1, and our hot_split) have a history map: the job reads the assignment
published in Redis under the input topic's name (`keyshift.placement.assignment_store`) at
start, so every executor and every producer place a key on the same slot (a split key's event
on the same piece's slot)."""


def check_job_strategy(name: str) -> str:
    """Return `name` if the job can place keys with it.

    Raises:
        ConfigurationError: for a strategy the job does not place with (weight: its random
            landing would differ between executors).
    """
    if name not in JOB_STRATEGIES:
        raise ConfigurationError(
            f"a keyshift job cannot use strategy {name!r}; use one of {', '.join(JOB_STRATEGIES)}"
        )
    return name


@dataclass(frozen=True)
class PlacementConfig:
    """Where a key's events are processed: the placement in force (paper 000's slots).

    A switch replaces the whole group (`keyshift.processing.job_record.Segment.config`).

    Attributes:
        strategy: placement strategy name, one of `JOB_STRATEGIES`.
        partitions: P slots = Kafka partitions of the input.
        max_stateful_partitions: Spark's stateful partitions at most; the query takes
            `stateful_partitions` = min(P, this) (`spark.sql.shuffle.partitions`) and spreads the
            slots over them by range (`keyshift.placement.tokens.stateful_partition_of_slot`).
            None: one per slot (S = P). A new run started by `keyshift.runtime.driver.run_job`
            without one gets `default_max_stateful_partitions` of its engine's cores, kept in its
            job record.
        epoch: the assignment epoch in force, written on every window.
        assignment: a learned strategy's key -> slot map (its first slot for a split key), read
            from Redis at start; None for a rule strategy.
        split: hot_split's split keys -> their slots (two or more; piece i on element i).
    """

    strategy: str = "hash"
    partitions: int = 8
    max_stateful_partitions: int | None = None
    epoch: int = 0
    assignment: dict[str, int] | None = None
    split: dict[str, tuple[int, ...]] | None = None

    @property
    def stateful_partitions(self) -> int:
        """S, the query's stateful partitions (`spark.sql.shuffle.partitions`): min(P,
        `max_stateful_partitions`), or P when that is None.

        Raises:
            PlacementError: `max_stateful_partitions` < 1.
        """
        from keyshift.placement.tokens import capped_stateful_partitions

        return capped_stateful_partitions(self.partitions, self.max_stateful_partitions)


@dataclass(frozen=True)
class EventTimeConfig:
    """How the run tells time: watermark, idleness, plausibility and alignment (`keyshift.eventtime`).

    Attributes:
        mode: the watermark mode, one of `keyshift.eventtime.watermarks.WATERMARK_MODES`:
            `global` (Spark's, the default), `partition` (the minimum over the active Kafka
            partitions' clocks minus `bound_ms`, Flink's), `key`, `nkey`, `dynamic` (`bound_ms`
            is then the maximum bound M).
        bound_ms: watermark bound, ms of event time: watermark = max event time seen - bound.
        groups: N, watermark groups of `nkey` mode.
        idle_fallback: `global` or `timeout`: how a silent key's windows close (per-key modes).
        idle_lag_ms: per-key modes: every watermark is at least the stream's event time minus
            this (ms of event time): the minimum over the active Kafka partitions' clocks
            (`keyshift.eventtime.partition_clocks`); default two days.
        key_idle_timeout_s: `timeout` fallback: seconds of processing time without events after
            which a key closes all its windows.
        partition_idle_timeout_s: seconds of processing time after which a Kafka partition that
            delivered no record stops holding the others' watermark back (until its next record);
            default 60 (Flink's `withIdleness`).
        max_ahead_ms: event-time plausibility, ms of event time an event may be ahead of the
            stream (watermark + bound, or its chunk's median) or of its batch's timestamp before
            it is a dead letter (`keyshift.eventtime.plausibility`); default 7 days.
        max_behind_ms: ms of event time an event may be behind the watermark (in the first
            batch: its chunk's median) before it is a dead letter; default 30 days.
        reference_min_events: events a chunk needs for its median event time to count as a
            reference of the stream; default 50.
        max_partition_drift_ms: watermark alignment (Flink's FLIP-182): no Kafka partition is
            read more than this (ms of event time) ahead of the slowest one with records to
            read; the input is then read by keyshift's aligned Kafka source
            (`keyshift.processing.sources.aligned_kafka`) instead of Spark's. None (default):
            Spark's Kafka source, no bound.
    """

    mode: str = "global"
    bound_ms: int = HOUR_MS
    groups: int = WatermarkPolicy.groups
    idle_fallback: str = WatermarkPolicy.idle_fallback
    idle_lag_ms: int = WatermarkPolicy.idle_lag_ms
    key_idle_timeout_s: float = WatermarkPolicy.idle_timeout_s
    partition_idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    max_ahead_ms: int = PlausibilityLimits.max_ahead_ms
    max_behind_ms: int = PlausibilityLimits.max_behind_ms
    reference_min_events: int = PlausibilityLimits.reference_min_events
    max_partition_drift_ms: int | None = None

    @property
    def policy(self) -> WatermarkPolicy:
        """The run's watermark policy.

        Raises:
            ConfigurationError: an unknown mode or fallback, or a value out of range.
        """
        return WatermarkPolicy(
            mode=self.mode, bound_ms=self.bound_ms, groups=self.groups, idle_fallback=self.idle_fallback,
            idle_lag_ms=self.idle_lag_ms, idle_timeout_s=self.key_idle_timeout_s,
        )

    @property
    def plausibility(self) -> PlausibilityLimits:
        """The event-time plausibility limits of this run.

        Raises:
            ConfigurationError: a limit < 1.
        """
        return PlausibilityLimits(self.max_ahead_ms, self.max_behind_ms, self.reference_min_events)


@dataclass(frozen=True)
class ExchangeConfig:
    """How events reach a key's windows (`keyshift.processing.operators.exchange`).

    Attributes:
        mode: one of `keyshift.processing.operators.exchange.EXCHANGES`: `local_merge`
            (default), `plain` (every event crosses the shuffle) or `global_merge` (no shuffle;
            windows merged in Redis, `keyshift.processing.operators.global_merge`).
        emit: Local Merge's emit mode, `batch` (default), `window` or `count:N`; ignored by `plain`.
    """

    mode: str = "local_merge"
    emit: str = "batch"


@dataclass(frozen=True)
class InputConfig:
    """The run's Kafka input.

    Attributes:
        topic: the input topic.
        max_offsets_per_trigger: records per micro-batch at most (None: all available), Spark's
            `maxOffsetsPerTrigger`.
        limit: bounded run: read this many records of the topic, flush the last windows, stop.
            None: run until stopped.
        idle_timeout_s: a bounded run fails when no batch completes for this long (seconds); a
            continuous run waits for input as long as it takes.
        end_offsets: a bounded run's end, partition -> offset (exclusive), set by the driver
            once the limit's offsets are known: records at or past it belong to someone else's
            later replay and are ignored, so a run reads exactly [start, end) plus its own markers.
    """

    topic: str = FLIGHTS_TOPIC
    max_offsets_per_trigger: int | None = 250_000
    limit: int | None = None
    idle_timeout_s: float = 300.0
    end_offsets: dict[int, int] | None = None


OPTION_GROUPS: dict[str, tuple[str, str]] = {
    "strategy": ("placement", "strategy"), "partitions": ("placement", "partitions"),
    "max_stateful_partitions": ("placement", "max_stateful_partitions"), "epoch": ("placement", "epoch"),
    "assignment": ("placement", "assignment"), "split": ("placement", "split"),
    "watermark": ("event_time", "mode"), "bound_ms": ("event_time", "bound_ms"), "watermark_groups": ("event_time", "groups"),
    "idle_fallback": ("event_time", "idle_fallback"), "idle_lag_ms": ("event_time", "idle_lag_ms"),
    "key_idle_timeout_s": ("event_time", "key_idle_timeout_s"),
    "partition_idle_timeout_s": ("event_time", "partition_idle_timeout_s"), "max_ahead_ms": ("event_time", "max_ahead_ms"),
    "max_behind_ms": ("event_time", "max_behind_ms"), "reference_min_events": ("event_time", "reference_min_events"),
    "max_partition_drift_ms": ("event_time", "max_partition_drift_ms"),
    "exchange": ("exchange", "mode"), "emit": ("exchange", "emit"),
    "topic": ("input", "topic"), "max_offsets_per_trigger": ("input", "max_offsets_per_trigger"), "limit": ("input", "limit"),
    "idle_timeout_s": ("input", "idle_timeout_s"), "end_offsets": ("input", "end_offsets"),
}
"""Flat option name (the CLI's `--option-name` with `_`, and a job record's key before the groups)
-> (group attribute of `JobConfig`, field of that group)."""

_OPTION_OF = {grouped: option for option, grouped in OPTION_GROUPS.items()}
_GROUPS: dict[str, type] = {"placement": PlacementConfig, "event_time": EventTimeConfig, "exchange": ExchangeConfig,
                            "input": InputConfig}


def recorded_options(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A job record's config (`JobConfig.as_json`, or flat as written before the groups) as flat
    option names (`OPTION_GROUPS`), values as stored: what the keyshift page reads, and the first
    step of `JobConfig.from_json`. Top-level names (`run_id`, `job`, ...) and names this version
    does not know pass through; a group's unknown names are dropped.

    Raises:
        AttributeError: a group that is not a JSON object.
    """
    grouped = {name for name in _GROUPS if isinstance(raw.get(name), Mapping)}  # a flat record's `exchange` is a name
    flat = {k: v for k, v in raw.items() if k not in grouped}
    for name in grouped:
        known = {f.name for f in fields(_GROUPS[name])}
        flat.update({_OPTION_OF[(name, attribute)]: value for attribute, value in raw[name].items() if attribute in known})
    return flat


TOP_OPTIONS = ("job", "window_ms", "redis_url", "checkpoint_location")
"""`JobConfig`'s settings outside the groups."""


@dataclass(frozen=True)
class JobConfig:
    """What one run of a keyed window job does (the flight delay job by default).

    Attributes:
        run_id: names the run's folder `runs/<run_id>/` and its Redis records.
        job: the job's name (`keyshift.jobs.job_spec`), default `flight_delays`.
        window_ms: window size p, ms of event time (tumbling; or the sliding window's size of a
            key-window job, whose slide is the spec's `slide_ms`).
        redis_url: where executors ask the store's atomic assign for keys the assignment lacks,
            and read a `key_lookup` spec's map; None: the settings' Redis.
        checkpoint_location: the Hadoop URI or path under which the run's Spark checkpoints are
            kept (`<location>/<run_id>/checkpoint`, `.../checkpoint-1` after a switch); None: in
            the run's folder (`keyshift.checkpoint_files`).
        placement: `PlacementConfig`. event_time: `EventTimeConfig`. exchange: `ExchangeConfig`.
        input: `InputConfig`.
    """

    run_id: str
    job: str = "flight_delays"
    window_ms: int = HOUR_MS
    redis_url: str | None = None
    checkpoint_location: str | None = None
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    event_time: EventTimeConfig = field(default_factory=EventTimeConfig)
    exchange: ExchangeConfig = field(default_factory=ExchangeConfig)
    input: InputConfig = field(default_factory=InputConfig)

    @classmethod
    def from_options(cls, run_id: str, **options: Any) -> "JobConfig":
        """A config from flat options (the CLI's names, `OPTION_GROUPS`), each put in its group;
        `TOP_OPTIONS` stay at the top. Options left out keep their defaults.

        Raises:
            ConfigurationError: an option name that is not a `JobConfig` setting.
        """
        top: dict[str, Any] = {}
        groups: dict[str, dict[str, Any]] = {name: {} for name in _GROUPS}
        for name, value in options.items():
            if name in OPTION_GROUPS:
                group, attribute = OPTION_GROUPS[name]
                groups[group][attribute] = value
            elif name in TOP_OPTIONS:
                top[name] = value
            else:
                raise ConfigurationError(f"{name!r} is not a job setting; use one of {', '.join(sorted(OPTION_GROUPS))}, "
                                         f"{', '.join(TOP_OPTIONS)}")
        return cls(run_id=run_id, **top, **{name: _GROUPS[name](**values) for name, values in groups.items()})

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "JobConfig":
        """The config as a job record stores it (`as_json`): grouped, or flat as written before
        the groups. Names this version does not know are ignored; offsets' partition keys may be
        text; `split` slots become tuples.

        Raises:
            ConfigurationError: no `run_id`, or a malformed value.
        """
        try:
            flat = recorded_options(raw)
            options = {k: v for k, v in flat.items() if k in OPTION_GROUPS or k in TOP_OPTIONS}
            if options.get("end_offsets") is not None:
                options["end_offsets"] = {int(p): int(o) for p, o in options["end_offsets"].items()}
            if options.get("split") is not None:
                options["split"] = {key: tuple(slots) for key, slots in options["split"].items()}
            return cls.from_options(str(raw["run_id"]), **options)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigurationError(f"a job config is malformed ({type(exc).__name__}: {exc}): {dict(raw)}") from exc

    def as_json(self) -> dict[str, Any]:
        """The config as a job record stores it: `run_id`, `TOP_OPTIONS` and
        one object per group (`placement`, `event_time`, `exchange`, `input`)."""
        return asdict(self)

    def with_end_offsets(self, end_offsets: Mapping[int, int] | None) -> "JobConfig":
        """This config with a bounded run's input end (`InputConfig.end_offsets`, partition -> offset)."""
        return replace(self, input=replace(self.input, end_offsets=dict(end_offsets) if end_offsets is not None else None))

    def with_placement(self, **changes: Any) -> "JobConfig":
        """This config with `PlacementConfig` fields changed (`dataclasses.replace` of the group)."""
        return replace(self, placement=replace(self.placement, **changes))

    @property
    def spec(self) -> JobSpec:
        """The job's spec (raises ConfigurationError for an unknown job)."""
        from keyshift.jobs import job_spec

        return job_spec(self.job)

    @property
    def source_tasks(self) -> int:
        """Tasks of the ingest stage per micro-batch: S (`PlacementConfig.stateful_partitions`),
        each reading P/S Kafka partitions one after the other (`DataFrame.coalesce`, no shuffle),
        so the ingest stage pays the per-task cost S times, not P; P for `global_merge`, whose
        tasks each merge one Kafka partition's slot into Redis
        (`keyshift.processing.operators.global_merge`).

        Raises:
            PlacementError: `max_stateful_partitions` < 1.
        """
        placement = self.placement
        return placement.partitions if self.exchange.mode == "global_merge" else placement.stateful_partitions

    def check_exchange(self) -> None:
        """Check the exchange and its emit mode against the job and the watermark mode.

        Raises:
            ConfigurationError: an unknown exchange or emit mode; `global_merge` with a per-key
                watermark mode or a key-window job; `plain`/`global_merge` are for tumbling jobs.
        """
        exchange = self.exchange.mode
        check_exchange(exchange)
        parse_emit(self.exchange.emit)
        if exchange != "local_merge" and self.spec.key_windows:
            raise ConfigurationError(f"job {self.job} computes key windows, which take events one by one; "
                                     f"exchange {exchange!r} is for tumbling-window jobs")
        if exchange == "global_merge" and self.event_time.policy.per_key:
            raise ConfigurationError(f"exchange global_merge closes windows on the global watermark; "
                                     f"watermark mode {self.event_time.mode!r} keeps per-key clocks in the processor's state")
